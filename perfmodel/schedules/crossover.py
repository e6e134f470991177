"""Models set against one another as the context grows: KV cache per sequence and the decode
step, and the contexts where one model's curve crosses another's.

Two quantities per model and context c (the positions a sequence holds):

- ``kv_bytes_per_sequence``: ``memory.kv_bytes_per_sequence`` of the whole model (windows,
  chunks and paging applied);
- ``decode_step_s``: one decode step of ``batch`` sequences at context c
  (``Step.uniform(batch, 1, c)`` through ``price_step``, the decode phase's timing).

A crossover of model B against the reference A is the smallest integer context where
sign(B - A) turns to the other nonzero sign (equal stretches carry the sign before them):
found on a grid, then pinned to the integer by bisection over the same functions. Where a
hybrid (windowed or chunked layers) holds less than full attention past some length, that
length is its crossover.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from perfmodel.cost.memory import kv_bytes_of, kv_bytes_per_sequence
from perfmodel.cost.step import Dtypes, Step, price_step
from perfmodel.schedules.static import phase_timing
from perfmodel.specs.hardware import Hardware
from perfmodel.specs.model import Model
from perfmodel.specs.workload import Parallelism, Workload, Workloads

QUANTITIES = ("kv_bytes_per_sequence", "decode_step_s")


def curve(model: Model, hw: Hardware, base: Workload, plan: Parallelism,
          quantity: str) -> Callable[[np.ndarray], np.ndarray]:
    """``quantity`` of ``model`` as a function of contexts (an integer array)."""
    w = Workloads.from_list([base])
    if quantity == "kv_bytes_per_sequence":
        kvb = kv_bytes_of(model, w)
        return lambda c: kv_bytes_per_sequence(model, 1, kvb, np.asarray(c, dtype=float),
                                               base.kv_block_tokens)
    if quantity != "decode_step_s":
        raise ValueError(f"quantity must be one of {', '.join(QUANTITIES)}, got {quantity!r}")
    timing = phase_timing(hw, "decode", w.cuda_graphs)[0]

    def step_s(c: np.ndarray) -> np.ndarray:
        c = np.asarray(c, dtype=np.int64)
        d = Dtypes.of_workloads(w).take(np.zeros(len(c), dtype=int))
        return price_step(model, hw, plan, Step.uniform(base.batch, 1, c,
                                                        expert_skew=base.expert_skew),
                          d, timing).time
    return step_s


def crossings(diff: Callable[[np.ndarray], np.ndarray], lo: int, hi: int,
              points: int = 64) -> list[int]:
    """Smallest integer contexts in [lo, hi] where sign(diff) turns to the other nonzero
    sign (see the module docstring); ``points`` geometric grid points, then bisection."""
    grid = np.unique(np.geomspace(lo, hi, points).round().astype(np.int64))
    sign = _carried(np.sign(diff(grid)))
    out = []
    for i in np.flatnonzero((sign[1:] != sign[:-1]) & (sign[:-1] != 0)):
        a, b, before = int(grid[i]), int(grid[i + 1]), sign[i]
        while b - a > 1:                  # invariant: sign at a is ``before``, at b not
            mid = (a + b) // 2
            s = np.sign(diff(np.array([mid]))[0])
            a, b = (mid, b) if s == before or s == 0 else (a, mid)
        out.append(b)
    return out


def _carried(sign: np.ndarray) -> np.ndarray:
    """Zeros replaced by the last nonzero sign before them (leading zeros stay 0)."""
    idx = np.where(sign != 0, np.arange(len(sign)), 0)
    return sign[np.maximum.accumulate(idx)]


def context_curves(models: Sequence[Model], hw: Hardware, contexts: Sequence[int],
                   base: Workload, plan: Parallelism) -> list[dict]:
    """One row per model and context: model, context, and each of ``QUANTITIES``."""
    c = np.asarray(list(contexts), dtype=np.int64)
    out = []
    for m in models:
        values = {q: curve(m, hw, base, plan, q)(c) for q in QUANTITIES}
        out += [{"model": m.name, "context": int(x)} | {q: float(values[q][i])
                                                         for q in QUANTITIES}
                for i, x in enumerate(c)]
    return out


CROSSOVER_COLUMNS = ("model", "reference", "quantity", "context", "value", "below_after")


def crossovers(models: Sequence[Model], hw: Hardware, base: Workload, plan: Parallelism,
               lo: int, hi: int) -> list[dict]:
    """Where each model's curves cross the first model's in [lo, hi]: rows of model,
    reference, quantity, context, value (the reference's there) and ``below_after`` (the
    model holds or takes less than the reference from the crossing on)."""
    ref, out = models[0], []
    for m in models[1:]:
        for q in QUANTITIES:
            a, b = curve(ref, hw, base, plan, q), curve(m, hw, base, plan, q)
            def diff(c: np.ndarray, a=a, b=b) -> np.ndarray:
                return b(c) - a(c)
            out += [{"model": m.name, "reference": ref.name, "quantity": q, "context": c,
                     "value": float(a(np.array([c]))[0]),
                     "below_after": bool(diff(np.array([c]))[0] < 0)}
                    for c in crossings(diff, lo, hi)]
    return out


__all__ = ["CROSSOVER_COLUMNS", "QUANTITIES", "context_curves", "crossings", "crossovers", "curve"]
