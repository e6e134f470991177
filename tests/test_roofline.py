"""Roofline times, derived by hand from the A100-80GB SXM spec file: GEMMs, memory passes,
timing modes, collectives and the CPU terms (attention is in test_attention_time.py)."""

import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import perfmodel as pm
from perfmodel.cost.ops import AllReduce, Gemm, pointwise
from perfmodel.cost.roofline import busy_units, gemm_memory_efficiency, op_time
from perfmodel.cost.tiling import gemm_plan
from perfmodel.specs.dtypes import CODE

BW = 2.039e12 * 0.865          # A100 80GB: peak bandwidth x memory_fraction
PEAK = 312e12                  # bf16 dense
LAT, LAUNCH = 2e-6, 2.6e-6


def one(x) -> float:
    """The single value of a one-instance result."""
    return float(np.ravel(x)[0])


def _gemm(m, n, k, dtype="bf16", nbytes=2):
    return Gemm(m=m, n=n, k=k, weight_bytes=nbytes, act_bytes=nbytes, dtype=CODE[dtype])


def _elem(kind, rows, n, nbytes=2, dtype="bf16"):
    return pointwise(kind, rows, n, act_bytes=nbytes, dtype=CODE[dtype])


def gemm_efficiency(m, n, k, groups, hw):
    return one(gemm_plan(m, n, k, groups, hw)[0])


def t(op, hw, timing="stream"):
    return op_time(op, hw, timing)


def test_decode_gemm_is_memory_bound(a100):
    r = t(_gemm(1, 4096, 4096), a100, timing="kernel")
    nbytes = 4096 * 4096 * 2 + 2 * 4096 * 2
    assert r.bound_name() == "memory"
    # split-K (32 tiles < 108 SMs) adds the reduction kernel: two kernel latencies
    assert one(r.time_s) == pytest.approx(nbytes / BW + 2 * LAT, rel=1e-9)


def test_large_gemm_is_compute_bound_with_wave_quantization(a100):
    # 32 x 32 = 1024 tiles of 128x128 on 108 SMs -> 10 waves, 1024/1080 busy;
    # pipeline ramp k / (k + 128)
    eff = 0.87 * 1024 / 1080 * 4096 / (4096 + 128)
    assert gemm_efficiency(4096, 4096, 4096, 1, a100) == pytest.approx(eff)
    r = t(_gemm(4096, 4096, 4096), a100, timing="kernel")
    assert r.bound_name() == "compute"
    assert one(r.time_s) == pytest.approx(2 * 4096**3 / (PEAK * eff) + LAT, rel=1e-9)


def test_small_m_uses_a_small_tile_and_split_k(a100):
    # m=1 pads to a 16-row tile; 32 n-tiles split-K x3 = 96 of 108 SMs; slices 4096/3 deep
    depth = 4096 / 3
    assert gemm_efficiency(1, 4096, 4096, 1, a100) == \
        pytest.approx(0.87 / 16 * 96 / 108 * depth / (depth + 128))


def test_shallow_k_is_less_efficient(a100):
    assert gemm_efficiency(4096, 4096, 256, 1, a100) < gemm_efficiency(4096, 4096, 8192, 1, a100)


def test_gemm_plan_vectorised_equals_one_at_a_time(a100, h100):
    m = np.array([1, 7, 64, 300, 4096, 9000])
    n = np.array([4096, 128, 14336, 576, 4096, 128256])
    k = np.array([4096, 8192, 4096, 512, 256, 8192])
    for hw in (a100, h100):
        eff, split = gemm_plan(m, n, k, 1.0, hw)
        for i in range(len(m)):
            e1, s1 = gemm_plan(m[i], n[i], k[i], 1.0, hw)
            assert (eff[i], split[i]) == (e1, s1)


def test_timing_modes(a100):
    tiny = _elem("add", 1, 16)
    kernel = one(t(tiny, a100, "kernel").time_s)
    assert kernel == pytest.approx(96 / BW + LAT)
    assert one(t(tiny, a100, "stream").time_s) == pytest.approx(LAUNCH)     # launch-bound
    assert one(t(tiny, a100, "host").time_s) == pytest.approx(kernel + LAUNCH)
    assert t(tiny, a100, "stream").bound_name() == "overhead"
    # a timing per instance: the three at once
    three = pointwise("add", np.ones(3), 16, act_bytes=2)
    np.testing.assert_allclose(t(three, a100, np.array([0, 1, 2])).time_s,
                               [kernel, LAUNCH, kernel + LAUNCH])


def test_count_multiplies_time(a100):
    once = one(t(_gemm(8, 4096, 4096), a100).time_s)
    forty = replace(_gemm(8, 4096, 4096), count=40)
    assert one(t(forty, a100).time_s) == pytest.approx(40 * once)
    assert one(t(replace(forty, count=0), a100).time_s) == 0.0


def test_all_reduce_time(a100):
    op = AllReduce(payload=8e6, devices=8)
    wire = 2 * 7 / 8 * 8e6 / (300e9 * 0.78)
    # NCCL's model: 6.6 us per collective + 0.6 us per NVLink hop, 14 hops for 8 devices
    assert one(t(op, a100).time_s) == pytest.approx(wire + 6.6e-6 + 14 * 0.6e-6)
    assert t(op, a100).bound_name() == "communication"


def test_ridge_point_and_peak_fallbacks(a100):
    assert a100.ridge_point("bf16") == pytest.approx(312e12 / 2.039e12)
    # no fp8 path on Ampere: fp8 runs at the next wider supported rate (bf16), not int8
    assert math.isclose(a100.peak("fp8"), 312e12)
    assert a100.peak_table()[CODE["fp8"]] == a100.peak("fp8")
    tpu = pm.hardware("tpu-v5e")
    assert tpu.peak("fp16") == tpu.peak("bf16")        # the twin 16-bit float


def test_a_dtype_without_a_rate_is_a_spec_error(a100):
    # only a narrower rate: bf16 cannot fall back to anything (fp32 would be a wider one)
    fp8_only = replace(a100, peak_flops_per_s={"fp8": 600e12})
    with pytest.raises(pm.SpecError, match="no rate for bf16"):
        op_time(_gemm(8, 64, 64), fp8_only)


def test_kernel_memory_fraction_applies_to_its_kind_only(a100):
    slow_norm = replace(a100, efficiency=replace(
        a100.efficiency, kernel_memory_fraction={"rms_norm": 0.4}, kernel_latency_by_kind={},
        kernel_unit_bytes_per_s={}))
    norm, add = _elem("rms_norm", 4096, 4096), _elem("add", 4096, 4096)
    nb = norm.bytes.total
    assert one(t(norm, slow_norm, "kernel").time_s) == pytest.approx(nb / (2.039e12 * 0.4) + LAT)
    assert t(add, slow_norm, "kernel").time_s == t(add, a100, "kernel").time_s


def test_per_sm_rate_caps_a_kind_by_the_sm_count(a100, h100):
    # the shipped rms_norm cap: 6.476 GB/s per SM (vLLM PR 16 on an A100: 699 GB/s / 108 SMs)
    norm = _elem("rms_norm", 4096, 4096)
    for hw in (a100, h100):
        assert hw.efficiency.kernel_unit_bytes_per_s == {"rms_norm": pytest.approx(6.476e9)}
        r = t(norm, hw, "kernel")
        assert one(r.memory_s) == pytest.approx(norm.bytes.total / (hw.compute_units * 6.476e9))
    assert 108 * 6.476e9 / 2.039e12 == pytest.approx(0.343, abs=1e-3)   # the sourced fraction
    # a fraction below the cap wins; other kinds are untouched
    low = replace(a100, efficiency=replace(a100.efficiency, kernel_memory_fraction={
        "rms_norm": 0.2}))
    assert one(t(norm, low, "kernel").memory_s) == pytest.approx(
        norm.bytes.total / (2.039e12 * 0.2))
    add = _elem("add", 4096, 4096)
    assert one(t(add, a100, "kernel").memory_s) == pytest.approx(add.bytes.total / BW)


def test_mixed_pointwise_kinds_priced_each_by_its_own_rules(a100):
    """One record holding an rms_norm and an add: each instance gets its kind's cap and
    fixed cost, exactly as if priced alone."""
    both = pointwise("rms_norm", 4096, 4096)
    both = replace(both, code=np.array([both.code, pointwise("add", 1, 1).code]))
    times = t(both, a100, "kernel").time_s
    assert times[0] == one(t(_elem("rms_norm", 4096, 4096), a100, "kernel").time_s)
    assert times[1] == one(t(_elem("add", 4096, 4096), a100, "kernel").time_s)


def test_gemm_streaming_adds_to_compute_when_it_cannot_overlap(a100):
    # GPU: copies feed the tensor cores while they work, time = max(compute, memory);
    # a CPU BLAS core packs a panel, then multiplies it: the two add
    serial = replace(a100, efficiency=replace(a100.efficiency, gemm_overlap=False))
    for m in (1, 64, 4096):
        op = _gemm(m, 4096, 4096)
        both, alone = t(op, serial, "kernel"), t(op, a100, "kernel")
        assert (one(both.compute_s), one(both.memory_s)) == \
            (one(alone.compute_s), one(alone.memory_s))
        latency = one(alone.fixed_s)
        assert latency >= LAT
        assert one(both.time_s) == pytest.approx(
            one(alone.compute_s) + one(alone.memory_s) + latency, rel=1e-12)


def test_kernel_latency_by_kind(a100):
    slow_start = replace(a100, efficiency=replace(
        a100.efficiency, kernel_latency_by_kind={"rms_norm": 9e-6}, kernel_memory_fraction={},
        kernel_unit_bytes_per_s={}))
    norm, add = _elem("rms_norm", 1, 64), _elem("add", 1, 64)
    assert one(t(norm, slow_start, "kernel").time_s) == \
        pytest.approx(norm.bytes.total / BW + 9e-6)
    assert t(add, slow_start, "kernel").time_s == t(add, a100, "kernel").time_s


def _cpu_blas(hw, **terms):
    """``hw`` with one compute unit, 128x128 tiles, no k ramp, plus the CPU BLAS terms."""
    eff = replace(hw.efficiency, gemm_fraction=0.5, gemm_tile_m=128, gemm_tile_n=128,
                  gemm_k_half=0.0, **terms)
    return replace(hw, compute_units=1, efficiency=eff)


def test_panel_packing_ramp_replaces_row_padding(a100):
    # off: m=4 pads to a 16-row tile -> 0.5 x 4/16; on (m_half 28): 0.5 x 4/(4 + 28)
    assert gemm_efficiency(4, 128, 256, 1, _cpu_blas(a100)) == pytest.approx(0.5 * 4 / 16)
    hw = _cpu_blas(a100, gemm_m_half=28.0)
    assert gemm_efficiency(4, 128, 256, 1, hw) == pytest.approx(0.5 * 4 / 32)
    assert gemm_efficiency(100, 128, 256, 1, hw) == pytest.approx(0.5 * 100 / 128)
    # m = 1 is a GEMV: no packing and no row tiles (its time is the weight stream); a GPU
    # (no m_half) still pads the one row to a 16-row tile
    assert gemm_efficiency(1, 128, 256, 1, hw) == pytest.approx(0.5)
    assert gemm_efficiency(1, 128, 256, 1, _cpu_blas(a100)) == pytest.approx(0.5 / 16)


def test_output_width_term_slows_wide_packed_gemms_only(a100):
    # n_half 3072: n = 1024 keeps 3072/4096 = 3/4, n = 9216 keeps 3072/12288 = 1/4 (both whole
    # 128-column tiles); m = 1 (GEMV) and an unset half-width are untouched
    hw = _cpu_blas(a100, gemm_m_half=28.0, gemm_n_half=3072.0)
    assert gemm_efficiency(4, 1024, 256, 1, hw) == pytest.approx(0.5 * 4 / 32 * 3 / 4)
    assert gemm_efficiency(4, 9216, 256, 1, hw) == pytest.approx(0.5 * 4 / 32 / 4)
    assert gemm_efficiency(1, 9216, 256, 1, hw) == pytest.approx(0.5)
    off = _cpu_blas(a100, gemm_m_half=28.0)
    assert gemm_efficiency(4, 9216, 256, 1, off) == pytest.approx(0.5 * 4 / 32)


def test_gemm_and_gemv_streaming_fractions(a100):
    hw = _cpu_blas(a100, gemm_memory_fraction=0.4, gemv_memory_fraction=0.25)
    gemv, skinny = _gemm(1, 4096, 4096), _gemm(8, 4096, 4096)
    assert one(t(gemv, hw, "kernel").memory_s) == pytest.approx(
        gemv.bytes.total / (2.039e12 * 0.25))
    assert one(t(skinny, hw, "kernel").memory_s) == pytest.approx(
        skinny.bytes.total / (2.039e12 * 0.4))
    # other kinds keep memory_fraction; GEMV falls back to the GEMM fraction, then the shared
    add = _elem("add", 64, 4096)
    assert one(t(add, hw, "kernel").memory_efficiency) == pytest.approx(0.865)
    only_gemm = _cpu_blas(a100, gemm_memory_fraction=0.4)
    assert one(t(gemv, only_gemm, "kernel").memory_efficiency) == pytest.approx(0.4)


def test_gemv_depth_ramp(a100):
    # k/(k + k_half) on the GEMV streaming rate only: k = k_half halves it; m > 1 untouched
    hw = _cpu_blas(a100, gemv_memory_fraction=0.25, gemv_k_half=512.0)
    for k in (256, 512, 4096):
        assert one(t(_gemm(1, 4096, k), hw, "kernel").memory_efficiency) == pytest.approx(
            0.25 * k / (k + 512))
    skinny = _gemm(8, 4096, 512)
    assert t(skinny, hw, "kernel").memory_efficiency == \
        t(skinny, _cpu_blas(a100, gemv_memory_fraction=0.25), "kernel").memory_efficiency
    # deeper GEMVs stream faster, never past the fraction itself
    effs = [one(t(_gemm(1, 4096, k), hw, "kernel").memory_efficiency)
            for k in (64, 512, 4096, 65536)]
    assert effs == sorted(effs) and effs[-1] < 0.25


def test_cpu_blas_terms_are_off_on_shipped_hardware():
    # defaults leave GPU predictions unchanged: no packing ramp, GEMMs stream at memory_fraction
    shipped = sorted((Path(pm.__file__).parent / "hardware").glob("*.yaml"))
    assert shipped
    for path in shipped:
        hw = pm.load_hardware(path)
        eff = hw.efficiency
        assert eff.gemm_m_half == 0 and eff.gemm_n_half == 0 \
            and eff.gemm_memory_fraction is None and eff.gemv_memory_fraction is None \
            and eff.gemv_k_half == 0, path.name
        if "bf16" not in hw.peak_flops_per_s and "fp16" not in hw.peak_flops_per_s:
            continue
        for m in (1, 8):
            op = _gemm(m, 4096, 4096)
            assert one(t(op, hw, "kernel").memory_efficiency) == pytest.approx(
                eff.memory_fraction)
            assert one(gemm_memory_efficiency(op.bytes.total, hw, m, 4096)) == \
                pytest.approx(eff.memory_fraction)


def _two_thread_cpu(a100, **eff):
    """A 2-unit sync device with a 100 GB/s memory and the PyTorch grain rule."""
    base = {"launch_mode": "sync", "parallel_grain_elements": 32768, "kernel_latency_s": 0.0,
            "kernel_latency_by_kind": {}, "kernel_unit_bytes_per_s": {},
            "kernel_memory_fraction": {}, "memory_fraction": 0.8, "memory_half_bytes": 0.0}
    return replace(a100, compute_units=2, memory_bytes_per_s=100e9,
                   efficiency=replace(a100.efficiency, **(base | eff)))


def test_grain_rule_gives_small_elementwise_kernels_one_thread(a100):
    cpu = _two_thread_cpu(a100, kernel_unit_bytes_per_s={"add": 30e9})
    at_grain = _elem("add", 64, 512, 4, "fp32")       # 32768 elements
    above = _elem("add", 66, 512, 4, "fp32")          # 33792
    assert busy_units(at_grain, cpu) == 1 and busy_units(above, cpu) == 2
    # one thread: 30 GB/s (its cap); two: min(0.8 x 100, 2 x 30) = 60 GB/s
    assert one(t(at_grain, cpu, "kernel").memory_s) == pytest.approx(at_grain.bytes.total / 30e9)
    assert one(t(above, cpu, "kernel").memory_s) == pytest.approx(above.bytes.total / 60e9)
    # the bigger kernel takes less time: the step PyTorch's chunking makes
    assert one(t(above, cpu, "kernel").time_s) < one(t(at_grain, cpu, "kernel").time_s)
    # GEMMs and attention thread their own way; a kind without a rate is not capped;
    # without the grain (GPUs) every kernel has all the units
    assert busy_units(_gemm(8, 512, 512, "fp32", 4), cpu) == 2
    norm = _elem("rms_norm", 8, 512, 4, "fp32")
    assert one(t(norm, cpu, "kernel").memory_s) == pytest.approx(norm.bytes.total / 80e9)
    gpu = replace(cpu, efficiency=replace(cpu.efficiency, parallel_grain_elements=0))
    assert busy_units(at_grain, gpu) == 2
    # many threads: a 100,000-element kernel gets ceil(100000 / 32768) = 4 of 16
    wide = replace(cpu, compute_units=16)
    big = _elem("add", 100, 1000, 4, "fp32")
    assert busy_units(big, wide) == 4
    assert one(t(big, wide, "kernel").memory_s) == pytest.approx(big.bytes.total / 80e9)
    assert one(t(big, replace(wide, memory_bytes_per_s=1e12), "kernel").memory_s) == \
        pytest.approx(big.bytes.total / 120e9)     # 4 threads x 30 GB/s under 0.8 TB/s
