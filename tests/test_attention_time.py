"""Attention time as FlashAttention's kernels cut it: prefill tiles, decode programs and
key splits, the append-KV path, and steps that mix groups. Hand-derived from the A100-80GB
SXM and H100 SXM spec files."""

import math
from dataclasses import replace

import numpy as np
import pytest

import perfmodel as pm
from perfmodel.cost.ops import Attention, attended_positions
from perfmodel.cost.roofline import op_time
from perfmodel.cost.tiling import append_kv_rows, kv_splits, prefill_tile_fraction
from tests.datasheet import datasheet

BW = 2.039e12 * 0.865          # A100 80GB: peak bandwidth x memory_fraction
PEAK = 312e12                  # bf16 dense
LAT = 2e-6


def one(x) -> float:
    return float(np.ravel(x)[0])


def att(batch, q, kv, heads=32, kv_heads=8, hd=128, window=0):
    """One instance of one group of ``batch`` sequences."""
    return Attention(batch=np.array([[batch]]), q_len=np.array([[q]]), kv_len=np.array([[kv]]),
                     n_heads=heads, n_kv_heads=kv_heads, qk_dim=hd, v_dim=hd,
                     cache_elems=2 * hd, window=window)


def tile_fraction(op, hw):
    """``prefill_tile_fraction`` of a one-group record."""
    q, kv, w = op.q_len[0, 0], op.kv_len[0, 0], op.window
    return float(prefill_tile_fraction(hw, op.batch[0, 0], op.n_heads, op.n_kv_heads,
                                       op.qk_dim, q, kv, w, attended_positions(q, kv, w)))


def _one_unit(hw, **eff):
    return replace(hw, compute_units=1, efficiency=replace(hw.efficiency, **eff))


def _prefill(q, kv, heads=1, window=0):
    return att(1, q, kv, heads=heads, kv_heads=1, window=window)


def test_attention_fraction(a100):
    # A100 file: FlashAttention-2 forward 73% of peak, 128 x 64 tiles. Block i of 128 rows
    # needs 2(i+1) key tiles (causal): 1056 per head, 32 heads = 1024 programs, 33,792 tiles
    # on 108 SMs = 312.89 each, + the idle 0.5185 of the 10th wave x the shortest (2 tiles).
    # Useful: 32 heads x 4096 x 4097 / 2 positions / 8192 per tile = 32,776 tiles.
    r = op_time(att(1, 4096, 4096), a100, "kernel")
    busy = 32 * 1056 / 108 + (10 - 1024 / 108) * 2
    assert one(r.compute_efficiency) == pytest.approx(0.73 * 32776 / (108 * busy))
    assert r.bound_name() == "compute"


def test_causal_prefill_computes_diagonal_tiles_in_full(a100):
    hw = _one_unit(a100)
    # 128 new tokens, no prior context: 2 key tiles of 64 = 16,384 scores, 8,256 attended
    assert tile_fraction(_prefill(128, 128), hw) == pytest.approx(8256 / 16384)
    # after 1024 cached tokens: 18 key tiles, 128 x 1024 + 8,256 attended
    assert tile_fraction(_prefill(128, 1152), hw) == \
        pytest.approx((128 * 1024 + 8256) / (18 * 8192))
    # a longer prompt wastes a smaller share on the diagonal
    assert tile_fraction(_prefill(2048, 2048), hw) > tile_fraction(_prefill(256, 256), hw)


def test_sliding_window_prefill_skips_tiles_before_the_window(a100):
    # 512 tokens, window 128: blocks of 128 rows need key tiles [0,2), [0,4), [2,6), [4,8) =
    # 14 tiles; attended: positions 1..128 see p (8,256), the other 384 see 128 (49,152)
    frac = tile_fraction(_prefill(512, 512, window=128), _one_unit(a100))
    assert frac == pytest.approx((8256 + 384 * 128) / (14 * 8192))


def test_cpu_key_splits_are_clipped_at_kv_len(a100):
    # PyTorch's CPU flash attention: 512-key splits from key 0, the last one a GEMM over the
    # keys left (min(512, kv - start)). 1024 tokens in 256-row blocks (one unit): blocks end
    # at keys 256, 512, 768, 1024 -> they compute 512, 512, 1024, 1024 keys (not the
    # 256..1024 of exact causal keys, nor whole 512-key tiles past kv)
    hw = _one_unit(a100, attention_tile_q=((1, 32), (192, 64), (768, 256)),
                   attention_tile_kv=512, attention_clip_kv=True)
    assert tile_fraction(_prefill(1024, 1024), hw) == \
        pytest.approx(1024 * 1025 / 2 / (256 * (512 + 512 + 1024 + 1024)))
    # 128 tokens (32-row blocks): every block computes all 128 keys; unclipped, 512 each
    assert tile_fraction(_prefill(128, 128), hw) == pytest.approx(128 * 129 / 2 / (4 * 32 * 128))
    unclipped = _one_unit(a100, attention_tile_q=((1, 32),), attention_tile_kv=512)
    assert tile_fraction(_prefill(128, 128), unclipped) == \
        pytest.approx(128 * 129 / 2 / (4 * 32 * 512))


def test_few_programs_wait_for_the_longest(a100):
    # one head, 4096 tokens: 32 programs on 108 SMs, so the last block's 64 tiles set the time
    assert tile_fraction(_prefill(4096, 4096), a100) == \
        pytest.approx(4096 * 4097 / 2 / 8192 / (108 * 64))


def test_query_tile_steps_by_length(a100):
    hw = _one_unit(a100, attention_tile_q=((1, 32), (192, 64), (768, 256)), attention_tile_kv=1)
    assert [hw.efficiency.attention_q_tile(q) for q in (2, 191, 192, 767, 768, 5000)] == \
        [32, 32, 64, 64, 256, 256]
    # key tiles of 1: only the masked half of each diagonal block is wasted
    # 256 tokens in 64-row blocks: block i computes 64 x 64(i+1) scores
    scores = sum(64 * 64 * (i + 1) for i in range(4))
    assert tile_fraction(_prefill(256, 256), hw) == pytest.approx(256 * 257 / 2 / scores)


def test_short_chunks_pack_the_kv_group_into_rows(a100, h100):
    # 4 new tokens after 4092 cached, 8 query heads on one KV head (speculative verification).
    # attended: 4 x 4092 + 10 = 16,378 positions per head
    op = att(1, 4, 4096, heads=8, kv_heads=1)
    useful = 8 * 16378
    # H100 file (FlashAttention-3, 128 x 128, PackGQA): one block holds 16 positions x 8 heads,
    # so one program walks 32 key tiles
    assert tile_fraction(op, _one_unit(h100)) == pytest.approx(useful / (32 * 128 * 128))
    # A100 file (FlashAttention-2, 128 x 64, no packing): 8 programs of 64 key tiles, 4 of
    # each 128 rows used
    assert not a100.efficiency.attention_pack_gqa
    assert tile_fraction(op, _one_unit(a100)) == pytest.approx(useful / (8 * 64 * 128 * 64))


@pytest.mark.parametrize("q,kv,heads", [(7, 7, 3), (100, 900, 5), (3000, 3000, 40),
                                        (129, 129, 1), (64, 8192, 64)])
def test_prefill_tile_fraction_is_a_fraction(a100, h100, q, kv, heads):
    for hw in (a100, h100, _one_unit(a100)):
        assert 0 < tile_fraction(_prefill(q, kv, heads), hw) <= 1


def test_decode_attention_packs_the_gqa_group_into_query_rows(a100):
    # 32 query heads over 8 KV heads: one new token gives 4 query rows per KV head, padded
    # to a 16-row tile; 64 sequences x 8 KV heads = 512 tiles = 5 waves of 108 (512/540)
    r = op_time(att(64, 1, 2048), a100, "kernel")
    assert one(r.compute_efficiency) == pytest.approx(0.73 * 4 / 16 * 512 / 540)
    assert r.bound_name() == "memory"


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
    assert kv_splits(np.array([programs]), np.array([32]), 108)[0] == splits


def _wave_fill(programs: int, units: int) -> float:
    w = programs / units
    return w / math.ceil(w)


def test_decode_kv_splits_never_fill_worse_than_one_split():
    for units in (2, 108, 132):
        programs = np.repeat(np.arange(1, 2 * units), 4)
        tiles = np.tile([1, 1, 32, 391], 2 * units - 1)
        got = kv_splits(programs, tiles, units)
        for p, n_tiles, n in zip(programs, tiles, got, strict=True):
            assert 1 <= n <= max(1, min(units, n_tiles))
            assert _wave_fill(p * n, units) >= _wave_fill(p, units)


def test_long_context_decode_at_batch_1_is_split_to_stream_at_full_bandwidth(a100):
    # one sequence x 8 KV heads = 8 programs would leave 100 of 108 SMs idle; split over
    # the keys (and combined by a second kernel) the read of 134 MB streams at the
    # device's bandwidth: bytes / BW + two kernel latencies
    op = att(1, 1, 32768)
    r = op_time(op, a100, "kernel")
    assert r.bound_name() == "memory"
    assert one(r.time_s) == pytest.approx(op.bytes.total / BW + 2 * LAT, rel=1e-9)
    # the same read by 64 sequences fills the SMs without a split: one kernel
    wide = att(64, 1, 512)
    assert one(op_time(wide, a100, "kernel").time_s) == \
        pytest.approx(wide.bytes.total / BW + LAT, rel=1e-9)


def test_split_decode_adds_a_combine_at_the_generic_fixed_cost(a100):
    # FlashAttention's combine (FA2 flash_fwd_splitkv_combine_kernel, FA3
    # run_mha_fwd_combine) is a small kernel of its own: it costs the device's generic
    # kernel_latency_s, not a second attention kernel's fixed cost, after a split decode
    # as after a split append-KV chunk (flash_attn_with_kvcache)
    own, generic = 7e-6, 3e-6
    hw = replace(a100, efficiency=replace(a100.efficiency, kernel_latency_s=generic,
                                          kernel_latency_by_kind={"attention": own}))
    split = op_time(att(1, 1, 32768), hw, "kernel")           # 8 programs on 108 SMs
    whole = op_time(att(64, 1, 512), hw, "kernel")            # fills the SMs: no split
    assert one(split.fixed_s) == pytest.approx(own + generic)
    assert one(whole.fixed_s) == pytest.approx(own)
    chunk = op_time(att(1, 64, 2880, kv_heads=4), _append(hw), "kernel")
    assert one(chunk.fixed_s) == pytest.approx(own + generic)


def test_unpacked_decode_streams_the_cache_once_per_query_head(a100):
    # PyTorch's CPU flash attention: one program per (sequence, query head), no key split;
    # each of the 4 query heads of a KV group streams that head's K/V again
    op = att(2, 1, 4096)
    cpu = replace(a100, compute_units=48, efficiency=replace(
        a100.efficiency, attention_decode_pack_gqa=False, kernel_latency_s=0.0))
    kv = 2 * 4096 * 8 * 128 * 2 * 2                         # K and V of 8 KV heads, 2 sequences
    assert op.bytes.kv_read == kv
    r = op_time(op, cpu, "kernel")
    assert one(r.memory_s) == pytest.approx((op.bytes.total + 3 * kv) / BW)
    assert one(op_time(op, a100, "kernel").memory_s) == pytest.approx(op.bytes.total / BW)
    # 64 single-head programs on 48 units: 64/96 busy; no split, so no combine kernel
    assert one(r.compute_efficiency) == pytest.approx(cpu.efficiency.attention * 64 / 96)
    assert one(r.fixed_s) == 0.0
    assert one(op_time(op, a100, "kernel").fixed_s) == 2 * LAT      # split + combine on GPU


def test_mixed_step_pools_decodes_and_adds_prefill_chunks(a100):
    """A varlen kernel over a 512-token chunk and 63 decodes at 1000..4000 keys: FLOPs and
    bytes are the sums of the groups; compute time = the chunk's FLOPs at its own tile
    efficiency + the decodes' FLOPs at the pool's (63 x 8 = 504 programs on 108 SMs, no
    split: unequal programs longest first); memory time = all bytes at the bandwidth."""
    ctx = np.linspace(1000, 4000, 63).round().astype(int)
    batch = np.array([[1, *np.ones(63, int)]])
    op = Attention(batch=batch, q_len=np.array([[512, *np.ones(63, int)]]),
                   kv_len=np.array([[512, *ctx]]), n_heads=32, n_kv_heads=8, qk_dim=128,
                   v_dim=128, cache_elems=256)
    chunk, decodes = att(1, 512, 512), [att(1, 1, c) for c in ctx]
    assert op.flops == pytest.approx(chunk.flops + sum(d.flops for d in decodes), rel=1e-12)
    assert op.bytes.total == pytest.approx(
        chunk.bytes.total + sum(d.bytes.total for d in decodes), rel=1e-12)
    chunk_eff = one(op_time(chunk, a100, "kernel").compute_efficiency)
    # decode pool: 4 query rows in a 16-row tile; programs of c keys (no split: 504 >=
    # 0.8 x 108); T = max(longest, total / 108 + idle share of the last wave x shortest)
    n = 63 * 8
    total = 8 * ctx.sum()
    makespan = max(ctx.max(), total / 108 + (math.ceil(n / 108) - n / 108) * ctx.min())
    pool_eff = 0.73 * 4 / 16 * total / (108 * makespan)
    compute = chunk.flops / (PEAK * chunk_eff) + sum(d.flops for d in decodes) / (PEAK * pool_eff)
    r = op_time(op, a100, "kernel")
    assert one(r.compute_s) == pytest.approx(compute, rel=1e-9)
    assert one(r.memory_s) == pytest.approx(op.bytes.total / BW, rel=1e-9)
    assert one(r.time_s) == pytest.approx(max(compute, op.bytes.total / BW) + LAT, rel=1e-9)


def test_one_decode_group_equals_the_pooled_formula_with_equal_programs(a100):
    # a uniform decode of 64 sequences split into 4 groups of 16 at the same context: the
    # pool is the same 512 programs, so the time is the same
    single = att(64, 1, 2048)
    split = Attention(batch=np.array([[16, 16, 16, 16]]), q_len=np.ones((1, 4), int),
                      kv_len=np.full((1, 4), 2048), n_heads=32, n_kv_heads=8, qk_dim=128,
                      v_dim=128, cache_elems=256)
    assert one(op_time(split, a100, "kernel").time_s) == \
        pytest.approx(one(op_time(single, a100, "kernel").time_s), rel=1e-12)


def _append(hw):
    return replace(hw, efficiency=replace(hw.efficiency, attention_append_kv=True))


def test_append_kv_prefill_copies_new_kv_in_every_program(a100):
    # flash_attn_with_kvcache, 4096 new tokens, no prior context, 32 query heads of 128:
    # 64 blocks of 64 query rows; block i copies the new keys up to the end of the 128-key
    # tile holding its last row: 128 x ceil((i + 1) / 2) rows, sum 128 x 1056 = 135,168.
    # Each row is K and V (2 x 128 x 2 bytes = 512 B), read from the new K/V and written to
    # the cache, by each of the 32 query-head programs: 135,168 x 512 x 2 x 32 bytes.
    op = att(1, 4096, 4096, kv_heads=4)
    append = 135_168 * 512 * 2 * 32
    assert append_kv_rows(np.array([128]), np.array([4096]), np.array([4096]), 0)[0] == 135_168
    # 2048 programs fill the SMs: no key split, one kernel. Compute: the same blocks compute
    # those 135,168 keys each; busy SM = 32 x 135,168 / 108 + (19 - 2048/108) x 128 keys;
    # useful = 32 x (4096 x 4097 / 2) / 64 query rows.
    busy = 32 * 135_168 / 108 + (19 - 2048 / 108) * 128
    frac = 32 * (4096 * 4097 / 2) / 64 / (108 * busy)
    compute = op.flops / (PEAK * 0.73 * frac)
    r = op_time(op, _append(a100), "kernel")
    assert one(r.compute_efficiency) == pytest.approx(0.73 * frac, rel=1e-12)
    # compute-bound (Q, K, V, O stream in 43 us); the copy comes before each program's
    # compute (a barrier), so it adds to the body; one kernel
    assert op.bytes.total / BW < compute
    assert one(r.time_s) == pytest.approx(compute + append / BW + LAT, rel=1e-9)
    plain = op_time(op, a100, "kernel")
    assert one(plain.memory_s) == pytest.approx(op.bytes.total / BW)    # no copy by default


def test_append_kv_prefill_splits_keys_when_programs_are_few(a100):
    # a 64-token chunk on 2880 cached+new keys: 32 programs < 0.8 x 108, so the keys (23
    # tiles of 128) are split. Counts that shorten a split: 1 2 3 4 5 6 8 12 23, filling
    # 32n / 108 per wave: n = 23 fills 736/756 = 0.974 best; n = 3 fills 96/108 = 0.889
    # >= 0.85 x 0.974, n = 1, 2 do not -> 3 splits and a combine kernel
    assert kv_splits(np.array([32]), np.array([23]), 108)[0] == 3
    op = att(1, 64, 2880, kv_heads=4)
    assert one(op_time(op, _append(a100), "kernel").fixed_s) == 2 * LAT
    assert one(op_time(op, a100, "kernel").fixed_s) == LAT


def test_append_kv_leaves_decode_alone(a100):
    op = att(8, 1, 4096, kv_heads=4)
    assert op_time(op, _append(a100), "kernel") == op_time(op, a100, "kernel")


def test_append_kv_copy_starts_at_a_sliding_windows_first_tile():
    # 512 new tokens, no context, a 128-key window, one query head of 128: block i (rows
    # 64i..64i+63) sees keys from 64i - 127 on, so its copy starts at the 128-key tile
    # holding max(0, 64i - 127) and ends at the tile holding row 64i + 63. Blocks 0..7:
    # start 0 0 0 0 128 128 256 256, end 128 128 256 256 384 384 512 512, rows
    # 128 128 256 256 256 256 256 256 = 1792; without the window every start is 0: 2560
    rows = append_kv_rows(np.array([128, 128]), np.array([512, 512]), np.array([512, 512]),
                          np.array([0, 128]))
    np.testing.assert_array_equal(rows, [2560, 1792])


def test_a_few_new_tokens_on_a_cache_run_as_decode():
    """Speculative verification: 2 new tokens of DeepSeek-V3 (16 query heads per device
    under TP8, one latent KV head) on a 2,048-token cache. FlashMLA packs the 2 x 16 query
    rows of the latent head into one tile and splits the keys as in decode, so the step
    reads the same cache in about the same time as one token; a 128-row prefill tile per
    head with one program per sequence would leave 131 of the 132 SMs idle (6.7 ms)."""
    from perfmodel.cost.step import Dtypes, Step, price_step

    model, hw, plan = pm.model("deepseek-v3"), datasheet("h200-sxm"), pm.Parallelism(tp=8)
    times = {}
    for q in (1, 2, 16, 17):
        cost = price_step(model, hw, plan, Step.uniform(1, q, 2048 + q), Dtypes.of("fp8"))
        times[q] = float(cost.time_s[cost.names.index("attention"), 0])
    assert times[1] < times[2] < 1.1 * times[1]
    assert times[16] < 2 * times[1]
    # past 16 new tokens a group is a prefill chunk again: one program per sequence and
    # latent head, no key split (a pre-existing limit of the chunked-prefill model)
    assert times[17] > 10 * times[16]
