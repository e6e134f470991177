"""A disaggregated deployment's pools take the engine's host time as ``simulate`` adds it
(``serving.disagg``), and so does the planner's check of a disaggregated plan."""

import json
import shlex

import numpy as np
import pytest
from typer.testing import CliRunner

from perfmodel.cli.app import app
from perfmodel.serving import host_time, traffic
from perfmodel.serving.disagg import Pool, simulate_disaggregated
from perfmodel.serving.engines.vllm import EngineConfig
from perfmodel.serving.planner import check as planner_check
from perfmodel.serving.planner import plans as planner
from perfmodel.serving.planner.plans import Target
from perfmodel.specs import load
from perfmodel.specs.workload import Parallelism

MODEL, H100 = load.model("llama-3-8b"), load.hardware("h100-sxm")
HOST = host_time.resolve("vllm")


def _itl(res):
    gaps = [np.diff(res.token_s[a:b]) for a, b in zip(res.token_offsets[:-1],
                                                      res.token_offsets[1:], strict=True)]
    return np.concatenate(gaps)


def test_host_time_makes_disaggregated_ttft_and_itl_no_smaller():
    reqs = traffic.generate(60, rate=8.0, input_len=800, output_len=40,
                            length_dist="uniform", seed=3)
    runs = {}
    for name, host in (("off", host_time.NO_HOST), ("on", HOST)):
        engine = EngineConfig(host=host)
        runs[name] = simulate_disaggregated(MODEL, reqs, Pool(H100, Parallelism()),
                                            Pool(H100, Parallelism(), engine),
                                            "nvlink", engine)
    off, on = runs["off"], runs["on"]
    assert np.all(on.ttft_s >= off.ttft_s)
    # at least the API server and the stream on each side
    assert np.all(on.ttft_s - off.ttft_s >= 2 * HOST.request_s + HOST.stream_s)
    assert _itl(on).mean() >= _itl(off).mean()
    assert on.info["prefill"].info["host"] == HOST


def test_a_disaggregated_check_takes_the_host_time_and_prints_it():
    base = Target(8, 1.0, 0.05, 1000, 100, rate=20.0)
    cols, _ = planner.candidates(MODEL, [H100], base)
    cols = planner.evaluate(cols, base)
    i = int(np.flatnonzero(cols["feasible"] & (cols["prefill_replicas"] > 0)
                           & (cols["gpus"] <= 3))[0])
    plan = planner.record(MODEL, cols, i)
    off = planner_check.check(MODEL, H100, plan, cols, i, base, 100, 0)
    on_target = Target(8, 1.0, 0.05, 1000, 100, rate=20.0, host=HOST)
    on = planner_check.check(MODEL, H100, plan, cols, i, on_target, 100, 0)
    assert on["whole_run_ttft_p90_s"] > off["whole_run_ttft_p90_s"]
    assert on["whole_run_tpot_p90_s"] >= off["whole_run_tpot_p90_s"]
    assert off["command"].endswith(" --no-host-time")        # GPU steps only
    assert "host-time" not in on["command"]                  # simulate's default: vLLM's own
    run = CliRunner().invoke(app, [*shlex.split(on["command"])[1:], "-f", "json",
                                   "--no-progress"])         # the printed command reproduces it
    assert run.exit_code == 0, run.output
    printed = json.loads(run.stdout)
    assert printed["ttft_s"]["p90"] == pytest.approx(on["whole_run_ttft_p90_s"], rel=1e-9)
    assert printed["tpot_s"]["p90"] == pytest.approx(on["whole_run_tpot_p90_s"], rel=1e-9)
