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
    ("base: no-such-gpu\n", r"unknown hardware 'no-such-gpu'"),
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
