"""SGLang on MI300X / MI355X: the engines.sglang blocks are the fit of AITER's own kernel
timings (reports/amd_published/aiter.csv, aiter_fit.py), and the decode-only MMA share they
add prices the decode pool and nothing else."""

from __future__ import annotations

import csv
import importlib.util
import statistics
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from perfmodel.compare.errors import predict_rows
from perfmodel.compare.rows import read_measurements
from perfmodel.specs import SpecError
from perfmodel.specs.load import hardware, load_hardware

ROOT = Path(__file__).resolve().parents[1]
HERE = ROOT / "reports" / "amd_published"
DEVICES = ("mi300x", "mi355x")


@pytest.fixture(scope="module")
def fit():
    sys.path.insert(0, str(ROOT))          # validate.corpus.fit, which the script imports
    spec = importlib.util.spec_from_file_location("aiter_fit", HERE / "aiter_fit.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _median_abs(rows: list[dict], hw) -> float:
    return statistics.median(abs(r["error"]) for r in predict_rows(rows, hw))


def test_sample_is_attributed_and_every_row_prices() -> None:
    with (HERE / "aiter.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    counts: dict[tuple[str, str], int] = {}
    for r in rows:
        counts[r["device"], r["op"]] = counts.get((r["device"], r["op"]), 0) + 1
        assert r["source"].startswith("aiter:") or r["source"] == "aiter-pr2039"
    assert counts == {("mi300x", "gemm"): 447, ("mi300x", "moe"): 47,
                      ("mi300x", "attention"): 64, ("mi355x", "gemm"): 450,
                      ("mi355x", "moe"): 174, ("mi355x", "attention"): 64}
    for device in DEVICES:
        out = predict_rows(read_measurements(HERE / "aiter.csv", devices=[device]),
                           hardware(device, "sglang"))
        assert all(r["predicted_s"] > 0 for r in out)


@pytest.mark.parametrize("device", DEVICES)
def test_shipped_constants_are_the_fit(fit, device: str) -> None:
    """A rerun of the fit from the top-level figures gives the file's values."""
    hw = hardware(device, "sglang")
    fitted = hw.calibration["fitted"]
    base = fit.structural(hardware(device, fit.BASE_ENGINE))
    moe = "moe_kernels.fp8_block.gemm_fraction" in fitted
    for cls in (*fit.SHIPPED, "moe") if moe else fit.SHIPPED:
        values = fit.fit(fit.rows_of(device, cls), base, fit.CLASSES[cls][1])
        for name, value in values.items():
            key = name.replace("gemm.", "gemm_kernels.").replace("moe.", "moe_kernels.")
            assert fitted[key] == value
    assert bool(hw.efficiency.moe_kernels) == moe
    if moe:
        assert hw.efficiency.moe_kernels["fp8_block"][:6] == tuple(
            fitted[n.replace("moe.", "moe_kernels.")] for n in fit.CLASSES["moe"][1])
    assert hw.efficiency.gemm_kernels["fp8_block"][:3] == tuple(
        hw.calibration["fitted"][f"gemm_kernels.fp8_block.{n}"]
        for n in ("gemm_fraction", "memory_fraction", "latency_s"))
    assert hw.efficiency.attention_decode_fraction == \
        hw.calibration["fitted"]["attention_decode_fraction"]
    assert hw.efficiency.latency_for("attention") == \
        hw.calibration["fitted"]["kernel_latency_s.attention"]
    assert hw.efficiency.attention_decode_tile_q_latent == fit.LATENT_TILE
    assert hw.uncertainty.uncalibrated            # the family band stays


@pytest.mark.parametrize("device", DEVICES)
def test_sglang_block_beats_the_top_level(device: str) -> None:
    """On AITER's rows the SGLang view's median |error| is the calibration's figure and
    at most half the top-level (vLLM) figures'; the vLLM view is unchanged."""
    sglang, vllm = hardware(device, "sglang"), hardware(device, "vllm")
    assert not vllm.efficiency.gemm_kernels and vllm.efficiency.attention_decode_fraction is None
    rows = read_measurements(HERE / "aiter.csv", devices=[device])
    note = sglang.calibration["note"]
    for op in ("gemm", "attention"):
        mine = [r for r in rows if r["op"] == op]
        after, before = _median_abs(mine, sglang), _median_abs(mine, vllm)
        assert after < 0.25 and before > 0.3 and after < before / 1.5
        assert f" {round(before, 3)}" in note.split(";")[0]     # the note's before figure


def test_held_out_figures_are_stated(fit) -> None:
    """The calibration blocks state the held-out figures the fit reaches."""
    for device in DEVICES:
        cal = hardware(device, "sglang").calibration
        s = fit.device_fit(device)
        stated = {"gemm": s["gemm"]["held_out"], "attention_decode": s["mla"]["held_out"]}
        # the MoE constants ship where, held out, they beat the dense pricing (MI355X only)
        if fit.ships("moe", s["moe"]):
            stated["moe"] = s["moe"]["held_out"]
        assert bool(hardware(device, "sglang").efficiency.moe_kernels) == ("moe" in stated)
        assert cal["held_out_median_abs_error"] == stated
        assert cal["rows"] == {"gemm": s["gemm"]["rows"], "attention_decode": s["mla"]["rows"],
                               "moe": s["moe"]["rows"]}


def _mla(q_len: int, kv_len: int, batch: int) -> dict:
    return {"op": "attention", "dtype": "fp8", "kv_dtype": "fp8", "batch": batch,
            "q_len": q_len, "kv_len": kv_len, "n_heads": 128, "n_kv_heads": 1,
            "head_dim": 576, "v_dim": 512, "cache_dim": 576, "measured_s": "1"}


def test_decode_fraction_prices_the_decode_only() -> None:
    """Halving attention_decode_fraction doubles a compute-bound MLA decode's body (128
    heads, 8192 keys, batch 256: 584 GFLOP) and leaves a prefill of the same heads as it was."""
    hw = hardware("mi300x", "sglang")
    half = replace(hw, efficiency=replace(
        hw.efficiency, attention_decode_fraction=hw.efficiency.attention_decode_fraction / 2))
    fixed = hw.efficiency.latency_for("attention")
    decode, prefill = _mla(1, 8192, 256), _mla(2048, 2048, 4)
    d1, d2 = (predict_rows([decode], h)[0]["predicted_s"] - fixed for h in (hw, half))
    assert d2 / d1 == pytest.approx(2.0, rel=0.02)
    p1, p2 = (predict_rows([prefill], h)[0]["predicted_s"] for h in (hw, half))
    assert p1 == p2
    # unset, the decode takes attention_fraction's share (the files without the key)
    unset = replace(hw, efficiency=replace(hw.efficiency, attention_decode_fraction=None))
    assert unset.efficiency.attention_decode == unset.efficiency.attention


def test_bad_decode_fraction_is_one_line(tmp_path: Path) -> None:
    text = (ROOT / "perfmodel" / "hardware" / "mi300x.yaml").read_text()
    bad = tmp_path / "mi300x-bad.yaml"
    bad.write_text(text.replace("attention_decode_fraction: 0.216",
                                "attention_decode_fraction: 1.5"))
    with pytest.raises(SpecError) as info:
        load_hardware(bad, "sglang")
    message = str(info.value)
    assert "attention_decode_fraction" in message and "\n" not in message
