"""``perfmodel compare-inferencex``: InferenceX rows replayed with their launch flags and
client (``compare.inferencex``), on five verbatim rows (tests/data/inferencex)."""

import json
from pathlib import Path

import numpy as np
from typer.testing import CliRunner

from perfmodel.cli.app import app
from perfmodel.compare import inferencex as ix

SAMPLE = Path(__file__).parent / "data" / "inferencex" / "sample.csv"


def test_client_lengths_and_loop():
    """vLLM's random dataset with range ratio 0.8: integers in [int(0.8 L), L]; a closed
    loop of ``concurrency`` users over 10 x concurrency prompts."""
    point = ix.load(SAMPLE)[0]
    reqs = ix.requests(point)
    assert len(reqs) == 40 and reqs.closed_loop == 4
    assert reqs.input_tokens.min() >= 819 and reqs.input_tokens.max() <= 1024
    assert reqs.output_tokens.min() >= 819 and reqs.output_tokens.max() <= 1024
    assert not np.array_equal(reqs.input_tokens, reqs.output_tokens)


def test_trtllm_launch_rule():
    """dsr1_fp8_h200_trt.sh: max_num_tokens = ceil((CONC + ISL + 64) / 64) * 64, >= 8192."""
    assert ix.trtllm_max_num_tokens({"concurrency": 4, "isl": 8192, "osl": 1024}) == \
        {"max_num_tokens": 8320, "max_seq_len": 9216}
    assert ix.trtllm_max_num_tokens({"concurrency": 64, "isl": 1024, "osl": 1024}) == \
        {"max_num_tokens": 8192, "max_seq_len": 8192}


def test_plan_of_each_row():
    points = {p.id: p for p in ix.load(SAMPLE)}
    assert ix.plan(points["ix0100"]).describe() == "TP8"
    row = dict(points["ix0119"].row, ep=8, dp_attention=True)
    assert ix.plan(ix.Point("x", "h200/trt", row, {})).attention_dp


def test_cli_replays_and_counts_skips(tmp_path):
    result = CliRunner().invoke(app, ["compare-inferencex", str(SAMPLE), "--no-progress",
                                      "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert (summary["h200/sglang"]["replayed"], summary["h200/sglang"]["skipped"]) == (1, 1)
    assert summary["h200/trt"]["replayed"] == 2       # 8k/1k: the prompt fits 8320 tokens
    assert summary["mi300x/sglang"]["replayed"] == 1
    tput = summary["h200/sglang"]["tput_per_gpu"]
    assert tput["rows"] == 1 and tput["median_abs"] == abs(tput["bias"])
    assert "| h200/trt | 2 (0) |" in result.output


def test_cli_bad_file_is_one_line(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("id,date\nx,2026-01-01\n")
    result = CliRunner().invoke(app, ["compare-inferencex", str(bad)])
    assert result.exit_code != 0
    assert "missing column" in result.output and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_activations_between_layers_are_bf16():
    """fp8-block W8A8 quantizes inside each linear (SGLang's
    deepgemm_w8a8_block_fp8_linear_with_fallback, TensorRT-LLM's FP8BlockScalesLinearMethod):
    the workload's activations stay bf16 while the linears run fp8."""
    from perfmodel.specs.matmul_path import matmul_path

    _, hw, wl, _, _ = ix.setup(ix.load(SAMPLE)[0])
    assert wl.act_dtype == "bf16" and wl.weights_dtype == "fp8"
    path = matmul_path(hw, wl.weights_dtype, wl.weight_group_size, wl.weight_scale_bytes,
                       wl.act_dtype)
    assert path.kind == "w8a8" and path.compute == "fp8"


def test_row_version_from_the_image_of_its_date():
    """A row that records its version keeps it; one that does not gets the image its launch
    config ran from that date (dsr1-fp8-h200-sglang: v0.5.6 from 2025-12-31)."""
    launch = ix._launch()
    point = ix.load(SAMPLE)[0]
    assert ix.row_version(point, launch) == "0.5.9"
    bare = ix.Point("x", "h200/sglang", dict(point.row, framework_version=float("nan"),
                                             date="2026-01-05"), {})
    assert ix.row_version(bare, launch) == "0.5.6"
    early = ix.Point("y", "h200/sglang", dict(bare.row, date="2025-10-01"), {})
    assert ix.row_version(early, launch) is None
