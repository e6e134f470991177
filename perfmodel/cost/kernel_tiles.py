"""The output tile a dense quantized GEMM kernel chooses per shape, by its own heuristic.

DeepGEMM does not run one tile: for every GEMM it walks a list of (block_m, block_n,
cluster) layouts and keeps the one its heuristic rates best (``kernel_tiles.yaml``, with
the source of each rule). On Hopper the rating is a cycle estimate, max(L1, L2 bytes per
cycle) / wave efficiency (``_cycles``); on Blackwell a comparison of waves, multicast, the
last wave's fill and the block size (``_waves``). The chosen block sets the GEMM's tile
padding and its waves over the SMs, e.g. on an H100 (132 SMs) a 128-row GEMM of n 7168
runs 128 x 48 blocks, 150 of them in two waves (57% busy), where the device's own 128 x 128
tile gives 56 blocks in one (42%).

An engine block names the kernel each of its ``gemm_kernels`` keys runs
(``efficiency.gemm_kernel_tiles``, key -> kernel); ``cost.moe.plan`` prices those GEMMs
on the chosen tile (``tiling.tile_plan``). The choice depends only on integers (m, n, k,
the SM count), so it is made once per distinct shape (``tiling._per_key``).
"""

from __future__ import annotations

import functools
import math

import numpy as np

from perfmodel.cost.tiling import _per_key
from perfmodel.specs.tile_rules import kernels

RULES = ("cycles", "waves", "fixed", "scored")


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _sm90_layouts(spec: dict, m: int, units: int) -> list[tuple[int, int, int, int]]:
    """(block_m, block_n, cluster_m, cluster_n) candidates of DeepGEMM's SM90 1D2D
    kernel, in ``get_layout_candidates`` order."""
    block_m = [b for b, upto in spec["block_m"] if not upto or m <= upto]
    start, end, step = spec["block_n"]
    bk = spec["block_k"]
    block_n = [b for b in range(start, end + 1, step)
               if b <= bk or b % (b - bk) == 0 or bk % (b - bk) == 0]
    big = spec["both_above"]
    return [(bm, bn, cm, cn) for cm, cn in spec["clusters"] if units % (cm * cn) == 0
            for bm in block_m for bn in block_n if not (bm > big and bn > big)]


def _cycles(spec: dict, m: int, n: int, k: int, units: int) -> tuple[float, float, float]:
    """DeepGEMM SM90 ``get_layout_info`` / ``compare``: the layout of fewest modelled
    cycles, max(L1, L2 cycles) / wave efficiency (its integer arithmetic), with its
    operand share (``_operand_share``)."""
    l1_rate, l2_rate = _rates(spec, units)
    best, choice = math.inf, (0.0, 0.0, 1.0)
    for bm, bn, cm, cn in _sm90_layouts(spec, m, units):
        blocks = _cdiv(m, bm) * _cdiv(n, bn)
        waves = _cdiv(blocks, units)
        if cm * cn > 1 and waves <= 1:
            continue
        l1, l2 = _operand_bytes(spec, bm, bn, cm, cn, k)
        cycles = int(max(l1 * blocks // l1_rate, l2 * blocks // l2_rate)
                     / (blocks / (waves * units)))
        if cycles < best:
            share = _operand_share(spec, bm, bn, k, l1 / l1_rate, l2 / l2_rate, units)
            best, choice = cycles, (bm, bn, share)
    return choice


def _rates(spec: dict, units: int) -> tuple[int, int]:
    """(L1, L2) bytes per cycle of the whole GPU, as DeepGEMM's SM90 heuristic takes them."""
    return (spec["l1_bytes_per_cycle_per_unit"] * units,
            int(min(spec["l2_bytes_per_cycle_per_unit"] * units,
                    spec["l2_bytes_per_cycle_max"])))


def _operand_bytes(spec: dict, bm: int, bn: int, cm: int, cn: int, k: int
                   ) -> tuple[int, int]:
    """One block's operand traffic as DeepGEMM counts it: (L1: the TMA's writes to shared
    memory, the tensor cores' reads of at least ``mma_rows`` rows, the bf16 output
    written and stored; L2: A and B, less a multicast partner's share, and the output)."""
    out = bm * bn * 2
    l1 = k * (bm + bn) + k * (max(spec["mma_rows"], bm) + bn) + 2 * out
    return l1, k * (bm // cn + bn // cm) + out


def _operand_share(spec: dict, bm: int, bn: int, k: int, l1: float, l2: float, units: int
                   ) -> float:
    """The share of its time a block of bm x bn keeps the tensor cores on useful rows:
    its MMA cycles (at least ``mma_rows`` rows at ``mma_flops_per_cycle_per_unit``) over
    the larger of those and its L1 / L2 operand cycles (``_operand_bytes`` at ``_rates``),
    times bm over the rows the MMA computes. A narrow block reads more operand bytes per
    FLOP: 64 x 16 moves 160 bytes of shared memory per k for 2,048 FLOPs, 5 times its MMA
    time at 8,192 FLOPs and 128 bytes per cycle."""
    rows = max(spec["mma_rows"], bm)
    mma = 2 * rows * bn * k / (spec["mma_flops_per_cycle_per_unit"] * units)
    return bm / rows * mma / max(mma, l1, l2)


def _sm100_layouts(spec: dict, m: int, n: int, k: int, units: int
                   ) -> list[tuple[int, int, int]]:
    """(block_m, block_n, cluster size) candidates of DeepGEMM's SM100 1D1D kernel, in
    ``get_layout_candidates`` order (without swap A/B, then with)."""
    small_k, end_small = spec["block_n_end_small_k"]
    start, end, step = spec["block_n"]
    plain_m = next(b for b, upto in spec["block_m"] if not upto or m <= upto)
    plain_n = [spec["block_n_small"], *range(start, (end_small if k <= small_k else end) + 1,
                                             step)]
    first, last, every = spec["swap_block_m"]
    swap_m = list(range(first, last + 1, every))
    out = []
    for swap, block_m, block_n in ((0, [plain_m], plain_n), (1, swap_m, [spec["swap_block_n"]])):
        for cm, cn in spec["clusters"]:
            if (cm > 1 and swap) or (cn > 1 and not swap) or units % (cm * cn):
                continue
            out += [(bm, bn, cm * cn) for bm in block_m for bn in block_n
                    if (bm // cn) % 8 == 0 and (bn // cm) % 8 == 0
                    and _cdiv(m, bm) % cm == 0 and _cdiv(n, bn) % cn == 0
                    and _tmem(spec, bm, bn, swap)]
    return out


def _tmem(spec: dict, bm: int, bn: int, swap: int) -> bool:
    """Whether the accumulators (2 x UMMA N columns) and the scales fit tensor memory."""
    a, per = spec["sf_align"], spec["sf_per_column"]
    scales = _cdiv(bm, a) * a // per + _cdiv(bn, a) * a // per
    return 2 * (bm if swap else bn) + scales <= spec["tmem_columns"]


def _waves(spec: dict, m: int, n: int, k: int, units: int) -> tuple[float, float, float]:
    """DeepGEMM SM100 ``compare``: one wave first, then multicast, fewer waves, a fuller
    last wave, the smaller block_m + block_n, the smaller block area."""
    def key(layout: tuple[int, int, int]) -> tuple:
        bm, bn, cluster = layout
        blocks = _cdiv(m, bm) * _cdiv(n, bn)
        waves = _cdiv(blocks, units)
        return (waves != 1, -cluster, waves, -(blocks % units or units), bm + bn, bm * bn)

    best = min(_sm100_layouts(spec, m, n, k, units), key=key)  # min keeps the first of ties
    return best[0], best[1], 1.0


def _fixed(spec: dict, m: int, n: int, k: int, units: int) -> tuple[float, float, float]:
    """A kernel of one tile per M range (sgl-kernel's CUTLASS fp8 ``scaled_mm``): the
    first ``blocks`` entry (largest M, block_m, block_n) whose largest M covers m (0:
    every M)."""
    bm, bn = next((bm, bn) for upto, bm, bn in spec["blocks"] if not upto or m <= upto)
    return bm, bn, 1.0


def _scored(spec: dict, m: int, n: int, k: int, units: int) -> tuple[float, float, float]:
    """FlashInfer's untuned mm_fp4 CuTe-DSL tactic (``_compute_tactic_for_m`` at the M
    bucket's representative, the next power of 2 of m up to ``rep_m_max``): swap A/B for
    m <= ``swap_m_max`` (n 8-aligned and above m), then the candidate MMA tile of highest
    score, prob_m x CTAs x n_eff x tile throughput / (tile_m x waves x SMs); the block
    one CTA computes, over (m, n): (tile_m / CTAs per MMA, tile_n), or swapped
    (tile_n, tile_m / CTAs per MMA)."""
    rep = min(2 ** max(0, math.ceil(math.log2(m))), spec["rep_m_max"])
    swap = n % 8 == 0 and rep <= spec["swap_m_max"] and n > rep
    pm_, pn = (n, rep) if swap else (rep, n)
    best, choice = -1.0, (128, 128)
    for tm, tn in spec["tiles"]:
        if tn < spec["narrow_tile_n"] and pn > tn:
            continue
        tiles_n = _cdiv(pn, tn)
        through = (tm * tn / spec["max_tile_area"]) ** 0.5 * (min(tm, tn) / max(tm, tn)) ** 0.25
        if tm * tn > spec["large_tile_area"]:
            through *= next((f for upto, f in spec["small_k"] if k <= upto), 1.0)
        ctas = _cdiv(pm_, tm) * tiles_n
        score = pm_ * ctas * (pn / (tiles_n * tn)) * through / (tm * _cdiv(ctas, units) * units)
        if score > best:
            best, choice = score, (tm, tn)
    tm, tn = choice
    cta_m = tm // (2 if tm == spec["two_cta_tile_m"] else 1)
    return (tn, cta_m, 1.0) if swap else (cta_m, tn, 1.0)


@functools.lru_cache(maxsize=1 << 17)
def _choose(kernel: int, m: int, n: int, k: int, units: int) -> tuple[float, ...]:
    name = sorted(kernels())[kernel]
    spec = kernels()[name]
    pick = {"cycles": _cycles, "waves": _waves, "fixed": _fixed, "scored": _scored}[
        spec["rule"]]
    return tuple(float(v) for v in pick(spec, max(m, 1), max(n, 1), max(k, 1), units))


def chosen_tile(kernel: str, m: np.ndarray, n: np.ndarray, k: np.ndarray, units: int
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(block_m, block_n, operand share) ``kernel`` runs each GEMM of [m, k] x [k, n]
    with on ``units`` SMs: the block it chooses and the share of its MMA time that block's
    operand traffic leaves (``_operand_share``; 1 for a rule without a cycle model)."""
    index = sorted(kernels()).index(kernel)
    out = _per_key(functools.partial(_choose, index), m, n, k, units)
    return out[..., 0], out[..., 1], out[..., 2]


def whole_tiles(kernel: str) -> bool:
    """Whether ``kernel`` runs its tile whatever the size (a CUTLASS kernel compiled for one
    tile shape per M range: a GEMM of 16 rows in a 64-row tile computes 64), rather than
    a block its heuristic sized to the GEMM."""
    return kernels()[kernel]["rule"] in ("fixed", "scored")
