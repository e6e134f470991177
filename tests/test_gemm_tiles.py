"""A GEMM library's menu of output tiles (``efficiency.gemm_tiles``): the tile each GEMM
takes, derived by hand; adding a tile never makes a GEMM slower; split-K stays with the
device's own tile; and the file format."""

from dataclasses import replace

import numpy as np
import pytest

import perfmodel as pm
from perfmodel.cost.ops import Gemm
from perfmodel.cost.roofline import op_time
from perfmodel.cost.tiling import gemm_choice, gemm_plan, gemm_tiles
from perfmodel.specs import SpecError
from perfmodel.specs.dtypes import CODE
from tests.datasheet import datasheet, datasheet_path


def _menu(hw: pm.Hardware, *tiles: tuple[int, int]) -> pm.Hardware:
    return replace(hw, efficiency=replace(hw.efficiency, gemm_tiles=tuple(tiles)))


def _choice(hw: pm.Hardware, m: float, n: float, k: float) -> tuple[float, float, int]:
    frac, split, index = gemm_choice(np.array([m]), np.array([n]), np.array([k]),
                                     np.array([1.0]), hw)
    return float(frac[0]), float(split[0]), int(index[0])


def test_shipped_hopper_menu():
    hw = datasheet("h100-sxm")
    assert gemm_tiles(hw.efficiency) == ((128, 256), (256, 128), (128, 128))
    assert datasheet("a100-80gb-sxm").efficiency.gemm_tiles == ()


def test_a_1000_row_prefill_gemm_takes_the_tile_that_fills_the_waves(h100):
    """Qwen3-14B's MLP down projection in a 986-token prefill on an H100 SXM (132 SMs):
    m = 986, n = 5120, k = 17408. Rows pad to 1024 with 128- or 256-row tiles (986/1024);
    k ramp 17408 / (17408 + 128).
      128 x 256 (the device's tile): 8 x 20 = 160 tiles, 2 waves of 132: 160/264 busy
      256 x 128: 4 x 40 = 160 tiles: the same, a tie, so not taken
      128 x 128: 8 x 40 = 320 tiles, 3 waves: 320/396 busy, taken."""
    pad, ramp = 986 / 1024, 17408 / (17408 + 128)
    single = _menu(h100)
    frac, split, index = _choice(single, 986, 5120, 17408)
    assert (index, split) == (0, 1.0)
    assert frac == pytest.approx(0.80 * pad * 160 / 264 * ramp)
    frac, split, index = _choice(_menu(h100, (256, 128), (128, 128)), 986, 5120, 17408)
    assert gemm_tiles(_menu(h100, (256, 128), (128, 128)).efficiency)[index] == (128, 128)
    assert split == 1.0
    assert frac == pytest.approx(0.80 * pad * 320 / 396 * ramp)       # 0.618 against 0.463


def test_split_k_stays_with_the_device_tile(a100):
    """m = 256, n = 4096, k = 5504 on an A100 (108 SMs, 128 x 128 tiles): 2 x 32 = 64 tiles,
    split-K min(108 // 64, 5504 // 256) = 1, so 64/108 busy. 256 x 128 tiles run one
    program each: 32 tiles, 32/108 busy, and lose (split 3 ways they would fill 96/108:
    the model prices a split at one kernel latency, not its partial sums' round trip, so
    no alternative tile is split)."""
    ramp = 5504 / (5504 + 128)
    frac, split, index = _choice(_menu(a100, (256, 128)), 256, 4096, 5504)
    assert (index, split) == (0, 1.0)
    assert frac == pytest.approx(0.87 * 64 / 108 * ramp)
    # below a wave the device's tile still splits: m = 16 (16-row tile), 32 tiles x 3
    frac, split, index = _choice(_menu(a100, (256, 128)), 16, 4096, 4096)
    assert (index, split) == (0, 3.0)


@pytest.mark.parametrize("name", ["h100-sxm", "a100-80gb-sxm", "l4", "mi300x", "b200"])
def test_adding_a_tile_never_makes_a_gemm_slower(name):
    """Over random shapes (grouped ones too), every tile appended to the menu leaves each
    GEMM's fraction and its whole time (compute, memory, the split's extra kernel) no
    worse."""
    rng = np.random.default_rng(7)
    size = 4000
    m = np.ceil(np.exp(rng.uniform(0, np.log(20000), size)))
    n = np.ceil(np.exp(rng.uniform(np.log(64), np.log(60000), size)))
    k = np.ceil(np.exp(rng.uniform(np.log(64), np.log(30000), size)))
    groups = np.where(rng.random(size) < 0.2, rng.integers(2, 65, size), 1).astype(float)
    gemm = Gemm(m=m, n=n, k=k, weight_bytes=2, act_bytes=2, dtype=CODE["bf16"],
                groups=groups)
    hw = _menu(pm.hardware(name))
    frac = first = gemm_plan(m, n, k, groups, hw)[0]
    time = op_time(gemm, hw, "kernel").time_s
    for tile in [(256, 128), (128, 128), (64, 128), (64, 64), (256, 256), (16, 512)]:
        hw = _menu(hw, *hw.efficiency.gemm_tiles, tile)
        more, more_time = gemm_plan(m, n, k, groups, hw)[0], op_time(gemm, hw, "kernel").time_s
        assert np.all(more >= frac) and np.all(more_time <= time * (1 + 1e-12)), tile
        frac, time = more, more_time
    assert np.any(frac > first)                                 # the menu does act


def test_menu_in_the_file(tmp_path):
    text = (datasheet_path("a100-80gb-sxm")).read_text()
    path = tmp_path / "a.yaml"
    path.write_text(text.replace("  gemm_tile_n: 128\n",
                                 "  gemm_tile_n: 128\n  gemm_tiles: [[256, 128], [128, 256]]\n"))
    assert pm.hardware(str(path)).efficiency.gemm_tiles == ((256, 128), (128, 256))
    path.write_text(text.replace("  gemm_tile_n: 128\n", "  gemm_tile_n: 128\n  gemm_tiles: []\n"))
    assert pm.hardware(str(path)).efficiency.gemm_tiles == ()


@pytest.mark.parametrize("value", ["[128, 256]", "[[128, 0]]", "[[128, 256, 64]]", "128",
                                   "[[128, true]]", "[[128.5, 256]]"])
def test_a_bad_menu_is_one_line_naming_the_field(tmp_path, value):
    text = (datasheet_path("a100-80gb-sxm")).read_text()
    path = tmp_path / "bad.yaml"
    path.write_text(text.replace("  gemm_tile_n: 128\n",
                                 f"  gemm_tile_n: 128\n  gemm_tiles: {value}\n"))
    with pytest.raises(SpecError) as info:
        pm.hardware(str(path))
    message = str(info.value)
    assert "\n" not in message
    for part in (str(path), "efficiency.gemm_tiles", "[rows, columns]"):
        assert part in message, (part, message)


def test_calibrate_writes_the_menu_back(tmp_path):
    """A calibrated file keeps the device's menu: the efficiency block calibrate writes
    loads back to the same tiles (and a device without one writes no key)."""
    import yaml

    from validate.calibrate import _efficiency_block

    hw = datasheet("h100-sxm")
    eff = replace(hw.efficiency, dequant={})
    doc = yaml.safe_load((datasheet_path("h100-sxm")).read_text())
    doc["efficiency"] = _efficiency_block(eff, "test")
    path = tmp_path / "h100-sxm.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    assert pm.hardware(str(path)).efficiency == eff
    assert "gemm_tiles" not in _efficiency_block(replace(eff, gemm_tiles=()), "test")
