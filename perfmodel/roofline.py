"""Roofline time of one operator on one device.

    device_s = max(flops / (peak[dtype] * eff_compute), bytes / (bandwidth * eff_memory))
               + kernel_latency
    time_s   = device_s                            timing="kernel" (device time only; CUDA graphs)
             = max(device_s, launch_overhead)      timing="stream" (host launches overlap device)
             = device_s + launch_overhead          timing="host"   (one synchronised call)

``eff_compute`` for a GEMM is the best-shape fraction times tile padding, wave quantization
and (if calibrated) a k-depth ramp, and on a CPU BLAS a panel-packing ramp in m in place of
row padding; ``eff_memory`` is the streaming fraction (a GEMM's or a GEMV's own when
calibrated) times (if calibrated) a size ramp. Collectives use the interconnect instead of memory.
The tile and wave efficiencies of GEMMs and attention come from ``perfmodel.tiling``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from perfmodel.ops import Op
from perfmodel.specs import Hardware
from perfmodel.tiling import (
    append_kv_bytes,
    append_kv_splits,
    attention_efficiency,
    decode_splits,
    gemm_plan,
    gemm_split_k,
)


@dataclass(frozen=True)
class OpTime:
    """Time of ``op`` (all ``op.count`` instances) and why: which term won."""

    op: Op
    compute_s: float        # per instance, at achievable compute
    memory_s: float         # per instance, at achievable bandwidth (or link for collectives)
    overhead_s: float       # per instance: kernel latency, or launch when that dominates
    time_s: float           # all instances
    bound: str              # compute | memory | overhead | communication
    compute_efficiency: float
    memory_efficiency: float

    @property
    def attained_flops_per_s(self) -> float:
        per = self.time_s / self.op.count if self.op.count else 0.0
        return self.op.flops / per if per > 0 else 0.0


def extra_kernels(op: Op, hw: Hardware, gemm_split: int | None = None) -> int:
    """Kernels beyond the first: split-K GEMMs reduce their partial sums in a second pass;
    decode attention split over the KV length (flash-decoding) combines partial outputs.
    ``gemm_split``: a GEMM's split-K factor when the caller has already worked it out."""
    s = op.shape
    if op.kind == "gemm":
        if gemm_split is None:
            gemm_split = gemm_split_k(s["m"], s["n"], s["k"], s.get("groups", 1.0), hw)
        return int(gemm_split > 1)
    if op.kind == "attention" and s["q_len"] == 1:
        return int(decode_splits(op, hw) > 1)
    if op.kind == "attention" and hw.efficiency.attention_append_kv:
        return int(append_kv_splits(op, hw) > 1)
    return 0


def memory_efficiency(nbytes: float, hw: Hardware, kind: str = "",
                      m: float | None = None, k: float | None = None,
                      units: float | None = None) -> float:
    """Achievable fraction of peak bandwidth for a ``kind`` kernel moving ``nbytes`` on
    ``units`` compute units (default all); a GEMM (``m`` rows) streams at its own fraction
    when one is set (GEMV for m = 1, slowed for a short ``k`` by ``gemv_k_half``)."""
    eff = hw.efficiency
    ramp = nbytes / (nbytes + eff.memory_half_bytes) if eff.memory_half_bytes else 1.0
    if kind == "gemm" and m is not None:
        if m <= 1 and k and eff.gemv_k_half:
            ramp *= k / (k + eff.gemv_k_half)
        return eff.gemm_memory_fraction_for(m) * ramp
    return kind_memory_fraction(kind, hw, units) * ramp


def kind_memory_fraction(kind: str, hw: Hardware, units: float | None = None) -> float:
    """Streaming fraction of a ``kind`` kernel: its own or the shared fraction, capped by
    its per-unit rate (``kernel_unit_bytes_per_s`` x the ``units`` it runs on, default
    compute_units) where one is set."""
    eff = hw.efficiency
    frac = eff.memory_fraction_for(kind)
    rate = eff.kernel_unit_bytes_per_s.get(kind)
    if rate:
        used = hw.compute_units if units is None else units
        frac = min(frac, rate * used / hw.memory_bytes_per_s)
    return frac


_OWN_THREADING = ("gemm", "attention", "all_reduce", "layer_overhead")


def busy_units(op: Op, hw: Hardware) -> int:
    """Compute units ``op`` runs on: all of them, except that with
    ``parallel_grain_elements`` set a memory-bound kernel of e = m x n elements gets
    min(compute_units, ceil(e / grain)) threads (PyTorch's parallel_for chunking)."""
    grain = hw.efficiency.parallel_grain_elements
    if not grain or op.kind in _OWN_THREADING:
        return hw.compute_units
    elements = op.shape.get("m", 1.0) * op.shape.get("n", 1.0)
    return int(min(hw.compute_units, max(1, math.ceil(elements / grain))))


TIMINGS = ("kernel", "stream", "host")


def device_bytes(op: Op, hw: Hardware) -> float:
    """Bytes ``op`` moves on ``hw``: its accounting, plus, for decode attention on a device
    that runs each query head as its own program (``attention_decode_pack_gqa`` false), the
    KV cache streamed again for every further query head of a group."""
    s = op.shape
    if op.kind == "attention" and s["q_len"] == 1 \
            and not hw.efficiency.attention_decode_pack_gqa:
        return op.bytes.total + op.bytes.kv_read * (s["n_heads"] // s["n_kv_heads"] - 1)
    return op.bytes.total


def op_time(op: Op, hw: Hardware, timing: str = "stream") -> OpTime:
    """Time for all instances of ``op``. ``timing`` says how launches count (see above)."""
    eff = hw.efficiency
    if op.kind == "all_reduce":
        return _collective_time(op, hw)
    if op.kind == "layer_overhead":
        return _layer_overhead_time(op, hw, timing)
    if op.kind == "gemm":
        c_eff, split = gemm_plan(op.shape["m"], op.shape["n"], op.shape["k"],
                                  op.shape.get("groups", 1.0), hw)
        extra = extra_kernels(op, hw, split)
    else:
        c_eff = attention_efficiency(op, hw) if op.kind == "attention" else eff.gemm_fraction
        extra = extra_kernels(op, hw)
    nbytes = device_bytes(op, hw)
    is_gemm = op.kind == "gemm"
    m_eff = memory_efficiency(nbytes, hw, op.kind, op.shape["m"] if is_gemm else None,
                              op.shape["k"] if is_gemm else None, busy_units(op, hw))
    compute_s = op.flops / (hw.peak(op.dtype) * c_eff) if op.flops else 0.0
    memory_s = nbytes / (hw.memory_bytes_per_s * m_eff) if nbytes else 0.0
    body_s = compute_s + memory_s if is_gemm and not eff.gemm_overlap \
        else max(compute_s, memory_s)
    append = append_kv_bytes(op, hw)
    if append:      # each program copies before it computes (a barrier between the two)
        append_s = append / (hw.memory_bytes_per_s * m_eff)
        memory_s += append_s
        body_s += append_s
    device_s = body_s + eff.latency_for(op.kind) * (1 + extra)
    if timing == "stream":
        per = max(device_s, eff.launch_overhead_s)
    elif timing == "host":
        per = device_s + eff.launch_overhead_s
    else:
        per = device_s
    overhead = per - body_s
    if overhead > max(compute_s, memory_s):
        bound = "overhead"
    else:
        bound = "compute" if compute_s >= memory_s else "memory"
    return OpTime(op, compute_s, memory_s, overhead, per * op.count, bound, c_eff, m_eff)


def _collective_time(op: Op, hw: Hardware) -> OpTime:
    """Ring all-reduce: 2(n-1)/n * S over the per-direction link at the collective fraction,
    plus latency = collective_latency + 2(n-1) hops x latency_s (NCCL's own cost model:
    a base per collective plus a per-hop hardware latency)."""
    link = hw.interconnect
    devices = op.shape["devices"]
    frac = hw.efficiency.collective_fraction
    wire_s = op.bytes.act_read / (link.link_bytes_per_s * frac)
    latency_s = link.collective_latency_s + 2 * (devices - 1) * link.latency_s
    per = wire_s + latency_s
    return OpTime(op, 0.0, wire_s, latency_s, per * op.count, "communication", 0.0, frac)


def _layer_overhead_time(op: Op, hw: Hardware, timing: str) -> OpTime:
    """Framework glue per decoder layer: ``layer_overhead_s`` per instance when host time
    adds to the step (timing="host", a sync device); 0 when the host overlaps the device."""
    per = hw.efficiency.layer_overhead_s if timing == "host" else 0.0
    return OpTime(op, 0.0, 0.0, per, per * op.count, "overhead", 0.0, 0.0)
