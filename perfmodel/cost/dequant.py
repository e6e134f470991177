"""Weight-only quantized matmuls on a GPU: the kernel's own conversion work.

A weight-only kernel (int4/int8/fp8 weights, 16-bit activations) streams the packed
weights and their group scales, turns each weight into a 16-bit operand in registers
(unpack, convert, multiply by the scale, add the zero) and multiplies at the activations'
rate. At batch 1 the weight stream is small, and the conversion runs on the SMs' ALUs:

    dequant_s = n * k * groups * ceil(m / max(tile_m, gemm_tile_m)) * ops_per_weight
                / (compute_units * alu_ops_per_clock_per_unit * alu_clock_hz)

(every tile of activation rows dequantizes the weights again: ``tile_m`` rows for the
small-batch kernel, the device's GEMM tile ``gemm_tile_m`` when that is larger, as a
mixed-input GEMM's CTA converts its weight tile once for all its rows). The scales are
already in the streamed bytes (``Gemm.weight_bytes`` includes scale bytes / group size).
The GEMM rule combines it with the body (``DequantKernel.overlap``):

    overlap:  body = max(compute_s, memory_s, dequant_s)   the conversion hides under the
                                                           prefetched weight stream
    no overlap: body = max(compute_s, memory_s) + dequant_s

A GEMM gets it only where its stored weights are narrower than a 16-bit compute dtype and
the device lists a kernel for that weight dtype (``Efficiency.dequant``, ``converts``); CPU
and TPU files list none, so their GEMMs are unchanged.

What the reports show (``OpTimes.dequant_s``, the ``dequant`` row of ``--breakdown``): the
seconds the conversion adds to the step, the GEMM's time with it less its time without it,
both through the same fixed cost and host launch:

    dequant row = time(body with dequant_s) - time(body with dequant_s = 0)
                = max(c, m, d) - max(c, m)   overlap (0 while the conversion hides under the
                                             tensor cores' work or the weight stream)
                = d                          no overlap (and less where a host launch that
                                             outlasts the device time hides it: timing stream)

The GEMM's own row keeps the rest, so the rows still add up to the step and the totals are
the GEMMs' whole times. A weight-only GEMM whose conversion hides entirely shows a 0 row.
"""

from __future__ import annotations

import numpy as np

from perfmodel.cost.ops import Gemm
from perfmodel.specs.dtypes import BYTES, DTYPES
from perfmodel.specs.hardware import Hardware


def _table(hw: Hardware) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ops per weight, tile rows, overlap) by weight dtype code; 0 ops where none."""
    memo = hw.memo.get("dequant")
    if memo is None:
        kernels = hw.efficiency.dequant
        ops = np.array([kernels[d].ops_per_weight if d in kernels else 0.0 for d in DTYPES])
        tile = np.array([kernels[d].tile_m if d in kernels else 1 for d in DTYPES], dtype=float)
        overlap = np.array([kernels[d].overlap if d in kernels else True for d in DTYPES])
        memo = hw.memo["dequant"] = (ops, tile, overlap)
    return memo


def converts(hw: Hardware, weights: np.ndarray | int, compute: np.ndarray | int
             ) -> np.ndarray:
    """Where a GEMM of stored weight dtype codes ``weights`` (-1: stored at the compute
    dtype) at compute dtype codes ``compute`` converts its weights in the kernel on ``hw``:
    weights narrower than a 16-bit compute dtype, and a kernel listed for them."""
    wcode = np.asarray(weights, dtype=int)
    code = np.where(wcode >= 0, wcode, 0)
    compute_bytes = BYTES[np.asarray(compute, dtype=int)]
    listed = hw.memo.get("dequant_listed")
    if listed is None:      # per device, not per GEMM record: this runs on every GEMM
        listed = hw.memo["dequant_listed"] = np.array([d in hw.efficiency.dequant
                                                       for d in DTYPES])
    return (wcode >= 0) & (BYTES[code] < compute_bytes) & (compute_bytes == 2.0) & listed[code]


def dequant_time(op: Gemm, hw: Hardware) -> tuple[np.ndarray, np.ndarray]:
    """(dequant_s, overlap) of every instance of ``op`` on ``hw`` (module docstring);
    dequant_s is 0 where the weights are not narrower than a 16-bit compute dtype or the
    device lists no kernel for them."""
    if not hw.efficiency.dequant:
        return np.zeros(()), np.ones((), dtype=bool)
    ops, tile, overlap = _table(hw)
    wcode = np.asarray(op.weight_dtype, dtype=int)
    code = np.where(wcode >= 0, wcode, 0)
    per_weight = np.where(converts(hw, wcode, op.dtype), ops[code], 0.0)
    if not per_weight.any():
        return np.zeros(np.shape(per_weight)), overlap[code]
    eff = hw.efficiency
    rate = hw.compute_units * eff.alu_ops_per_clock_per_unit * eff.alu_clock_hz
    # a CTA converts its weight tile once for its own rows: past the small-batch kernel's
    # tile, the mixed-input GEMM (Marlin, Machete, CUTLASS) tiles rows as any GEMM does
    tiles = np.ceil(op.m / np.maximum(tile[code], eff.gemm_tile_m))
    return op.n * op.k * op.groups * tiles * per_weight / rate, overlap[code]


def combine(compute_s: np.ndarray, memory_s: np.ndarray, dequant_s: np.ndarray,
            overlap: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(compute_s, body_s) of an overlapping GEMM with the conversion added: the SMs' work
    (tensor cores or ALUs) is the compute term; overlap takes the max of the three, no
    overlap adds the conversion to max(compute, memory)."""
    work = np.where(overlap, np.maximum(compute_s, dequant_s), compute_s + dequant_s)
    body = np.where(overlap, np.maximum(work, memory_s),
                    np.maximum(compute_s, memory_s) + dequant_s)
    return work, body
