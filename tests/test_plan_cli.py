"""The ``plan`` command: its output, the simulate command it prints (which must agree with
the plan), its files, progress, and one-line errors for bad input."""

import json
import re
import shlex

import numpy as np
import pytest

from perfmodel.specs import load


def _cli():
    import typer

    from perfmodel.cli.app import OneLineErrors
    from perfmodel.cli.plan import plan_cmd
    from perfmodel.cli.simulate import simulate_cmd

    cli = typer.Typer(cls=OneLineErrors, add_completion=False, pretty_exceptions_enable=False,
                      rich_markup_mode=None)
    cli.callback()(lambda: None)
    cli.command("plan")(plan_cmd)
    cli.command("simulate")(simulate_cmd)
    return cli


def _run(*args: str, command: str = "plan"):
    from typer.testing import CliRunner

    return CliRunner().invoke(_cli(), [command, *args])


ASK = ("-m", "llama-3-8b", "-H", "h100-sxm,a100-80gb-sxm", "--gpus", "2", "--slo-ttft", "1",
       "--slo-tpot", "0.03", "--requests", "100")
LENGTHS = ("--input-len", "1000", "--output-len", "100")


def test_plan_command_explains_and_gives_launch_lines():
    r = _run(*ASK, *LENGTHS)
    assert r.exit_code == 0, r.output
    for text in ("chosen:", "met", "why:", "parallelism (best", "batch ", "precision ",
                 "reproduce the check:", "perfmodel simulate -m llama-3-8b",
                 "vllm serve meta-llama/Meta-Llama-3-8B", "--max-num-seqs", "--kv-cache-dtype",
                 "python -m sglang.launch_server", "--max-running-requests", "searched:",
                 "warm-up", "planned in"):
        assert text in r.stdout, text


def test_the_printed_simulate_command_reproduces_the_plan():
    """Issue 27 item 1: run the command the plan prints; its p90s are the check's (the
    whole run's, and the steady state's within 10% or its stated 95% interval), and its
    estimated capacity per replica times the replicas is the plan's within 5%."""
    # GPU steps only: the steady-state against whole-run comparison below was sized for
    # them (the API server's queue at 30 req/s widens the warm-up's TTFT gap to 11%)
    r = _run("-m", "llama-3-8b", "-H", "h100-sxm", "--rate", "30", "--slo-ttft", "1",
             "--slo-tpot", "0.05", "--requests", "300", *LENGTHS, "-f", "json",
             "--no-host-time")
    assert r.exit_code == 0, r.output
    plan = json.loads(r.stdout)
    cmd = shlex.split(plan["simulate_command"])
    assert cmd[:2] == ["perfmodel", "simulate"] and plan["winner"]["confirmed"]
    assert cmd[-1] == "--no-host-time"
    sim = _run(*cmd[2:], "-f", "json", "--no-progress", command="simulate")
    assert sim.exit_code == 0, sim.output
    got = json.loads(sim.stdout)
    w = plan["winner"]
    assert got["n_requests"] == w["requests"]
    assert got["ttft_s"]["p90"] == pytest.approx(w["whole_run_ttft_p90_s"], rel=1e-9)
    assert got["tpot_s"]["p90"] == pytest.approx(w["whole_run_tpot_p90_s"], rel=1e-9)
    # the whole run (warm-up and drain in) against the steady window: within 10%, or within
    # the 95% interval the plan states for the steady p90 where that is wider
    for name in ("ttft", "tpot"):
        steady, band = w[f"simulated_{name}_p90_s"], w[f"simulated_{name}_p90_band_s"]
        assert abs(got[f"{name}_s"]["p90"] - steady) <= max(0.10 * steady, band)
    rate = cmd[cmd.index("--rate") + 1]
    cmd[cmd.index("--rate") + 1] = f"{rate},{float(rate) / 2:g}"    # two rates: capacity shown
    two = _run(*cmd[2:], "--no-progress", command="simulate")
    per_replica = float(re.search(r"estimated capacity ([\d.]+) req/s", two.stdout).group(1))
    assert per_replica * w["copies"] == pytest.approx(w["capacity_req_s"], rel=0.05)
    p = plan["plan"]
    for flag, value in (("--weights-dtype", p["weights_dtype"]), ("--act-dtype", p["act_dtype"]),
                        ("--kv-dtype", p["kv_dtype"]), ("--max-num-seqs", p["max_num_seqs"])):
        assert cmd[cmd.index(flag) + 1] == str(value)


def test_plan_command_json_and_files(tmp_path):
    r = _run(*ASK, *LENGTHS, "-f", "json", "--out", str(tmp_path / "p"))
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout.split("\nwrote ")[0])
    assert data["winner"]["confirmed"] and "vllm serve" in data["commands"]["vLLM"]
    assert data["feasible"] <= data["candidates"] and data["pareto"]
    assert data["plan"]["precision"] in data["winner"]["label"]
    assert {"tp", "pp", "ep", "dp", "nodes", "precision", "kv_dtype"} <= set(data["plan"])
    head = (tmp_path / "p" / "plan.csv").read_text().splitlines()[0].split(",")
    assert {"throughput_per_gpu", "precision", "kv_dtype", "pareto", "feasible",
            "nodes"} <= set(head)
    assert (tmp_path / "p" / "pareto.png").stat().st_size > 10_000


def test_plan_command_from_a_trace_and_a_rate(tmp_path):
    from perfmodel.serving import traffic

    path = tmp_path / "t.csv"
    traffic.write_trace(traffic.generate(80, rate=4.0, input_len=800, output_len=80, seed=1),
                        path)
    r = _run(*ASK, "--trace", str(path))
    assert r.exit_code == 0, r.output
    assert "the asked" in r.stdout and f"--lengths-from {path}" in r.stdout
    both = _run(*ASK, "--trace", str(path), "--input-len", "5")
    assert both.exit_code == 2 and "--input-len" in both.stderr
    # a 4.9 req/s ask on a budget of 8 uses the fewest GPUs, not all 8
    r = _run("-m", "llama-3-8b", "-H", "h100-sxm", "--gpus", "8", "--rate", "4.9",
             "--slo-ttft", "1", "--slo-tpot", "0.05", "--requests", "100", *LENGTHS,
             "-f", "json")
    assert json.loads(r.stdout)["plan"]["gpus"] == 1


def test_progress_goes_to_stderr_when_asked():
    r = _run(*ASK, *LENGTHS, "--progress")
    assert r.exit_code == 0 and "simulating 1 of at most 3" in r.stderr
    assert "estimating candidates" in r.stderr and "simulating" not in r.stdout


@pytest.mark.parametrize(("change", "flag"), [
    (("--slo-ttft", "0"), "--slo-ttft"), (("--slo-tpot", "-0.1"), "--slo-tpot"),
    (("--gpus", "0"), "--gpus"), (("-H", "h100-sxmm"), "--hardware"),
    (("-m", "llama-3.1-405b", "-H", "l4", "--gpus", "1"), "fits on none"),
    (("--requests", "1000000"), "--requests"), ((), "--input-len")])
def test_plan_command_bad_input_is_one_line(change, flag):
    args = list(ASK)
    for key, value in zip(change[::2], change[1::2], strict=True):
        args[args.index(key) + 1] = value
    lengths = () if flag == "--input-len" else ("--input-len", "100", "--output-len", "10")
    r = _run(*args, *lengths)
    assert r.exit_code == 2
    assert r.stderr.startswith("error: ") and flag in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_issue_27_bad_inputs(tmp_path):
    """Each was 'error: requests: no requests' (or a silent cap)."""
    import time

    start = time.perf_counter()
    big = _run("-m", "llama-3-8b", "-H", "h100-sxm", "--gpus", "1000", "--slo-ttft", "1",
               "--slo-tpot", "0.05", "--requests", "100", *LENGTHS, "-f", "json")
    assert big.exit_code == 0, big.output
    assert json.loads(big.stdout)["plan"]["gpus"] <= 1000
    assert time.perf_counter() - start < 30
    one = tmp_path / "one.csv"
    one.write_text("arrival_s,input_tokens,output_tokens\n0.0,100,10\n")
    r = _run(*ASK, "--trace", str(one))
    assert r.exit_code == 2 and r.stderr.startswith("error: --trace:")
    assert "or give --rate" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    dp = _run("-m", "llama-3-8b", "-H", "h100-sxm", "--dp", "1000", "--rate", "5",
              "--num-requests", "300", "--no-progress", command="simulate")
    # more engines than requests: the rest stay idle, said in one warning (it was
    # "error: requests: no requests")
    assert dp.exit_code == 0, dp.output
    assert "warning: 300 requests over 1,000 engines: 700 stay idle" in dp.stderr
    none = _run("-m", "llama-3-8b", "-H", "h100-sxm", "--slo-ttft", "1", "--slo-tpot", "0.05",
                *LENGTHS)
    assert none.exit_code == 2 and none.stderr.startswith("error: --gpus:")


def test_launch_lines_of_moe_and_split_deployments():
    from types import SimpleNamespace

    from perfmodel.cli.plan import commands

    def cols(**over):
        base = {"tp": [1], "ep": [4], "attention_dp": [True], "prefill_replicas": [0],
                "decode_replicas": [2], "batch": [128], "weights_dtype": ["fp8"]}
        return {k: np.array(v) for k, v in (base | over).items()}

    moe = SimpleNamespace(model=load.model("qwen3-30b-a3b"), winner={"index": 0},
                          candidates=cols())
    out = commands(moe)        # EP4 with data-parallel attention: TP1 x DP4 in one server
    assert "--data-parallel-size 4 --enable-expert-parallel --quantization fp8" in out["vLLM"]
    assert "--tp-size 4 --dp-size 4 --enable-dp-attention --ep-size 4" in out["SGLang"]
    split = SimpleNamespace(model=load.model("llama-3-8b"), winner={"index": 0},
                            candidates=cols(tp=[2], ep=[1], attention_dp=[False],
                                            prefill_replicas=[1], decode_replicas=[3],
                                            weights_dtype=["bf16"]))
    out = commands(split)
    assert out["vLLM"].count("NixlConnector") == 4 and "--quantization" not in out["vLLM"]
    assert "--disaggregation-mode prefill" in out["SGLang"]


def test_a_three_device_plan_answers_in_under_ten_seconds():
    import time

    start = time.process_time()
    r = _run("-m", "llama-3-70b", "-H", "h100-sxm,h200-sxm,b200", "--rate", "15",
             "--input-len", "2000", "--output-len", "300", "--slo-ttft", "1",
             "--slo-tpot", "0.05")
    assert r.exit_code == 0, r.output
    assert time.process_time() - start < 10                  # CPU time: the CI box is shared
    assert "chosen: " in r.stdout and "met both SLOs in simulation" in r.stdout


def test_pessimistic_plans_to_the_band_or_says_it_had_none():
    from perfmodel.serving.planner import plans as planner

    target = planner.Target(2, 1.0, 0.05, 1000, 100, rate=5.0)
    _, notes = planner.candidates(load.model("llama-3-8b"), [load.hardware("h100-sxm")],
                                  target, pessimistic=True)
    banded = any("80% band" in n and "centre" not in n for n in notes)
    centred = any("no uncertainty band for h100-sxm" in n for n in notes)
    assert banded != centred                                # one or the other, said
    r = _run("-m", "llama-3-8b", "-H", "h100-sxm", "--gpus", "2", "--rate", "5",
             "--slo-ttft", "1", "--slo-tpot", "0.05", "--requests", "100", *LENGTHS,
             "--pessimistic")
    assert r.exit_code == 0 and "--pessimistic" in r.stdout
