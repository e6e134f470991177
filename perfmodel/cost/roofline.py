"""Roofline time of operator records on one device, for every instance at once.

    device_s = max(flops / (peak[dtype] * eff_compute), bytes / (bandwidth * eff_memory))
               + kernel_latency x kernels
    time_s   = device_s                            timing "kernel" (device time only: an isolated
                                                   kernel replayed from a CUDA graph)
             = device_s, fixed cost x (1 - graph_overlap)   timing "graph" (a kernel inside a
                                                   graph-replayed step: ``specs.composition``)
             = max(device_s, launch_overhead)      timing "stream" (host launches overlap device)
             = device_s + launch_overhead          timing "host"   (one synchronised call)
    (x count, the instances per step)

A weight-only quantized GEMM on a GPU adds its kernel's dequantization (``dequant``); one
with 16-bit outlier channels runs as three kernels, each timed here (``outliers``).
``eff_compute`` for a GEMM is the best-shape fraction times tile padding, wave quantization
and (if calibrated) a k-depth ramp, and on a CPU BLAS a panel-packing ramp in m in place of
row padding; ``eff_memory`` is the streaming fraction (a GEMM's or a GEMV's own when
calibrated, a memory-bound kind's own per ``specs.kinds``) times (if calibrated) a size
ramp. Attention follows FlashAttention's tiles and splits (``attention``), collectives the
interconnect, framework glue the host; a recurrent scan is one fused kernel or, on a device
that runs it unfused, its chain of operators (``scan_chain``). Each record's rule comes from
the registry.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np

from perfmodel.cost import moe
from perfmodel.cost.attention import attention_time
from perfmodel.cost.collectives import Parts, all_reduce_parts, all_to_all_parts
from perfmodel.cost.dequant import combine, dequant_time
from perfmodel.cost.ep import Traffic, ep_parts
from perfmodel.cost.ops import AllReduce, AllToAll, Gemm, OpRecord, Pointwise
from perfmodel.cost.outliers import OutlierGemm, in_series
from perfmodel.cost.scan import Scan
from perfmodel.cost.scan_chain import chain, chain_times
from perfmodel.cost.scan_kernels import scan_kernel_time
from perfmodel.cost.timebase import (
    BOUNDS,
    COMMUNICATION,
    HOST,
    OVERHEAD,
    TIMINGS,
    OpTimes,
    exposed_fixed,
    finish,
    kind_memory_fraction,
    peak,
    per_instance,
    size_ramp,
    timing_code,
)
from perfmodel.specs.hardware import Hardware
from perfmodel.specs.kinds import KINDS, POINTWISE

__all__ = ["BOUNDS", "TIMINGS", "OpTimes", "busy_units", "kind_memory_fraction", "op_time"]

def busy_units(op: OpRecord, hw: Hardware) -> np.ndarray | int:
    """Compute units ``op`` runs on: all of them, except that with
    ``parallel_grain_elements`` set a ``grain``-threaded kernel of e = rows x n elements gets
    min(compute_units, ceil(e / grain)) threads (PyTorch's parallel_for chunking)."""
    grain = hw.efficiency.parallel_grain_elements
    kind = POINTWISE[0] if isinstance(op, Pointwise) else op.kind
    if not grain or KINDS[kind].threading != "grain":
        return hw.compute_units
    elements = op.rows * op.n
    return np.minimum(hw.compute_units, np.maximum(1, np.ceil(elements / grain)))


def _kind_table(hw: Hardware, field: Callable[[str], float]) -> np.ndarray:
    return np.array([field(k) for k in POINTWISE])


def _stream_parameters(op: OpRecord, hw: Hardware, units: np.ndarray | int
                       ) -> tuple[np.ndarray, np.ndarray]:
    """(streaming fraction, fixed cost) of a memory pass, per instance: by kind."""
    eff = hw.efficiency
    if not isinstance(op, Pointwise):
        return kind_memory_fraction(op.kind, hw, units), eff.latency_for(op.kind)
    memo = hw.memo.setdefault("pointwise", {})
    if not memo:
        memo["fraction"] = _kind_table(hw, eff.memory_fraction_for)
        memo["rate"] = _kind_table(hw, lambda k: eff.kernel_unit_bytes_per_s.get(k, 0.0))
        memo["latency"] = _kind_table(hw, eff.latency_for)
    code = op.code
    frac, rate = memo["fraction"][code], memo["rate"][code]
    capped = np.minimum(frac, rate * units / hw.memory_bytes_per_s)
    return np.where(rate > 0, capped, frac), memo["latency"][code]


def _gemm_time(op: Gemm, hw: Hardware, timing: np.ndarray | int) -> OpTimes:
    eff = hw.efficiency
    c_eff, split = moe.plan(op, hw)
    nbytes = op.bytes.total
    m_eff = moe.memory_fraction(op, hw, gemm_memory_efficiency(nbytes, hw, op.m, op.k))
    compute_s = op.flops / (peak(hw, op.dtype) * c_eff)        # efficiencies are > 0
    memory_s = nbytes / (hw.memory_bytes_per_s * m_eff)
    dequant_s, overlap = dequant_time(op, hw)                   # 0 unless weight-only
    bare_s = np.maximum(compute_s, memory_s) if eff.gemm_overlap else compute_s + memory_s
    if eff.gemm_overlap:
        work_s, body_s = combine(compute_s, memory_s, dequant_s, overlap)
    else:
        work_s = compute_s + dequant_s
        body_s = work_s + memory_s
    fixed_s = moe.fixed_cost(op, hw) * (1.0 + (split > 1))
    times = finish(op, hw, timing, work_s, memory_s, body_s, fixed_s, c_eff, m_eff)
    if not np.any(dequant_s):
        return times
    without = per_instance(hw, timing, bare_s + exposed_fixed(hw, timing, fixed_s)) \
        * op.count                                                      # dequant's row
    return replace(times, dequant_s=times.time_s - without)


def gemm_memory_efficiency(nbytes: np.ndarray, hw: Hardware, m: np.ndarray, k: np.ndarray
                           ) -> np.ndarray:
    """Streaming fraction of a GEMM with ``m`` rows: the GEMV fraction for m = 1 (slowed
    for a short ``k`` by ``gemv_k_half``), else the GEMM fraction, when calibrated."""
    eff = hw.efficiency
    ramp = size_ramp(nbytes, hw)
    gemv = m <= 1
    if eff.gemv_k_half:
        ramp = ramp * np.where(gemv & (k > 0), k / (k + eff.gemv_k_half), 1.0)
    frac = eff.gemm_memory_fraction_for(2.0)
    if eff.gemv_memory_fraction is not None:
        frac = np.where(gemv, eff.gemv_memory_fraction, frac)
    return frac * ramp


def _stream_time(op: OpRecord, hw: Hardware, timing: np.ndarray | int) -> OpTimes:
    """A memory pass (elementwise, embedding gather, KV-cache write)."""
    eff = hw.efficiency
    nbytes = op.bytes.total
    fraction, fixed_s = _stream_parameters(op, hw, busy_units(op, hw))
    m_eff = fraction * size_ramp(nbytes, hw)
    c_eff = np.full(np.shape(m_eff), eff.gemm_fraction)
    compute_s = op.flops / (peak(hw, op.dtype) * eff.gemm_fraction)
    memory_s = nbytes / (hw.memory_bytes_per_s * m_eff)
    body_s = np.maximum(compute_s, memory_s)
    return finish(op, hw, timing, compute_s, memory_s, body_s, fixed_s, c_eff, m_eff)


def _collective_time(op: AllReduce | AllToAll, hw: Hardware, timing: np.ndarray | int
                     ) -> OpTimes:
    """A collective, priced by ``cost.collectives`` (latency + bytes over the link or the
    network; ring or tree for an all-reduce). Launches are not added."""
    if isinstance(op, AllToAll):
        parts = all_to_all_parts(hw, op.devices, op.payload, op.nodes, op.off_node)
        deepep = np.asarray(op.kernel) >= 0
        if deepep.any():
            ep = ep_parts(hw, np.maximum(op.kernel, 0),
                          Traffic(op.payload, op.link_bytes, op.network_bytes, op.copies),
                          op.nodes, op.sms)
            parts = Parts(np.where(deepep, ep.latency_s, parts.latency_s),
                          np.where(deepep, ep.wire_s, parts.wire_s))
    else:
        parts = all_reduce_parts(hw, op.devices, op.payload, op.nodes)
    wire_s, latency_s = parts.wire_s, parts.latency_s
    per = parts.total
    zeros = np.zeros(np.shape(per))
    frac = hw.efficiency.collective_fraction
    return OpTimes(zeros, wire_s, latency_s, latency_s, per * op.count,
                   np.full(np.shape(per), COMMUNICATION), zeros, zeros + frac)


def _host_time(op: OpRecord, hw: Hardware, timing: np.ndarray | int) -> OpTimes:
    """Framework glue per decoder layer: ``layer_overhead_s`` per instance when host time
    adds to the step (timing host, a sync device); 0 when the host overlaps the device."""
    per = np.where(np.asarray(timing) == HOST, hw.efficiency.layer_overhead_s, 0.0) \
        * np.ones(np.shape(op.count))
    zeros = np.zeros(np.shape(per))
    return OpTimes(zeros, zeros, per, per, per * op.count, np.full(np.shape(per), OVERHEAD),
                   zeros, zeros)


def _outlier_time(op: OutlierGemm, hw: Hardware, timing: np.ndarray | int) -> OpTimes:
    """A GEMM with 16-bit outlier channels: its kernels in series (``cost.outliers``)."""
    return in_series([op_time(k, hw, timing) for k in op.kernels], op.on)


def _scan_time(op: Scan, hw: Hardware, timing: np.ndarray | int) -> OpTimes:
    """A recurrent layer's chunked scan: one fused kernel (the stream rule), or a
    linear-attention scan as the engine's kernels run it where the device's file gives
    them (``cost.scan_kernels``), or where the device runs it unfused, its chain of
    operators, each timed by its own rule, in series (``cost.scan_chain``)."""
    if hw.efficiency.scan_kernel == "fused":
        if hw.efficiency.scan_kernels and op.kind == "linear_attention" \
                and np.all(op.delta):          # the delta rule's kernels (not lightning)
            return scan_kernel_time(op, hw, timing)
        return _stream_time(op, hw, timing)
    ch = chain(op)
    per_group = timing if isinstance(timing, int) else np.asarray(timing)[..., None]
    return chain_times(op, ch, [op_time(r, hw, per_group) for r in ch.records], hw, timing)


RULES: dict[str, Callable[[OpRecord, Hardware, np.ndarray | int], OpTimes]] = {
    "gemm": _gemm_time, "attention": attention_time, "stream": _stream_time,
    "collective": _collective_time, "host": _host_time, "outliers": _outlier_time,
    "scan": _scan_time,
}


def op_time(op: OpRecord, hw: Hardware, timing: str | np.ndarray | int = "stream") -> OpTimes:
    """Times of every instance of ``op`` on ``hw``; ``timing`` (a name, or codes per
    instance) says how host launches count (see the module docstring)."""
    return RULES[op.rule](op, hw, timing_code(timing))
