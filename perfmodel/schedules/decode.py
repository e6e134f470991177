"""The decode steps of a request, summed exactly: contexts S+1 ... S+G-1 for N configurations.

Only the context operators (attention, MLA's form-dependent projections) change from step
to step; the others are priced once and multiplied by the step count. A context operator's
time is piecewise linear in the context: its FLOPs and bytes grow linearly (until a window
is full), its efficiency changes only where the flash-decoding split can (past multiples of
``cost.attention.split_tile``, the pricing's own rule, not re-derived here), and the
roofline's max() terms bend where compute meets memory, where
the device time meets the launch overhead and where the bound label changes. Between such
points the sum over integer contexts is exact from the end points,
sum_{c=a}^{b} f(c) = (b - a + 1) (f(a) + f(b)) / 2, which is a weighted sum over the points
(``_weights``). So decode is priced at the structural points (``_samples``), the bends are
found on the lines between them (``_bends``), and, where one falls inside a segment, priced
again with them. Where the time is not piecewise linear (a calibrated bandwidth ramp,
``memory_half_bytes``, or an MLA form that changes inside the range) every context is priced.
"""

from __future__ import annotations

import itertools

import numpy as np

from perfmodel.cost.attention import packed_programs, split_tile
from perfmodel.cost.layers import AttentionSpec, mla_absorbed, step_template
from perfmodel.cost.ops import ByteCounts
from perfmodel.cost.step import Dtypes, Step, StepCost, composed_seconds, price_step
from perfmodel.cost.timebase import BOUNDS
from perfmodel.schedules.phases import PhaseCost
from perfmodel.specs.hardware import Hardware
from perfmodel.specs.model import Model
from perfmodel.specs.workload import Parallelism, Workloads


def _ranges(owner: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(owner, value) for every integer of each inclusive range [lo, hi] (empty if hi < lo)."""
    n = np.maximum(hi - lo + 1, 0)
    starts = np.repeat(lo - (np.cumsum(n) - n), n)
    return np.repeat(owner, n), starts + np.arange(n.sum())


def _every_context(model: Model, hw: Hardware, c0: np.ndarray, c1: np.ndarray) -> np.ndarray:
    """Configurations whose decode time is not piecewise linear in the context."""
    if hw.efficiency.memory_half_bytes:
        return np.ones(len(c0), dtype=bool)
    if model.mla is not None:
        one = np.ones(len(c0), dtype=int)
        return mla_absorbed(model, one, c0) != mla_absorbed(model, one, c1)
    return np.zeros(len(c0), dtype=bool)


def _samples(model: Model, hw: Hardware, plan: Parallelism, w: Workloads, c0: np.ndarray,
             c1: np.ndarray, live: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sorted distinct (configuration, context) points: both ends, every context where the
    time is not piecewise linear, the two sides of each key-tile boundary where a split may
    change, and of each window's and chunk's end."""
    full = live & _every_context(model, hw, c0, c1)
    rest = np.flatnonzero(live & ~full)
    every_cfg, every_ctx = _ranges(np.flatnonzero(full), c0[full], c1[full])
    cfg, ctx = [rest, rest, every_cfg], [c0[rest], c1[rest], every_ctx]
    specs = [s for s in step_template(model, plan.tp, plan.ep, plan.attention_dp)
             if isinstance(s, AttentionSpec)]
    for s in specs:       # the key split changes only past a multiple of split_tile
        tile = split_tile(hw, w.batch[rest] * packed_programs(1, s.heads, s.kv_heads),
                          s.qk_dim).astype(np.int64)
        split = tile > 0
        own, lo, hi, tile = rest[split], c0[rest][split], c1[rest][split], tile[split]
        who, m = _ranges(own, -(-lo // tile), (hi - 1) // tile)
        step = np.repeat(tile, np.maximum((hi - 1) // tile - -(-lo // tile) + 1, 0))
        cfg += [who, who]
        ctx += [m * step, m * step + 1]
    for window in {s.window for s in specs if s.window}:
        inside = (c0[rest] <= window) & (window < c1[rest])
        cfg += [rest[inside]] * 2
        ctx += [np.full(inside.sum(), window), np.full(inside.sum(), window + 1)]
    for chunk in {s.chunk for s in specs if s.chunk}:   # the keys drop to 1 past each chunk
        who, m = _ranges(rest, -(-c0[rest] // chunk), (c1[rest] - 1) // chunk)
        cfg += [who, who]
        ctx += [m * chunk, m * chunk + 1]
    return _unique(np.concatenate(cfg), np.concatenate(ctx))


def _unique(cfg: np.ndarray, ctx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct (configuration, context) pairs, sorted."""
    span = int(ctx.max()) + 2 if len(ctx) else 1
    key = np.sort(cfg.astype(np.int64) * span + ctx)
    key = key[np.r_[True, key[1:] != key[:-1]]] if len(key) else key
    return key // span, key % span


def _bends(cfg: np.ndarray, ctx: np.ndarray, cost: StepCost,
           hw: Hardware) -> tuple[np.ndarray, np.ndarray]:
    """Points on both sides of each bend inside a segment between consecutive samples: where
    compute time meets memory time, or either meets the launch overhead minus the fixed
    cost, the fixed cost, half the launch overhead or their sum (where the time's max()
    terms switch or the bound label changes)."""
    pairs = np.flatnonzero((cfg[1:] == cfg[:-1]) & (ctx[1:] - ctx[:-1] >= 2))
    if not len(pairs):
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    ends = (pairs, pairs + 1)
    comp = [cost.compute_s[:, e] for e in ends]
    mem = [cost.memory_s[:, e] for e in ends]
    fixed, launch = cost.fixed_s[:, pairs], hw.efficiency.launch_overhead_s
    levels = np.stack([launch - fixed, fixed, np.full(fixed.shape, launch / 2), fixed + launch])
    # each line's value at the segment's two ends: (lines, operators, pairs)
    lo, hi = (np.concatenate([(c - m)[None], c[None] - levels, m[None] - levels])
              for c, m in zip(comp, mem, strict=True))
    with np.errstate(divide="ignore", invalid="ignore"):
        frac = lo / (lo - hi)          # a line from lo at a to hi at b crosses 0 there
    inside = (cost.count[:, pairs] > 0) & (lo * hi < 0) & (frac > 0) & (frac < 1)
    _, _, at = np.nonzero(inside)
    if not len(at):
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    a, b = ctx[pairs][at], ctx[pairs + 1][at]
    x = np.floor(a + (b - a) * frac[inside])
    owner = cfg[pairs][at]
    return (np.concatenate([owner, owner]),
            np.concatenate([np.clip(x, a, b), np.clip(x + 1, a, b)]).astype(np.int64))


def _weights(cfg: np.ndarray, ctx: np.ndarray) -> np.ndarray:
    """Each point once, plus half of the integer contexts strictly between it and each
    neighbour of the same configuration (exact for a function linear between points)."""
    w = np.ones(len(ctx))
    inner = np.where(cfg[1:] == cfg[:-1], ctx[1:] - ctx[:-1] - 1, 0) / 2.0
    w[:-1] += inner
    w[1:] += inner
    return w


def _price(model: Model, hw: Hardware, plan: Parallelism, w: Workloads, dtypes: Dtypes,
           timing: np.ndarray, cfg: np.ndarray, ctx: np.ndarray) -> StepCost:
    step = Step.uniform(w.batch[cfg], np.ones(len(cfg), dtype=np.int64), ctx,
                        expert_skew=w.expert_skew[cfg])
    return price_step(model, hw, plan, step, dtypes.take(cfg), timing[cfg], part="context")


# points priced per call: bounds the memory of a grid of 10^5 long generations (a StepCost
# holds 16 fields x operators x points)
CHUNK_POINTS = 500_000


def _chunks(cfg: np.ndarray) -> list[slice]:
    """Runs of whole configurations of about ``CHUNK_POINTS`` points each."""
    starts = np.flatnonzero(np.r_[True, cfg[1:] != cfg[:-1]])
    holding = np.searchsorted(starts, np.arange(0, len(cfg), CHUNK_POINTS), side="right") - 1
    firsts = starts[holding]         # sorted: drop repeats without np.unique (it loads np.ma)
    edges = [*firsts[np.r_[True, firsts[1:] != firsts[:-1]]].tolist(), len(cfg)]
    return [slice(a, b) for a, b in itertools.pairwise(edges)]


def _context_sums(model: Model, hw: Hardware, plan: Parallelism, w: Workloads,
                  dtypes: Dtypes, timing: np.ndarray, cfg: np.ndarray, ctx: np.ndarray,
                  out: np.ndarray, last: np.ndarray) -> tuple:
    """Price the context operators at the points of some configurations (adding the points
    on both sides of every bend) and add their weighted sums into ``out`` (fields x
    operators x N) and the last point's time into ``last``; returns the context cost's
    template positions."""
    cost = _price(model, hw, plan, w, dtypes, timing, cfg, ctx)
    more = _bends(cfg, ctx, cost, hw)
    if len(more[0]):
        cfg, ctx = _unique(np.concatenate([cfg, more[0]]), np.concatenate([ctx, more[1]]))
        cost = _price(model, hw, plan, w, dtypes, timing, cfg, ctx)
    weights = _weights(cfg, ctx)
    starts = np.flatnonzero(np.r_[True, cfg[1:] != cfg[:-1]])
    owners = cfg[starts]
    labels = [np.where(cost.bound == b, cost.time_s, 0.0) for b in range(len(BOUNDS))]
    stacked = np.stack([cost.time_s, cost.flops, *cost.bytes.astuple(), cost.dequant_s,
                        *labels])
    out[:, :, owners] = np.add.reduceat(stacked * weights, starts, axis=-1)
    last[:, owners] = cost.time_s[:, np.r_[starts[1:], len(cfg)] - 1]
    return tuple(cost.positions.tolist())


def decode_phase(model: Model, hw: Hardware, plan: Parallelism, w: Workloads, dtypes: Dtypes,
                 timing: np.ndarray, first: StepCost) -> PhaseCost:
    """The G - 1 decode steps of every configuration; ``first`` prices all operators of the
    first step (context S + 1) at ``timing`` (codes per configuration)."""
    n = len(w)
    steps = w.gen_len - 1
    c0 = w.prompt_len + 1
    c1 = c0 + np.maximum(steps, 1) - 1
    live = steps >= 1
    template = step_template(model, plan.tp, plan.ep, plan.attention_dp)
    context = [r for r, p in enumerate(first.positions.tolist()) if template[p].context]
    time = first.time_s * steps
    dequant = first.dequant_s * steps
    flops = first.flops * steps
    nbytes = [b * steps for b in first.bytes.astuple()]
    bound = first.bound.copy()
    static_step = np.delete(first.time_s, context, axis=0).sum(axis=0)
    last_step = first.time.copy()
    if live.any() and context:
        cfg, ctx = _samples(model, hw, plan, w, c0, c1, live)
        sums = np.zeros((8 + len(BOUNDS), len(context), n))
        last = np.zeros((len(context), n))
        for part in _chunks(cfg):
            positions = _context_sums(model, hw, plan, w, dtypes, timing, cfg[part], ctx[part],
                                      sums, last)
        row = dict(zip(first.positions.tolist(), range(len(first.names)), strict=True))
        context = [row[p] for p in positions]    # the context cost's order
        time[context] = sums[0]
        flops[context] = sums[1]
        for j in range(5):
            nbytes[j][context] = sums[2 + j]
        dequant[context] = sums[7]
        bound[context] = np.where(live, sums[8:].argmax(axis=0), bound[context])
        last_step = np.where(live, static_step + last.sum(axis=0), last_step)
    # the band's composition term: the first step's graph fixed cost for each step (a
    # kernel's fixed cost changes with the context only where a split adds a combine)
    composed = composed_seconds(first, timing) * np.maximum(steps, 0)
    return PhaseCost("decode", np.maximum(steps, 0), first.names, first.kinds, first.classes,
                     first.positions, first.count, time, flops, ByteCounts(*nbytes), bound,
                     first.time, last_step, first.time_s, dequant, first.error_codes,
                     composed)
