"""Fitting recovers a known Efficiency from times that op_time itself generated."""

from dataclasses import replace

import pytest

from perfmodel import ops
from perfmodel.roofline import op_time
from validate.fit import Sample, fit_efficiency, free_parameters, stratified

pytest.importorskip("scipy")

TRUE = {"gemm_fraction": 0.7, "memory_fraction": 0.8, "kernel_latency_s": 4e-6,
        "gemm_k_half": 300.0, "memory_half_bytes": 2e6}


def synthetic(hw, timing="kernel"):
    truth = replace(hw, efficiency=replace(hw.efficiency, **TRUE, kernel_memory_fraction={},
                                           kernel_latency_by_kind={}))
    shapes = [ops.gemm("g", m, n, k, weight_bytes=2, act_bytes=2, dtype="fp16")
              for m in (1, 16, 128, 1024, 4096) for n, k in ((4096, 4096), (1024, 8192),
                                                              (12288, 512))]
    shapes += [ops.elementwise(kind, kind, rows, 4096, act_bytes=2, dtype="fp16")
               for rows in (1, 64, 1024, 16384) for kind in ("add", "rms_norm")]
    return [Sample(op, op_time(op, truth, timing).time_s, timing) for op in shapes]


def test_recovers_known_parameters(a100):
    result = fit_efficiency(synthetic(a100), a100)
    for name, value in TRUE.items():
        if name == "kernel_latency_s":   # fitted per kernel kind: each recovers the truth
            for kind in ("gemm", "add", "rms_norm"):
                assert result.fitted[f"{name}.{kind}"] == pytest.approx(value, rel=0.05), kind
            continue
        assert result.fitted[name] == pytest.approx(value, rel=0.02), name
    assert result.median_abs_error < 1e-3
    assert "launch_overhead_s" in result.fixed      # kernel timing cannot see launches
    assert result.hardware.peak_flops_per_s == a100.peak_flops_per_s


def test_free_parameters_follow_the_data(a100):
    gemm_only = [s for s in synthetic(a100, "stream") if s.op.kind == "gemm"]
    assert {"gemm_fraction", "launch_overhead_s"} <= set(free_parameters(gemm_only))
    host = [s for s in synthetic(a100, "host") if s.op.kind == "add"]
    assert not {"gemm_fraction", "launch_overhead_s"} & set(free_parameters(host))


def test_stratified_subsample_is_deterministic(a100):
    samples = synthetic(a100) * 20
    a, b = stratified(samples, 40), stratified(samples, 40)
    assert a == b and len(a) <= 40
    assert {s.op.op_class for s in a} == {"gemm", "norm", "elementwise"}


def test_rejects_unknown_parameters(a100):
    with pytest.raises(ValueError, match="cannot fit warp_speed"):
        fit_efficiency(synthetic(a100), a100, params=["warp_speed"])


def test_recovers_a_per_kind_streaming_fraction(a100):
    # truth differs from the base only in the two fractions being fitted
    # (a100 ships a per-SM rms_norm cap, 0.343 of peak: fitting the kind replaces it)
    truth = replace(a100, efficiency=replace(a100.efficiency, memory_fraction=0.8,
                                             kernel_memory_fraction={"rms_norm": 0.4},
                                             kernel_unit_bytes_per_s={}))
    shapes = [ops.elementwise(kind, kind, rows, 4096, act_bytes=2, dtype="fp16")
              for rows in (256, 1024, 4096, 16384) for kind in ("add", "rms_norm")]
    samples = [Sample(op, op_time(op, truth).time_s, "kernel") for op in shapes]
    names = ["memory_fraction.add", "memory_fraction.rms_norm"]
    assert set(names) <= set(free_parameters(samples))
    result = fit_efficiency(samples, a100, params=names)
    assert result.fitted["memory_fraction.rms_norm"] == pytest.approx(0.4, rel=0.02)
    assert result.fitted["memory_fraction.add"] == pytest.approx(0.8, rel=0.02)
    assert result.hardware.efficiency.kernel_memory_fraction["rms_norm"] == \
        pytest.approx(0.4, rel=0.02)
    assert "rms_norm" not in result.hardware.efficiency.kernel_unit_bytes_per_s


def test_cpu_blas_terms_are_fitted_for_host_devices_only(a100):
    # a sync-launch (CPU) device: panel packing and the GEMM/GEMV streaming fractions
    cpu = replace(a100, efficiency=replace(a100.efficiency, launch_mode="sync"))
    truth = replace(cpu, efficiency=replace(cpu.efficiency, gemm_m_half=40.0,
                                            gemm_n_half=20000.0,
                                            gemm_memory_fraction=0.3,
                                            gemv_memory_fraction=0.2,
                                            gemv_k_half=600.0))
    shapes = [ops.gemm("g", m, n, k, weight_bytes=2, act_bytes=2, dtype="bf16")
              for m in (1, 2, 8, 32, 256, 1024)
              for n, k in ((4096, 4096), (1024, 8192), (4096, 512), (16384, 1024))]
    samples = [Sample(op, op_time(op, truth, "host").time_s, "host") for op in shapes]
    names = ["gemm_m_half", "gemm_n_half", "gemm_memory_fraction", "gemv_memory_fraction",
             "gemv_k_half"]
    assert set(names) <= set(free_parameters(samples, cpu))
    assert not set(names) & set(free_parameters(samples, a100))    # GPUs: tiles, as before
    assert not set(names) & set(free_parameters(samples))
    result = fit_efficiency(samples, cpu, params=names)
    assert result.fitted["gemm_m_half"] == pytest.approx(40.0, rel=0.02)
    assert result.fitted["gemm_n_half"] == pytest.approx(20000.0, rel=0.05)
    assert result.fitted["gemm_memory_fraction"] == pytest.approx(0.3, rel=0.02)
    assert result.fitted["gemv_memory_fraction"] == pytest.approx(0.2, rel=0.02)
    assert result.fitted["gemv_k_half"] == pytest.approx(600.0, rel=0.05)


def test_output_width_term_needs_spread_and_switches_off_when_absent(a100):
    cpu = replace(a100, efficiency=replace(a100.efficiency, launch_mode="sync",
                                           gemm_m_half=40.0, gemm_overlap=False))

    def samples(widths):
        return [Sample(op, op_time(op, cpu, "host").time_s, "host")
                for op in (ops.gemm("g", m, n, 1024, weight_bytes=2, act_bytes=2,
                                    dtype="bf16") for m in (2, 8, 64) for n in widths)]

    assert "gemm_n_half" not in free_parameters(samples((2048, 4096)), cpu)   # 2x: no trend
    flat = samples((1024, 4096, 16384))           # 16x, but the truth has no width term
    assert "gemm_n_half" in free_parameters(flat, cpu)
    result = fit_efficiency(flat, cpu, params=["gemm_m_half", "gemm_n_half"])
    assert result.fitted["gemm_n_half"] == 0.0    # beyond OFF_ABOVE: written as off
    assert result.fitted["gemm_m_half"] == pytest.approx(40.0, rel=0.02)


def test_recovers_per_thread_rates_under_the_grain_rule(a100):
    # a 2-thread host device; add streams 30 GB/s per thread (60 of the 80 GB/s the
    # fraction allows on two), silu_and_mul 8 GB/s per thread, rms_norm is not thread-bound
    cpu = replace(a100, compute_units=2, memory_bytes_per_s=100e9, efficiency=replace(
        a100.efficiency, launch_mode="sync", parallel_grain_elements=32768,
        kernel_latency_s=1e-6, kernel_latency_by_kind={}, kernel_unit_bytes_per_s={},
        kernel_memory_fraction={}, memory_fraction=0.8, memory_half_bytes=0.0))
    truth = replace(cpu, efficiency=replace(cpu.efficiency, kernel_memory_fraction={
        "add": 0.8, "silu_and_mul": 0.3, "rms_norm": 0.4},
        kernel_unit_bytes_per_s={"add": 30e9, "silu_and_mul": 8e9}))
    shapes = [ops.elementwise(kind, kind, rows, 512, act_bytes=4, dtype="fp32")
              for rows in (1, 16, 48, 64, 72, 256, 1024, 4096)
              for kind in ("add", "silu_and_mul", "rms_norm")]
    samples = [Sample(op, op_time(op, truth, "host").time_s, "host") for op in shapes]
    free = free_parameters(samples, cpu)
    assert {f"thread_share.{k}" for k in ("add", "silu_and_mul", "rms_norm")} <= set(free)
    assert not any(p.startswith("thread_share") for p in free_parameters(samples, a100))
    # without rows below the grain the rate is not free
    big = [s for s in samples if s.op.shape["m"] * 512 > 32768]
    assert not any(p.startswith("thread_share") for p in free_parameters(big, cpu))
    result = fit_efficiency(samples, cpu, max_nfev=200)
    rates = result.hardware.efficiency.kernel_unit_bytes_per_s
    assert rates["add"] == pytest.approx(30e9, rel=0.03)
    assert rates["silu_and_mul"] == pytest.approx(8e9, rel=0.03)
    assert "rms_norm" not in rates          # never binds: written as no cap
    fractions = result.hardware.efficiency.kernel_memory_fraction
    assert fractions["rms_norm"] == pytest.approx(0.4, rel=0.03)
    # the fraction is the rate on every thread: 2 x 30 and 2 x 8 GB/s of 100
    assert fractions["add"] == pytest.approx(0.6, rel=0.03)
    assert fractions["silu_and_mul"] == pytest.approx(0.16, rel=0.03)
    assert result.fitted["thread_share.add"] == pytest.approx(0.5, rel=0.03)
    assert result.median_abs_error < 0.01
