"""The error class: the one key compare, calibration and the uncertainty band group by."""

import numpy as np

from perfmodel.cost.error_class import ERROR_CLASSES, GEMV_ROWS, error_class
from perfmodel.cost.ops import AllReduce, AllToAll, Attention, Gemm, LayerOverhead, pointwise


def test_gemm_rows_split_gemv_from_gemm_at_the_threshold():
    out = error_class(Gemm(m=np.array([1, GEMV_ROWS - 1, GEMV_ROWS, 4096]), n=4096, k=4096))
    assert out.tolist() == ["gemv", "gemv", "gemm", "gemm"]


def test_grouped_gemm_is_moe_whatever_its_rows():
    out = error_class(Gemm(m=np.array([1, 4096]), n=1024, k=4096, groups=np.array([8, 1])))
    assert out.tolist() == ["moe", "gemm"]


def test_attention_decode_needs_one_new_token_in_every_real_group():
    # groups: (decode, padding), (decode, prefill)
    op = Attention(batch=np.array([[4, 0], [4, 1]]), q_len=np.array([[1, 7], [1, 7]]),
                   kv_len=np.array([[100, 7], [100, 7]]), n_heads=32, n_kv_heads=8,
                   qk_dim=128, v_dim=128, cache_elems=256)
    assert error_class(op).tolist() == ["attention_decode", "attention_prefill"]


def test_other_kernels_by_their_rule():
    assert error_class(pointwise("rms_norm", rows=np.array([1, 2]), n=64)).tolist() == \
        ["memory", "memory"]
    assert error_class(AllReduce(payload=np.array([8e3]), devices=4)).tolist() == ["collective"]
    assert error_class(AllToAll(payload=np.array([8e3]), devices=4)).tolist() == ["collective"]
    assert str(error_class(LayerOverhead())) == "host"


def test_every_class_returned_is_declared():
    ops = [Gemm(m=np.array([1, 512]), n=64, k=64), Gemm(m=2, n=64, k=64, groups=4),
           pointwise("add", rows=3, n=8), AllReduce(payload=1.0, devices=2), LayerOverhead()]
    seen = {str(c) for op in ops for c in np.ravel(error_class(op))}
    assert seen <= set(ERROR_CLASSES)
