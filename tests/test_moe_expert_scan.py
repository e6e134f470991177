"""TensorRT-LLM's routing sort: one block ranks every (token, top-k) slot up to 256 tokens
(top-k 1, 2, 4, 6 or 8, at most 510 local experts); otherwise its three-step sort scans the
batch once per local expert, a thread per (local expert, token)
(``cost.moe.expert_scan``), priced at ``moe_kernels.<class>.scan_s`` per thread."""

import numpy as np
import pytest

import perfmodel as pm
from perfmodel.compare.moe_forms import moe_layer
from perfmodel.cost import moe
from perfmodel.cost.moe import expert_scan
from perfmodel.specs.dtypes import CODE
from tests.moe_rows import expert_gemms, with_routing

SCAN_S = 1e-11


@pytest.mark.parametrize("tokens, topk, local, threads", [
    (256, 8, 32, 0.0),          # the one-block prologue: no scan
    (257, 8, 32, 257 * 32.0),   # one token more: the three-step sort
    (16, 3, 32, 16 * 32.0),     # top-3 has no one-block prologue
    (16, 8, 510, 0.0),          # floor(log2(511)) + 1 = 9 radix bits: still one block
    (16, 8, 511, 16 * 511.0),   # 10 bits: the three-step sort
    (8192, 8, 1, 8192.0),       # EP 256 of 256 experts: one scan
])
def test_the_three_step_sort_runs_a_thread_per_local_expert_and_token(tokens, topk, local,
                                                                      threads):
    got = expert_scan(np.array([tokens]), np.array([topk]), np.array([local]))
    assert got.tolist() == [threads]


def test_a_corpus_row_scans_its_devices_experts_on_the_up_gemm_only():
    one = np.array([1.0])
    # 1,024 tokens, top-8, 256 experts over EP 32: 8 on the device
    parts = moe_layer(tokens=1024 * one, topk=8 * one, hidden=4096 * one, width=512 * one,
                      pairs=256 * one, groups=8 * one, wb=2 * one, stored=np.array([-1]),
                      dtype=np.array([CODE["bf16"]]), mode=np.array([-1]),
                      local_combine=one, local_experts=8 * one)
    up, down = (op for op, _ in parts if getattr(op, "experts", False))
    assert float(up.scan[0]) == 8 * 1024.0 and float(np.sum(down.scan)) == 0.0
    hw = pm.hardware("h100-sxm")
    on, off = with_routing(hw, "bf16", 1e-9, SCAN_S), with_routing(hw, "bf16", 1e-9, 0.0)
    extra = np.asarray(moe.fixed_cost(up, on) - moe.fixed_cost(up, off)).ravel()
    assert extra.tolist() == pytest.approx([8 * 1024 * SCAN_S])


@pytest.mark.parametrize("plan, threads", [
    # qwen3-30b-a3b: 128 experts, top-8; 4 sequences x 256 new tokens = 1,024 tokens
    (dict(), 128 * 1024.0),
    # data-parallel attention over EP 4: 4,096 tokens routed, 32 experts per device
    (dict(ep=4, attention_dp=True), 32 * 4096.0),
])
def test_the_estimate_prices_the_scan_once_per_moe_layer(plan, threads):
    hw = pm.hardware("h100-sxm")
    up, down = expert_gemms(hw, plan)
    assert float(np.asarray(up.scan).ravel()[0]) == threads
    assert float(np.asarray(down.scan).ravel()[0]) == 0.0
    on, off = with_routing(hw, "fp8", 1e-9, SCAN_S), with_routing(hw, "fp8", 1e-9, 0.0)
    extra = np.asarray(moe.fixed_cost(up, on) - moe.fixed_cost(up, off)).ravel()[0]
    assert float(extra) == pytest.approx(threads * SCAN_S)


def test_a_decode_batch_takes_the_one_block_prologue():
    from perfmodel.cost.step import Dtypes, Step, step_records

    records = step_records(pm.model("qwen3-30b-a3b"), pm.hardware("h100-sxm"),
                           pm.Parallelism(), Step.uniform(64, 1, 1024), Dtypes.of())
    up = next(r for r in records if r.name == "experts.gate_up_proj")
    assert float(np.asarray(up.scan).ravel()[0]) == 0.0


def test_scan_s_is_off_where_the_engine_does_not_fit_it():
    from validate.corpus.params import apply

    for device in ("h100-sxm", "h200-sxm", "b200"):
        for engine in ("vllm", "sglang"):
            table = pm.hardware(device, engine).efficiency.moe_kernels
            assert all(len(row) < 8 or row[7] == 0.0 for row in table.values())
    hw = apply(pm.hardware("h100-sxm"), {"moe.bf16.gemm_fraction": 0.6})
    assert hw.efficiency.moe_kernels["bf16"][7] == 0.0
