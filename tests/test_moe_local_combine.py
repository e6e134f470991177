"""TensorRT-LLM's MoE copies the device's (token, expert) rows into expert order and reads
only those back when it un-permutes (``compare.moe_forms.LOCAL_COMBINE``); Triton fused_moe's
un-permutation reads every token's top-k slots. Its routing and sort read every (token,
top-k) slot of the batch (``moe_kernels.<class>.slot_s``)."""

import numpy as np
import pytest

import perfmodel as pm
from perfmodel.compare.moe_forms import LOCAL_COMBINE, moe_layer
from perfmodel.cost.ops import Pointwise
from perfmodel.specs.dtypes import CODE
from perfmodel.specs.kinds import POINTWISE_CODE
from tests.moe_rows import expert_gemms, with_routing

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


# the routing and expert sort's cost per (token, top-k) slot (``moe_kernels.<class>.slot_s``,
# ``cost.moe.fixed_cost``): TensorRT-LLM's prologue reads every slot's expert id
SLOT_S = 1e-9


def test_the_up_gemm_carries_the_layers_slots_and_pays_slot_s_each():
    from perfmodel.cost import moe

    one = np.array([1.0])
    parts = moe_layer(tokens=T * one, topk=K * one, hidden=H * one, width=512 * one,
                      pairs=PAIRS * one, groups=8 * one, wb=2 * one, stored=np.array([-1]),
                      dtype=np.array([CODE["bf16"]]), mode=np.array([-1]),
                      local_combine=one)
    up, down = (op for op, _ in parts if getattr(op, "experts", False))
    assert float(up.slots[0]) == T * K == 8192.0 and float(np.sum(down.slots)) == 0.0
    hw = pm.hardware("h100-sxm")
    on, off = with_routing(hw, "bf16", SLOT_S), with_routing(hw, "bf16", 0.0)
    # 8,192 slots x 1 ns = 8.192 us on the up GEMM, nothing on the down GEMM
    extra = np.asarray(moe.fixed_cost(up, on) - moe.fixed_cost(up, off)).ravel()
    assert extra.tolist() == pytest.approx([8.192e-6])
    np.testing.assert_array_equal(moe.fixed_cost(down, on), moe.fixed_cost(down, off))


@pytest.mark.parametrize("plan, slots", [
    # qwen3-30b-a3b, top-8; 4 sequences x 256 new tokens = 1,024 tokens: 8,192 slots
    (dict(), 8192.0),
    # data-parallel attention over EP 4: the layer routes the 4 devices' tokens
    (dict(ep=4, attention_dp=True), 4 * 8192.0),
])
def test_the_estimate_prices_the_slots_once_per_moe_layer(plan, slots):
    from perfmodel.cost import moe

    hw = pm.hardware("h100-sxm")
    up, down = expert_gemms(hw, plan)
    assert float(np.asarray(up.slots).ravel()[0]) == slots
    assert float(np.asarray(down.slots).ravel()[0]) == 0.0
    on, off = with_routing(hw, "fp8", SLOT_S), with_routing(hw, "fp8", 0.0)
    extra = np.asarray(moe.fixed_cost(up, on) - moe.fixed_cost(up, off)).ravel()[0]
    assert float(extra) == pytest.approx(slots * SLOT_S)


def test_slot_s_is_off_where_the_engine_does_not_fit_it():
    from validate.corpus.params import apply

    for device in ("h100-sxm", "h200-sxm", "b200"):
        for engine in ("vllm", "sglang"):
            table = pm.hardware(device, engine).efficiency.moe_kernels
            assert all(row[6] == 0.0 for row in table.values())
        trt = pm.hardware(device, "trtllm").efficiency.moe_kernels
        assert all(1e-13 <= row[6] <= 1e-8 for row in trt.values())
    # a fit without slot_s (vLLM's, SGLang's rows) leaves it at 0, not at its start
    hw = apply(pm.hardware("h100-sxm"), {"moe.bf16.gemm_fraction": 0.6})
    assert hw.efficiency.moe_kernels["bf16"][6] == 0.0
