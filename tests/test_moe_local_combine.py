"""TensorRT-LLM's MoE copies the device's (token, expert) rows into expert order and reads
only those back when it un-permutes (``compare.forms.LOCAL_COMBINE``); Triton fused_moe's
un-permutation reads every token's top-k slots."""

import numpy as np
import pytest

from perfmodel.compare.forms import LOCAL_COMBINE, moe_layer
from perfmodel.cost.ops import Pointwise
from perfmodel.specs.dtypes import CODE
from perfmodel.specs.kinds import POINTWISE_CODE

GATHER = POINTWISE_CODE["gather"]
# T 1,024 tokens, top-8, hidden 4,096; EP 32: 256 of the 8,192 pairs on the device
T, K, H, PAIRS = 1024.0, 8.0, 4096.0, 256.0


def _gathers(local: float) -> list[Pointwise]:
    one = np.array([1.0])
    parts = moe_layer(tokens=T * one, topk=K * one, hidden=H * one, width=512 * one,
                      pairs=PAIRS * one, groups=8 * one, wb=2 * one, stored=np.array([-1]),
                      dtype=np.array([CODE["bf16"]]), mode=np.array([-1]),
                      local_combine=local * one)
    return [op for op, _ in parts if isinstance(op, Pointwise) and int(op.code) == GATHER]


def _bytes(op: Pointwise) -> float:
    b = op.bytes
    return float(np.sum((b.act_read + b.act_write) * np.asarray(op.count)))


def test_triton_un_permutation_reads_and_writes_every_top_k_slot():
    (combine,) = _gathers(0.0)
    assert _bytes(combine) == pytest.approx(2 * T * K * H * 2)


def test_trtllm_copies_the_local_pairs_and_reads_only_them_back():
    expand, combine = _gathers(1.0)
    assert _bytes(expand) == pytest.approx(2 * PAIRS * H * 2)          # read + write
    assert _bytes(combine) == pytest.approx((PAIRS + T) * H * 2)       # pairs in, T out


def test_the_trtllm_kernels_are_the_local_ones():
    for name in ("moe_torch_flow_cutlass", "moe_torch_flow_nongated", "moe_torch_flow",
                 "deepgemm"):
        assert name.startswith(LOCAL_COMBINE)
    for name in ("vllm_fused_moe", "sglang_fused_moe_triton",
                 "vllm_unquantizedfusedmoe_triton_tritonexperts"):
        assert not name.startswith(LOCAL_COMBINE)
