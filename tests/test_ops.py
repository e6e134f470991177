"""Operator records: hand-derived FLOPs and bytes."""

from hypothesis import given
from hypothesis import strategies as st

from perfmodel import ops
from perfmodel.ops import ByteCounts


def test_gemm_counts_weights_once_per_step():
    # [1, 4096] x [4096, 4096] in bf16
    op = ops.gemm("g", 1, 4096, 4096, weight_bytes=2, act_bytes=2, dtype="bf16")
    assert op.flops == 2 * 4096 * 4096
    assert op.bytes == ByteCounts(weights=4096 * 4096 * 2, act_read=4096 * 2, act_write=4096 * 2)
    # 64 tokens: 64x the FLOPs, same weight bytes
    op64 = ops.gemm("g", 64, 4096, 4096, weight_bytes=2, act_bytes=2, dtype="bf16")
    assert op64.flops == 64 * op.flops
    assert op64.bytes.weights == op.bytes.weights


def test_int4_weights_are_half_a_byte_not_zero():
    op = ops.gemm("g", 1, 128, 128, weight_bytes=0.5, act_bytes=2, dtype="bf16")
    assert op.bytes.weights == 128 * 128 * 0.5


def test_grouped_gemm_for_experts():
    op = ops.gemm("e", 3, 100, 10, weight_bytes=1, act_bytes=2, dtype="bf16", groups=4)
    assert op.flops == 2 * 3 * 100 * 10 * 4
    assert op.bytes.weights == 100 * 10 * 4


def test_attention_decode_reads_kv_once_per_kv_head():
    # GQA: 32 query heads, 8 KV heads, head_dim 128, one new token, 1000 cached, fp16
    op = ops.attention("a", batch=2, q_len=1, kv_len=1000, n_heads=32, n_kv_heads=8,
                       qk_dim=128, v_dim=128, act_bytes=2, kv_bytes=2, dtype="bf16")
    assert op.bytes.kv_read == 2 * 8 * 1000 * 256 * 2
    assert op.flops == 2 * 2 * 32 * 1000 * 256     # = 4 * B * C * heads * head_dim
    assert op.bytes.act_read == 2 * 32 * 128 * 2


def test_causal_prefill_halves_the_masked_part():
    op = ops.attention("a", batch=1, q_len=4, kv_len=4, n_heads=1, n_kv_heads=1, qk_dim=8,
                       v_dim=8, act_bytes=2, kv_bytes=2, dtype="bf16")
    assert op.flops == 2 * (1 + 2 + 3 + 4) * 16


def test_sliding_window_caps_reads_and_flops():
    op = ops.attention("a", batch=1, q_len=1, kv_len=10_000, n_heads=4, n_kv_heads=4,
                       qk_dim=64, v_dim=64, act_bytes=2, kv_bytes=2, dtype="bf16", window=4096)
    assert op.bytes.kv_read == 4 * 4096 * 128 * 2
    assert op.flops == 2 * 4 * 4096 * 128


@given(st.integers(1, 300), st.integers(0, 300), st.one_of(st.none(), st.integers(1, 400)))
def test_attended_positions_matches_brute_force(q_len, prior, window):
    kv_len = q_len + prior
    brute = sum(min(p, window) if window else p for p in range(prior + 1, kv_len + 1))
    assert ops.attended_positions(q_len, kv_len, window) == brute


def test_elementwise_schema():
    op = ops.elementwise("s", "silu_and_mul", 10, 64, act_bytes=2, dtype="bf16")
    assert op.bytes.act_read == 10 * 128 * 2 and op.bytes.act_write == 10 * 64 * 2
    norm = ops.elementwise("n", "rms_norm", 10, 64, act_bytes=2, dtype="bf16")
    assert norm.bytes.weights == 64 * 2


def test_ring_all_reduce_traffic():
    op = ops.all_reduce("ar", 1e6, 4, dtype="bf16")
    assert op.bytes.act_read == 2 * 3 / 4 * 1e6


def test_bytecounts_add():
    a = ByteCounts(1, 2, 3, 4, 5)
    assert (a + a).total == 30 and a.scaled(3).kv_write == 15
