"""Fitting recovers a known Efficiency from times that op_time itself generated."""

from dataclasses import replace

import numpy as np
import pytest

from perfmodel.cost.ops import Attention, Embedding, Gemm, KvWrite, kind_names, pointwise
from perfmodel.cost.roofline import op_time
from perfmodel.specs.dtypes import CODE
from validate.fit import (
    Sample,
    Samples,
    _Residuals,
    _with,
    fit_efficiency,
    free_parameters,
    log_errors,
    stratified,
)

pytest.importorskip("scipy")

TRUE = {"gemm_fraction": 0.7, "memory_fraction": 0.8, "kernel_latency_s": 4e-6,
        "gemm_k_half": 300.0, "memory_half_bytes": 2e6}


def gemm(m, n, k, dtype="fp16"):
    return Gemm(m=m, n=n, k=k, weight_bytes=2, act_bytes=2, dtype=CODE[dtype], name="g")


def elementwise(kind, rows, n, act_bytes=2, dtype="fp16"):
    return pointwise(kind, rows, n, act_bytes=act_bytes, dtype=CODE[dtype], name=kind)


def kind(sample):
    return kind_names(sample.op).item()


def timed(op, hw, timing):
    return Sample(op, float(op_time(op, hw, timing).time_s), timing)


def synthetic(hw, timing="kernel"):
    truth = replace(hw, efficiency=replace(hw.efficiency, **TRUE, kernel_memory_fraction={},
                                           kernel_latency_by_kind={}))
    shapes = [gemm(m, n, k) for m in (1, 16, 128, 1024, 4096)
              for n, k in ((4096, 4096), (1024, 8192), (12288, 512))]
    shapes += [elementwise(kind, rows, 4096) for rows in (1, 64, 1024, 16384)
               for kind in ("add", "rms_norm")]
    return [timed(op, truth, timing) for op in shapes]


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
    gemm_only = [s for s in synthetic(a100, "stream") if kind(s) == "gemm"]
    assert {"gemm_fraction", "launch_overhead_s"} <= set(free_parameters(gemm_only))
    host = [s for s in synthetic(a100, "host") if kind(s) == "add"]
    assert not {"gemm_fraction", "launch_overhead_s"} & set(free_parameters(host))


def test_stratified_subsample_is_deterministic(a100):
    samples = synthetic(a100) * 20
    a, b = stratified(samples, 40), stratified(samples, 40)
    assert len(a) == 39 and np.array_equal(a.measured, b.measured)   # 13 of each class
    assert list(a.kinds) == list(b.kinds)
    assert set(a.classes) == {"gemm", "norm", "elementwise"}
    # the records follow their samples: each kept sample predicts its own measured time
    truth = replace(a100, efficiency=replace(a100.efficiency, **TRUE, kernel_memory_fraction={},
                                             kernel_latency_by_kind={}))
    assert np.abs(a.log_errors(truth)).max() < 1e-12


def test_samples_in_columns_predict_as_one_op_time_each(a100):
    """Samples of every record type, stacked by type, price exactly as op_time of each."""
    ops = [gemm(16, 4096, 4096), elementwise("silu_and_mul", 8, 1024),
           Attention(batch=[2], q_len=[1], kv_len=[300], n_heads=8, n_kv_heads=2, qk_dim=64,
                     v_dim=64, cache_elems=128, dtype=CODE["bf16"]),
           gemm(1, 1024, 8192), Embedding(rows=8, n=512, act_bytes=4, dtype=CODE["fp32"]),
           KvWrite(rows=8, n=256, act_bytes=4, kv_bytes=4, dtype=CODE["fp32"]),
           elementwise("rms_norm", 64, 4096)]
    samples = [Sample(op, 1e-5, t) for op, t in zip(ops, ["kernel", "host"] * 4, strict=False)]
    columns = Samples.of(samples)
    assert len(columns.groups) == 5 and list(columns.kinds) == [kind(s) for s in samples]
    alone = [float(op_time(s.op, a100, s.timing).time_s) for s in samples]
    assert list(columns.predicted(a100)) == alone
    assert list(log_errors(samples, a100)) == pytest.approx(np.log(np.array(alone) / 1e-5))
    with pytest.raises(ValueError, match="one operator instance"):
        Samples.of([Sample(gemm(np.array([1, 2]), 64, 64), 1e-5)])


def test_a_per_kind_entry_moves_only_its_kind(a100):
    """What the fit's partial re-pricing relies on: changing one kind's entry of the
    per-kind tables changes the predictions of that kind's samples and of no other."""
    cpu = replace(a100, compute_units=2, efficiency=replace(
        a100.efficiency, launch_mode="sync", parallel_grain_elements=32768,
        kernel_unit_bytes_per_s={}, kernel_memory_fraction={}))
    ops = [gemm(m, 4096, 4096) for m in (1, 64)]
    ops += [elementwise(k, rows, 512) for k in ("add", "rms_norm", "silu_and_mul", "rotary")
            for rows in (16, 4096)]             # on one thread, then on both
    ops += [Attention(batch=[b], q_len=[q], kv_len=[512], n_heads=8, n_kv_heads=2, qk_dim=64,
                      v_dim=64, cache_elems=128, dtype=CODE["fp16"]) for b, q in ((1, 512),
                                                                                (4, 1))]
    ops += [r for rows in (16, 4096) for r in (Embedding(rows=rows, n=512, dtype=CODE["fp16"]),
                                                KvWrite(rows=rows, n=256, dtype=CODE["fp16"]))]
    samples = Samples.of([Sample(op, 1e-5, "host") for op in ops])
    base = samples.log_errors(cpu)
    per_kind = [p for p in free_parameters(samples, cpu) if "." in p]
    assert len(per_kind) == 8 + 6 + 6       # latency of 8 kinds, fraction and share of 6
    for name in per_kind:
        value = 2e-5 if name.startswith("kernel_latency_s") else 0.3
        moved = samples.log_errors(_with(cpu, {name: value}))
        changed = set(samples.kinds[moved != base])
        assert changed == {name.split(".")[1]}, name
    # so the residuals of a Jacobian column re-price only that kind, to the same numbers
    names = free_parameters(samples, cpu)
    resid, x = _Residuals(samples, cpu, names), np.log([0.5] * len(names))
    resid(x)
    for j, name in enumerate(names):
        step = x.copy()
        step[j] += 1e-3
        assert np.array_equal(resid(step), _Residuals(samples, cpu, names)(step)), name


def test_rejects_unknown_parameters(a100):
    with pytest.raises(ValueError, match="cannot fit warp_speed"):
        fit_efficiency(synthetic(a100), a100, params=["warp_speed"])


def test_recovers_a_per_kind_streaming_fraction(a100):
    # truth differs from the base only in the two fractions being fitted
    # (a100 ships a per-SM rms_norm cap, 0.343 of peak: fitting the kind replaces it)
    truth = replace(a100, efficiency=replace(a100.efficiency, memory_fraction=0.8,
                                             kernel_memory_fraction={"rms_norm": 0.4},
                                             kernel_unit_bytes_per_s={}))
    shapes = [elementwise(kind, rows, 4096) for rows in (256, 1024, 4096, 16384)
              for kind in ("add", "rms_norm")]
    samples = [Sample(op, float(op_time(op, truth).time_s), "kernel") for op in shapes]
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
    shapes = [gemm(m, n, k, "bf16") for m in (1, 2, 8, 32, 256, 1024)
              for n, k in ((4096, 4096), (1024, 8192), (4096, 512), (16384, 1024))]
    samples = [timed(op, truth, "host") for op in shapes]
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
        return [timed(gemm(m, n, 1024, "bf16"), cpu, "host") for m in (2, 8, 64)
                for n in widths]

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
    shapes = [elementwise(kind, rows, 512, act_bytes=4, dtype="fp32")
              for rows in (1, 16, 48, 64, 72, 256, 1024, 4096)
              for kind in ("add", "silu_and_mul", "rms_norm")]
    samples = [timed(op, truth, "host") for op in shapes]
    free = free_parameters(samples, cpu)
    assert {f"thread_share.{k}" for k in ("add", "silu_and_mul", "rms_norm")} <= set(free)
    assert not any(p.startswith("thread_share") for p in free_parameters(samples, a100))
    # without rows below the grain the rate is not free
    big = [s for s in samples if s.op.rows * 512 > 32768]
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
    # plain floats, as a hardware YAML is written from them (yaml.safe_dump refuses numpy's)
    assert {type(v) for table in (rates, fractions) for v in table.values()} == {float}
    assert result.median_abs_error < 0.01
