"""The new-user battery (issue 27, item 7), the serving half: each input that broke
``simulate`` or ``compare-serving`` now ends in one ``error:`` line and exit 2, or goes on
with a stated warning. Through typer's runner, as a user meets them."""

import csv
import json

import numpy as np
import pytest
from typer.testing import CliRunner

from perfmodel.cli import simulate as simulate_cli
from perfmodel.cli.app import app
from perfmodel.serving import traffic
from perfmodel.serving.requests import Requests
from perfmodel.specs.errors import SpecError

runner = CliRunner()
BASE = ["simulate", "-m", "llama-3-8b", "-H", "h100-sxm", "--no-progress"]


def _error(*args: str) -> str:
    result = runner.invoke(app, [*BASE, *args])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def _trace(tmp_path, row: str) -> str:
    path = tmp_path / "t.csv"
    path.write_text(f"arrival_s,input_tokens,output_tokens\n{row}\n")
    return str(path)


def test_empty_out_is_refused_and_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    line = _error("--rate", "5", "--num-requests", "4", "--out", "")
    assert line.startswith("error: --out: expected a folder name")
    assert list(tmp_path.iterdir()) == []


def test_a_trace_of_10e23_tokens_is_one_line(tmp_path):
    line = _error("--trace", _trace(tmp_path, "0,100000000000000000000000,10"))
    assert "column 'input_tokens', row 2: expected at most 1,000,000,000 tokens, got 1" in line


def test_a_huge_mean_length_is_one_line():
    assert "--input-len: expected a whole number in [1, 1,000,000,000]" in _error(
        "--rate", "1", "--input-len", str(10**23))


def test_a_wide_lognormal_is_refused_not_collapsed_to_one_token():
    line = _error("--rate", "5", "--num-requests", "8", "--length-dist", "lognormal",
                  "--spread", "50")
    assert line.startswith("error: --spread: expected a number in [0, 3]")
    # the widest allowed sigma still leaves a median far above 1 token at the defaults
    lengths = traffic.generate(4000, rate=1.0, input_len=1024, output_len=128,
                               length_dist="lognormal", spread=traffic.MAX_LOGNORMAL_SIGMA)
    assert np.median(lengths.input_tokens) > 5


def test_rate_inf_is_a_stated_warning():
    result = runner.invoke(app, [*BASE, "--rate", "inf", "--num-requests", "6",
                                 "--input-len", "64", "--output-len", "4"])
    assert result.exit_code == 0, result.output
    assert "warning: --rate inf: all 6 requests arrive at t=0" in result.stderr


def test_a_trace_arrival_of_1e300_is_refused(tmp_path):
    line = _error("--trace", _trace(tmp_path, "1e300,100,10"))
    assert line.endswith("expected a time <= 1e+09 s (about 32 years), got 1e300")


@pytest.mark.parametrize("flag", [["--input-len", "50"], ["--seed", "3"],
                                  ["--num-requests", "9"], ["--length-dist", "uniform"]])
def test_generated_traffic_flags_with_a_trace_are_refused(tmp_path, flag):
    line = _error("--trace", _trace(tmp_path, "0,100,10"), *flag)
    assert line.startswith(f"error: {flag[0]}: a --trace sets its own arrivals and lengths")


def test_burstiness_without_gamma_arrivals_is_refused():
    line = _error("--rate", "5", "--num-requests", "8", "--burstiness", "0.5")
    assert "--burstiness applies only to --arrival gamma" in line


def test_burstiness_with_gamma_arrivals_reaches_the_arrivals(tmp_path):
    def arrivals(b: str) -> list:
        out = tmp_path / b
        result = runner.invoke(app, [*BASE, "--rate", "5", "--num-requests", "30",
                                     "--input-len", "64", "--output-len", "4", "--arrival",
                                     "gamma", "--burstiness", b, "--out", str(out)])
        assert result.exit_code == 0, result.output
        rows = list(csv.DictReader((out / "requests.csv").open()))
        return [float(r["arrival_s"]) for r in rows]
    assert arrivals("0.2") != arrivals("5")


def test_more_replicas_than_requests_leaves_the_rest_idle():
    result = runner.invoke(app, [*BASE, "--rate", "5", "--num-requests", "20", "--dp", "1000",
                                 "--input-len", "64", "--output-len", "4", "-f", "json"])
    assert result.exit_code == 0, result.output
    assert "warning: 20 requests over 1,000 engines: 980 stay idle" in result.stderr
    assert json.loads(result.stdout)["n_requests"] == 20


def test_requests_past_the_context_are_rejected_counted_and_said():
    """vLLM answers a request longer than max_model_len with HTTP 400: the generated ones
    past the limit are dropped, counted, and the run goes on with the rest."""
    reqs = traffic.generate(300, rate=5.0, input_len=2000, output_len=128,
                            length_dist="lognormal", spread=1.5)
    too_long = int(np.sum(reqs.input_tokens + reqs.output_tokens > 8192))
    assert too_long > 0
    result = runner.invoke(app, [*BASE, "--rate", "5", "--num-requests", "300",
                                 "--length-dist", "lognormal", "--spread", "1.5",
                                 "--input-len", "2000", "-f", "json"])
    assert result.exit_code == 0, result.output
    assert f"{too_long} of 300 generated requests are longer" in result.stderr
    assert json.loads(result.stdout)["n_requests"] == 300 - too_long


def test_within_limit_keeps_the_rest_in_order_and_refuses_all_gone():
    reqs = Requests.of([0, 1, 2], [10, 500, 20], [5, 5, 5])
    kept, dropped = traffic.within_limit(reqs, 100)
    assert dropped == 1 and kept.input_tokens.tolist() == [10, 20]
    assert traffic.within_limit(reqs, 10**6) == (reqs, 0)
    with pytest.raises(SpecError, match="every one of the 3 requests"):
        traffic.within_limit(reqs, 5)


def test_help_lists_pp_but_no_batch():
    result = runner.invoke(app, ["simulate", "--help"])
    assert result.exit_code == 0
    assert "--pp" in result.stdout and "--batch" not in result.stdout


def test_a_long_run_says_how_long_it_will_take(monkeypatch):
    monkeypatch.setattr(simulate_cli, "_ANNOUNCE_AFTER_S", 0.0)
    clock = iter(np.arange(0.0, 1e6, 10.0))     # every call: 10 s more
    monkeypatch.setattr(simulate_cli.time, "perf_counter", lambda: float(next(clock)))
    lines = []
    monkeypatch.setattr(simulate_cli.typer, "echo", lambda text, err=False: lines.append(text))
    eta = simulate_cli._Eta(10**7, 10**7 / 30, "30 req/s")     # set up at t = 0
    eta(0, 10**7, 0.0)              # t = 10 s: the first step, the pace starts here
    eta(0, 10**7, 10**7 / 30 / 1000)  # t = 20 s: no request finished, 0.1% of the arrivals
    eta(5000, 10**7, 10**7 / 30 / 500)  # said once: 0.1% in 10 s, 99.9% more in 9,990 s
    assert lines == ["note: 30 req/s: 0.10% of 10,000,000 requests simulated in 20 s: "
                     "about 2.8 h in all"]


def test_a_real_run_passes_the_clock_to_the_announcer(monkeypatch):
    seen = []
    monkeypatch.setattr(simulate_cli._Eta, "__call__",
                        lambda self, done, total, clock: seen.append((done, total, clock)))
    result = runner.invoke(app, [*BASE, "--rate", "50", "--num-requests", "40",
                                 "--input-len", "64", "--output-len", "8", "--dp", "2"])
    assert result.exit_code == 0, result.output
    assert seen and all(t == 20 for _, t, _ in seen) and max(c for *_, c in seen) > 0


def test_a_header_only_experiments_file_says_so(tmp_path):
    from tests.test_compare_serving import HEAD

    exp = tmp_path / "e.csv"
    exp.write_text(HEAD)
    result = runner.invoke(app, ["compare-serving", str(exp)])
    assert result.exit_code == 2
    assert result.stderr.strip() == f"error: {exp}: no runs, only a header; expected one row " \
                                    "per run"


def test_a_requests_file_without_a_runs_rows_is_said(tmp_path):
    from tests.test_compare_serving import _files

    exp, req = _files(tmp_path)           # rows for a/capped only, none for a/norows
    result = runner.invoke(app, ["compare-serving", str(exp), "--requests", str(req),
                                 "--no-progress", "-f", "json"])
    assert result.exit_code == 0, result.output
    assert ("warning: --requests: requests.csv has no rows for 1 of the 2 runs (a/norows, "
            "column experiment_id): they are regenerated from their rate and mean lengths "
            "(Poisson)") in result.stderr
    quiet = runner.invoke(app, ["compare-serving", str(exp), "--requests", str(req),
                                "--only", "capped", "--no-progress", "-f", "json"])
    assert quiet.exit_code == 0 and "warning" not in quiet.stderr


def test_a_request_the_engine_can_never_admit_is_one_clear_error() -> None:
    """SGLang's prefill adder reserves room past the prompt (a page per request and its
    expected output), so a prompt one token short of the whole pool passes simulate's
    pool-size check but is never admitted: one SpecError naming the request, where the loop
    used to end in a ValueError from pricing an empty list of steps."""
    import perfmodel as pm
    from perfmodel.serving.engines import engine_config
    from perfmodel.serving.pricing import kv_pool
    from perfmodel.serving.simulate import simulate
    from perfmodel.specs.workload import Parallelism, Workload

    m, hw = pm.model("llama-3-8b"), pm.hardware("h100-sxm")
    cfg = engine_config("sglang", mem_fraction_static=0.2)
    blocks = kv_pool(m, hw, Parallelism(), Workload.for_model(m), cfg).blocks
    prompt = blocks * cfg.block_size - 2
    one = np.array([0])
    reqs = Requests(arrival_s=np.array([0.0]), input_tokens=np.array([prompt]),
                    output_tokens=np.array([1]), prefix_id=one - 1, prefix_tokens=one)
    with pytest.raises(SpecError, match=r"sglang cannot admit request 0 \(\d+ prompt \+ 1 "
                                        r"output tokens\) into a KV pool of \d+ blocks"):
        simulate(m, hw, reqs, engine=cfg)
