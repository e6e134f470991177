"""Goldens on the shipped, calibrated h100-sxm (vLLM's constants fitted by calibrate --from):
each derived by hand from the file's values, so a regenerated calibration that moves them
fails here and the derivation is redone. The formulas' own goldens price the datasheet files
(tests/datasheet.py)."""

from __future__ import annotations

import pytest

import perfmodel as pm
from perfmodel.cost.collectives import all_reduce_parts
from perfmodel.cost.ops import Gemm
from perfmodel.cost.roofline import op_time
from perfmodel.specs.dtypes import CODE

H100 = pm.hardware("h100-sxm")


def test_the_file_holds_the_constants_derived_from() -> None:
    eff, link = H100.efficiency, H100.interconnect
    assert (eff.gemm_fraction, eff.gemm_k_half, eff.memory_fraction) == (0.9033, 18.18, 0.8604)
    assert eff.kernel_latency_s == pytest.approx(2.272e-6)
    assert (eff.collective_fraction, link.custom_all_reduce_fraction) == (0.6895, 0.5134)
    assert link.collective_latency_s == pytest.approx(6.965e-6)
    assert link.custom_all_reduce_latency_s == pytest.approx(4.556e-6)
    assert link.custom_all_reduce_max_bytes == 8 * 2**20


def test_large_bf16_gemm() -> None:
    """8192^3: 128x256 tiles, 64 x 32 = 2048 tiles on 132 SMs, 16 waves: 2048 / 2112 =
    0.96970 (the 256x128 and 128x128 alternatives fill the same, the device tile wins the
    tie); no split; k ramp 8192 / (8192 + 18.18) = 0.997786. Efficiency 0.9033 x 0.96970 x
    0.997786 = 0.873988; 2 x 8192^3 = 1.099512e12 FLOP / (989.4e12 x 0.873988) =
    1.271518 ms, + 2.272 us = 1.273790 ms (memory: 402.65 MB / (3.35e12 x 0.8604) =
    0.1397 ms, not binding)."""
    g = Gemm(m=8192.0, n=8192.0, k=8192.0, weight_bytes=2.0, act_bytes=2.0,
             dtype=CODE["bf16"])
    assert float(op_time(g, H100, "kernel").time_s) == pytest.approx(1.273790e-3, rel=1e-5)


def test_decode_gemv() -> None:
    """m = 1, 4096 -> 14336: 14336 x 4096 x 2 + 4096 x 2 + 14336 x 2 = 117,477,376 B at
    3.35e12 x 0.8604 = 2.88234e12 B/s: 40.7577 us; the 256x128 tile (112 programs, no split,
    k ramp 4096 / 4114.18) out-fills the device tile split twice (56 x 2 programs at depth
    2048), so one kernel latency: + 2.272 us = 43.0297 us."""
    g = Gemm(m=1.0, n=14336.0, k=4096.0, weight_bytes=2.0, act_bytes=2.0, dtype=CODE["bf16"])
    assert float(op_time(g, H100, "kernel").time_s) == pytest.approx(43.0297e-6, rel=1e-5)


def test_all_reduce_custom_below_its_limit_nccl_above() -> None:
    """4 GPUs, 128 KiB: vLLM's one-stage custom all-reduce, 3 x 131,072 = 393,216 B at 450e9
    x 0.5134 = 231.03e9 B/s: 1.70201 us + 4.556 us = 6.25801 us. 8 GPUs, 16 MiB (over the
    8 MiB limit): NCCL's ring, 6.965 us + 14 hops x 0.6 us = 15.365 us, + 2 x 7/8 x
    16,777,216 = 29,360,128 B at 450e9 x 0.6895 = 310.275e9 B/s: 94.6261 us; 109.991 us."""
    assert float(all_reduce_parts(H100, 4, 131072.0).total) == pytest.approx(6.25801e-6,
                                                                               rel=1e-5)
    assert float(all_reduce_parts(H100, 8, 16.0 * 2**20).total) == pytest.approx(109.991e-6,
                                                                                  rel=1e-5)
