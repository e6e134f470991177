"""`perfmodel report` takes estimate's serving levers, and its report says they are on."""

import json

import pytest
from typer.testing import CliRunner

import perfmodel as pm
from perfmodel.cli.app import app

runner = CliRunner()
BASE = ["report", "--model", "llama-3-8b", "--hardware", "h100-sxm", "--batch", "8",
        "--prompt", "1024", "--gen", "32", "--sweep-batch", "1,8", "--dpi", "30"]


def _report(tmp_path, *args: str) -> tuple[str, dict]:
    result = runner.invoke(app, [*BASE, *args, "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    data = json.loads((tmp_path / "estimate.json").read_text())
    return (tmp_path / "report.md").read_text(), data


def test_levers_reach_the_estimate_and_the_assumptions(tmp_path):
    md, data = _report(tmp_path, "--tp", "2", "--pp", "2", "--weights-format", "w4a16-g128",
                       "--outlier-fraction", "0.01", "--shared-prefix", "256",
                       "--contexts", "512,2048")
    want = pm.estimate(pm.hardware("h100-sxm"), pm.model("llama-3-8b"),
                       pm.Workload(batch=8, prompt_len=1024, gen_len=32,
                                   weights_dtype="int4", weight_group_size=128,
                                   weight_scale_bytes=2.5, outlier_fraction=0.01,
                                   shared_prefix=256),
                       pm.Parallelism(tp=2, pp=2))
    assert data["ttft_s"] == pytest.approx(want.ttft_s, rel=1e-12)
    assert data["tpot_s"] == pytest.approx(want.tpot_s, rel=1e-12)
    for words in ("TP2 x PP2", "Outlier channels: 1.00%", "Prefix caching: 256 shared",
                  "--weights-format w4a16-g128", "pipeline_bubble"):
        assert words in md, words


def test_speculation_in_the_report(tmp_path):
    md, data = _report(tmp_path, "--draft-heads", "3", "--acceptance", "0.8,0.6,0.4",
                       "--contexts", "2048")
    assert "Speculative decoding: heads, K = 3" in md
    assert data["speculation"]["k"] == 3


def test_contexts_inside_the_prefix_are_left_out(tmp_path):
    result = runner.invoke(app, [*BASE, "--shared-prefix", "600", "--contexts", "512,2048",
                                 "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "512 left out of the context figures" in result.output
    bad = runner.invoke(app, [*BASE, "--shared-prefix", "600", "--contexts", "512",
                              "--out", str(tmp_path / "b")])
    assert bad.exit_code == 2
    assert "--contexts: every context is at most --shared-prefix 600" in bad.output


def test_speculation_needs_one_model(tmp_path):
    result = runner.invoke(app, ["report", "--model", "llama-3-8b,mistral-7b", "--hardware",
                                 "h100-sxm", "--draft-heads", "2", "--acceptance", "0.8",
                                 "--out", str(tmp_path)])
    assert result.exit_code == 2
    assert "expected one --model" in result.output
