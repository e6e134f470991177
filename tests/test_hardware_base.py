"""``base:`` in a hardware YAML: a variant of another device, block by block."""

from __future__ import annotations

from pathlib import Path

import pytest

import perfmodel as pm
from perfmodel.specs.errors import SpecError
from perfmodel.specs.load import load_hardware


def _write(folder: Path, name: str, text: str) -> Path:
    path = folder / f"{name}.yaml"
    path.write_text(text)
    return path


def test_shipped_variant_changes_one_figure() -> None:
    meta, stock = pm.hardware("h100-sxm-meta"), pm.hardware("h100-sxm")
    assert meta.memory_bytes_per_s == 2.4e12
    assert stock.memory_bytes_per_s == 3.35e12
    assert meta.memory_bytes == stock.memory_bytes
    assert meta.peak_flops_per_s == stock.peak_flops_per_s
    assert meta.efficiency == stock.efficiency and meta.interconnect == stock.interconnect
    assert "Meta's H100 variant" in meta.sources["memory"]
    assert meta.sources["compute"] == stock.sources["compute"]


def test_a_local_base_and_a_replaced_key(tmp_path: Path) -> None:
    """A base beside the file, a scalar replaced, a block merged key by key (the base's
    note dropped with the figures it described)."""
    base = (pm.specs.load.HARDWARE_DIR / "l4.yaml").read_text().replace("name: l4",
                                                                        "name: mine")
    _write(tmp_path, "mine", base)
    child = _write(tmp_path, "slow", "version: 1\nbase: mine.yaml\nname: slow\n"
                   "compute:\n  compute_units: 30\n  source: a test\n")
    hw, ref = load_hardware(child), pm.hardware("l4")
    assert hw.name == "slow" and hw.compute_units == 30
    assert hw.peak_flops_per_s == ref.peak_flops_per_s
    assert hw.sources["compute"] == "a test" and "compute.note" not in hw.sources


@pytest.mark.parametrize(("text", "match"), [
    ("base: h100-sxm\nmemory:\n  bandwidth_bytes_per_s: 1 TB/s\n", r"memory\.source: .*own"),
    ("base: 3\n", r"base: expected the name or path"),
    ("base: no-such-gpu\n", r"base: not a shipped hardware name"),
    ("base: child.yaml\n", r"names this file itself"),
    ("base: h100-sxm\nmemory:\n  bandwidth_bytes_per_s: -1 TB/s\n  source: x\n",
     r"bandwidth_bytes_per_s"),
])
def test_bad_bases(tmp_path: Path, text: str, match: str) -> None:
    with pytest.raises(SpecError, match=match):
        load_hardware(_write(tmp_path, "child", "version: 1\nname: child\n" + text))


def test_no_base_of_a_base(tmp_path: Path) -> None:
    _write(tmp_path, "mid", "version: 1\nbase: h100-sxm\nname: mid\n")
    child = _write(tmp_path, "child", "version: 1\nbase: mid.yaml\nname: child\n")
    with pytest.raises(SpecError, match="has a base of its own"):
        load_hardware(child)


@pytest.mark.parametrize(("name", "bf16", "link_devices"), [
    ("b300", 2.25e15, 8), ("gb200", 2.5e15, 72), ("gb300", 2.5e15, 72)])
def test_blackwell_variants_carry_their_own_kernel_fit(name: str, bf16: float,
                                                       link_devices: int) -> None:
    """The Blackwell files lay datasheet figures over b200's; their efficiency is vLLM's
    fitted to their own measured kernels (calibrate --from), the structure (tiles, launch,
    RMSNorm rate) b200's; the NVLink 5 link 900 GB/s per direction."""
    hw, b200 = pm.hardware(name), pm.hardware("b200")
    assert hw.calibration["engine"] == "vllm"
    folder = {"b300": "b300_sxm", "gb200": "gb200", "gb300": "gb300"}[name]
    assert f"systems/data/{folder} " in hw.calibration["source"]
    assert hw.efficiency.gemm_fraction != b200.efficiency.gemm_fraction
    assert (hw.efficiency.gemm_tile_m, hw.efficiency.gemm_tile_n, hw.efficiency.gemm_tiles) \
        == (b200.efficiency.gemm_tile_m, b200.efficiency.gemm_tile_n, b200.efficiency.gemm_tiles)
    assert hw.peak("bf16") == bf16 and hw.peak("fp8") == 2 * bf16
    assert hw.interconnect.link_bytes_per_s == 900e9
    assert hw.interconnect.max_devices == link_devices
    assert "as b200" in hw.sources["efficiency"]


def test_an_nvl72_gpu_takes_tensor_parallelism_past_eight() -> None:
    """A GB200 NVL72 rack is one NVLink domain of 72: tp 16 prices over NVLink, where an
    HGX B200 (8 per node) refuses it."""
    model, wl = pm.model("llama-3-70b"), pm.Workload(batch=8, prompt_len=512, gen_len=4)
    est = pm.estimate(pm.hardware("gb200"), model, wl, pm.Parallelism(tp=16))
    assert est.tpot_s > 0
    with pytest.raises(SpecError, match="joins at most 8 devices"):
        pm.estimate(pm.hardware("b200"), model, wl, pm.Parallelism(tp=16))


def test_a30_is_an_ampere_pcie_card() -> None:
    a30, a100 = pm.hardware("a30"), pm.hardware("a100-80gb-pcie")
    assert a30.compute_units == 56 and a30.peak("bf16") == 165e12
    # Ampere's efficiency, at the A30's clock: fp32 = SMs x 64 lanes x 2 x clock
    assert a30.efficiency.gemm_fraction == a100.efficiency.gemm_fraction
    assert a30.efficiency.alu_clock_hz * 56 * 64 * 2 == pytest.approx(10.3e12, rel=0.01)
    assert a30.interconnect.topology == "pcie"
