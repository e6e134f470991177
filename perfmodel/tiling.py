"""How kernels cut an operator into tiles and run them in waves over the compute units.

GEMMs: tile padding, wave quantization, split-K and the k-depth ramp (``gemm_efficiency``).
Attention: FlashAttention's decode programs and key splits (flash-decoding), and the useful
share of the tile time of a causal (or sliding-window) prefill (``prefill_tile_fraction``),
including the append-KV variant (``append_kv_splits``, ``append_kv_bytes``).
``roofline.op_time`` turns these efficiencies into time.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from perfmodel.ops import Op, attended_positions
from perfmodel.specs import Hardware

_SPLIT_K_MIN_DEPTH = 256   # split-K slices are at least this deep (k elements)


def _pad(size: float, tile: int) -> tuple[float, int]:
    """Useful fraction of the padded extent when ``size`` is covered by tiles of ``tile``.
    Small sizes use a smaller power-of-two tile (kernels for skinny shapes), down to 16."""
    used = min(tile, max(16, 2 ** math.ceil(math.log2(max(size, 1.0)))))
    return size / (math.ceil(size / used) * used), used


def _gemm_tiles(m: float, n: float, groups: float, hw: Hardware) -> tuple[float, float, float]:
    """(useful share of the padded rows, of the padded columns, output tiles of all groups)."""
    eff = hw.efficiency
    pad_m, tm = _pad(m, eff.gemm_tile_m)
    pad_n, tn = _pad(n, eff.gemm_tile_n)
    return pad_m, pad_n, math.ceil(m / tm) * math.ceil(n / tn) * max(1.0, math.ceil(groups))


def _wave_fill(programs: float, units: int) -> float:
    """Busy share of the units while ``programs`` equal programs run in waves of ``units``
    (the last, partial wave idles the rest)."""
    return programs / (math.ceil(programs / units) * units)


def _split_k(tiles: float, k: float, hw: Hardware) -> int:
    if tiles >= hw.compute_units:
        return 1
    return int(max(1, min(hw.compute_units // tiles, k // _SPLIT_K_MIN_DEPTH)))


def gemm_split_k(m: float, n: float, k: float, groups: float, hw: Hardware) -> int:
    """Split-K factor: when the output tiles cannot fill one wave, k is divided (slices at
    least 256 deep) so more units work; the partial sums then need a reduction pass."""
    return gemm_plan(m, n, k, groups, hw)[1]


def gemm_efficiency(m: float, n: float, k: float, groups: float, hw: Hardware) -> float:
    """Achievable fraction of peak for a GEMM:
    best-shape fraction x tile padding x wave quantization x k-depth ramp.

    Tiles of tile_m x tile_n cover the [m, n] output of each group; tiles run in waves of
    ``compute_units``; the last partial wave idles the rest. When the tiles cannot fill one
    wave, split-K divides k to create more work. Each tile's pipeline prologue/epilogue costs
    about ``gemm_k_half`` k-elements: efficiency x k_slice / (k_slice + gemm_k_half).
    A CPU BLAS (``gemm_m_half`` set) packs each weight panel once and reuses it for the m rows
    instead of padding rows into tiles: m / (m + gemm_m_half) for m > 1 (m = 1 runs as a
    GEMV: no padding, no packing);
    its packed path also slows as the output widens: x gemm_n_half / (gemm_n_half + n).
    """
    return gemm_plan(m, n, k, groups, hw)[0]


def gemm_plan(m: float, n: float, k: float, groups: float,
               hw: Hardware) -> tuple[float, int]:
    """(gemm_efficiency, gemm_split_k), worked out together: op_time needs both."""
    eff = hw.efficiency
    pad_m, pad_n, tiles = _gemm_tiles(m, n, groups, hw)
    split = _split_k(tiles, k, hw)
    wave = _wave_fill(tiles * split, hw.compute_units)
    depth = k / split
    ramp = depth / (depth + eff.gemm_k_half) if eff.gemm_k_half else 1.0
    if eff.gemm_m_half:     # a CPU BLAS: no row tiles
        # panel packing, amortised over the m rows; m = 1 runs as a GEMV, which does not
        # pack (its time is the weight stream: gemv_memory_fraction, gemv_k_half)
        pad_m = m / (m + eff.gemm_m_half) if m > 1 else 1.0
    if eff.gemm_n_half and m > 1:
        pad_n *= eff.gemm_n_half / (eff.gemm_n_half + n)
    return eff.gemm_fraction * pad_m * pad_n * wave * ramp, split


def attention_efficiency(op: Op, hw: Hardware) -> float:
    """FlashAttention compute efficiency: the attention fraction x how much of the device's
    tile time does useful work.

    Decode (q_len = 1): a program holds 128 query rows of one KV head of one sequence; the
    query heads sharing a KV head are packed into those rows (FlashAttention's GQA packing),
    so rows = n_heads / n_kv_heads, padded to a tile. Each program's keys are split over
    ``decode_kv_splits`` programs (flash-decoding), and all of them run in waves over the
    compute units. Without ``attention_decode_pack_gqa`` each query head is its own
    unsplit program (no rows to pad; its KV head's cache is streamed once per query head,
    see ``device_bytes``). Prefill: see ``prefill_tile_fraction``.
    """
    s = op.shape
    if s["q_len"] > 1:
        return hw.efficiency.attention * prefill_tile_fraction(op, hw)
    eff = hw.efficiency
    if not eff.attention_decode_pack_gqa:       # one query head per program, no key split
        return eff.attention * _wave_fill(s["batch"] * s["n_heads"], hw.compute_units)
    blocks = _decode_programs(op) * decode_splits(op, hw)
    pad_q, _ = _pad(s["n_heads"] // s["n_kv_heads"], 128)
    return eff.attention * _wave_fill(blocks, hw.compute_units) * pad_q


def _decode_programs(op: Op) -> int:
    """Decode programs before any KV split: one per (sequence, KV head, 128 packed rows)."""
    s = op.shape
    return s["batch"] * s["n_kv_heads"] * math.ceil(s["n_heads"] // s["n_kv_heads"] / 128)


def decode_splits(op: Op, hw: Hardware) -> int:
    """``decode_kv_splits`` of a decode attention op on ``hw`` (1 where decode programs are
    single query heads, which are not split)."""
    if not hw.efficiency.attention_decode_pack_gqa:
        return 1
    return decode_kv_splits(_decode_programs(op), _decode_keys(op), op.shape["head_dim"],
                            hw.compute_units)


def _decode_keys(op: Op) -> int:
    """Key positions one decode query reads (the window, if any, bounds them)."""
    s = op.shape
    window = int(s.get("window") or 0)
    return max(1, min(int(s["kv_len"]), window) if window else int(s["kv_len"]))


def decode_kv_tile(head_dim: int) -> int:
    """Keys per tile of FlashAttention-2's split-KV (decode) kernel: 256 up to head_dim 64,
    128 up to 128, 64 above (``run_mha_fwd_splitkv_dispatch``)."""
    return 256 if head_dim <= 64 else 128 if head_dim <= 128 else 64


_SPLIT_FULL = 0.8      # programs filling this share of the units are not split
_SPLIT_NEAR_BEST = 0.85
_SPLIT_MAX = 128


@functools.lru_cache(maxsize=4096)
def decode_kv_splits(programs: int, keys: int, head_dim: int, units: int) -> int:
    """How many programs share one (sequence, KV head)'s keys in decode: FlashAttention-2's
    rule (``num_splits_heuristic``). None when the programs already fill 80% of the units;
    otherwise the fewest splits whose last wave is within 85% of the best wave fill, counting
    only split counts that shorten each split (fewer key tiles per split than one split
    fewer). At most min(128, units, key tiles) splits."""
    if programs >= _SPLIT_FULL * units:
        return 1
    tiles = math.ceil(keys / decode_kv_tile(head_dim))
    most = max(1, min(_SPLIT_MAX, units, tiles))
    counts = [n for n in range(1, most + 1)
              if n == 1 or math.ceil(tiles / n) != math.ceil(tiles / (n - 1))]
    fill = {n: _wave_fill(programs * n, units) for n in counts}
    best = max(fill.values())
    return min(n for n in counts if fill[n] >= _SPLIT_NEAR_BEST * best)


def prefill_tile_fraction(op: Op, hw: Hardware) -> float:
    """Useful share of the tile time of a prefill attention.

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
    s = op.shape
    eff = hw.efficiency
    if eff.attention_append_kv:
        return _tile_fraction(op, hw, 1, APPEND_KV_TILE_Q, decode_kv_tile(s["head_dim"]),
                              append_kv_splits(op, hw))
    group = s["n_heads"] // s["n_kv_heads"]
    frac = _tile_fraction(op, hw, 1)
    if eff.attention_pack_gqa and group > 1:
        frac = max(frac, _tile_fraction(op, hw, group))
    return frac


# query rows per program of FlashAttention-2's split-KV kernel (run_mha_fwd_splitkv_dispatch)
APPEND_KV_TILE_Q = 64


def append_kv_splits(op: Op, hw: Hardware) -> int:
    """Key splits of an append-KV prefill (``attention_append_kv``): FlashAttention-2's
    ``num_splits_heuristic`` over its (sequence, query head, 64-row block) programs."""
    s = op.shape
    programs = s["batch"] * s["n_heads"] * math.ceil(s["q_len"] / APPEND_KV_TILE_Q)
    return decode_kv_splits(int(programs), _decode_keys(op), s["head_dim"], hw.compute_units)


def append_kv_bytes(op: Op, hw: Hardware) -> float:
    """Bytes the append-KV prologue moves (0 unless ``attention_append_kv`` and q_len > 1).

    Each (sequence, query head, block of 64 query rows) program copies the chunk's new keys
    and values, from the chunk's first position (or, with a sliding window, the start of the
    first key tile its first row sees, if later) to the end of the key tile holding its last
    row's causal limit (clipped at kv_len), reading each row from the new K/V and writing
    it to the cache: 2 x that many cache positions per program. The copies of one KV head's
    query heads write the same rows; the model has no cache term and streams them all."""
    s = op.shape
    if not hw.efficiency.attention_append_kv or op.kind != "attention" or s["q_len"] <= 1:
        return 0.0
    q, kv = int(s["q_len"]), int(s["kv_len"])
    window = int(s.get("window") or 0)
    start, end = _block_key_tiles(q, kv, window, APPEND_KV_TILE_Q, decode_kv_tile(s["head_dim"]))
    rows = float(np.maximum(np.minimum(end, kv) - np.maximum(start, kv - q), 0).sum())
    kept = min(kv, window or kv)
    per_position = op.bytes.kv_read / (s["batch"] * s["n_kv_heads"] * kept)
    return 2.0 * rows * per_position * s["batch"] * s["n_heads"]


def _block_key_tiles(q: int, kv: int, window: int, span: int,
                     bk: int) -> tuple[np.ndarray, np.ndarray]:
    """Key tiles of each block of ``span`` query positions in a causal prefill of ``q`` new
    tokens on ``kv`` keys: (start of the tile holding the first key its first row sees,
    given a sliding ``window`` (0: none); end of the tile holding its last row's last key)."""
    first_row = kv - q + np.arange(0, q, span)              # 0-based position of each block
    last_key = np.minimum(first_row + span, kv)             # keys seen by its last row
    first_key = np.maximum(first_row + 1 - window, 0) if window else np.zeros_like(first_row)
    return np.floor(first_key / bk) * bk, np.ceil(last_key / bk) * bk


def _tile_fraction(op: Op, hw: Hardware, packed: int, bq: int | None = None,
                   bk: int | None = None, splits: int = 1) -> float:
    """``prefill_tile_fraction`` with ``packed`` query heads per block row set (1: none);
    ``bq`` x ``bk`` tiles (default: the device's), each block's key tiles shared out over
    ``splits`` programs."""
    s = op.shape
    eff = hw.efficiency
    q, kv = int(s["q_len"]), int(s["kv_len"])
    window = int(s.get("window") or 0)
    bq = bq or eff.attention_q_tile(q)
    bk = bk or eff.attention_tile_kv
    start_key, end_key = _block_key_tiles(q, kv, window, max(1, bq // packed), bk)
    if eff.attention_clip_kv:
        end_key = np.minimum(end_key, kv)
    keys = end_key - start_key                              # keys each block computes
    if splits > 1:
        keys = np.ceil(keys / bk / splits) * bk
    programs = s["batch"] * s["n_heads"] // packed * splits
    units = hw.compute_units
    n = programs * len(keys)
    busy = max(float(keys.max()), programs * float(keys.sum()) / units
               + (math.ceil(n / units) - n / units) * float(keys.min()))
    useful = s["batch"] * s["n_heads"] * attended_positions(q, kv, window or None) / bq
    return min(1.0, useful / (units * busy))
