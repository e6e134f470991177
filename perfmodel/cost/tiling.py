"""How kernels cut an operator into tiles and run them in waves over the compute units.

GEMMs: tile padding, wave quantization, split-K and the k-depth ramp, for the best of the
device's tile shapes (``gemm_plan``).
Attention: FlashAttention's decode programs and key splits (flash-decoding, ``decode_plan``),
and the useful share of the tile time of a causal (or sliding-window) prefill
(``prefill_tile_fraction``), including the append-KV variant (``append_kv_splits``,
``append_kv_rows``). Every function works on numpy arrays of shapes. The parts that walk the
query blocks of one prefill, or search a split count, depend only on a few integers; they
are computed once per distinct value (``_per_key``) and broadcast back.
``roofline`` turns these efficiencies into time.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import replace

import numpy as np

from perfmodel.specs.hardware import Efficiency, Hardware

# Q/K head width past which a decode is MLA's absorbed form over the latent cache (576:
# the 512 latent + 64 rope), for the tile rule of ``attention.decode_row_tile``
LATENT_QK_DIM = 256
_SPLIT_K_MIN_DEPTH = 256   # split-K slices are at least this deep (k elements)
SPLIT_FULL = 0.8           # decode programs filling this share of the units are not split
_SPLIT_NEAR_BEST = 0.85
_SPLIT_MAX = 128
# query rows per program of FlashAttention-2's split-KV kernel (run_mha_fwd_splitkv_dispatch)
APPEND_KV_TILE_Q = 64


def latent_attention(op) -> np.ndarray:
    """Per instance of ``op`` (an ``Attention``): MLA's absorbed form, where K and V are read
    from one shared latent (a position holds fewer elements than Q/K plus V: 576 against
    576 + 512), not a 512-wide head of its own K and V (the corpus's head-dim-512 decodes)."""
    qk, v = np.asarray(op.g("qk_dim")), np.asarray(op.g("v_dim"))
    shared = np.asarray(op.g("cache_elems")) < qk + v
    return np.broadcast_to(shared.any(axis=-1), np.shape(op.batch)[:-1])


def _pad(size: np.ndarray, tile: int, whole: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Useful fraction of the padded extent when ``size`` is covered by tiles of ``tile``.
    Small sizes use a smaller power-of-two tile (kernels for skinny shapes), down to 16;
    with ``whole``, a kernel compiled for one tile pads every size to it."""
    size = np.asarray(size, dtype=float)
    used = np.minimum(tile, np.maximum(16.0, np.exp2(np.ceil(np.log2(np.maximum(size, 1.0))))))
    used = np.broadcast_to(np.asarray(tile, dtype=float), np.shape(used)) if whole else used
    return size / (np.ceil(size / used) * used), used


def wave_fill(programs: np.ndarray, units: float) -> np.ndarray:
    """Busy share of the units while ``programs`` equal programs run in waves of ``units``
    (the last, partial wave idles the rest)."""
    return programs / (np.ceil(programs / units) * units)


def gemm_tiles(eff: Efficiency) -> tuple[tuple[int, int], ...]:
    """The output tiles a GEMM may run with: the device's own tile (``gemm_tile_m`` x
    ``gemm_tile_n``) first, then the library's alternatives (``gemm_tiles``)."""
    return ((eff.gemm_tile_m, eff.gemm_tile_n), *eff.gemm_tiles)


def _tile_plan(m: np.ndarray, n: np.ndarray, k: np.ndarray, groups: np.ndarray,
               eff: Efficiency, units: int, tile: tuple[int, int], may_split: bool = True,
               whole: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(achievable fraction, split-K factor) of a GEMM run with ``tile`` output tiles (see
    ``gemm_plan``); without ``may_split``, one program per tile (no split-K); with
    ``whole``, tiles that never shrink to a small size (``_pad``)."""
    pad_m, tm = _pad(m, tile[0], whole)
    pad_n, tn = _pad(n, tile[1], whole)
    tiles = np.ceil(m / tm) * np.ceil(n / tn) * np.maximum(1.0, np.ceil(groups))
    split = np.where(tiles >= units, 1.0, np.maximum(1.0, np.minimum(
        np.floor_divide(units, tiles), np.floor_divide(k, _SPLIT_K_MIN_DEPTH)))) \
        if may_split else np.ones(np.shape(tiles))
    wave = wave_fill(tiles * split, units)
    depth = k / split
    ramp = depth / (depth + eff.gemm_k_half) if eff.gemm_k_half else 1.0
    if eff.gemm_m_half:     # a CPU BLAS: no row tiles
        pad_m = np.where(m > 1, m / (m + eff.gemm_m_half), 1.0)
    if eff.gemm_n_half:
        pad_n = np.where(m > 1, pad_n * (eff.gemm_n_half / (eff.gemm_n_half + n)), pad_n)
    return eff.gemm_fraction * pad_m * pad_n * wave * ramp, split


def tile_plan(m: np.ndarray, n: np.ndarray, k: np.ndarray, groups: np.ndarray, hw: Hardware,
              tile: tuple[np.ndarray, np.ndarray], k_half: float | None = None,
              whole: bool = False) -> np.ndarray:
    """Achievable fraction of a GEMM run with the given output ``tile`` (per instance: the
    one its kernel chose, ``cost.kernel_tiles``), one program per tile, no split-K, with
    the kernel's own k-depth ramp ``k_half`` (None: the device's ``gemm_k_half``) and,
    with ``whole``, every size padded to the whole tile."""
    eff = hw.efficiency if k_half is None else replace(hw.efficiency, gemm_k_half=k_half)
    return _tile_plan(m, n, k, groups, eff, hw.compute_units, tile, may_split=False,
                      whole=whole)[0]


def gemm_choice(m: np.ndarray, n: np.ndarray, k: np.ndarray, groups: np.ndarray,
                hw: Hardware, may_split: bool = True
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(achievable fraction, split-K factor, index into ``gemm_tiles``) of a GEMM: the
    device's own tile as ``gemm_plan`` prices it, or an alternative tile run one program per
    tile where that reaches a higher fraction (a shorter compute time); on a tie, the one
    listed first."""
    eff, units = hw.efficiency, hw.compute_units
    tiles = gemm_tiles(eff)
    frac, split = _tile_plan(m, n, k, groups, eff, units, tiles[0], may_split)
    choice = np.zeros(np.shape(frac), dtype=np.int64)
    for index, tile in enumerate(tiles[1:], start=1):
        other, _ = _tile_plan(m, n, k, groups, eff, units, tile, may_split=False)
        better = other > frac
        frac, split = np.where(better, other, frac), np.where(better, 1.0, split)
        choice = np.where(better, index, choice)
    return frac, split, choice


def gemm_plan(m: np.ndarray, n: np.ndarray, k: np.ndarray, groups: np.ndarray,
              hw: Hardware, may_split: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """(achievable fraction of peak, split-K factor) of a GEMM:
    best-shape fraction x tile padding x wave quantization x k-depth ramp.

    Tiles of tile_m x tile_n cover the [m, n] output of each group; tiles run in waves of
    ``compute_units``; the last partial wave idles the rest. When the tiles cannot fill one
    wave, split-K divides k (slices at least 256 deep) so more units work; the partial sums
    then need a reduction pass. Each tile's pipeline prologue/epilogue costs about
    ``gemm_k_half`` k-elements: efficiency x k_slice / (k_slice + gemm_k_half).
    A GPU library picks its tile per problem (cuBLAS's heuristics, CUTLASS's tile menus):
    where the device lists alternatives (``efficiency.gemm_tiles``), each runs at the same
    best-shape fraction, one program per output tile, and a GEMM takes whichever of them
    and its own tile gives the highest fraction (``gemm_choice``). Split-K stays with the
    device's own tile: it is priced here at one kernel latency, not the partial sums' round
    trip through memory, so letting every tile split would reward the idealisation (on the
    A100 layer measurements it took 545 compute-bound rows from +12% to -17%; see
    reports/a100/README.md).
    A CPU BLAS (``gemm_m_half`` set) packs each weight panel once and reuses it for the m rows
    instead of padding rows into tiles: m / (m + gemm_m_half) for m > 1 (m = 1 runs as a
    GEMV: no padding, no packing); its packed path also slows as the output widens:
    x gemm_n_half / (gemm_n_half + n).
    Without ``may_split`` no tile splits k (a fused MoE's grouped GEMM: one program per
    output tile of each expert, ``cost.moe``).
    """
    frac, split, _ = gemm_choice(m, n, k, groups, hw, may_split)
    return frac, split


def distinct(values: np.ndarray) -> tuple[int, np.ndarray, np.ndarray]:
    """(number of distinct values, each element's rank among them, the first element of
    each): ``np.unique(return_inverse=True, return_index=True)`` by a stable sort, several
    times faster than numpy 2's hash-based unique on 10^5-10^6 integers."""
    order = np.argsort(values, kind="stable")
    ordered = values[order]
    new = np.empty(len(values), dtype=bool)
    new[:1] = True
    np.not_equal(ordered[1:], ordered[:-1], out=new[1:])
    rank = np.cumsum(new) - 1
    inverse = np.empty(len(values), dtype=np.int64)
    inverse[order] = rank
    return int(rank[-1]) + 1 if len(values) else 0, inverse, order[new]


def _per_key(fn: Callable[..., tuple[float, ...]], *columns: np.ndarray) -> np.ndarray:
    """``fn`` (a cached function of integers) at every element of the broadcast ``columns``,
    evaluated once per distinct tuple of values; returns shape + (outputs,)."""
    arrays = np.broadcast_arrays(*(np.asarray(c, dtype=np.int64) for c in columns))
    shape = arrays[0].shape
    flat = [a.reshape(-1) for a in arrays]
    if flat[0].size <= 16:
        out = np.array([fn(*map(int, row)) for row in zip(*flat, strict=True)], dtype=float)
        return out.reshape(*shape, -1)
    key, span = np.zeros(flat[0].size, dtype=np.int64), 1
    for column in flat:                  # mixed-radix code of the distinct values per column
        count, inverse, _ = distinct(column)
        if span * count > 2**62:         # keep the code in range: renumber what we have
            span, key, _ = distinct(key)
        key, span = key * count + inverse, span * count
    _, inverse, first = distinct(key)
    rows = zip(*(c[first] for c in flat), strict=True)
    out = np.array([fn(*map(int, row)) for row in rows], dtype=float)[inverse.reshape(-1)]
    return out.reshape(*shape, -1)


def decode_kv_tile(head_dim: np.ndarray) -> np.ndarray:
    """Keys per tile of FlashAttention-2's split-KV (decode) kernel: 256 up to head_dim 64,
    128 up to 128, 64 above (``run_mha_fwd_splitkv_dispatch``)."""
    return np.where(head_dim <= 64, 256, np.where(head_dim <= 128, 128, 64))


@functools.lru_cache(maxsize=65536)
def _kv_splits(programs: int, tiles: int, units: int) -> tuple[float]:
    """FlashAttention-2's ``num_splits_heuristic`` for ``programs`` over key ``tiles``."""
    if programs >= SPLIT_FULL * units:
        return (1.0,)
    most = max(1, min(_SPLIT_MAX, units, tiles))
    counts = [n for n in range(1, most + 1)
              if n == 1 or math.ceil(tiles / n) != math.ceil(tiles / (n - 1))]
    fill = {n: float(wave_fill(programs * n, units)) for n in counts}
    best = max(fill.values())
    return (float(min(n for n in counts if fill[n] >= _SPLIT_NEAR_BEST * best)),)


def splits_settle(units: int) -> int:
    """Key tiles from which ``kv_splits`` no longer depends on the tiles: at tiles >= most x
    (most - 1), most = min(128, units), ceil(tiles / n) falls with every n up to most
    (tiles / (n - 1) - tiles / n >= 1), so every count is a candidate and the choice rests on
    the programs alone."""
    most = max(1, min(_SPLIT_MAX, units))
    return max(most * (most - 1), 1)


def kv_splits(programs: np.ndarray, tiles: np.ndarray, units: int) -> np.ndarray:
    """How many programs share one (sequence, KV head)'s keys: FlashAttention-2's rule
    (``num_splits_heuristic``). None when the programs already fill 80% of the units;
    otherwise the fewest splits whose last wave is within 85% of the best wave fill, counting
    only split counts that shorten each split (fewer key tiles per split than one split
    fewer). At most min(128, units, key tiles) splits."""
    programs, tiles = np.broadcast_arrays(np.asarray(programs), np.asarray(tiles))
    if programs.size <= 16:
        return np.array([_kv_splits(int(p), int(t), units)[0] for p, t in
                         zip(programs.ravel().tolist(), tiles.ravel().tolist(), strict=True)]
                        ).reshape(programs.shape)
    out = np.ones(programs.shape)
    need = programs < SPLIT_FULL * units
    if np.any(need):
        out[need] = _per_key(_kv_splits, programs[need], tiles[need], units)[..., 0]
    return out


def q_tile(eff: Efficiency, q_len: np.ndarray) -> np.ndarray:
    """Query rows per attention program for a prefill of ``q_len`` new tokens (the last step
    of ``attention_tile_q`` whose minimum q_len is reached)."""
    mins = np.array([m for m, _ in eff.attention_tile_q])
    tiles = np.array([t for _, t in eff.attention_tile_q], dtype=float)
    return tiles[np.maximum(np.searchsorted(mins, q_len, side="right") - 1, 0)]


def _block_key_tiles(q: int, kv: int, window: int, span: int, bk: int,
                     causal: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Key tiles of each block of ``span`` query positions in a causal prefill of ``q`` new
    tokens on ``kv`` keys: (start of the tile holding the first key its first row sees,
    given a sliding ``window`` (0: none); end of the tile holding its last row's last key).
    Not ``causal``: every block's last row sees all ``kv`` keys."""
    first_row = kv - q + np.arange(0, q, span)              # 0-based position of each block
    last_key = np.minimum(first_row + span, kv) if causal else np.full_like(first_row, kv)
    first_key = np.maximum(first_row + 1 - window, 0) if window else np.zeros_like(first_row)
    return np.floor(first_key / bk) * bk, np.ceil(last_key / bk) * bk


@functools.lru_cache(maxsize=65536)
def _block_stats(q: int, kv: int, window: int, span: int, bk: int, clip: int,
                 splits: int, causal: int = 1) -> tuple[float, float, float, float]:
    """(longest, total, shortest keys computed per query block, blocks) of one prefill."""
    start, end = _block_key_tiles(q, kv, window, span, bk, causal)
    if clip:
        end = np.minimum(end, kv)
    keys = end - start
    if splits > 1:
        keys = np.ceil(keys / bk / splits) * bk
    return float(keys.max()), float(keys.sum()), float(keys.min()), float(len(keys))


def tile_fraction(units: int, batch: np.ndarray, heads: np.ndarray, q: np.ndarray,
                  kv: np.ndarray, window: np.ndarray, attended: np.ndarray, *, packed: int
                  | np.ndarray, bq: np.ndarray, bk: np.ndarray, clip: bool,
                  splits: np.ndarray | float = 1.0, causal: np.ndarray | bool = True,
                  fixed: float = 0.0) -> np.ndarray:
    """Useful share of the tile time of a prefill (see ``prefill_tile_fraction``) with
    ``packed`` query heads per block row set (1: none), ``bq`` x ``bk`` tiles, each
    block's key tiles shared out over ``splits`` programs, and ``fixed`` key positions of
    work per program (``attention_program_keys``)."""
    span = np.maximum(1, np.floor_divide(bq, packed))
    kmax, ksum, kmin, blocks = np.moveaxis(
        _per_key(_block_stats, q, kv, window, span, bk, int(clip), splits, causal), -1, 0)
    programs = np.floor_divide(batch * heads, packed) * splits
    n = programs * blocks
    kmax, kmin = kmax + fixed, kmin + fixed
    busy = np.maximum(kmax, (programs * ksum + n * fixed) / units
                      + (np.ceil(n / units) - n / units) * kmin)
    useful = batch * heads * attended / bq
    return np.minimum(1.0, useful / (units * busy))


def prefill_tile_fraction(hw: Hardware, batch: np.ndarray, heads: np.ndarray,
                          kv_heads: np.ndarray, head_dim: np.ndarray, q: np.ndarray,
                          kv: np.ndarray, window: np.ndarray, attended: np.ndarray,
                          causal: np.ndarray | bool = True) -> np.ndarray:
    """Useful share of the tile time of a prefill attention (one group of sequences).

    One program per (sequence, query head, block of ``bq`` query rows) steps over key tiles of
    ``bk``: block i needs the tiles from the first key its first row sees (a sliding window
    drops earlier ones) to the last key its last row sees (causal), diagonal tiles in full
    (with ``attention_clip_kv`` the last tile stops at kv_len).
    Programs run on ``compute_units``; with unequal programs (causal) the busiest unit
    finishes last: T = max(longest program, total / units + the idle share of the last
    wave x the shortest program), the longest-first schedule FlashAttention uses for causal
    prefill. Fraction = attended positions / (units x T x tile area). With
    ``attention_pack_gqa`` the query heads of a KV group may instead share a block's rows
    (bq / group positions per block, one program per KV head): the better of the two counts.
    With ``attention_append_kv`` the split-KV kernel's 64 x ``decode_kv_tile`` tiles and its
    key splits (``append_kv_splits``) replace the device's tiles, without packing.
    """
    eff, units = hw.efficiency, hw.compute_units
    if eff.attention_append_kv:
        splits = append_kv_splits(hw, batch, heads, head_dim, q, kv, window)
        return tile_fraction(units, batch, heads, q, kv, window, attended, packed=1,
                             bq=APPEND_KV_TILE_Q, bk=decode_kv_tile(head_dim),
                             clip=eff.attention_clip_kv, splits=splits, causal=causal,
                             fixed=eff.attention_program_keys)
    bq, bk = q_tile(eff, q), eff.attention_tile_kv
    frac = tile_fraction(units, batch, heads, q, kv, window, attended, packed=1, bq=bq, bk=bk,
                         clip=eff.attention_clip_kv, causal=causal,
                         fixed=eff.attention_program_keys)
    group = np.floor_divide(heads, kv_heads)
    if eff.attention_pack_gqa and np.any(group > 1):
        packed = tile_fraction(units, batch, heads, q, kv, window, attended,
                               packed=np.maximum(group, 1), bq=bq, bk=bk,
                               clip=eff.attention_clip_kv, causal=causal,
                               fixed=eff.attention_program_keys)
        frac = np.where(group > 1, np.maximum(frac, packed), frac)
    return frac


def _keys(kv: np.ndarray, window: np.ndarray) -> np.ndarray:
    """Key positions one query reads (the window, if any, bounds them), at least 1."""
    return np.maximum(1, np.where(window > 0, np.minimum(kv, window), kv))


def append_kv_splits(hw: Hardware, batch: np.ndarray, heads: np.ndarray, head_dim: np.ndarray,
                     q: np.ndarray, kv: np.ndarray, window: np.ndarray) -> np.ndarray:
    """Key splits of an append-KV prefill (``attention_append_kv``): FlashAttention-2's
    ``num_splits_heuristic`` over its (sequence, query head, 64-row block) programs."""
    programs = batch * heads * np.ceil(q / APPEND_KV_TILE_Q)
    tiles = np.ceil(_keys(kv, window) / decode_kv_tile(head_dim))
    return kv_splits(programs, tiles, hw.compute_units)


@functools.lru_cache(maxsize=65536)
def _append_rows(q: int, kv: int, window: int, bk: int) -> tuple[float]:
    start, end = _block_key_tiles(q, kv, window, APPEND_KV_TILE_Q, bk)
    return (float(np.maximum(np.minimum(end, kv) - np.maximum(start, kv - q), 0).sum()),)


def append_kv_rows(head_dim: np.ndarray, q: np.ndarray, kv: np.ndarray,
                   window: np.ndarray) -> np.ndarray:
    """Cache positions the append-KV prologue copies per (sequence, query head), summed over
    its 64-row query blocks.

    Each (sequence, query head, block of 64 query rows) program copies the chunk's new keys
    and values, from the chunk's first position (or, with a sliding window, the start of the
    first key tile its first row sees, if later) to the end of the key tile holding its last
    row's causal limit (clipped at kv_len). The copies of one KV head's query heads write the
    same rows; the model has no cache term and streams them all."""
    return _per_key(_append_rows, q, kv, window, decode_kv_tile(head_dim))[..., 0]


def decode_programs(heads: np.ndarray, kv_heads: np.ndarray) -> np.ndarray:
    """Decode programs per sequence before any key split: one per (KV head, 128 packed
    query rows)."""
    return kv_heads * np.ceil(np.floor_divide(heads, kv_heads) / 128)
