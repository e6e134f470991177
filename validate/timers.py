"""Timing discipline: warm-up, synchronisation, repeats, median and spread, cold caches.

A kernel is a callable ``call(i)`` that runs invocation number ``i`` on input set
``i % n_sets``; the sets together exceed the last-level cache (``rotation_sets``), so a call
never finds its inputs left in cache by the previous one. One sample times ``inner``
back-to-back calls and divides (so that sub-microsecond clocks and per-sample costs vanish);
the result is the median over samples, with their standard deviation and range.

CPU: ``time.perf_counter`` around synchronous calls. CUDA: events recorded on the stream
around the calls, then ``synchronize`` (the CPU clock would only see launches).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from validate.device import DeviceInfo, synchronize


@dataclass(frozen=True)
class Timing:
    """Seconds per call: median and spread over ``repeats`` samples of ``inner`` calls."""

    median_s: float
    std_s: float
    min_s: float
    max_s: float
    repeats: int
    inner: int


def stats(samples: Sequence[float], inner: int = 1) -> Timing:
    """Median, sample standard deviation (0 for one sample), min and max of ``samples``."""
    if not samples:
        raise ValueError("no timing samples")
    std = statistics.stdev(samples) if len(samples) > 1 else 0.0
    return Timing(statistics.median(samples), std, min(samples), max(samples), len(samples),
                  inner)


def rotation_sets(set_bytes: float, llc_bytes: float, *, factor: float = 2.0,
                  max_sets: int = 512, max_total_bytes: float = 1.5e9) -> int:
    """Input sets to rotate through so that together they exceed ``factor`` x the LLC.

    At least 2 (consecutive calls never share inputs), at most ``max_sets`` and no more than
    ``max_total_bytes`` of inputs in all (one set is always allowed).
    """
    per = max(float(set_bytes), 1.0)
    want = math.ceil(factor * llc_bytes / per)
    cap = max(1, int(max_total_bytes // per))
    return max(1, min(max(2, want), max_sets, cap))


def _clock(dev: DeviceInfo) -> Callable[[Callable[[int], object], int, int], float]:
    """A function timing ``inner`` calls starting at index ``start``: seconds per call."""
    if dev.kind == "cuda":
        import torch

        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

        def gpu(call: Callable[[int], object], start: int, inner: int) -> float:
            begin.record()
            for j in range(inner):
                call(start + j)
            end.record()
            end.synchronize()
            return begin.elapsed_time(end) * 1e-3 / inner

        return gpu

    def cpu(call: Callable[[int], object], start: int, inner: int) -> float:
        t0 = time.perf_counter()
        for j in range(inner):
            call(start + j)
        return (time.perf_counter() - t0) / inner

    return cpu


def measure(call: Callable[[int], object], dev: DeviceInfo, *, repeats: int = 21,
            min_repeats: int = 5, warmup_s: float = 0.02, sample_s: float = 5e-4,
            budget_s: float = 1.0) -> Timing:
    """Time ``call`` after a warm-up; ``repeats`` samples, fewer (>= ``min_repeats``) when
    one sample would take more than its share of ``budget_s``."""
    clock = _clock(dev)
    synchronize(dev)
    clock(call, 0, 1)                        # first call: allocation, JIT, page faults
    warm: list[float] = []
    while len(warm) < 2 or sum(warm) < warmup_s:
        warm.append(clock(call, len(warm) + 1, 1))
    index, per_call = len(warm) + 1, statistics.median(warm)
    inner = max(1, round(sample_s / max(per_call, 1e-9)))
    n = max(min_repeats, min(repeats, int(budget_s / (inner * per_call))))
    samples = []
    for _ in range(n):
        synchronize(dev)
        samples.append(clock(call, index, inner))
        index += inner
    return stats(samples, inner)
