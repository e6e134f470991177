"""Expert parallelism inside pipeline stages: each stage shards its own experts over its
group (vLLM's EP group is the TP x DP ranks of one stage), stages sit on consecutive groups
of devices, and a lone request pays every stage in series plus the sends between them."""

from __future__ import annotations

import pytest

import perfmodel as pm

H200, DSV3 = pm.hardware("h200-sxm"), pm.model("deepseek-v3")
ONE = pm.Workload(batch=1, prompt_len=2048, gen_len=16)


def _ttft(plan: pm.Parallelism, w: pm.Workload = ONE) -> float:
    return pm.estimate(H200, DSV3, w, plan).ttft_s


def test_dp_attention_stage_boundary_crosses_nodes_by_hand() -> None:
    """EP8 with DP attention x PP2: stage 0 is devices 0-7, stage 1 devices 8-15, the next
    node (8 per node): the one sequence's 2,048 x 7,168 bf16 activations leave its one
    attention device whole, over the NIC: 2.7 us + 29,360,128 B / 50 GB/s = 589.90256 us."""
    plan = pm.Parallelism(ep=8, attention_dp=True)
    gap = _ttft(pm.Parallelism(ep=8, attention_dp=True, pp=2)) - _ttft(plan)
    assert gap == pytest.approx(2.7e-6 + 2048 * 7168 * 2 / 50e9, rel=1e-9)


def test_tp_expert_stage_sends_a_slice_per_rank() -> None:
    """TP8 with its experts sharded over the same 8 (EP8 in TP8) x PP2: each rank sends
    1/8 of the activations: 2.7 us + 3,670,016 B / 50 GB/s = 76.10032 us."""
    gap = _ttft(pm.Parallelism(tp=8, ep=8, pp=2)) - _ttft(pm.Parallelism(tp=8, ep=8))
    assert gap == pytest.approx(2.7e-6 + 2048 * 7168 * 2 / 8 / 50e9, rel=1e-9)


def test_stages_inside_one_node_use_the_link() -> None:
    """EP4 x PP2 fills one 8-GPU node: the boundary is an NVLink send,
    0.6 us + 29,360,128 B / 450 GB/s."""
    h100 = pm.hardware("h100-sxm")
    mixtral = pm.model("mixtral-8x7b")
    w = pm.Workload(batch=1, prompt_len=2048, gen_len=16)
    one = pm.estimate(h100, mixtral, w, pm.Parallelism(ep=4, attention_dp=True)).ttft_s
    two = pm.estimate(h100, mixtral, w,
                      pm.Parallelism(ep=4, attention_dp=True, pp=2)).ttft_s
    width = mixtral.d_model * 2
    assert two - one == pytest.approx(0.6e-6 + 2048 * width / 450e9, rel=1e-9)


def test_stages_hold_their_share() -> None:
    """Per device, two stages of EP8 hold fewer weights and half the latent cache per
    sequence of one EP8 group; 16 devices as EP8 x PP2 hold fewer weights each than EP16
    (whose attention, dense layers and embeddings are whole on every device) but at least
    the routed experts' 1/16."""
    w = pm.Workload(batch=64, prompt_len=2048, gen_len=256)
    mem = {name: pm.estimate(H200, DSV3, w, plan).memory for name, plan in {
        "ep8": pm.Parallelism(ep=8, attention_dp=True),
        "ep8pp2": pm.Parallelism(ep=8, attention_dp=True, pp=2),
        "ep16": pm.Parallelism(ep=16, attention_dp=True)}.items()}
    assert mem["ep8pp2"].weights_bytes < mem["ep16"].weights_bytes < mem["ep8"].weights_bytes
    assert mem["ep8pp2"].kv_cache_bytes_per_sequence < mem["ep8"].kv_cache_bytes_per_sequence
    routed = DSV3.moe.n_experts * 3 * DSV3.d_model * DSV3.moe.expert_intermediate_size
    moe_layers = DSV3.n_layers - 3          # first_k_dense_replace: 3
    assert mem["ep8pp2"].weights_bytes > routed * moe_layers / 16


@pytest.mark.parametrize("batch", [8, 64, 256])
def test_micro_batches_never_lose_to_a_lone_pass(batch: int) -> None:
    """The pipeline's decode step is at most every stage in series for the whole batch (one
    micro-batch) plus the sends: micro-batching only overlaps work."""
    w = pm.Workload(batch=batch, prompt_len=1024, gen_len=64)
    est = pm.estimate(H200, DSV3, w, pm.Parallelism(ep=8, attention_dp=True, pp=2))
    flat = pm.estimate(H200, DSV3, w, pm.Parallelism(ep=8, attention_dp=True))
    trip = 2.7e-6 + (batch // 8) * DSV3.d_model * 2 / 50e9
    assert est.tpot_s <= flat.tpot_s + trip + 1e-12
    assert "PP2" in est.plan.describe() and "EP8" in est.plan.describe()
