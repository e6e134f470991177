"""Roofline time of attention, as FlashAttention's kernels cut it into programs.

An ``Attention`` instance is one kernel over groups of sequences (a varlen / paged kernel:
a step's prefill chunks and its decodes at different contexts in one launch).

- Decode groups (q_len = 1, and a few new tokens on a longer cache: ``_short``) share one
  pool of programs. With
  ``attention_decode_pack_gqa`` (FlashAttention), a program holds the query heads of one
  KV head of one sequence (``packed_programs``), its rows padded to
  ``attention_decode_tile_q`` (FlashAttention-3 packs a KV group's heads into the rows of
  its kBlockM = 128-row tile for head_dim 128: hopper/tile_size.h, pack_gqa) or, unset, to
  the smallest power of two from 16 up to 128; when the pool fills
  under 80% of the compute units its keys are split (flash-decoding, ``kv_splits`` on the
  pool's program count and its longest sequence's key tiles) and a combine kernel runs.
  Without it (PyTorch's CPU kernel) each query head is its own unsplit program and streams
  its KV head's cache again. The pool's efficiency is useful work over the units' time when
  the programs run longest-first: T = max(longest, total / units + idle share of the last
  wave x shortest); for equal programs that is the wave fill. Each program also does
  ``attention_program_keys`` key positions' worth of work of its own (queries, page table,
  output), whatever its keys.
- Each prefill group has the tile efficiency of ``tiling.prefill_tile_fraction``.
- The parts run one after another: compute time = sum of (FLOPs / (peak x efficiency)) over
  the parts (for one group, the group's own efficiency); memory time = all bytes over the
  bandwidth; time = max of the two, plus the kernel's fixed cost, plus the append-KV
  copies (``attention_append_kv``) before the compute. A split adds its combine kernel at
  the device's generic fixed cost (``kernel_latency_s``), not a second attention kernel's:
  the combine only merges each split's fp32 partial output and log-sum-exp
  (FlashAttention-2 ``flash_fwd_splitkv_combine_kernel``; FlashAttention-3
  ``run_mha_fwd_combine``, launched with programmatic dependent launch on sm90,
  hopper/flash_api.cpp, so its start overlaps the main kernel's tail); aiconfigurator's
  vLLM 0.24 FA3 decode rows grow 1.2 us from 512 keys (unsplit) to 1024 (split)
  (reports/serving/decode_itl.md).
- FP8 compute (an FP8 query, or an FP8 cache a backend casts the query to) runs at the
  FP8 peak, and the cast is a small kernel of its own (``cost.attention_kernels``, which
  also holds the per-backend profiles and their FP8 instantiations).
"""

from __future__ import annotations

from dataclasses import replace
from functools import partial

import numpy as np

from perfmodel.cost import attention_kernels as kernels
from perfmodel.cost.decode_fallback import (
    fallback_efficiency,
    fallback_mask,
    fallback_program_keys,
    fallback_splits,
    xqa_splits,
)
from perfmodel.cost.latent_tiles import flashmla_fill, latent_costs, trtllm_gen_splits
from perfmodel.cost.ops import Attention, attended_positions
from perfmodel.cost.tiling import (
    LATENT_QK_DIM,
    SPLIT_FULL,
    _keys,
    _pad,
    append_kv_rows,
    append_kv_splits,
    decode_kv_tile,
    decode_programs,
    kv_splits,
    latent_attention,
    prefill_tile_fraction,
    splits_settle,
)
from perfmodel.cost.timebase import (
    OpTimes,
    divide,
    finish,
    kind_memory_fraction,
    size_ramp,
)
from perfmodel.specs.hardware import Hardware


def packed_programs(q_len: np.ndarray, heads: np.ndarray, kv_heads: np.ndarray
                    ) -> np.ndarray:
    """Decode programs of one sequence with GQA packing, before any key split: the
    ``q_len`` x heads-per-KV-head query rows of each KV head, in tiles of 128 rows."""
    rows = q_len * np.floor_divide(heads, kv_heads)
    return decode_programs(rows * kv_heads, kv_heads)


def split_tile(hw: Hardware, pool: np.ndarray, head_dim: np.ndarray) -> np.ndarray:
    """Keys per tile of a decode pool of ``pool`` programs whose count sets its key split,
    0 where the split cannot change: without GQA packing (the kernel never splits), or when
    the pool fills the units (``kv_splits`` keeps one split, ``SPLIT_FULL``).

    The one rule of where a decode step's attention time bends as its context grows: its
    key split is a function of ceil(keys / this tile) alone, so the split, and with it the
    efficiency and the fixed cost, changes only between a multiple of the tile and the
    next context. ``decode_pool`` prices by it; ``schedules.decode`` samples its multiples
    to sum the decode steps exactly (tests/test_decode_sum.py holds the two together)."""
    if not hw.efficiency.attention_decode_pack_gqa:
        return np.zeros(np.broadcast_shapes(np.shape(pool), np.shape(head_dim)))
    return np.where(np.asarray(pool) < SPLIT_FULL * hw.compute_units,
                    decode_kv_tile(head_dim), 0)


def split_settles(hw: Hardware) -> int:
    """Key tiles (of ``split_tile``) past which the split no longer changes on ``hw``
    (``tiling.splits_settle``): a decode sum samples the multiples up to here only."""
    return splits_settle(hw.compute_units)


def decode_pool(op: Attention, hw: Hardware, decode: np.ndarray, split_unpacked=None,
                fixed=None) -> tuple[np.ndarray, np.ndarray]:
    """(compute efficiency, key splits) of the decode groups of each instance;
    ``split_unpacked(pool, keys)``: the key splits of an unpacked decode (none: unsplit);
    ``fixed``: each program's own work in key positions, per instance (none: the decode
    kernel's ``attention_decode_program_keys``, or the block's ``attention_program_keys``).
    A packed decode splits as FlashAttention-2 does, or as XQA does where the block sets
    ``attention_decode_splits: xqa`` (``decode_fallback.xqa_splits``)."""
    eff, units = hw.efficiency, hw.compute_units
    keys = _keys(op.kv_len, op.g("window"))
    if eff.attention_decode_pack_gqa:
        rows = op.g("q_len") * np.floor_divide(op.g("n_heads"), op.g("n_kv_heads"))
        programs = op.batch * packed_programs(op.g("q_len"), op.g("n_heads"),
                                              op.g("n_kv_heads")) * decode
        pool = programs.sum(axis=-1)
        tile = split_tile(hw, pool[..., None], op.g("qk_dim"))
        tiles = np.where(tile > 0, np.ceil(keys / np.maximum(tile, 1)), 1.0)
        splits = kv_splits(np.maximum(pool, 1), np.maximum((tiles * decode).max(axis=-1), 1),
                           units)
        if eff.attention_decode_splits == "xqa":    # the engine's own split rule
            splits = xqa_splits(hw, pool, (op.batch * decode).sum(axis=-1),
                                (np.maximum(op.kv_len - 1, 0) * decode).max(axis=-1))
        latent = latent_attention(op) if eff.attention_latent_sched else False
        if eff.attention_latent_sched == "trtllm_gen":   # the latent kernel's own rule
            splits = np.where(latent, trtllm_gen_splits(hw, op, decode), splits)
        work = np.broadcast_to(programs * keys, decode.shape)
        tile_q = decode_row_tile(hw, op.g("qk_dim"), op.g("kv_bytes"))
        fill = np.broadcast_to(_row_fill(rows, tile_q), decode.shape)
        pad = divide((work * fill).sum(axis=-1), work.sum(axis=-1))
    else:
        programs = op.batch * op.g("n_heads") * decode
        pool = programs.sum(axis=-1)
        splits, pad = np.ones(pool.shape), 1.0
        if split_unpacked is not None:
            splits = split_unpacked(pool, (keys * decode).max(axis=-1))
    n = pool * splits
    total = (programs * keys).sum(axis=-1)
    # each program's own work, in key positions
    if fixed is None:
        fixed = eff.attention_decode_program_keys or eff.attention_program_keys
    fixed = np.asarray(fixed, dtype=float)
    if decode.shape[-1] == 1:            # one group: equal programs, the makespan is the waves
        work = keys[..., 0] / splits + fixed
        longest = shortest = work
    else:
        work = keys / splits[..., None] + fixed[..., None]  # per program, in key positions
        longest = (work * decode).max(axis=-1)
        shortest = np.where(decode, work, np.inf).min(axis=-1)
        shortest = np.where(np.isfinite(shortest), shortest, 0.0)
    busy = total + n * fixed
    makespan = np.maximum(longest, busy / units + (np.ceil(n / units) - n / units) * shortest)
    share = divide(total, units * makespan)
    if eff.attention_decode_pack_gqa and eff.attention_latent_sched == "flashmla" \
            and np.any(latent):                     # the latent instances: its scheduler
        own, own_splits = flashmla_fill(hw, op, decode)
        share, splits = np.where(latent, own, share), np.where(latent, own_splits, splits)
    return eff.attention_decode * head_share(hw, op.qk_dim, decode=True) * pad * share, splits


def decode_row_tile(hw: Hardware, qk_dim: np.ndarray, kv_bytes: np.ndarray | float = 2.0
                    ) -> np.ndarray | int:
    """Query rows a decode program's tile pads a KV head's query heads to:
    ``attention_decode_tile_q``, or ``attention_decode_tile_q_fp8`` where it is set and the
    cache is 8-bit, or ``attention_decode_tile_q_latent`` where it is set and the Q/K head is
    MLA's latent (wider than ``LATENT_QK_DIM``); 0: the skinny-shape rule."""
    eff = hw.efficiency
    base = eff.attention_decode_tile_q
    if eff.attention_decode_tile_q_fp8:
        base = np.where(np.asarray(kv_bytes) < 2, eff.attention_decode_tile_q_fp8, base)
    latent = eff.attention_decode_tile_q_latent
    if not latent or latent == eff.attention_decode_tile_q:
        return base
    return np.where(qk_dim > LATENT_QK_DIM, latent, base)


def _row_fill(rows: np.ndarray, tile: np.ndarray | int) -> np.ndarray:
    """Useful share of the padded rows: ``rows`` in tiles of ``tile``, or where ``tile`` is
    0 the smallest power of two from 16 to 128 (``tiling._pad``, computed only then)."""
    size = np.maximum(tile, 1)
    fill = rows / (np.ceil(rows / size) * size)
    if np.any(np.asarray(tile) == 0):
        fill = np.where(np.asarray(tile) > 0, fill, _pad(rows, 128)[0])
    return fill


def head_share(hw: Hardware, head_dim: np.ndarray, decode: bool = False
               ) -> np.ndarray | float:
    """MMA share of an attention program's time: head_dim / (head_dim +
    ``attention_head_dim_half``). Each score needs 4 x head_dim MMA FLOPs (QK^T and PV) but
    also an exp, a max and a rescale on the SFU / FP32 pipes whatever head_dim, which the
    kernel overlaps only in part (FlashAttention-3: 989 TFLOP/s of MMA against 3.9 TFLOP/s
    of exp on an H100 SXM, so at head_dim 128 the exps alone take half the MMA time; Shah et
    al. 2024, section 3.1); a smaller head_dim spends a larger share on them. Off at 0."""
    half = hw.efficiency.attention_head_dim_half
    if decode and hw.efficiency.attention_decode_head_dim_half:
        half = hw.efficiency.attention_decode_head_dim_half
    return head_dim / (head_dim + half) if half else 1.0


_SHAPE = ("batch", "n_heads", "n_kv_heads", "qk_dim", "q_len", "kv_len", "window", "causal")


def _at(op: Attention, mask: np.ndarray, names: tuple[str, ...]) -> dict[str, np.ndarray]:
    """Fields ``names`` of the groups where ``mask`` holds (one entry per such group)."""
    idx = np.nonzero(mask)
    return {name: np.broadcast_to(op.g(name), mask.shape)[idx] for name in names}


def _prefill_efficiency(op: Attention, hw: Hardware, prefill: np.ndarray) -> np.ndarray:
    """Tile efficiency of each prefill group (1 elsewhere), computed where there is one.
    A few groups are looked up by shape in a table kept on the device (the fraction is a
    pure function of seven integers), many are computed together."""
    out = np.ones(prefill.shape)
    if not prefill.any():
        return out
    idx = np.nonzero(prefill)
    full = list(_at(op, prefill, _SHAPE).values())
    if len(full[0]) > 16:
        out[idx] = _tile_efficiency(hw, *full)
        return out
    memo = hw.memo.setdefault("prefill_efficiency", {})
    keys = list(zip(*(f.tolist() for f in full), strict=True))
    missing = [k for k in dict.fromkeys(keys) if k not in memo]
    if missing:
        values = _tile_efficiency(hw, *(np.array(c) for c in zip(*missing, strict=True)))
        memo.update(zip(missing, values.tolist(), strict=True))
    out[idx] = [memo[k] for k in keys]
    return out


def _tile_efficiency(hw: Hardware, batch: np.ndarray, heads: np.ndarray, kv_heads: np.ndarray,
                     head_dim: np.ndarray, q: np.ndarray, kv: np.ndarray,
                     window: np.ndarray, causal: np.ndarray) -> np.ndarray:
    attended = attended_positions(q, kv, window, causal=causal)
    return hw.efficiency.attention * head_share(hw, head_dim) * prefill_tile_fraction(
        hw, batch, heads, kv_heads, head_dim, q, kv, window, attended, causal)


def _append_kv(op: Attention, hw: Hardware, prefill: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray]:
    """(bytes the append-KV prologue copies, whether its kernel splits) per instance."""
    idx = np.nonzero(prefill)
    full = _at(op, prefill, ("batch", "q_len", "kv_len", "n_heads", "qk_dim", "window",
                             "cache_elems", "kv_bytes", "kv_from_cache"))
    rows = append_kv_rows(full["qk_dim"], full["q_len"], full["kv_len"], full["window"])
    per_position = np.where(full["kv_from_cache"].astype(bool),
                            full["cache_elems"] * full["kv_bytes"], 0.0)
    copies = np.zeros(prefill.shape)
    copies[idx] = 2.0 * rows * per_position * full["batch"] * full["n_heads"]
    split = np.zeros(prefill.shape, dtype=bool)
    split[idx] = append_kv_splits(hw, full["batch"], full["n_heads"], full["qk_dim"],
                                  full["q_len"], full["kv_len"], full["window"]) > 1
    return copies.sum(axis=-1), split.any(axis=-1)


def _restreamed(op: Attention, decode: np.ndarray) -> np.ndarray:
    """KV bytes read again when each decode query head is its own program (no GQA packing):
    every further query head of a group streams its KV head's cache once more."""
    group = np.floor_divide(op.g("n_heads"), op.g("n_kv_heads"))
    return (op.group_bytes().kv_read * (group - 1) * decode).sum(axis=-1)


def _fallback(op: Attention, hw: Hardware, decode: np.ndarray, rate: np.ndarray,
              group_eff: np.ndarray) -> np.ndarray:
    """``group_eff`` with the decode groups the engine runs on its fallback kernel
    (``cost.decode_fallback``) at that kernel's efficiency: one program per query head, its
    pool's waves as ``decode_pool`` prices an unpacked decode with the fallback's own work
    per program (``fallback_program_keys``), at the fallback's share of the fp32 peak."""
    fallback = fallback_mask(op, hw, decode)
    if not fallback.any():
        return group_eff
    eff = hw.efficiency
    unpacked = replace(hw, efficiency=replace(eff, attention_decode_pack_gqa=False))
    splits = partial(fallback_splits, hw, op.qk_dim)
    fixed = fallback_program_keys(hw, op.qk_dim)
    waves = divide(decode_pool(op, unpacked, fallback, splits, fixed)[0],
                   eff.attention_decode * head_share(hw, op.qk_dim, decode=True))
    own = fallback_efficiency(hw, rate) * waves
    return np.where(fallback, own[..., None], group_eff)


def _call_latency(eff, decode: np.ndarray, prefill: np.ndarray) -> np.ndarray | float:
    """Fixed cost of each instance's call: the attention call's (``kernel_latency_s``
    .attention), or where the engine decodes with a kernel of its own
    (``attention_decode_latency_s``) that one's for its decode groups and the call's for
    its prefill groups, added where an instance has both."""
    own = eff.attention_decode_latency_s
    if not own:
        return eff.latency_for("attention")
    return own * decode.any(axis=-1) + eff.latency_for("attention") * prefill.any(axis=-1)


def _query_elems(op: Attention) -> np.ndarray:
    """Query elements of each instance (new tokens x heads x Q/K head width)."""
    return (op.batch * op.q_len * op.g("n_heads") * op.g("qk_dim")).sum(axis=-1)


SHORT_Q = 16    # new tokens per sequence up to which a group on a cache runs as decode


def _short(op: Attention, hw: Hardware) -> np.ndarray:
    """Groups of a few new tokens (up to ``SHORT_Q``) attending a longer cache: speculative
    verification, a prefix-cache hit's tail, a small chunk. Their kernels pack the q_len x
    group query rows of a KV head like decode and split the keys (FlashMLA for MLA's spec
    tokens; FlashAttention-3's PackGQA with its split-KV scheduler; vLLM sends requests of
    up to 1 + num_speculative_tokens new tokens down its decode path), so they join the
    decode pool instead of filling one 128-row prefill tile per head with 2 rows and one
    program per sequence. A plain prefill (q_len = kv_len) keeps its prefill tiles."""
    if not hw.efficiency.attention_decode_pack_gqa:
        return np.zeros(np.shape(op.batch), dtype=bool)
    return (op.q_len > 1) & (op.q_len <= SHORT_Q) & (op.q_len < op.kv_len)


def attention_time(op: Attention, hw: Hardware, timing: np.ndarray | int) -> OpTimes:
    """Times of every ``Attention`` instance (see the module docstring); a call that
    computes in FP8 on the FP8 profile of the device's backend where it has one
    (``attention_kernels.fp8_view``), and MLA's absorbed decode on the block's
    ``attention_latent_kernel`` where it names one."""
    name = hw.efficiency.attention_latent_kernel
    if not name:
        return _backend_time(op, hw, timing)
    latent = latent_attention(op)
    if not latent.any():
        return _backend_time(op, hw, timing)
    own = _backend_time(op, kernels.for_kernel(hw, name), timing)
    return own if latent.all() else kernels.blend(latent, own, _backend_time(op, hw, timing))


def _backend_time(op: Attention, hw: Hardware, timing: np.ndarray | int) -> OpTimes:
    """``attention_time`` on ``hw``'s backend, its FP8 calls on its FP8 profile."""
    fp8_hw = kernels.fp8_view(hw)
    if fp8_hw is hw:
        return _attention_time(op, hw, timing)
    fp8 = np.broadcast_to(kernels.fp8_compute(hw, op.act_bytes, op.kv_bytes),
                          np.shape(op.batch)[:-1])
    if fp8.all():
        return _attention_time(op, fp8_hw, timing)
    if not fp8.any():
        return _attention_time(op, hw, timing)
    return kernels.blend(fp8, _attention_time(op, fp8_hw, timing),
                         _attention_time(op, hw, timing))


def _attention_time(op: Attention, hw: Hardware, timing: np.ndarray | int) -> OpTimes:
    eff = hw.efficiency
    active = op.batch > 0
    decode = active & ((op.q_len == 1) | _short(op, hw))
    prefill = active & ~decode
    flops = op.group_flops()
    any_decode, any_prefill = decode.any(), prefill.any()
    rate = kernels.rate(hw, op.dtype, op.act_bytes, op.kv_bytes)
    if any_decode:
        pool_eff, splits = decode_pool(op, hw, decode)
        group_eff = pool_eff[..., None]
        if any_prefill:
            group_eff = np.where(decode, group_eff, _prefill_efficiency(op, hw, prefill))
    else:
        group_eff = _prefill_efficiency(op, hw, prefill)
    if any_decode and eff.attention_fallback_fraction:   # groups the decode kernel refuses
        group_eff = _fallback(op, hw, decode, rate, group_eff)
    compute_s = divide(flops, rate[..., None] * group_eff).sum(axis=-1)
    c_eff = divide(op.flops, rate * compute_s)
    nbytes = op.bytes.total
    if any_decode and not eff.attention_decode_pack_gqa:
        nbytes = nbytes + _restreamed(op, decode)
    combine = (splits > 1) & decode.any(axis=-1) if any_decode else False
    cta_s = 0.0
    if any_decode and eff.attention_latent_cta_rows:    # trtllm-gen MLA's CTAs (latent_tiles)
        extra, cta_s, own = latent_costs(op, hw, decode, splits)
        nbytes, combine = nbytes + extra, combine & ~own
    m_eff = kind_memory_fraction("attention", hw) * size_ramp(nbytes, hw)
    memory_s = divide(nbytes, hw.memory_bytes_per_s * m_eff)
    body_s = np.maximum(compute_s, memory_s)
    if eff.attention_append_kv and any_prefill:     # each program copies before it computes
        copies, append_split = _append_kv(op, hw, prefill)
        append_s = copies / (hw.memory_bytes_per_s * m_eff)
        memory_s = memory_s + append_s
        body_s = body_s + append_s
        combine = combine | append_split
    cast = kernels.q_cast_bytes(hw, _query_elems(op), op.act_bytes, op.kv_bytes)
    if np.any(cast):            # the backend's query cast: a kernel of its own, before
        cast_s = cast / (hw.memory_bytes_per_s * m_eff)
        memory_s, body_s = memory_s + cast_s, body_s + cast_s
    # a split's combine and a query cast are small kernels of their own (module docstring)
    fixed_s = _call_latency(eff, decode, prefill) + eff.kernel_latency_s * (combine + (cast > 0)) \
        + cta_s
    return finish(op, hw, timing, compute_s, memory_s, body_s, fixed_s, c_eff,
                  m_eff * np.ones(np.shape(compute_s)))
