"""The CUTLASS fp8 ``scaled_mm`` kernels of one compiled tile per M range (rule ``fixed``,
``kernel_tiles.yaml``: sgl-kernel's and vLLM's sm100 dispatch) and how a GEMM they run is
padded to that whole tile (``cost.kernel_tiles.whole_tiles``, ``tiling._pad``)."""

import numpy as np
import pytest

import perfmodel as pm
from perfmodel.cost import kernel_tiles, moe
from perfmodel.cost.ops import Gemm
from perfmodel.specs.dtypes import CODE

FP8 = CODE["fp8"]


def _tile(kernel, m, n=4096, k=4096, units=132):
    bm, bn, share = kernel_tiles.chosen_tile(kernel, np.array([m]), np.array([n]),
                                             np.array([k]), units)
    return float(bm[0]), float(bn[0]), float(share[0])


@pytest.mark.parametrize(("kernel", "m", "tile"), [
    ("sgl_kernel_fp8_sm90", 1, (64, 64)),
    ("sgl_kernel_fp8_sm90", 256, (64, 64)),
    ("sgl_kernel_fp8_sm90", 257, (128, 128)),
    # 2-SM UMMA: TileShape 128 x 128 over a pair of CTAs (cluster 2 x 1), 64 x 128 each
    ("sgl_kernel_fp8_sm100", 200, (64, 128)),
    ("sgl_kernel_fp8_sm100", 4096, (128, 128)),
    # swap A/B at m <= 16: the CTA's 32 columns run over the GEMM's m
    ("vllm_cutlass_fp8_sm100", 8, (32, 64)),
    ("vllm_cutlass_fp8_sm100", 64, (64, 64)),
])
def test_the_fixed_rule_takes_the_m_ranges_tile(kernel, m, tile):
    assert _tile(kernel, m)[:2] == tile
    assert _tile(kernel, m)[2] == 1.0
    assert kernel_tiles.whole_tiles(kernel)
    assert not kernel_tiles.whole_tiles("deepgemm_sm90")


def _fp8(m, n=8192, k=4096):
    return Gemm(m=np.asarray(m, dtype=float), n=np.asarray(n, dtype=float),
                k=np.asarray(k, dtype=float), weight_bytes=1.0, act_bytes=1.0,
                dtype=FP8, weight_dtype=FP8)


def test_a_fixed_tile_pads_every_m_of_its_range_to_the_whole_tile():
    # sgl-kernel sm90, M in (1, 64]: a 16-row GEMM computes a 64-row tile, as many CTAs
    hw = pm.hardware("h200-sxm", "sglang")
    assert hw.efficiency.gemm_kernel_tiles["fp8@64"] == "sgl_kernel_fp8_sm90"
    frac, split = moe.plan(_fp8([16.0, 64.0]), hw)
    assert frac[0] == pytest.approx(frac[1] / 4) and np.all(split == 1)


def test_the_tiles_go_with_the_rows_they_price():
    # B200's top level is vLLM's: TensorRT-LLM's block brings its own gemm_kernels, so not
    # vLLM's CUTLASS tiles; B300's blocks inherit B200's vLLM rows, and their tiles with them
    assert pm.hardware("b200", "vllm").efficiency.gemm_kernel_tiles["fp8"] \
        == "vllm_cutlass_fp8_sm100"
    assert not pm.hardware("b200", "trtllm").efficiency.gemm_kernel_tiles
    assert pm.hardware("b200", "sglang").efficiency.gemm_kernel_tiles["fp8"] \
        == "sgl_kernel_fp8_sm100"


@pytest.mark.parametrize(("m", "n", "k", "tile"), [
    # m <= 32 with n 8-aligned: swap A/B, the narrowest tile_n covering m's bucket (8)
    (1, 4096, 4096, (8, 128)),
    (16, 4096, 4096, (16, 128)),
    # m 33 runs the tactic of its bucket's representative, 64: no swap, 128 x 64
    (33, 4096, 4096, (128, 64)),
    # a 256-row MMA tile is a 2-CTA pair: one CTA computes 128 rows of its 256 x 256
    (1024, 4096, 4096, (128, 256)),
    # k <= 1024 halves the score of tiles above 128 x 128
    (4096, 2048, 512, (128, 128)),
])
def test_flashinfer_fp4_untuned_tactic_by_hand(m, n, k, tile):
    assert _tile("flashinfer_fp4_sm100", m, n, k, 148)[:2] == tile
    assert kernel_tiles.whole_tiles("flashinfer_fp4_sm100")
    assert pm.hardware("b300", "trtllm").efficiency.gemm_kernel_tiles \
        == pm.hardware("b300", "vllm").efficiency.gemm_kernel_tiles
