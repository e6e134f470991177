"""`perfmodel simulate` through typer's runner: the fixed interface (JSON keys, --out
files), agreement with `perfmodel estimate` for a lone request, and one-line errors."""

import csv
import io
import json

import pytest
from typer.testing import CliRunner

from perfmodel.cli.app import app

runner = CliRunner()
BASE = ["simulate", "-m", "llama-3-8b", "-H", "h100-sxm", "--no-progress"]
STATS = ("mean", "p50", "p90", "p99")


def _json(*args: str) -> dict:
    result = runner.invoke(app, [*BASE, *args, "--format", "json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_json_has_the_fixed_keys_in_seconds():
    data = _json("--rate", "2", "--num-requests", "20", "--input-len", "256",
                 "--output-len", "16")
    for key in ("ttft_s", "tpot_s", "itl_s", "e2e_s"):
        assert set(STATS) <= set(data[key])
        assert 0 < data[key]["p50"] <= data[key]["p99"]
    assert data["n_requests"] == 20 and data["n_preempted"] == 0
    assert data["throughput_tokens_per_s"] > 0 and data["requests_per_s"] > 0


def test_lone_request_matches_the_estimate():
    """One request: TTFT and TPOT are estimate's (CUDA graphs on both sides) without host
    time; with vLLM 0.24's (v1 async scheduling, HTTP) they are longer by its formula."""
    args = ("--rate", "0.001", "--num-requests", "1", "--input-len", "700",
            "--output-len", "33")
    sim = _json(*args, "--no-host-time")
    est = runner.invoke(app, ["estimate", "-m", "llama-3-8b", "-H", "h100-sxm", "--prompt",
                              "700", "--gen", "33", "--cuda-graphs", "--format", "json"])
    e = json.loads(est.stdout)
    assert sim["ttft_s"]["mean"] == pytest.approx(e["ttft_s"], rel=1e-9)
    assert sim["tpot_s"]["mean"] == pytest.approx(e["tpot_s"], rel=1e-9)
    host = _json(*args)
    # 1.018 ms of host work per step hides behind every (longer) GPU step; 0.16 ms shows.
    # TTFT: tokenizing 700 x 2 us, the API server's 1 ms, the prefill step's 0.16 ms, the
    # API server's 20 us on the token, the stream 0.2 ms (alone, it waits for no other work)
    assert host["ttft_s"]["mean"] - e["ttft_s"] == pytest.approx(2.78e-3, abs=1e-9)
    assert host["tpot_s"]["mean"] - e["tpot_s"] == pytest.approx(0.16e-3, abs=1e-9)
    assert host["engine_time"]["host_s"] == pytest.approx(33 * 0.16e-3)


def test_several_rates_and_out_files(tmp_path):
    out = tmp_path / "sim"
    result = runner.invoke(app, [*BASE, "--rate", "5,50", "--num-requests", "60",
                                 "--input-len", "512", "--output-len", "32",
                                 "--slo-ttft", "0.5", "--slo-tpot", "0.05", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "estimated capacity" in result.stdout and "goodput" in result.stdout
    names = {p.name for p in out.iterdir()}
    assert {"requests-0.csv", "requests-1.csv", "steps-0.csv", "summary-1.json",
            "latency_cdf.png", "load.png", "timeseries-0.png", "load.txt"} <= names
    rows = list(csv.DictReader(io.StringIO((out / "requests-1.csv").read_text())))
    assert len(rows) == 60 and float(rows[0]["ttft_s"]) > 0
    slow, fast = (json.loads((out / f"summary-{i}.json").read_text()) for i in (0, 1))
    assert fast["queue_s"]["mean"] > slow["queue_s"]["mean"]


def test_trace_and_closed_loop(tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,input_tokens,output_tokens,prefix_id,prefix_tokens\n"
                     "0.0,300,8,sys,256\n0.5,300,8,sys,256\n1.0,50,4,,\n")
    data = _json("--trace", str(trace))
    assert data["n_requests"] == 3 and data["prefix_hit_tokens"] == 256
    closed = _json("--concurrency", "4", "--num-requests", "12", "--input-len", "128",
                   "--output-len", "8")
    assert closed["n_requests"] == 12 and closed["peak_running"] <= 4


def test_static_scheduler_runs():
    data = _json("--scheduler", "static", "--rate", "20", "--num-requests", "16",
                 "--input-len", "128", "--output-len", "8", "--max-num-seqs", "4")
    assert data["n_requests"] == 16


@pytest.mark.parametrize("args, words", [
    (["--rate", "2", "--concurrency", "3"], "one source of traffic"),
    ([], "one source of traffic"),
    (["--rate", "0"], "--rate"),
    (["--rate", "x"], "--rate"),
    (["--rate", "1", "--slo-ttft", "0"], "--slo-ttft"),
    (["--rate", "1", "--slo-tpot", "-1"], "--slo-tpot"),
    (["--rate", "1", "--input-len", "9000", "--output-len", "9000"], "context limit"),
    (["--rate", "1", "--arrival", "bursty"], "--arrival"),
])
def test_mistakes_are_one_line(args, words):
    result = runner.invoke(app, [*BASE, *args, "--num-requests", "3"])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and words in lines[0], lines


def test_bad_trace_names_file_and_column(tmp_path):
    trace = tmp_path / "bad.csv"
    trace.write_text("arrival_s,input_tokens,output_tokens\n-1,10,10\n")
    result = runner.invoke(app, [*BASE, "--trace", str(trace)])
    assert result.exit_code == 2 and "bad.csv" in result.output and "arrival_s" in result.output


def test_model_that_does_not_fit():
    result = runner.invoke(app, ["simulate", "-m", "llama-3.1-405b", "-H", "l4",
                                 "--no-progress", "--rate", "1", "--num-requests", "2"])
    assert result.exit_code == 2 and "does not fit" in result.output


def test_longest_gap_is_the_prompt_step_a_decode_waited_for():
    """A decoding request's longest gap is the step in which another request's long prompt
    ran beside it; a one-token request has none."""
    import numpy as np

    import perfmodel as pm
    from perfmodel.serving.requests import Requests
    from perfmodel.serving.simulate import simulate

    model, hw = pm.model("llama-3-8b"), pm.hardware("h100-sxm")
    res = simulate(model, hw, Requests.of([0.0, 0.05, 0.06], [100, 4000, 10], [40, 1, 3]))
    s = res.steps
    end = s.start_s + s.time_s
    inside = (s.start_s >= res.first_token_s[0] - 1e-12) & (end <= res.finish_s[0] + 1e-12)
    assert res.itl_max_s[0] == pytest.approx(s.time_s[inside].max(), rel=1e-12)
    assert res.itl_max_s[0] > 3 * res.tpot_s[0]        # the 4,000-token step stands out
    assert np.isnan(res.itl_max_s[1])
