"""Roofline times, derived by hand from the A100-80GB SXM spec file."""

import math
from dataclasses import replace
from pathlib import Path

import pytest

import perfmodel as pm
from perfmodel import ops
from perfmodel.roofline import device_bytes, extra_kernels, memory_efficiency, op_time
from perfmodel.tiling import (
    append_kv_bytes,
    append_kv_splits,
    attention_efficiency,
    decode_kv_splits,
    gemm_efficiency,
    prefill_tile_fraction,
)

BW = 2.039e12 * 0.865          # A100 80GB: peak bandwidth x memory_fraction
PEAK = 312e12                  # bf16 dense
LAT, LAUNCH = 2e-6, 2.6e-6


def _gemm(m, n, k):
    return ops.gemm("g", m, n, k, weight_bytes=2, act_bytes=2, dtype="bf16")


def test_decode_gemm_is_memory_bound(a100):
    t = op_time(_gemm(1, 4096, 4096), a100, timing="kernel")
    nbytes = 4096 * 4096 * 2 + 2 * 4096 * 2
    assert t.bound == "memory"
    # split-K (32 tiles < 108 SMs) adds the reduction kernel: two kernel latencies
    assert t.time_s == pytest.approx(nbytes / BW + 2 * LAT, rel=1e-9)


def test_large_gemm_is_compute_bound_with_wave_quantization(a100):
    # 32 x 32 = 1024 tiles of 128x128 on 108 SMs -> 10 waves, 1024/1080 busy;
    # pipeline ramp k / (k + 128)
    eff = 0.87 * 1024 / 1080 * 4096 / (4096 + 128)
    assert gemm_efficiency(4096, 4096, 4096, 1, a100) == pytest.approx(eff)
    t = op_time(_gemm(4096, 4096, 4096), a100, timing="kernel")
    assert t.bound == "compute"
    assert t.time_s == pytest.approx(2 * 4096**3 / (PEAK * eff) + LAT, rel=1e-9)


def test_small_m_uses_a_small_tile_and_split_k(a100):
    # m=1 pads to a 16-row tile; 32 n-tiles split-K x3 = 96 of 108 SMs; slices 4096/3 deep
    depth = 4096 / 3
    assert gemm_efficiency(1, 4096, 4096, 1, a100) == \
        pytest.approx(0.87 / 16 * 96 / 108 * depth / (depth + 128))


def test_shallow_k_is_less_efficient(a100):
    assert gemm_efficiency(4096, 4096, 256, 1, a100) < gemm_efficiency(4096, 4096, 8192, 1, a100)


def test_attention_fraction(a100, h100):
    # A100 file: FlashAttention-2 forward 73% of peak, 128 x 64 tiles. Block i of 128 rows
    # needs 2(i+1) key tiles (causal): 1056 per head, 32 heads = 1024 programs, 33,792 tiles
    # on 108 SMs = 312.89 each, + the idle 0.5185 of the 10th wave x the shortest (2 tiles).
    # Useful: 32 heads x 4096 x 4097 / 2 positions / 8192 per tile = 32,776 tiles.
    op = ops.attention("a", batch=1, q_len=4096, kv_len=4096, n_heads=32, n_kv_heads=8,
                       qk_dim=128, v_dim=128, act_bytes=2, kv_bytes=2, dtype="bf16")
    t = op_time(op, a100, "kernel")
    busy = 32 * 1056 / 108 + (10 - 1024 / 108) * 2
    assert t.compute_efficiency == pytest.approx(0.73 * 32776 / (108 * busy))
    assert t.bound == "compute"


def _one_unit(hw, **eff):
    return replace(hw, compute_units=1, efficiency=replace(hw.efficiency, **eff))


def _prefill(q, kv, heads=1, window=None):
    return ops.attention("a", batch=1, q_len=q, kv_len=kv, n_heads=heads, n_kv_heads=1,
                         qk_dim=128, v_dim=128, act_bytes=2, kv_bytes=2, dtype="bf16",
                         window=window)


def test_causal_prefill_computes_diagonal_tiles_in_full(a100):
    hw = _one_unit(a100)
    # 128 new tokens, no prior context: 2 key tiles of 64 = 16,384 scores, 8,256 attended
    assert prefill_tile_fraction(_prefill(128, 128), hw) == pytest.approx(8256 / 16384)
    # after 1024 cached tokens: 18 key tiles, 128 x 1024 + 8,256 attended
    assert prefill_tile_fraction(_prefill(128, 1152), hw) == \
        pytest.approx((128 * 1024 + 8256) / (18 * 8192))
    # a longer prompt wastes a smaller share on the diagonal
    assert prefill_tile_fraction(_prefill(2048, 2048), hw) > \
        prefill_tile_fraction(_prefill(256, 256), hw)


def test_sliding_window_prefill_skips_tiles_before_the_window(a100):
    # 512 tokens, window 128: blocks of 128 rows need key tiles [0,2), [0,4), [2,6), [4,8) =
    # 14 tiles; attended: positions 1..128 see p (8,256), the other 384 see 128 (49,152)
    frac = prefill_tile_fraction(_prefill(512, 512, window=128), _one_unit(a100))
    assert frac == pytest.approx((8256 + 384 * 128) / (14 * 8192))


def test_cpu_key_splits_are_clipped_at_kv_len(a100):
    # PyTorch's CPU flash attention: 512-key splits from key 0, the last one a GEMM over the
    # keys left (min(512, kv - start)). 1024 tokens in 256-row blocks (one unit): blocks end
    # at keys 256, 512, 768, 1024 -> they compute 512, 512, 1024, 1024 keys (not the
    # 256..1024 of exact causal keys, nor whole 512-key tiles past kv)
    hw = _one_unit(a100, attention_tile_q=((1, 32), (192, 64), (768, 256)),
                   attention_tile_kv=512, attention_clip_kv=True)
    assert prefill_tile_fraction(_prefill(1024, 1024), hw) == \
        pytest.approx(1024 * 1025 / 2 / (256 * (512 + 512 + 1024 + 1024)))
    # 128 tokens (32-row blocks): every block computes all 128 keys; unclipped, 512 each
    assert prefill_tile_fraction(_prefill(128, 128), hw) == \
        pytest.approx(128 * 129 / 2 / (4 * 32 * 128))
    unclipped = _one_unit(a100, attention_tile_q=((1, 32),), attention_tile_kv=512)
    assert prefill_tile_fraction(_prefill(128, 128), unclipped) == \
        pytest.approx(128 * 129 / 2 / (4 * 32 * 512))


def test_few_programs_wait_for_the_longest(a100):
    # one head, 4096 tokens: 32 programs on 108 SMs, so the last block's 64 tiles set the time
    frac = prefill_tile_fraction(_prefill(4096, 4096), a100)
    assert frac == pytest.approx(4096 * 4097 / 2 / 8192 / (108 * 64))


def test_query_tile_steps_by_length(a100):
    hw = _one_unit(a100, attention_tile_q=((1, 32), (192, 64), (768, 256)), attention_tile_kv=1)
    eff = hw.efficiency
    assert [eff.attention_q_tile(q) for q in (2, 191, 192, 767, 768, 5000)] == \
        [32, 32, 64, 64, 256, 256]
    # key tiles of 1: only the masked half of each diagonal block is wasted
    # 256 tokens in 64-row blocks: block i computes 64 x 64(i+1) scores
    scores = sum(64 * 64 * (i + 1) for i in range(4))
    assert prefill_tile_fraction(_prefill(256, 256), hw) == pytest.approx(256 * 257 / 2 / scores)


def test_short_chunks_pack_the_kv_group_into_rows(a100, h100):
    # 4 new tokens after 4092 cached, 8 query heads on one KV head (speculative verification).
    # attended: 4 x 4092 + 10 = 16,378 positions per head
    op = ops.attention("a", batch=1, q_len=4, kv_len=4096, n_heads=8, n_kv_heads=1,
                       qk_dim=128, v_dim=128, act_bytes=2, kv_bytes=2, dtype="bf16")
    useful = 8 * 16378
    # H100 file (FlashAttention-3, 128 x 128, PackGQA): one block holds 16 positions x 8 heads,
    # so one program walks 32 key tiles
    assert prefill_tile_fraction(op, _one_unit(h100)) == pytest.approx(useful / (32 * 128 * 128))
    # A100 file (FlashAttention-2, 128 x 64, no packing): 8 programs of 64 key tiles, 4 of
    # each 128 rows used
    assert not a100.efficiency.attention_pack_gqa
    assert prefill_tile_fraction(op, _one_unit(a100)) == \
        pytest.approx(useful / (8 * 64 * 128 * 64))


@pytest.mark.parametrize("q,kv,heads", [(7, 7, 3), (100, 900, 5), (3000, 3000, 40),
                                        (129, 129, 1), (64, 8192, 64)])
def test_prefill_tile_fraction_is_a_fraction(a100, h100, q, kv, heads):
    for hw in (a100, h100, _one_unit(a100)):
        frac = prefill_tile_fraction(_prefill(q, kv, heads), hw)
        assert 0 < frac <= 1


def test_timing_modes(a100):
    tiny = ops.elementwise("add", "add", 1, 16, act_bytes=2, dtype="bf16")
    kernel = op_time(tiny, a100, "kernel").time_s
    assert kernel == pytest.approx(96 / BW + LAT)
    assert op_time(tiny, a100, "stream").time_s == pytest.approx(LAUNCH)     # launch-bound
    assert op_time(tiny, a100, "host").time_s == pytest.approx(kernel + LAUNCH)
    assert op_time(tiny, a100, "stream").bound == "overhead"


def test_count_multiplies_time(a100):
    one = op_time(_gemm(8, 4096, 4096), a100).time_s
    assert op_time(_gemm(8, 4096, 4096).times(40), a100).time_s == pytest.approx(40 * one)


def test_all_reduce_time(a100):
    op = ops.all_reduce("ar", 8e6, 8, dtype="bf16")
    wire = 2 * 7 / 8 * 8e6 / (300e9 * 0.78)
    # NCCL's model: 6.6 us per collective + 0.6 us per NVLink hop, 14 hops for 8 devices
    assert op_time(op, a100).time_s == pytest.approx(wire + 6.6e-6 + 14 * 0.6e-6)


def test_ridge_point(a100):
    assert a100.ridge_point("bf16") == pytest.approx(312e12 / 2.039e12)
    # no fp8 path on Ampere: fp8 runs at the next wider supported rate (bf16), not int8
    assert math.isclose(a100.peak("fp8"), 312e12)
    tpu = pm.hardware("tpu-v5e")
    assert tpu.peak("fp16") == tpu.peak("bf16")        # the twin 16-bit float


def test_kernel_memory_fraction_applies_to_its_kind_only(a100):
    from dataclasses import replace

    slow_norm = replace(a100, efficiency=replace(
        a100.efficiency, kernel_memory_fraction={"rms_norm": 0.4}, kernel_latency_by_kind={},
        kernel_unit_bytes_per_s={}))
    norm = ops.elementwise("n", "rms_norm", 4096, 4096, act_bytes=2, dtype="bf16")
    add = ops.elementwise("a", "add", 4096, 4096, act_bytes=2, dtype="bf16")
    nb = norm.bytes.total
    assert op_time(norm, slow_norm, "kernel").time_s == \
        pytest.approx(nb / (2.039e12 * 0.4) + LAT)
    assert op_time(add, slow_norm, "kernel").time_s == op_time(add, a100, "kernel").time_s


def test_per_sm_rate_caps_a_kind_by_the_sm_count(a100, h100):
    # the shipped rms_norm cap: 6.476 GB/s per SM (vLLM PR 16 on an A100: 699 GB/s / 108 SMs)
    norm = ops.elementwise("n", "rms_norm", 4096, 4096, act_bytes=2, dtype="bf16")
    for hw in (a100, h100):
        assert hw.efficiency.kernel_unit_bytes_per_s == {"rms_norm": pytest.approx(6.476e9)}
        t = op_time(norm, hw, "kernel")
        assert t.memory_s == pytest.approx(norm.bytes.total / (hw.compute_units * 6.476e9))
    assert 108 * 6.476e9 / 2.039e12 == pytest.approx(0.343, abs=1e-3)   # the sourced fraction
    # a fraction below the cap wins; other kinds are untouched
    low = replace(a100, efficiency=replace(a100.efficiency, kernel_memory_fraction={
        "rms_norm": 0.2}))
    assert op_time(norm, low, "kernel").memory_s == pytest.approx(
        norm.bytes.total / (2.039e12 * 0.2))
    add = ops.elementwise("a", "add", 4096, 4096, act_bytes=2, dtype="bf16")
    assert op_time(add, a100, "kernel").memory_s == pytest.approx(add.bytes.total / BW)


def test_decode_attention_packs_the_gqa_group_into_query_rows(a100):
    # 32 query heads over 8 KV heads: one new token gives 4 query rows per KV head, padded
    # to a 16-row tile; 64 sequences x 8 KV heads = 512 tiles = 5 waves of 108 (512/540)
    op = ops.attention("a", batch=64, q_len=1, kv_len=2048, n_heads=32, n_kv_heads=8,
                       qk_dim=128, v_dim=128, act_bytes=2, kv_bytes=2, dtype="bf16")
    t = op_time(op, a100, "kernel")
    assert t.compute_efficiency == pytest.approx(0.73 * 4 / 16 * 512 / 540)
    assert t.bound == "memory"


@pytest.mark.parametrize("programs, splits", [(4, 16), (52, 2), (56, 5), (84, 5), (88, 1)])
def test_decode_kv_splits_follow_the_flash_decoding_rule(programs, splits):
    # 4096 keys in 128-key tiles = 32 tiles; the split counts that shorten a split are
    # 1 2 3 4 5 6 7 8 11 16 32. Wave fill f(n) = w / ceil(w), w = programs * n / 108; the
    # fewest splits with f >= 0.85 x the best f win.
    #  4: f = 4n/108 up to n = 27, best 64/108 (n = 16; n = 32 fills 128/216 alike),
    #     n = 11 gives 44/108 < 0.85 x 64/108                                     -> 16
    # 52: n = 2 fills 104/108, which no count beats                              -> 2
    # 56: best n = 32 (1792/108 = 16.6 of 17 waves, 0.976); n = 3, 4 fill 0.778, 0.691;
    #     n = 5 fills 2.59/3 = 0.864 >= 0.83                                       -> 5
    # 84: n = 1..4 fill 0.778 < 0.85 x 0.996 (n = 32); n = 5 fills 3.89/4 = 0.972   -> 5
    # 88 >= 0.8 x 108 = 86.4 programs: no split                                   -> 1
    assert decode_kv_splits(programs, 4096, 128, 108) == splits


def _wave_fill(programs: int, units: int) -> float:
    w = programs / units
    return w / math.ceil(w)


def test_decode_kv_splits_never_fill_worse_than_one_split():
    for units in (2, 108, 132):
        for programs in range(1, 2 * units):
            for keys in (1, 100, 4096, 50000):
                n = decode_kv_splits(programs, keys, 128, units)
                assert 1 <= n <= max(1, min(units, math.ceil(keys / 128)))
                assert _wave_fill(programs * n, units) >= _wave_fill(programs, units)


def test_long_context_decode_at_batch_1_is_split_to_stream_at_full_bandwidth(a100):
    # one sequence x 8 KV heads = 8 programs would leave 100 of 108 SMs idle; split over
    # the keys (and combined by a second kernel) the read of 134 MB streams at the
    # device's bandwidth: bytes / BW + two kernel latencies
    op = ops.attention("a", batch=1, q_len=1, kv_len=32768, n_heads=32, n_kv_heads=8,
                       qk_dim=128, v_dim=128, act_bytes=2, kv_bytes=2, dtype="bf16")
    t = op_time(op, a100, "kernel")
    assert t.bound == "memory"
    assert t.time_s == pytest.approx(op.bytes.total / BW + 2 * LAT, rel=1e-9)
    # the same read by 64 sequences fills the SMs without a split: one kernel
    wide = ops.attention("a", batch=64, q_len=1, kv_len=512, n_heads=32, n_kv_heads=8,
                         qk_dim=128, v_dim=128, act_bytes=2, kv_bytes=2, dtype="bf16")
    assert op_time(wide, a100, "kernel").time_s == \
        pytest.approx(wide.bytes.total / BW + LAT, rel=1e-9)


def test_gemm_streaming_adds_to_compute_when_it_cannot_overlap(a100):
    # GPU: copies feed the tensor cores while they work, time = max(compute, memory);
    # a CPU BLAS core packs a panel, then multiplies it: the two add
    serial = replace(a100, efficiency=replace(a100.efficiency, gemm_overlap=False))
    for m in (1, 64, 4096):
        op = _gemm(m, 4096, 4096)
        both, one = op_time(op, serial, "kernel"), op_time(op, a100, "kernel")
        assert (both.compute_s, both.memory_s) == (one.compute_s, one.memory_s)
        latency = one.time_s - max(one.compute_s, one.memory_s)
        assert latency >= LAT
        assert both.time_s == pytest.approx(one.compute_s + one.memory_s + latency, rel=1e-12)


def test_kernel_latency_by_kind(a100):
    from dataclasses import replace

    slow_start = replace(a100, efficiency=replace(
        a100.efficiency, kernel_latency_by_kind={"rms_norm": 9e-6}, kernel_memory_fraction={},
        kernel_unit_bytes_per_s={}))
    norm = ops.elementwise("n", "rms_norm", 1, 64, act_bytes=2, dtype="bf16")
    add = ops.elementwise("a", "add", 1, 64, act_bytes=2, dtype="bf16")
    assert op_time(norm, slow_start, "kernel").time_s == \
        pytest.approx(norm.bytes.total / BW + 9e-6)
    assert op_time(add, slow_start, "kernel").time_s == op_time(add, a100, "kernel").time_s


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
    assert op_time(gemv, hw, "kernel").memory_s == pytest.approx(
        gemv.bytes.total / (2.039e12 * 0.25))
    assert op_time(skinny, hw, "kernel").memory_s == pytest.approx(
        skinny.bytes.total / (2.039e12 * 0.4))
    # other kinds keep memory_fraction; GEMV falls back to the GEMM fraction, then the shared
    add = ops.elementwise("add", "add", 64, 4096, act_bytes=2, dtype="bf16")
    assert op_time(add, hw, "kernel").memory_efficiency == pytest.approx(0.865)
    only_gemm = _cpu_blas(a100, gemm_memory_fraction=0.4)
    assert op_time(gemv, only_gemm, "kernel").memory_efficiency == pytest.approx(0.4)


def test_gemv_depth_ramp(a100):
    # k/(k + k_half) on the GEMV streaming rate only: k = k_half halves it; m > 1 untouched
    hw = _cpu_blas(a100, gemv_memory_fraction=0.25, gemv_k_half=512.0)
    for k in (256, 512, 4096):
        gemv = _gemm(1, 4096, k)
        assert op_time(gemv, hw, "kernel").memory_efficiency == pytest.approx(
            0.25 * k / (k + 512))
    skinny = _gemm(8, 4096, 512)
    assert op_time(skinny, hw, "kernel").memory_efficiency == pytest.approx(
        op_time(skinny, _cpu_blas(a100, gemv_memory_fraction=0.25), "kernel")
        .memory_efficiency)
    # deeper GEMVs stream faster, never past the fraction itself
    effs = [op_time(_gemm(1, 4096, k), hw, "kernel").memory_efficiency
            for k in (64, 512, 4096, 65536)]
    assert effs == sorted(effs) and effs[-1] < 0.25


def test_cpu_blas_terms_are_off_on_shipped_hardware():
    # defaults leave GPU predictions unchanged: no packing ramp, GEMMs stream at memory_fraction
    shipped = sorted((Path(pm.__file__).parents[1] / "hardware").glob("*.yaml"))
    assert shipped
    for path in shipped:
        hw = pm.load_hardware(path)
        eff = hw.efficiency
        assert eff.gemm_m_half == 0 and eff.gemm_n_half == 0 \
            and eff.gemm_memory_fraction is None and eff.gemv_memory_fraction is None \
            and eff.gemv_k_half == 0, path.name
        for m in (1, 8):
            op = _gemm(m, 4096, 4096)
            if "bf16" not in hw.peak_flops_per_s and "fp16" not in hw.peak_flops_per_s:
                continue
            t = op_time(op, hw, "kernel")
            assert t.memory_efficiency == pytest.approx(memory_efficiency(op.bytes.total, hw))


def test_unpacked_decode_streams_the_cache_once_per_query_head(a100):
    # PyTorch's CPU flash attention: one program per (sequence, query head), no key split;
    # each of the 4 query heads of a KV group streams that head's K/V again
    op = ops.attention("a", batch=2, q_len=1, kv_len=4096, n_heads=32, n_kv_heads=8,
                       qk_dim=128, v_dim=128, act_bytes=2, kv_bytes=2, dtype="bf16")
    cpu = replace(a100, compute_units=48, efficiency=replace(
        a100.efficiency, attention_decode_pack_gqa=False, kernel_latency_s=0.0))
    kv = 2 * 4096 * 8 * 128 * 2 * 2                         # K and V of 8 KV heads, 2 sequences
    assert op.bytes.kv_read == kv
    assert device_bytes(op, cpu) == op.bytes.total + 3 * kv
    assert device_bytes(op, a100) == op.bytes.total          # packed: read once
    # 64 single-head programs on 48 units: 64/96 busy; no split, so no combine kernel
    assert attention_efficiency(op, cpu) == pytest.approx(cpu.efficiency.attention * 64 / 96)
    assert extra_kernels(op, cpu) == 0 and extra_kernels(op, a100) == 1
    t = op_time(op, cpu, "kernel")
    assert t.memory_s == pytest.approx(device_bytes(op, cpu) / BW)


def _two_thread_cpu(a100, **eff):
    """A 2-unit sync device with a 100 GB/s memory and the PyTorch grain rule."""
    base = {"launch_mode": "sync", "parallel_grain_elements": 32768, "kernel_latency_s": 0.0,
            "kernel_latency_by_kind": {}, "kernel_unit_bytes_per_s": {},
            "kernel_memory_fraction": {}, "memory_fraction": 0.8, "memory_half_bytes": 0.0}
    return replace(a100, compute_units=2, memory_bytes_per_s=100e9,
                   efficiency=replace(a100.efficiency, **(base | eff)))


def test_grain_rule_gives_small_elementwise_kernels_one_thread(a100):
    from perfmodel.roofline import busy_units

    cpu = _two_thread_cpu(a100, kernel_unit_bytes_per_s={"add": 30e9})
    at_grain = ops.elementwise("a", "add", 64, 512, act_bytes=4, dtype="fp32")    # 32768
    above = ops.elementwise("a", "add", 66, 512, act_bytes=4, dtype="fp32")       # 33792
    assert busy_units(at_grain, cpu) == 1 and busy_units(above, cpu) == 2
    # one thread: 30 GB/s (its cap); two: min(0.8 x 100, 2 x 30) = 60 GB/s
    assert op_time(at_grain, cpu, "kernel").memory_s == \
        pytest.approx(at_grain.bytes.total / 30e9)
    assert op_time(above, cpu, "kernel").memory_s == pytest.approx(above.bytes.total / 60e9)
    # the bigger kernel takes less time: the step PyTorch's chunking makes
    assert op_time(above, cpu, "kernel").time_s < op_time(at_grain, cpu, "kernel").time_s
    # GEMMs and attention thread their own way; a kind without a rate is not capped;
    # without the grain (GPUs) every kernel has all the units
    gemm = ops.gemm("g", 8, 512, 512, weight_bytes=4, act_bytes=4, dtype="fp32")
    assert busy_units(gemm, cpu) == 2
    norm = ops.elementwise("n", "rms_norm", 8, 512, act_bytes=4, dtype="fp32")
    assert op_time(norm, cpu, "kernel").memory_s == pytest.approx(norm.bytes.total / 80e9)
    gpu = replace(cpu, efficiency=replace(cpu.efficiency, parallel_grain_elements=0))
    assert busy_units(at_grain, gpu) == 2
    # many threads: a 100,000-element kernel gets ceil(100000 / 32768) = 4 of 16
    wide = replace(cpu, compute_units=16)
    big = ops.elementwise("a", "add", 100, 1000, act_bytes=4, dtype="fp32")
    assert busy_units(big, wide) == 4
    assert op_time(big, wide, "kernel").memory_s == pytest.approx(big.bytes.total / 80e9)
    assert op_time(big, replace(wide, memory_bytes_per_s=1e12), "kernel").memory_s == \
        pytest.approx(big.bytes.total / 120e9)     # 4 threads x 30 GB/s under 0.8 TB/s


def _append(hw):
    return replace(hw, efficiency=replace(hw.efficiency, attention_append_kv=True))


def _gqa_attention(q, kv, heads=32, kv_heads=4, batch=1):
    return ops.attention("a", batch=batch, q_len=q, kv_len=kv, n_heads=heads,
                         n_kv_heads=kv_heads, qk_dim=128, v_dim=128, act_bytes=2, kv_bytes=2,
                         dtype="fp16")


def test_append_kv_prefill_copies_new_kv_in_every_program(a100):
    # flash_attn_with_kvcache, 4096 new tokens, no prior context, 32 query heads of 128:
    # 64 blocks of 64 query rows; block i copies the new keys up to the end of the 128-key
    # tile holding its last row: 128 x ceil((i + 1) / 2) rows, sum 128 x 1056 = 135,168.
    # Each row is K and V (2 x 128 x 2 bytes = 512 B), read from the new K/V and written to
    # the cache, by each of the 32 query-head programs: 135,168 x 512 x 2 x 32 bytes.
    op = _gqa_attention(4096, 4096)
    append = 135_168 * 512 * 2 * 32
    assert append_kv_bytes(op, a100) == 0.0
    assert append_kv_bytes(op, _append(a100)) == append
    # 2048 programs fill the SMs: no key split, one kernel. Compute: the same blocks compute
    # those 135,168 keys each; busy SM = 32 x 135,168 / 108 + (19 - 2048/108) x 128 keys;
    # useful = 32 x (4096 x 4097 / 2) / 64 query rows.
    assert append_kv_splits(op, _append(a100)) == 1
    busy = 32 * 135_168 / 108 + (19 - 2048 / 108) * 128
    frac = 32 * (4096 * 4097 / 2) / 64 / (108 * busy)
    compute = op.flops / (PEAK * 0.73 * frac)
    t = op_time(op, _append(a100), "kernel")
    assert t.compute_efficiency == pytest.approx(0.73 * frac, rel=1e-12)
    # compute-bound (Q, K, V, O stream in 43 us); the copy comes before each program's
    # compute (a barrier), so it adds to the body
    assert op.bytes.total / BW < compute
    assert t.time_s == pytest.approx(compute + append / BW + LAT, rel=1e-9)


def test_append_kv_prefill_splits_keys_when_programs_are_few(a100):
    # a 64-token chunk on 2880 cached+new keys: 32 programs < 0.8 x 108, so the keys (23
    # tiles of 128) are split. Counts that shorten a split: 1 2 3 4 5 6 8 12 23, filling
    # 32n / 108 per wave: n = 23 fills 736/756 = 0.974 best; n = 3 fills 96/108 = 0.889
    # >= 0.85 x 0.974, n = 1, 2 do not -> 3 splits and a combine kernel
    op = _gqa_attention(64, 2880)
    assert append_kv_splits(op, _append(a100)) == 3
    assert extra_kernels(op, _append(a100)) == 1 and extra_kernels(op, a100) == 0


def test_append_kv_leaves_decode_alone(a100):
    op = _gqa_attention(1, 4096, batch=8)
    assert append_kv_bytes(op, _append(a100)) == 0.0
    assert op_time(op, _append(a100), "kernel") == op_time(op, a100, "kernel")


def test_append_kv_copy_starts_at_a_sliding_windows_first_tile(a100):
    # 512 new tokens, no context, a 128-key window, one query head of 128: block i (rows
    # 64i..64i+63) sees keys from 64i - 127 on, so its copy starts at the 128-key tile
    # holding max(0, 64i - 127) and ends at the tile holding row 64i + 63. Blocks 0..7:
    # start 0 0 0 0 128 128 256 256, end 128 128 256 256 384 384 512 512, rows
    # 128 128 256 256 256 256 256 256 = 1792; without the window every start is 0: 2560
    def op(window):
        return ops.attention("a", batch=1, q_len=512, kv_len=512, n_heads=1, n_kv_heads=1,
                             qk_dim=128, v_dim=128, act_bytes=2, kv_bytes=2, dtype="fp16",
                             window=window)
    assert append_kv_bytes(op(None), _append(a100)) == 2560 * 512 * 2
    assert append_kv_bytes(op(128), _append(a100)) == 1792 * 512 * 2
