"""compare-serving: measured runs read into replays, errors and medians by hand, the shared
measurements mapped to shipped specs, and the command's one-line mistakes."""

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from perfmodel.cli.app import app
from perfmodel.compare import serving
from perfmodel.serving.results import SimResult, StepLog
from perfmodel.specs.errors import SpecError

SHARED = Path(__file__).resolve().parents[2] / "shared" / "measurements" / "serving"
HEAD = ("source,id,gpu,model,tp,pp,dp,max_num_seqs,max_num_batched_tokens,max_model_len,"
        "chunked_prefill,prefix_caching,gpu_mem_util,arrival,rate_or_concurrency,n_requests,"
        "input_len_mean,output_len_mean,workload,ttft_mean_ms,ttft_p50_ms,ttft_p90_ms,"
        "ttft_p99_ms,itl_mean_ms,itl_p50_ms,itl_p90_ms,itl_p99_ms,tpot_mean_ms,tpot_p50_ms,"
        "tpot_p90_ms,tpot_p99_ms,e2e_mean_ms,e2e_p50_ms,e2e_p90_ms,e2e_p99_ms,"
        "throughput_output_tok_s\n")
METRICS = "50,40,60,70,10,10,11,12,10,10,11,12,500,450,600,700,100\n"


def _files(tmp_path: Path, model: str = "Qwen/Qwen3-14B", tp: str = "1") -> tuple[Path, Path]:
    exp = tmp_path / "experiments.csv"
    exp.write_text(
        HEAD
        + f"x,a/capped,NVIDIA H100 80GB HBM3,{model},{tp},1,1,256,8192,,True,True,0.9,"
          f"poisson; client cap 2 in flight,4,3,200,8,w,{METRICS}"
        + f"x,a/norows,NVIDIA H100 80GB HBM3,{model},1,1,1,256,8192,,True (vLLM V1 default),"
          f"False,0.9,poisson,4,5,200,8,w,{METRICS}")
    req = tmp_path / "requests.csv"
    req.write_text("experiment_id,request_id,client_id,arrival_s,sched_arrival_s,input_tokens,"
                   "output_tokens,ttft_s,e2e_s,status\n"
                   "a/capped,0,c,0.0,0.0,200,8,0.05,0.5,ok\n"
                   "a/capped,1,c,0.31,0.3,200,8,0.05,0.5,ok\n"
                   "a/capped,2,c,0.6,0.6,200,8,0.05,0.5,error\n"
                   "a/capped,3,c,0.9,0.8,180,8,0.05,0.5,ok\n")
    return exp, req


def test_runs_are_read_as_replays(tmp_path):
    exp, req = _files(tmp_path)
    capped, norows = serving.load_runs(exp, req)
    assert (capped.model, capped.hardware) == ("qwen3-14b", "h100-sxm")
    assert len(capped.requests) == 3 and capped.requests.client_cap == 2
    assert capped.requests.arrival_s.tolist() == [0.0, 0.3, 0.8]       # scheduled times
    assert "1 failed requests left out" in capped.notes
    assert len(norows.requests) == 5 and norows.requests.client_cap == 0
    assert norows.engine.chunked_prefill and not norows.engine.prefix_caching
    assert capped.measured["ttft_s"]["p90"] == pytest.approx(0.060)
    assert capped.measured["throughput_tokens_per_s"] == 100


def test_errors_by_hand():
    predicted = {"ttft_s": {"mean": 0.06, "p90": 0.05}, "throughput_tokens_per_s": 90.0}
    measured = {"ttft_s": {"mean": 0.05, "p90": 0.05}, "throughput_tokens_per_s": 100.0}
    got = serving.errors(predicted, measured)
    assert got == pytest.approx({"ttft_s.mean": 0.2, "ttft_s.p90": 0.0,
                                 "throughput_tokens_per_s": -0.1})


def test_medians_by_hand():
    rows = [{"id": "rv/a", "e2e_s.mean": 0.1}, {"id": "rv/b", "e2e_s.mean": -0.3},
            {"id": "lss/c", "e2e_s.mean": 0.2}, {"id": "lss/d", "skipped": "why"}]
    s = serving.summarize(rows)
    assert s["all"]["e2e_s.mean"] == pytest.approx(0.2) and s["all"]["skipped"] == 1
    assert s["rv"]["e2e_s.mean"] == pytest.approx(0.2) and s["rv"]["runs"] == 2
    assert s["lss"]["runs"] == 1 and s["lss"]["e2e_s.mean"] == pytest.approx(0.2)


def test_replayed_runs_carry_signed_errors(tmp_path):
    exp, req = _files(tmp_path)
    rows = serving.compare(serving.load_runs(exp, req))
    for row in rows:
        assert "skipped" not in row
        pred = row["predicted"]["e2e_s"]["mean"]
        assert row["e2e_s.mean"] == pytest.approx(pred / 0.5 - 1)


def test_an_unknown_model_is_not_replayed_and_says_why(tmp_path):
    exp, req = _files(tmp_path, model="acme/Nope-1B")
    rows = serving.compare(serving.load_runs(exp, req))
    assert all("acme/Nope-1B" in r["skipped"] for r in rows)


def test_missing_column_names_the_file(tmp_path):
    bad = tmp_path / "e.csv"
    bad.write_text("id,gpu\nx,y\n")
    with pytest.raises(SpecError, match=r"e\.csv: missing column 'model'"):
        serving.load_runs(bad)


@pytest.mark.skipif(not SHARED.exists(), reason="../shared/measurements/serving not present")
def test_the_shared_runs_map_to_shipped_specs():
    import perfmodel as pm

    runs = serving.load_runs(SHARED / "experiments.csv", SHARED / "requests.csv")
    assert len(runs) == 31
    assert sum(r.id.startswith("rv/") for r in runs) == 27
    assert all(len(r.requests) > 0 and not r.skip for r in runs)
    for r in runs:
        pm.model(r.model), pm.hardware(r.hardware)
    capped = [r for r in runs if r.requests.client_cap]
    assert len(capped) == 27 and all(r.requests.client_cap == 256 for r in capped)


def test_command_json_and_mistakes(tmp_path):
    exp, req = _files(tmp_path)
    runner = CliRunner()
    result = runner.invoke(app, ["compare-serving", str(exp), "--requests", str(req),
                                 "--format", "json", "--no-progress"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["summary"]["all"]["runs"] == 2
    result = runner.invoke(app, ["compare-serving", str(tmp_path / "none.csv")])
    assert result.exit_code == 2 and result.output.count("\n") == 1 and "none.csv" in result.output
    result = runner.invoke(app, ["compare-serving", str(exp), "--only", "zzz"])
    assert result.exit_code == 2 and "--only" in result.output


def _stub(model, hw, requests, plan, engine, progress=None, label=""):
    """A simulator whose every request gets its first token 0.1 s after it arrives and one
    token every 10 ms after that."""
    out = requests.output_tokens
    first = requests.arrival_s + 0.1
    token_s = np.concatenate([f + 0.01 * np.arange(k) for f, k in zip(first, out, strict=True)])
    zero, none = np.zeros(len(out), np.int64), np.zeros(1, np.int64)
    return SimResult(requests, requests.arrival_s, requests.arrival_s, first,
                     first + 0.01 * (out - 1), zero, zero,
                     np.concatenate([[0], np.cumsum(out)]), token_s,
                     StepLog(none * 0.0, none * 0.0, none, none, none, none, none), 100)


def test_errors_of_a_stub_simulator_by_hand(tmp_path):
    exp, req = _files(tmp_path)
    row = serving.compare(serving.load_runs(exp, req)[:1], simulate=_stub)[0]
    # 3 requests sent at 0, 0.3, 0.8 s, 8 tokens each: TTFT 0.1 s, TPOT and ITL 10 ms,
    # E2E 0.17 s; 24 tokens over 0.97 s. Measured: TTFT 50 ms, ITL 10 ms (p99 12),
    # TPOT 10 ms, E2E 500 ms, 100 tokens/s
    assert row["ttft_s.mean"] == pytest.approx(0.1 / 0.05 - 1)
    assert row["itl_s.mean"] == pytest.approx(0.0, abs=1e-9)
    assert row["itl_s.p99"] == pytest.approx(0.010 / 0.012 - 1)
    assert row["tpot_s.mean"] == pytest.approx(0.0, abs=1e-9)
    assert row["e2e_s.mean"] == pytest.approx(0.17 / 0.5 - 1)
    assert row["throughput_tokens_per_s"] == pytest.approx(24 / 0.97 / 100 - 1)
    csv = serving.flat([row])[0]
    assert csv["predicted.e2e_s.mean"] == pytest.approx(0.17)
    assert csv["measured.e2e_s.mean"] == pytest.approx(0.5)


def test_a_run_without_itl_has_no_itl_error(tmp_path):
    exp, req = _files(tmp_path)
    exp.write_text(exp.read_text().replace(",10,10,11,12,10,10,11,12,", ",,,,,10,10,11,12,"))
    rows = serving.compare(serving.load_runs(exp, req), simulate=_stub)
    for row in rows:
        assert "itl_s" not in row["measured"] and not any(k.startswith("itl") for k in row)
        assert all(v == v for k, v in row.items() if "." in k)        # no NaN


@pytest.mark.parametrize(("change", "message"), [
    ("tp", r"experiments\.csv: run 'a/capped': column 'tp': 'one' is not a whole number"),
    ("status", r"requests\.csv: missing column 'status'"),
    ("sched", r"requests\.csv: run 'a/capped': missing column 'sched_arrival_s'"),
])
def test_bad_values_are_one_line_errors_naming_file_run_and_column(tmp_path, change, message):
    exp, req = _files(tmp_path, tp="one" if change == "tp" else "1")
    if change in ("status", "sched"):
        column = ",status" if change == "status" else ",sched_arrival_s"
        lines = req.read_text().splitlines()
        at = lines[0].split(",").index(column[1:])
        req.write_text("\n".join(",".join(x for i, x in enumerate(line.split(","))
                                           if i != at) for line in lines) + "\n")
    with pytest.raises(SpecError, match=message) as info:
        serving.load_runs(exp, req)
    assert "\n" not in str(info.value)


def test_command_csv(tmp_path):
    exp, req = _files(tmp_path)
    result = CliRunner().invoke(app, ["compare-serving", str(exp), "--requests", str(req),
                                      "--format", "csv", "--no-progress", "--only", "capped"])
    assert result.exit_code == 0, result.output
    head, *body = result.stdout.splitlines()
    assert len(body) == 1 and body[0].startswith("a/capped,qwen3-14b,h100-sxm,")
    assert "e2e_s.mean" in head.split(",") and "measured.e2e_s.mean" in head.split(",")
