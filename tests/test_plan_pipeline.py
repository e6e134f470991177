"""The planner searches pipeline stages where no node holds the model by tensor
parallelism alone, prices them with the simulator's pipeline, and launches them with each
engine's own flag."""

import json
import shlex

import pytest
from typer.testing import CliRunner

from perfmodel.cli.app import app
from perfmodel.serving.planner import search as planner_search
from perfmodel.specs import load

A100 = load.hardware("a100-80gb-sxm")        # 8 x 80 GB a node, no fp8 rate: bf16 only
BIG = load.model("llama-3.1-405b")           # 810 GB of bf16 weights
SMALL = load.model("llama-3-8b")


def test_pipeline_stages_are_searched_only_where_no_node_holds_the_model():
    assert planner_search.fits_in_node(SMALL, A100) and not planner_search.fits_in_node(BIG, A100)
    assert all(p.pp == 1 for p in planner_search.replica_plans(SMALL, A100, 16))
    staged = [(p.tp, p.pp) for p in planner_search.replica_plans(BIG, A100, 16) if p.pp > 1]
    assert staged == [(1, 2), (2, 2), (4, 2), (8, 2), (1, 4), (2, 4), (4, 4), (1, 8), (2, 8)]
    assert not any("pipeline" in n for n in planner_search.left_out(BIG, A100, 16))
    assert any("nor pipeline" in n for n in planner_search.left_out(SMALL, A100, 16))


def test_the_planner_picks_pipeline_stages_and_launches_them():
    """405B in bf16 needs more than one node's 640 GB: TP alone (at most 8, in a node)
    holds no sequence, so the plan is TP x PP over two nodes; its simulate command, run
    as printed, gives the check's figures; every engine's launch names the stages."""
    runner = CliRunner()
    r = runner.invoke(app, ["plan", "-m", "llama-3.1-405b", "-H", "a100-80gb-sxm", "--gpus",
                            "16", "--slo-ttft", "10", "--slo-tpot", "0.3", "--input-len",
                            "1000", "--output-len", "100", "--requests", "100", "-f", "json",
                            "--no-progress"])
    assert r.exit_code == 0, r.output
    plan = json.loads(r.stdout)
    p = plan["plan"]
    assert p["pp"] > 1 and p["tp"] * p["pp"] == 16 and p["nodes"] == 2
    cmd = shlex.split(plan["simulate_command"])
    assert cmd[cmd.index("--pp") + 1] == str(p["pp"])
    sim = runner.invoke(app, [*cmd[1:], "-f", "json", "--no-progress", "--no-band"])
    assert sim.exit_code == 0, sim.output
    got = json.loads(sim.stdout[sim.stdout.index("{"):])
    assert got["pipeline"]["stages"] == p["pp"]
    # the printed --rate has 6 significant digits: the arrivals move by as little
    assert got["ttft_s"]["p90"] == pytest.approx(plan["winner"]["whole_run_ttft_p90_s"],
                                                  rel=1e-4)
    assert got["tpot_s"]["p90"] == pytest.approx(plan["winner"]["whole_run_tpot_p90_s"],
                                                  rel=1e-4)
    launch = plan["commands"]
    assert f"--pipeline-parallel-size {p['pp']}" in launch["vLLM"]
    assert f"--pp-size {p['pp']}" in launch["SGLang"]
    assert f"pipeline_parallel_size: {p['pp']}" in launch["TensorRT-LLM"]


def test_pipeline_stages_are_searched_for_vllm_only():
    """SGLang's and TensorRT-LLM's pipeline loops are not simulated: no stage is planned
    for them, and the search says so."""
    from perfmodel.cli.devices import device

    sgl = device("a100-80gb-sxm", "sglang")
    assert sgl.engine == "sglang"
    assert all(p.pp == 1 for p in planner_search.replica_plans(BIG, sgl, 16))
    assert any("not searched for --engine sglang" in n
               for n in planner_search.left_out(BIG, sgl, 16))
