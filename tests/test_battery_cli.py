"""Issue 33's battery, the commands: plans, rates and settings that simulate accepted
silently are refused (or said) as estimate refuses them; every --out refuses an empty name;
Ctrl-C ends every command with `error: aborted` (exit 130) and leaves no folder behind;
estimate's and simulate's batch ceilings agree; every command answers -h."""

import csv
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import matplotlib.figure
import pytest
import typer
from typer.testing import CliRunner

import perfmodel as pm
from perfmodel.cli.app import ABORTED, app, load_plugins
from perfmodel.serving.engines.vllm import EngineConfig
from perfmodel.serving.pricing import kv_pool
from perfmodel.serving.requests import check_memory

runner = CliRunner()
SIM = ["simulate", "-m", "llama-3-8b", "-H", "h100-sxm", "--no-progress", "--num-requests",
       "4", "--input-len", "64", "--output-len", "8"]
EST = ["estimate", "-m", "llama-3-8b", "-H", "h100-sxm"]
ROOT = Path(__file__).resolve().parents[1]


def _error(*args: str) -> str:
    result = runner.invoke(app, list(args))
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


@pytest.mark.parametrize("plan", [["--ep", "2", "--tp", "2"], ["--attention-dp", "--ep", "2"]])
def test_simulate_refuses_expert_parallelism_on_a_dense_model(plan):
    assert _error(*SIM, "--rate", "5", *plan) == \
        "error: parallelism: ep=2: llama-3-8b has no routed experts"


@pytest.mark.parametrize(("args", "line"), [
    (["--rate", "5", "--engine", "sglang", "--schedule-conservativeness", "nan"],
     "error: --schedule-conservativeness: expected a finite number > 0, got nan; "
     "--mem-fraction-static: a share in (0, 1] (0: SGLang's rule), got 0.0"),
    (["--rate", "1e-300"], "error: --rate: 1e-300 req/s spreads 4 requests over 4e+300 s; "
     "expected arrivals within 1e+09 s (about 32 years): a higher rate"),
    (["--rate", "5", "--max-model-len", "1000000000"],
     "error: --max-model-len: 1,000,000,000 exceeds llama-3-8b's context limit 8,192 "
     "(max_position_embeddings), which the engine refuses (vLLM unless "
     "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1); expected at most 8,192"),
    (["--rate", "5", "--dp", "1000000000"], "error: parallelism: one device x 1000000000 "
     "replicas uses 1,000,000,000 devices; expected at most 1,000,000"),
])
def test_simulate_refuses_what_it_accepted(args, line):
    assert _error(*SIM, *args) == line


def test_a_billion_requests_are_refused_before_any_is_made():
    line = _error(*SIM, "--rate", "5", "--num-requests", "1000000000")
    assert line.startswith("error: --num-requests: 1,000,000,000 requests of 8 output tokens "
                           "need about 3,072 GB to simulate (3 runs: each token's time is "
                           "kept), more than this machine's")
    check_memory(10**6, 128, 1, total=10e9)          # 8.7 GB: fits in 10 GB
    with pytest.raises(pm.SpecError, match="expected at most 919,117"):
        check_memory(10**6, 128, 1, total=8e9)


def test_more_turns_than_requests_runs():
    """`--turns 50 --num-requests 20` was a ValueError (a session cut short was padded
    from too few draws)."""
    result = runner.invoke(app, [*SIM, "--rate", "5", "--turns", "50", "--num-requests", "20",
                                 "-f", "json"])
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize(("args", "warning"), [
    (["--arrival", "gamma", "--burstiness", "inf"],
     "warning: --burstiness inf: every gap exactly 1/rate (gamma's limit: --arrival constant)"),
    (["--engine-version", "99.0.0"], "warning: --engine-version 99.0.0: newer than vllm's "
     "profile (0.24.0, the newest measured): priced with 0.24.0's host time"),
])
def test_simulate_states_what_it_assumes(args, warning):
    result = runner.invoke(app, [*SIM, "--rate", "5", *args, "-f", "json"])
    assert result.exit_code == 0, result.output
    assert warning in result.stderr.splitlines()


def test_estimate_refuses_skew_on_a_dense_model_and_a_draft_larger_than_its_target():
    assert _error(*EST, "--expert-skew", "1") == ("error: workload: expert_skew 1: llama-3-8b "
                                                  "has no routed experts; drop it (or set 0)")
    assert _error(*EST, "--draft", "llama-3-70b", "--acceptance", "0.7") == (
        "error: speculation: draft llama-3-70b (69.5 B active parameters) is not smaller than "
        "the target llama-3-8b (7.5 B); expected a smaller draft model")
    assert _error(*EST, "--dp", "1000000000").endswith("expected at most 1,000,000")


def test_calibrate_checks_its_engine():
    line = _error_with(load_plugins(), "calibrate", "--engine", "bogus")
    assert line == "error: --engine: expected one of vllm, sglang, trtllm, got 'bogus'"


def _error_with(cli: typer.Typer, *args: str) -> str:
    result = runner.invoke(cli, list(args))
    assert result.exit_code == 2, result.output
    return result.stderr.strip().splitlines()[-1]


EMPTY_OUT = [["sweep", "-m", "llama-3-8b", "-H", "h100-sxm"],
             ["report", "-m", "llama-3-8b", "-H", "h100-sxm"],
             ["roofline", "-m", "llama-3-8b", "-H", "h100-sxm"],
             ["plan", "-m", "llama-3-8b", "-H", "h100-sxm", "--rate", "1", "--input-len",
              "100", "--output-len", "10", "--slo-ttft", "1", "--slo-tpot", "1"],
             ["compare-serving"], ["calibrate-serving"], ["kernels", "import", "csv", "x.csv"],
             [*SIM, "--rate", "5"]]


@pytest.mark.parametrize("command", EMPTY_OUT, ids=lambda c: " ".join(c[:3]))
def test_an_empty_out_is_refused_and_writes_nothing(command, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert _error(*command, "--out", "") == (
        "error: --out: expected a folder name, got an empty one (it would write into the "
        "current folder; give --out . for that)")
    assert list(tmp_path.iterdir()) == []


def test_kernels_import_checks_out_before_any_work():
    source = "/work/shared/measurements/vidur-a100-attention.csv"
    line = _error("kernels", "import", "csv", source, "--out", "/proc/x")
    assert line == ("error: --out: '/proc/x': cannot write there (No such file or directory), "
                    "expected a directory this user can create or write in")


def test_ui_blames_the_host_it_cannot_resolve():
    # without --allow-remote a name that is not loopback is refused before it is resolved
    assert _error("ui", "--host", "no.such.host.invalid", "--no-browser").startswith(
        "error: --host: no.such.host.invalid is not a loopback address")
    line = _error("ui", "--host", "no.such.host.invalid", "--allow-remote", "--no-browser")
    assert line.startswith("error: --host: cannot listen on 'no.such.host.invalid' (")
    assert line.endswith("expected an address of this machine (127.0.0.1, the default)")


def test_roofline_says_a_device_has_no_rate_for_the_weights(tmp_path):
    result = runner.invoke(app, ["roofline", "-m", "llama-3-8b", "-H", "tpu-v4",
                                 "--weights-dtype", "fp8", "--out", str(tmp_path / "r.png")])
    assert result.exit_code == 0, result.output
    assert ("warning: tpu-v4 lists no fp8 rate: fp8 weights priced as a weight-only kernel "
            "runs them, dequantized and multiplied at the activations' rate"
            ) in result.stderr.splitlines()


HEADER = ["device", "source", "model", "tp", "op", "dtype", "m", "n", "k", "batch", "q_len",
          "kv_len", "n_heads", "n_kv_heads", "head_dim", "measured_s", "measured_std_s"]


@pytest.mark.parametrize(("change", "line"), [
    ({"m": "1000000000000000000"}, "column m: expected a whole number in [1, 1,000,000,000] "
     "or blank, got '1000000000000000000'"),
    ({"tp": "0"}, "column tp: expected a whole number in [1, 1,000,000,000] or blank, got '0'"),
    ({"measured_s": "nan"}, "column measured_s: expected a time in seconds in (0, 3600], "
     "got 'nan'"),
])
def test_a_bad_measurement_is_refused_where_it_enters(tmp_path, change, line):
    row = dict(zip(HEADER, ["a100-80gb-sxm", "x", "m", "1", "gemm", "bf16", "16", "4096",
                            "4096", "", "", "", "", "", "", "1e-5", "0"], strict=True)) | change
    path = tmp_path / "m.csv"
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, HEADER)
        writer.writeheader()
        writer.writerow(row)
    expected = f"error: {path}: row 2: {line}"
    assert _error_with(load_plugins(), "compare", "-H", "a100-80gb-sxm", str(path)) == expected
    assert _error("kernels", "import", "csv", str(path), "--out", str(tmp_path / "c")) == \
        expected
    assert not (tmp_path / "c").exists()


INTERRUPTED = [["sweep", "-m", "llama-3-8b", "-H", "h100-sxm", "--batch", "1"],
               ["report", "-m", "llama-3-8b", "-H", "h100-sxm", "--roofline-batch", "1",
                "--sweep-batch", "1"],
               [*SIM, "--rate", "5"],
               ["plan", "-m", "llama-3-8b", "-H", "h100-sxm", "--gpus", "1", "--rate", "1",
                "--input-len", "100", "--output-len", "10", "--slo-ttft", "1", "--slo-tpot",
                "1", "--requests", "100"]]


@pytest.mark.parametrize("command", INTERRUPTED, ids=lambda c: c[0])
def test_ctrl_c_says_aborted_exits_130_and_leaves_no_folder(command, tmp_path, monkeypatch):
    def interrupt(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", interrupt)
    out = tmp_path / "new" / "out"
    result = runner.invoke(app, [*command, "--out", str(out)])
    assert result.exit_code == ABORTED == 130, result.output
    assert result.stderr.strip() == "error: aborted"
    assert not (tmp_path / "new").exists()


def _interrupted(args: list[str], after_s: float, tmp_path: Path) -> tuple[int, str, float]:
    """Run the CLI in a process group of its own, send the group SIGINT (as a terminal's
    Ctrl-C does) after ``after_s``: (exit code, stderr, seconds it took to stop)."""
    code = ("import signal, sys, runpy; signal.signal(signal.SIGINT, signal.default_int_handler)"
            "; sys.argv = ['perfmodel', *sys.argv[1:]]; runpy.run_module('perfmodel', "
            "run_name='__main__')")
    env = os.environ | {"PYTHONPATH": str(ROOT)}
    with open(tmp_path / "err.txt", "w+") as err:
        proc = subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.DEVNULL,
                                stderr=err, env=env, start_new_session=True, cwd=tmp_path)
        time.sleep(after_s)
        assert proc.poll() is None, "finished before the interrupt"
        os.killpg(proc.pid, signal.SIGINT)
        start = time.monotonic()
        try:
            rc = proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
        err.seek(0)
        return rc, err.read(), time.monotonic() - start


LONG = ["simulate", "-m", "llama-3-8b", "-H", "h100-sxm", "--rate", "20", "--num-requests",
        "20000", "--dp", "2", "--workers", "2", "--no-progress"]


def test_ctrl_c_under_worker_processes_stops_at_once_without_tracebacks(tmp_path):
    rc, err, took = _interrupted(LONG, 6.0, tmp_path)
    assert (rc, err.strip()) == (130, "error: aborted")
    assert took < 15          # it had been ignored for over 60 s


def test_ctrl_c_on_a_local_dask_cluster_stops(tmp_path):
    pytest.importorskip("distributed")
    rc, err, took = _interrupted([*LONG, "--cluster", "local"], 14.0, tmp_path)
    assert (rc, err.strip()) == (130, "error: aborted")
    assert took < 30          # it had been ignored entirely


def test_estimate_and_simulate_agree_on_the_batch_ceiling():
    """Llama-3-8B on an H100 at 4K context: estimate counted the whole batch's prefill
    activations (max batch 60, 25 GB of workspace) while simulate's pool held 107; both now
    bound a step's activations by the chunked-prefill budget (8,192 tokens)."""
    m, hw = pm.model("llama-3-8b"), pm.hardware("h100-sxm")
    est = pm.estimate(hw, m, pm.Workload(prompt_len=4096, gen_len=1))
    pool = kv_pool(m, hw, pm.Parallelism(), pm.Workload.for_model(m), EngineConfig())
    per_request = -(-4097 // 16)                      # whole blocks of 16 tokens
    assert est.memory.max_batch == pool.blocks // per_request == 107
    # sweep --batch 64 --context 4096 marked 64 as not fitting
    grid = pm.estimate_many(hw, m, pm.Workloads.of(batch=[64, 108], prompt_len=4096,
                                                   gen_len=1))
    assert grid.memory.fits.tolist() == [True, False]


def _commands(group, path=()):
    for name, command in sorted(group.commands.items()):
        yield (*path, name)
        if hasattr(command, "commands"):        # a group: its subcommands too
            yield from _commands(command, (*path, name))


def test_every_command_answers_dash_h():
    import typer.main

    cli = load_plugins()
    commands = list(_commands(typer.main.get_command(cli)))
    assert len(commands) > 15 and ("kernels", "import", "csv") in commands
    for path in [(), *commands]:
        result = runner.invoke(cli, [*path, "-h"])
        assert result.exit_code == 0, (path, result.output)
        assert result.stdout.startswith("Usage: ") and "--help" in result.stdout, path
