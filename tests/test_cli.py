"""The CLI through typer's runner: outputs, formats and one-line errors with exit code 2."""

import csv
import io
import json
import subprocess
import sys
from enum import Enum
from pathlib import Path

import pytest
from typer.testing import CliRunner

from perfmodel.cli.app import app
from perfmodel.cli.common import command_line
from perfmodel.specs.load import HARDWARE_DIR, MODELS_DIR

runner = CliRunner()
BASE = ["estimate", "--model", "llama-2-13b", "--hardware", "h100-sxm"]
REQUIRED = ("weights_bytes", "kv_cache_bytes_per_token", "kv_cache_bytes", "max_batch", "fits",
            "ttft_s", "tpot_s", "e2e_s", "throughput_tokens_per_s")


def test_table():
    result = runner.invoke(app, BASE)
    assert result.exit_code == 0
    assert "TTFT" in result.stdout and "819.2 kB" in result.stdout


def test_json_keys_and_units():
    result = runner.invoke(app, [*BASE, "--format", "json", "--batch", "4", "--prompt", "100",
                                 "--gen", "10"])
    assert result.exit_code == 0
    data = json.loads(result.stdout)
    for key in REQUIRED:
        assert key in data
    for phase in ("prefill", "decode"):
        assert {"time_s", "flops", "bytes", "bound"} <= set(data[phase])
    assert {"first_step_s", "last_step_s"} <= set(data["decode"])
    assert data["kv_cache_bytes_per_token"] == 819_200
    assert data["workload"]["batch"] == 4 and "tp" not in data["workload"]
    assert data["parallelism"] == {"tp": 1, "pp": 1, "ep": 1, "dp": 1,
                                   "attention_dp": False, "expert_replicas": 0}
    assert data["decode"]["steps"] == 9 and data["prefill"]["steps"] == 1
    assert data["e2e_s"] == pytest.approx(data["ttft_s"] + 9 * data["tpot_s"])


def test_tp_is_the_plan_not_the_workload():
    data = json.loads(runner.invoke(app, [*BASE, "--tp", "2", "-f", "json"]).stdout)
    assert data["parallelism"]["tp"] == 2 and "tp" not in data["workload"]
    assert data["kv_cache_bytes_per_token"] == 819_200 / 2      # KV heads split over 2
    row = next(csv.DictReader(io.StringIO(runner.invoke(app, [*BASE, "--tp", "2", "-f",
                                                               "csv"]).stdout)))
    assert row["tp"] == "2" and "workload_tp" not in row
    assert "h100-sxm x2 (TP2)" in runner.invoke(app, [*BASE, "--tp", "2"]).stdout
    ones = runner.invoke(app, [*BASE, "--pp", "1", "--ep", "1", "--dp", "1", "-f", "json"])
    assert json.loads(ones.stdout)["parallelism"] == {"tp": 1, "pp": 1, "ep": 1, "dp": 1,
                                                      "attention_dp": False,
                                                      "expert_replicas": 0}


def test_csv_one_row():
    result = runner.invoke(app, [*BASE, "--format", "csv"])
    rows = list(csv.DictReader(io.StringIO(result.stdout)))
    assert result.exit_code == 0 and len(rows) == 1
    assert float(rows[0]["ttft_s"]) > 0


def test_breakdown_lists_every_operator():
    result = runner.invoke(app, [*BASE, "--breakdown"])
    assert result.exit_code == 0
    for name in ("qkv_proj", "attention", "gate_up_proj", "lm_head", "intensity", "bound"):
        assert name in result.stdout
    data = json.loads(runner.invoke(app, [*BASE, "--breakdown", "-f", "json"]).stdout)
    assert {o["phase"] for o in data["operators"]} == {"prefill", "decode"}


def test_dtypes_and_paths(tmp_path):
    result = runner.invoke(app, ["estimate", "--model", str(MODELS_DIR / "llama-2-7b.yaml"),
                                 "--hardware",
                                 str(HARDWARE_DIR / "a100-80gb-sxm.yaml"), "--weights-dtype",
                                 "int4", "--kv-dtype", "fp8", "-f", "json"])
    assert result.exit_code == 0
    data = json.loads(result.stdout)
    assert data["kv_cache_bytes_per_token"] == 32 * 2 * 32 * 128


def test_not_fitting_reports_numbers():
    result = runner.invoke(app, ["estimate", "-m", "llama-3.1-405b", "-H", "l4", "-f", "json"])
    assert result.exit_code == 0
    data = json.loads(result.stdout)
    assert data["fits"] is False and data["max_batch"] == 0
    table = runner.invoke(app, ["estimate", "-m", "llama-3.1-405b", "-H", "l4"]).stdout
    assert "NO: needs" in table


def test_list():
    result = runner.invoke(app, ["list"])
    assert result.exit_code == 0
    assert "h100-sxm" in result.stdout and "deepseek-v3" in result.stdout


def _bad_yaml(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("name: [unclosed")
    return str(path)


def _unknown_key(tmp_path):
    path = tmp_path / "typo.yaml"
    path.write_text((HARDWARE_DIR / "h100-sxm.yaml").read_text().replace("vendor:", "vendr:"))
    return str(path)


@pytest.mark.parametrize(("args", "needle"), [
    (["estimate", "-m", "nope", "-H", "h100-sxm"], "unknown model 'nope'"),
    (["estimate", "-m", "llama-2-7b", "-H", "nope"], "unknown hardware 'nope'"),
    ([*BASE, "--weights-dtype", "int3"], "unknown dtype 'int3'"),
    ([*BASE, "--batch", "0"], "batch"),
    ([*BASE, "--prompt", "-5"], "prompt"),
    ([*BASE, "--tp", "3"], "tp=3 must divide n_heads=40"),
    ([*BASE, "--tp", "0"], "--tp"),
    ([*BASE, "--ep", "4"], "ep=4 must equal tp=1"),
    ([*BASE, "--pp", "99"], "pp=99 exceeds n_layers=40"),
    ([*BASE, "--group-size", "0"], "--group-size"),
    ([*BASE, "--format", "xml"], "--format"),
    ([*BASE, "--decode-samples", "9"], "No such option: --decode-samples"),
    ("BAD_YAML", "not valid YAML"),
    ("UNKNOWN_KEY", "(top level): 1 unknown field; did you mean 'vendor'?"),
])
def test_bad_input_exits_2_with_one_line(tmp_path, args, needle):
    if args == "BAD_YAML":
        args = ["estimate", "-m", "llama-2-7b", "-H", _bad_yaml(tmp_path)]
    elif args == "UNKNOWN_KEY":
        args = ["estimate", "-m", "llama-2-7b", "-H", _unknown_key(tmp_path)]
    result = runner.invoke(app, args)
    assert result.exit_code == 2
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert needle in result.output
    assert "Traceback" not in result.output


def test_estimate_path_stays_light():
    code = ("import sys, perfmodel.cli.app, perfmodel.schedules.estimates, "
            "perfmodel.report.tables, perfmodel.cli.common;"
            "heavy = [m for m in ('torch', 'matplotlib', 'pandas') if m in sys.modules];"
            "print(heavy); sys.exit(1 if heavy else 0)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout


@pytest.mark.parametrize("module, args", [
    ("perfmodel.cli.app", ["estimate", "-m", "x", "-H", "h100-sxm"]),
    ("perfmodel.cli.app", ["estimate", "-m", "llama-2-7b", "-H", "h100-sxm", "--batch", "0"]),
    ("perfmodel", ["estimate", "-m", "llama-2-7b"]),   # python -m perfmodel: the same entry
    ("perfmodel", ["estimate", "-m", "llama-2-7b", "-H", "h100-sxm", "--ep", "2"]),
    ("perfmodel", ["no-such-command"]),
])
def test_console_script_error_is_one_line(module, args):
    done = subprocess.run([sys.executable, "-m", module, *args], capture_output=True,
                          text=True)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:")


def test_markdown_breakdown_is_a_table():
    import perfmodel as pm
    from perfmodel.report import tables as report

    est = pm.estimate(pm.hardware("h100-sxm"), pm.model("llama-2-7b"))
    note, blank, *lines = report.breakdown_markdown(est).splitlines()
    # the rows are totals over each phase's steps, and the note says so (127 decode steps)
    assert "prefill: totals over 1 step;" in note and "decode: totals over 127 steps" in note
    assert blank == "" and lines[0].startswith("| phase | name")
    assert len(lines) == 2 + len(est.prefill.ops) + len(est.decode.ops)
    row = report.flat_record(est)
    assert row["kv_cache_bytes_per_sequence"] == est.memory.kv_cache_bytes_per_sequence
    assert row["warnings"] == ""
    # through the CLI: the estimate table, a blank line, then the breakdown table
    out = runner.invoke(app, ["estimate", "-m", "llama-2-7b", "-H", "h100-sxm", "-f",
                              "markdown", "--breakdown"]).output
    assert out.rstrip("\n") == report.markdown(est) + "\n\n" + report.breakdown_markdown(est)


class _Suite(str, Enum):
    quick = "quick"


def test_command_line_spells_out_a_reproducible_run():
    line = command_line("validate", device=_Suite.quick, out=Path("my dir/r"), threads=None,
                        plots=False, progress=True, batch="1,16")
    assert line == ("perfmodel validate --device quick --out 'my dir/r' --no-plots --progress "
                    "--batch 1,16")


def test_table_states_a_memory_shortfall_once_and_keeps_other_warnings():
    big = runner.invoke(app, ["estimate", "-m", "llama-3.1-405b", "-H", "h100-sxm"])
    assert big.exit_code == 0, big.output
    lines = big.output.splitlines()
    assert [ln.split()[0] for ln in lines if "NO: needs" in ln or "does not fit" in ln] \
        == ["fits"]
    long = runner.invoke(app, ["estimate", "-m", "llama-2-7b", "-H", "h100-sxm", "--prompt",
                               "8192"])
    assert [ln for ln in long.output.splitlines() if ln.startswith("warning")] == [
        "warning             prompt + generated = 8320 tokens exceeds llama-2-7b's context "
        "limit (max_position_embeddings = 4096)"]


class _EntryPoint:
    def __init__(self, name, value, load):
        self.name, self.value, self.load = name, value, load


def test_plugins_add_commands_and_a_broken_one_is_one_warning(monkeypatch, capsys):
    import importlib.metadata

    import typer

    from perfmodel.cli.app import load_plugins

    def register(target):
        target.command("hello")(lambda: typer.echo("hi"))

    def broken():
        raise ImportError("No module named 'torch'")

    found = [_EntryPoint("bad", "bad.cli:register", broken),
             _EntryPoint("good", "good.cli:register", lambda: register)]
    monkeypatch.setattr(importlib.metadata, "entry_points",
                        lambda group: found if group == "perfmodel.commands" else [])
    target = typer.Typer()
    target.command("noop")(lambda: None)
    assert load_plugins(target) is target
    warning = capsys.readouterr().err.strip().splitlines()
    assert warning == ["warning: commands of 'bad' (bad.cli:register) not loaded: "
                       "ImportError: No module named 'torch'"]
    result = runner.invoke(target, ["hello"])
    assert result.exit_code == 0 and result.stdout == "hi\n"
