"""What every roofline rule shares: the result record, the timing and bound codes, peak
rates per dtype code, the safe division, the bandwidth ramp and the closing step that adds
fixed costs and host launches (``finish``). See ``roofline`` for the formula."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from perfmodel.cost.ops import OpRecord
from perfmodel.specs.dtypes import DTYPES
from perfmodel.specs.errors import SpecError
from perfmodel.specs.hardware import Hardware

TIMINGS = ("kernel", "stream", "host", "graph")
KERNEL, STREAM, HOST, GRAPH = 0, 1, 2, 3
BOUNDS = ("compute", "memory", "overhead", "communication", "idle")
COMPUTE, MEMORY, OVERHEAD, COMMUNICATION, IDLE = 0, 1, 2, 3, 4


@dataclass(frozen=True)
class OpTimes:
    """Times of every instance of a record, and why: which term won (``bound``, a code into
    ``BOUNDS``). Per instance except ``time_s``, which covers all ``count`` instances."""

    compute_s: np.ndarray      # at achievable compute
    memory_s: np.ndarray       # at achievable bandwidth (the link for collectives)
    fixed_s: np.ndarray        # device fixed cost: kernel latency x kernels
    overhead_s: np.ndarray     # time beyond the body: fixed cost, or launch when it dominates
    time_s: np.ndarray         # all instances
    bound: np.ndarray
    compute_efficiency: np.ndarray
    memory_efficiency: np.ndarray
    # of ``time_s``, the seconds a weight-only GEMM's in-kernel conversion adds (``dequant``)
    dequant_s: np.ndarray | float = 0.0

    def bound_name(self, i: int = 0) -> str:
        return BOUNDS[int(np.ravel(self.bound)[i])]


def timing_code(timing: str | np.ndarray | int) -> np.ndarray | int:
    """A timing name (kernel | stream | host) or an array of codes, as codes."""
    if isinstance(timing, str):
        if timing not in TIMINGS:
            raise SpecError(f"--timing: expected one of {', '.join(TIMINGS)}, got {timing!r}")
        return TIMINGS.index(timing)
    if isinstance(timing, (int, np.integer)):
        return int(timing)
    return np.asarray(timing)


def peak(hw: Hardware, dtype: np.ndarray | int) -> np.ndarray:
    """Dense peak FLOP/s of ``hw`` for every dtype code (``Hardware.peak``'s fallbacks);
    SpecError for a dtype it has no rate for."""
    table = hw.peak_table()
    out = table[dtype]
    if np.isnan(out).any():
        hw.peak(DTYPES[int(np.ravel(dtype)[np.flatnonzero(np.isnan(np.ravel(out)))[0]])])
    return out


def divide(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """num / den, and 0 where num is 0 (no FLOPs or no bytes: no time)."""
    num = np.asarray(num, dtype=float)
    return np.where(num != 0, num / np.where(num != 0, den, 1.0), 0.0)


def size_ramp(nbytes: np.ndarray, hw: Hardware) -> np.ndarray | float:
    """Bandwidth efficiency factor b / (b + memory_half_bytes) (1 when off)."""
    half = hw.efficiency.memory_half_bytes
    return nbytes / (nbytes + half) if half else 1.0


def kind_memory_fraction(kind: str, hw: Hardware, units: np.ndarray | None = None
                         ) -> np.ndarray | float:
    """Streaming fraction of a ``kind`` kernel: its own or the shared fraction, capped by
    its per-unit rate (``kernel_unit_bytes_per_s`` x the ``units`` it runs on, default
    compute_units) where one is set."""
    eff = hw.efficiency
    frac = eff.memory_fraction_for(kind)
    rate = eff.kernel_unit_bytes_per_s.get(kind)
    if rate:
        used = hw.compute_units if units is None else units
        frac = np.minimum(frac, rate * used / hw.memory_bytes_per_s)
    return float(frac) if np.ndim(frac) == 0 else frac


def finish(op: OpRecord, hw: Hardware, timing: np.ndarray | int, compute_s: np.ndarray,
           memory_s: np.ndarray, body_s: np.ndarray, fixed_s: np.ndarray,
           c_eff: np.ndarray, m_eff: np.ndarray) -> OpTimes:
    """Add the fixed cost (the part a graph-replayed step exposes: ``exposed_fixed``) and
    the host launch (per ``timing``), pick the bound, x count."""
    fixed_s = exposed_fixed(hw, timing, fixed_s)
    per = per_instance(hw, timing, body_s + fixed_s)
    overhead = per - body_s
    return OpTimes(compute_s, memory_s, fixed_s, overhead, per * op.count,
                   bound_code(compute_s, memory_s, overhead), c_eff, m_eff)


def exposed_fixed(hw: Hardware, timing: np.ndarray | int, fixed_s: np.ndarray | float
                  ) -> np.ndarray | float:
    """The part of a kernel's isolated fixed cost ``fixed_s`` it pays: all of it, except
    inside a graph-replayed step (timing ``graph``), where its neighbours hide the device's
    ``composition.graph_overlap`` of it (``specs.composition``)."""
    share = hw.composition.exposed()
    if share == 1.0:
        return fixed_s
    if isinstance(timing, int):
        return fixed_s * share if timing == GRAPH else fixed_s
    return fixed_s * np.where(timing == GRAPH, share, 1.0)


def per_instance(hw: Hardware, timing: np.ndarray | int, device_s: np.ndarray) -> np.ndarray:
    """Seconds of one instance whose device time is ``device_s``, with the host launch as
    ``timing`` counts it (the module docstring of ``roofline``; ``graph``: device time, as
    ``kernel``)."""
    launch = hw.efficiency.launch_overhead_s
    if isinstance(timing, int):
        return (device_s, np.maximum(device_s, launch), device_s + launch, device_s)[timing]
    return np.where(timing == STREAM, np.maximum(device_s, launch),
                    np.where(timing == HOST, device_s + launch, device_s))


def bound_code(compute_s: np.ndarray, memory_s: np.ndarray, overhead_s: np.ndarray
               ) -> np.ndarray:
    """Which term a kernel's time follows (a ``BOUNDS`` code): overhead where the time beyond
    the body exceeds both roofline terms, else the larger of compute and memory."""
    return np.where(overhead_s > np.maximum(compute_s, memory_s), OVERHEAD,
                    np.where(compute_s >= memory_s, COMPUTE, MEMORY))
