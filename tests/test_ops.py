"""Operator records: hand-derived FLOPs and bytes, for one instance and for arrays of them."""

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from perfmodel.cost.ops import (
    AllReduce,
    Attention,
    ByteCounts,
    Embedding,
    Gemm,
    KvWrite,
    Pointwise,
    attended_positions,
    kind_names,
    pointwise,
)

BF16 = 2


def attention(batch, q_len, kv_len, **fields):
    """One instance of one group."""
    defaults = {"n_heads": 32, "n_kv_heads": 8, "qk_dim": 128, "v_dim": 128,
                "cache_elems": 256}
    return Attention(batch=np.array([[batch]]), q_len=np.array([[q_len]]),
                     kv_len=np.array([[kv_len]]), **(defaults | fields))


def test_gemm_counts_weights_once_per_step():
    # [1, 4096] x [4096, 4096] in bf16
    op = Gemm(m=1, n=4096, k=4096, weight_bytes=2, act_bytes=2)
    assert op.flops == 2 * 4096 * 4096
    assert op.bytes == ByteCounts(weights=4096 * 4096 * 2, act_read=4096 * 2, act_write=4096 * 2)
    # 64 tokens: 64x the FLOPs, same weight bytes
    op64 = Gemm(m=64, n=4096, k=4096, weight_bytes=2, act_bytes=2)
    assert op64.flops == 64 * op.flops
    assert op64.bytes.weights == op.bytes.weights


def test_gemm_fields_broadcast_over_instances():
    # three GEMMs in one record: rows [1, 2, 3] against one weight shape
    op = Gemm(m=np.array([1.0, 2.0, 3.0]), n=10, k=20, weight_bytes=1, act_bytes=2)
    np.testing.assert_array_equal(op.flops, 2 * np.array([1, 2, 3]) * 10 * 20)
    np.testing.assert_array_equal(op.bytes.weights, [200, 200, 200])
    assert op.shape == (3,) and op.take(1).flops == 2 * 2 * 10 * 20


def test_int4_weights_are_half_a_byte_not_zero():
    op = Gemm(m=1, n=128, k=128, weight_bytes=0.5, act_bytes=2)
    assert op.bytes.weights == 128 * 128 * 0.5


def test_grouped_gemm_for_experts_and_bias():
    op = Gemm(m=3, n=100, k=10, weight_bytes=1, act_bytes=2, groups=4, bias=1)
    assert op.flops == 2 * 3 * 100 * 10 * 4
    assert op.bytes.weights == (100 * 10 + 100) * 4


def test_weights_as_activations_move_to_act_read():
    op = Gemm(m=3, n=100, k=10, weight_bytes=2, act_bytes=2, weights_are_activations=True)
    assert op.bytes.weights == 0
    assert op.bytes.act_read == 3 * 10 * 2 + 100 * 10 * 2


def test_attention_decode_reads_kv_once_per_kv_head():
    # GQA: 32 query heads, 8 KV heads, head_dim 128, one new token, 1000 cached, bf16
    op = attention(2, 1, 1000)
    assert op.bytes.kv_read == 2 * 8 * 1000 * 256 * 2
    assert op.flops == 2 * 2 * 32 * 1000 * 256     # = 4 * B * C * heads * head_dim
    assert op.bytes.act_read == 2 * 32 * 128 * 2


def test_causal_prefill_halves_the_masked_part():
    op = attention(1, 4, 4, n_heads=1, n_kv_heads=1, qk_dim=8, v_dim=8, cache_elems=16)
    assert op.flops == 2 * (1 + 2 + 3 + 4) * 16


def test_sliding_window_caps_reads_and_flops():
    op = attention(1, 1, 10_000, n_heads=4, n_kv_heads=4, qk_dim=64, v_dim=64, cache_elems=128,
                   window=4096)
    assert op.bytes.kv_read == 4 * 4096 * 128 * 2
    assert op.flops == 2 * 4 * 4096 * 128


def test_attention_groups_sum_and_padding_is_free():
    """A mixed instance (a 512-token chunk and two decodes at 900 and 2000) is the sum of the
    groups priced alone; a padding group (batch 0) adds nothing."""
    grouped = Attention(batch=np.array([[1, 1, 1, 0]]), q_len=np.array([[512, 1, 1, 7]]),
                        kv_len=np.array([[512, 900, 2000, 9]]), n_heads=32, n_kv_heads=8,
                        qk_dim=128, v_dim=128, cache_elems=256)
    alone = [attention(1, 512, 512), attention(1, 1, 900), attention(1, 1, 2000)]
    assert grouped.flops == sum(a.flops for a in alone)
    for source in ("act_read", "act_write", "kv_read"):
        assert getattr(grouped.bytes, source) == sum(getattr(a.bytes, source) for a in alone)


def test_expanded_mla_form_reads_kv_as_activations():
    op = attention(1, 4, 4, kv_from_cache=False, n_heads=2, n_kv_heads=2, qk_dim=8, v_dim=4,
                   cache_elems=12)
    assert op.bytes.kv_read == 0
    assert op.bytes.act_read == 1 * 4 * 2 * 8 * 2 + 1 * 2 * 4 * 12 * 2


@given(st.integers(1, 300), st.integers(0, 300), st.one_of(st.none(), st.integers(1, 400)))
def test_attended_positions_matches_brute_force(q_len, prior, window):
    kv_len = q_len + prior
    brute = sum(min(p, window) if window else p for p in range(prior + 1, kv_len + 1))
    assert attended_positions(q_len, kv_len, window or 0) == brute


def test_attended_positions_vectorised():
    q, kv, w = np.array([1, 4, 3]), np.array([10, 4, 9]), np.array([0, 0, 5])
    expected = [attended_positions(a, b, c) for a, b, c in zip(q, kv, w, strict=True)]
    np.testing.assert_array_equal(attended_positions(q, kv, w), expected)


def test_elementwise_schema():
    op = pointwise("silu_and_mul", 10, 64, act_bytes=2)
    assert op.bytes.act_read == 10 * 128 * 2 and op.bytes.act_write == 10 * 64 * 2
    norm = pointwise("rms_norm", 10, 64, act_bytes=2)
    assert norm.bytes.weights == 64 * 2
    layer = pointwise("layer_norm", 10, 64, act_bytes=2)
    assert layer.bytes.weights == 2 * 64 * 2 and layer.flops == 7 * 10 * 64


def test_pointwise_record_mixes_kinds():
    codes = np.array([pointwise("add", 1, 1).code, pointwise("gelu", 1, 1).code])
    both = Pointwise(code=codes, rows=4, n=8)
    assert list(kind_names(both)) == ["add", "gelu"]
    np.testing.assert_array_equal(both.bytes.act_read, [2 * 4 * 8 * 2, 4 * 8 * 2])


def test_embedding_and_kv_write():
    assert Embedding(rows=8, n=512, act_bytes=4).bytes == \
        ByteCounts(weights=8 * 512 * 4, act_write=8 * 512 * 4)
    assert KvWrite(rows=8, n=256, act_bytes=2, kv_bytes=1).bytes == \
        ByteCounts(act_read=8 * 256 * 2, kv_write=8 * 256 * 1)


def test_ring_all_reduce_traffic():
    op = AllReduce(payload=1e6, devices=4)
    assert op.bytes.act_read == 2 * 3 / 4 * 1e6


def test_bytecounts_add():
    a = ByteCounts(1, 2, 3, 4, 5)
    assert (a + a).total == 30 and a.scaled(3).kv_write == 15
