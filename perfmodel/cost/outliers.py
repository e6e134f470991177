"""The outlier-aware mixed scheme: a weight-only GEMM with a share of its input channels kept
in 16 bits, run as bitsandbytes runs LLM.int8()'s decomposition.

LLM.int8() (Dettmers et al. 2022, arXiv 2208.07339, section 3.2) multiplies the few input
feature dimensions that carry outliers in 16 bits and the rest at low precision, then adds
the two products. bitsandbytes runs it (``MatMul8bitLt.forward``,
bitsandbytes/autograd/_functions.py) as two more kernels after the quantized matmul: the
outlier columns of the activations are copied out (``subA = A[:, idx].contiguous()``), and
a 16-bit matmul over them is accumulated into the quantized matmul's output
(``output.addmm(subA, subB)``, which reads that output and writes a new one). With a share f
of the k input channels in 16 bits (SpQR keeps its outliers in 16 bits likewise), an
``OutlierGemm`` [m, k] x [k, n] is three kernels in series:

    main     [m, (1 - f) k] x [(1 - f) k, n] at the quantized bytes per weight, converted in
             the kernel over its (1 - f) k n weights (``cost.dequant``)
    gather   the m x f k outlier activations read and written (kind ``gather``)
    outlier  [m, f k] x [f k, n] with 16-bit weights, also reading the m x n output it adds
             to (``AddGemm``)

each with its own fixed cost and host launch (``roofline`` times each by its own rule and
``in_series`` adds them up). FLOPs stay the GEMM's 2 m n k (the two matmuls split them); the
weight bytes are k n ((1 - f) q + 2 f), what ``dtypes.mixed_bytes`` counts for memory: the
16-bit channels are not also stored quantized, so the quantized GEMM runs over the other
(1 - f) k (bitsandbytes' own int8 path keeps all k in its int8 matrix and zeroes the
outlier columns of the activations instead). Where f is 0 the record is the plain GEMM (the
other two kernels have count 0).

Any share makes a decode step slower than none: per channel moved, the 16-bit GEMM streams
2 B where the quantized one saved q and its conversion, and two kernels are added. The time
is not monotone in f, though: a small extra kernel bound by its fixed cost, its launch or its
tile padding takes a few more channels for free, and in a compute-bound step whose
conversion does not overlap (tinygemm) a 16-bit channel costs less than a quantized one
(tests/test_outliers.py).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from functools import cached_property

import numpy as np

from perfmodel.cost.ops import ByteCounts, Gemm, Num, Pointwise, pointwise
from perfmodel.cost.timebase import OpTimes, bound_code
from perfmodel.specs.dtypes import DTYPE_BYTES


@dataclass(frozen=True, kw_only=True, eq=False)
class AddGemm(Gemm):
    """C + A B (``torch.addmm``, beta 1): a GEMM that also reads the m x n output it adds to."""

    @property
    def bytes(self) -> ByteCounts:
        own = super().bytes
        return replace(own, act_read=own.act_read
                       + self.m * self.n * self.act_bytes * self.groups)


@dataclass(frozen=True, kw_only=True, eq=False)
class OutlierGemm(Gemm):
    """A weight-only GEMM with ``outlier_fraction`` of its input channels in 16 bits (the
    module docstring); ``weight_bytes`` are the quantized channels' bytes per weight, group
    scales included."""

    outlier_fraction: Num = 0.0

    @property
    def rule(self) -> str:
        return "outliers"

    @cached_property
    def on(self) -> np.ndarray:
        """Where the instance has outlier channels (the two extra kernels run)."""
        return np.asarray(self.outlier_fraction) > 0

    @cached_property
    def kernels(self) -> tuple[Gemm, Pointwise, AddGemm]:
        """(main, gather, outlier) of every instance; where the fraction is 0 the main kernel
        is the whole GEMM and the other two have count 0."""
        f, on = self.outlier_fraction, self.on
        k_out = np.where(on, f * self.k, self.k)      # any shape where off: count 0 there
        own = {x.name: getattr(self, x.name) for x in fields(Gemm)}
        main = Gemm(**own | {"k": np.where(on, (1.0 - f) * self.k, self.k)})
        count = self.count * on
        gather = pointwise("gather", self.m * self.groups, k_out, act_bytes=self.act_bytes,
                           dtype=self.dtype, count=count, name=self.name)
        outlier = AddGemm(**own | {"k": k_out, "weight_bytes": DTYPE_BYTES["bf16"],
                                   "bias": 0.0, "weight_dtype": -1, "count": count,
                                   "slots": 0.0, "scan": 0.0})
        return main, gather, outlier

    @property
    def bytes(self) -> ByteCounts:
        main, gather, outlier = self.kernels
        return main.bytes + (gather.bytes + outlier.bytes).scaled(self.on)


def in_series(parts: list[OpTimes], on: np.ndarray) -> OpTimes:
    """The times of an ``OutlierGemm``'s kernels (``OutlierGemm.kernels``, each timed by its
    own rule) run one after the other: per-instance terms and times add up (the extra
    kernels only where ``on``), the bound is the sum's, the efficiencies the main kernel's."""
    main, *extra = parts

    def total(name: str) -> np.ndarray:
        return getattr(main, name) + sum(np.where(on, getattr(p, name), 0.0) for p in extra)

    compute, memory, overhead = total("compute_s"), total("memory_s"), total("overhead_s")
    return OpTimes(compute, memory, total("fixed_s"), overhead, total("time_s"),
                   bound_code(compute, memory, overhead), main.compute_efficiency,
                   main.memory_efficiency, main.dequant_s)


def weight_gemm(outlier_fraction: np.ndarray, **record: Num) -> Gemm:
    """A GEMM of stored weights: an ``OutlierGemm`` where any instance keeps outlier
    channels in 16 bits, else a plain ``Gemm`` (``record``: its fields)."""
    if np.any(np.asarray(outlier_fraction) > 0):
        return OutlierGemm(outlier_fraction=outlier_fraction, **record)
    return Gemm(**record)
