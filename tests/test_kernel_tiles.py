"""DeepGEMM's own tile choice (``cost.kernel_tiles``, ``kernel_tiles.yaml``) and how a
dense quantized GEMM whose ``gemm_kernels`` key names it is priced (``cost.moe.plan``)."""

from dataclasses import replace

import numpy as np
import pytest

import perfmodel as pm
from perfmodel.cost import kernel_tiles, moe
from perfmodel.cost.ops import Gemm
from perfmodel.specs.dtypes import CODE
from perfmodel.specs.errors import SpecError

FP8 = CODE["fp8"]
BLOCK = 1.0 + 4.0 / (128 * 128)


def _tile(kernel, m, n, k, units):
    bm, bn, share = kernel_tiles.chosen_tile(kernel, np.array([m]), np.array([n]),
                                             np.array([k]), units)
    return float(bm[0]), float(bn[0]), float(share[0])


def test_every_kernel_names_a_known_rule():
    assert kernel_tiles.kernels()
    assert {v["rule"] for v in kernel_tiles.kernels().values()} <= set(kernel_tiles.RULES)


def test_sm90_small_m_takes_the_small_block_m():
    # block_m 16 is a candidate only for m <= 16, 32 only for m <= 32 (sm90.hpp)
    assert _tile("deepgemm_sm90", 8, 4096, 7168, 132)[0] == 16
    assert _tile("deepgemm_sm90", 24, 4096, 7168, 132)[0] == 32
    assert _tile("deepgemm_sm90", 200, 4096, 7168, 132)[0] in (64, 128, 256)


def test_sm90_never_pairs_two_sides_above_128_nor_block_n_176():
    for m, n in [(4096, 7168), (8192, 18432), (300, 2112), (128, 7168)]:
        bm, bn, _ = _tile("deepgemm_sm90", m, n, 7168, 132)
        assert not (bm > 128 and bn > 128) and bn != 176 and bn <= 192


def test_operand_share_of_a_narrow_block_by_hand():
    # 128 x 1024 x 12288 on 132 SMs: 64 x 16 blocks (128 of them, one wave); per block,
    # MMA cycles 2 x 64 x 16 x k / (8192 x 132), L2 cycles (k (64 + 16) + 2 x 64 x 16) /
    # 6153 (the larger operand term): share = their ratio
    k = 12288
    mma = 2 * 64 * 16 * k / (8192 * 132)
    l2 = (k * 80 + 2 * 64 * 16) / 6153
    assert _tile("deepgemm_sm90", 128, 1024, k, 132) == pytest.approx((64, 16, mma / l2))


def test_a_large_block_under_multicast_is_mma_bound():
    # 256 x 128 at k 7168 (many waves, so a cluster of 2 is a candidate): MMA
    # 2 x 256 x 128 / 8192 = 8 cycles per k per SM; L1 (384 + 384) / 128 = 6; L2 alone
    # 132 x 384 / 6153 = 8.24 (share 0.95), with B multicast to the pair 132 x (256 + 64)
    # / 6153 = 6.87: MMA bound, share 1
    assert _tile("deepgemm_sm90", 4096, 7168, 7168, 132) == (256, 128, 1.0)


def test_sm100_prefers_one_wave_then_the_fullest_last_wave():
    # 64 x 7168: every single-wave candidate beats a two-wave one; among them the most
    # blocks (last-wave fill), so block_n 64 (112 blocks) over 128 (56)
    bm, bn, share = _tile("deepgemm_sm100", 64, 7168, 4096, 148)
    blocks = np.ceil(64 / bm) * np.ceil(7168 / bn)
    assert blocks <= 148 and share == 1.0
    for other in (128, 256):
        assert blocks >= np.ceil(7168 / other)


def _hw(tiles):
    hw = pm.hardware("h100-sxm", "sglang")
    return replace(hw, efficiency=replace(hw.efficiency, gemm_kernel_tiles=tiles))


def _block_gemm(m, n, k):
    return Gemm(m=np.asarray(m, dtype=float), n=np.asarray(n, dtype=float),
                k=np.asarray(k, dtype=float), weight_bytes=BLOCK, act_bytes=1.0,
                dtype=FP8, weight_dtype=FP8)


def test_named_keys_price_on_the_kernels_tile_and_others_keep_the_menu():
    op = _block_gemm([128.0, 4096.0], 1024.0, 12288.0)
    off = _hw({})
    only_top = _hw({"fp8_block": "deepgemm_sm90"})
    frac_off, _ = moe.plan(op, off)
    frac_top, _ = moe.plan(op, only_top)
    assert frac_top[0] == frac_off[0]           # m 128: bucket fp8_block@128, not named
    assert frac_top[1] != frac_off[1]


def test_the_vllm_blocks_do_not_name_kernel_tiles():
    # the feature is off where no block names it: vLLM's and TensorRT-LLM's pricing as before
    for engine in ("vllm", "trtllm"):
        assert not pm.hardware("h100-sxm", engine).efficiency.gemm_kernel_tiles


def _load(tmp_path, tiles: str):
    from perfmodel.specs.load import load_hardware
    from validate.corpus.write import shipped_path

    src = shipped_path("h100-sxm").read_text()
    anchor = "      gemm_kernel_tiles: "
    if anchor in src:                           # the shipped naming out, the test's in
        start = src.index(anchor)
        src = src[:start] + src[src.index("}", start) + 2:]
    sglang = src.index("  sglang:")
    at = src.index("      gemm_kernels:\n", sglang)
    path = tmp_path / "h100-sxm.yaml"
    path.write_text(src[:at] + anchor + tiles + "\n" + src[at:])
    return load_hardware(path, "sglang")


def test_kernel_names_and_keys_are_checked(tmp_path):
    with pytest.raises(SpecError, match="deepgemm_sm90"):
        _load(tmp_path, "{fp8_block: deepgem_sm90}")
    with pytest.raises(SpecError, match="key of gemm_kernels"):
        _load(tmp_path, "{fp8_block@8: deepgemm_sm90}")
    assert _load(tmp_path, "{fp8_block: deepgemm_sm90}").efficiency.gemm_kernel_tiles == {
        "fp8_block": "deepgemm_sm90"}


def test_a_class_k_half_replaces_the_engines_ramp_for_its_own_tile():
    op = _block_gemm([4096.0], 7168.0, 512.0)
    hw = _hw({"fp8_block": "deepgemm_sm90"})
    hw = replace(hw, efficiency=replace(hw.efficiency, gemm_kernel_k_half={}))
    own = replace(hw, efficiency=replace(hw.efficiency,
                                         gemm_kernel_k_half={"fp8_block": 1000.0}))
    engine = hw.efficiency.gemm_k_half
    ratio = moe.plan(op, own)[0][0] / moe.plan(op, hw)[0][0]
    assert ratio == pytest.approx((512 / (512 + 1000)) / (512 / (512 + engine)))


def test_k_half_is_read_from_the_class_row():
    hw = pm.hardware("h100-sxm", "sglang")
    assert set(hw.efficiency.gemm_kernel_k_half) <= set(hw.efficiency.gemm_kernel_tiles)
    assert all(8 <= v <= 4096 for v in hw.efficiency.gemm_kernel_k_half.values())
