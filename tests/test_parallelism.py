"""Pipeline and data parallelism: golden values from the schedule's own rules, worked from
separately priced steps, and properties (replicas never cut throughput; a lone request pays
every stage in series; the phase's rows add up to its time)."""

import itertools
import json
from dataclasses import replace

import numpy as np
import pytest
from typer.testing import CliRunner

import perfmodel as pm
from perfmodel.cli.app import app
from perfmodel.cost.params import stage_layers
from perfmodel.schedules.pipeline import trip_seconds
from tests.datasheet import datasheet

H100 = datasheet("h100-sxm")
LLAMA = pm.model("llama-3-70b")          # 80 layers, d 8192


def _est(batch, tp=8, pp=1, dp=1, hw=H100, model=LLAMA, **kw):
    return pm.estimate(hw, model, pm.Workload(batch=batch, prompt_len=2048, gen_len=256, **kw),
                       pm.Parallelism(tp=tp, pp=pp, dp=dp))


def test_stage_layers_follow_vllm():
    assert stage_layers(80, 8).tolist() == [10] * 8
    assert stage_layers(61, 4).tolist() == [15, 15, 16, 15]     # the extra layer before the last
    assert stage_layers(10, 4).tolist() == [2, 3, 3, 2]


def test_a_lone_request_pays_every_stage_in_series():
    """Batch 1: one micro-batch; TPOT = the whole replica's step + one trip through the 3
    boundaries of 4 stages (NVLink: 0.6 us + 8192 x 2 B / 2 / 450 GB/s each)."""
    flat, piped = _est(1, tp=2), _est(1, tp=2, pp=4)
    trip = 3 * (0.6e-6 + 8192 * 2 / 2 / 450e9)
    assert trip_seconds(H100, pm.Parallelism(tp=2, pp=4), np.array([8192 * 2.0]))[0] == \
        pytest.approx(trip)
    assert piped.decode.time_s == pytest.approx(flat.decode.time_s + 255 * trip, rel=1e-9)
    assert piped.ttft_s == pytest.approx(flat.ttft_s + 3 * (0.6e-6 + 2048 * 8192 / 450e9),
                                         rel=1e-9)
    # each device does a quarter of the work; the rest of the time it waits (the bubble)
    bubble = next(o for o in piped.decode.ops if o.name == "pipeline_bubble")
    assert bubble.time_s == pytest.approx(0.75 * flat.decode.time_s, rel=1e-6)
    assert piped.memory.weights_bytes < flat.memory.weights_bytes / 3.5


def test_micro_batches_fill_the_pipe():
    """Batch 64 on PP2 x TP4: two micro-batches of 32. Prefill = F + (2 - 1) x the busiest
    stage + one trip; a decode step = max(F + trip, 2 x busiest), F the TP4 step of 32."""
    piped = _est(64, tp=4, pp=2)
    half = _est(32, tp=4)
    f_prefill = half.ttft_s
    assert f_prefill < piped.ttft_s < 1.6 * f_prefill            # about F + F / 2
    assert piped.tpot_s == pytest.approx(half.tpot_s, rel=0.03)  # balanced: 2 x F / 2 = F
    ops = sum(o.time_s for o in piped.decode.ops)
    assert ops == pytest.approx(piped.decode.time_s, rel=1e-9)   # rows add up to the phase


def test_replicas_scale_throughput_not_latency():
    one, two = _est(16, tp=4), _est(16, tp=4, dp=2)
    assert (two.ttft_s, two.tpot_s, two.memory.weights_bytes) == \
        (one.ttft_s, one.tpot_s, one.memory.weights_bytes)
    assert two.throughput_tokens_per_s == pytest.approx(2 * one.throughput_tokens_per_s)
    assert two.to_dict()["devices"] == 8
    assert two.to_dict()["throughput_per_device_tokens_per_s"] == pytest.approx(
        one.to_dict()["throughput_per_device_tokens_per_s"])


@pytest.mark.parametrize("dp", [1, 2, 3, 4])
def test_more_replicas_never_cut_throughput(dp):
    assert _est(8, tp=2, dp=dp + 1).throughput_tokens_per_s > \
        _est(8, tp=2, dp=dp).throughput_tokens_per_s


def test_stages_across_nodes_use_the_network():
    """TP8 x PP2 on H100s: the one boundary crosses from node 0 to node 1 (50 GB/s, 2.7 us)."""
    plan = pm.Parallelism(tp=8, pp=2)
    bytes_each = np.array([8192 * 2.0 * 64])
    assert trip_seconds(H100, plan, bytes_each)[0] == pytest.approx(
        2.7e-6 + 8192 * 2 * 64 / 8 / 50e9)
    with pytest.raises(pm.SpecError, match="network_bytes_per_s"):
        _est(1, tp=8, pp=2, hw=pm.hardware("a100-80gb-pcie"))


def test_cli_pipeline_and_replicas():
    runner = CliRunner()
    args = ["estimate", "-m", "llama-3-70b", "-H", "h100-sxm", "--tp", "4", "--pp", "2",
            "--dp", "2", "--batch", "16", "--breakdown"]
    out = runner.invoke(app, args)
    assert out.exit_code == 0, out.output
    assert "pipeline_bubble" in out.stdout and "pipeline_p2p" in out.stdout
    data = json.loads(runner.invoke(app, [*args, "-f", "json"]).stdout)
    assert data["devices"] == 16 and data["parallelism"]["pp"] == 2
    assert 0 < data["communication_share"] < 1


# --- expert parallelism inside the tensor-parallel group ----------------------------------

DSV3, H200 = pm.model("deepseek-v3"), datasheet("h200-sxm")


def _moe(batch, plan, skew=0.0, prompt=2048, gen=16):
    return pm.estimate(H200, DSV3, pm.Workload(batch=batch, prompt_len=prompt, gen_len=gen,
                                               weights_dtype="fp8", expert_skew=skew), plan)


def test_busiest_device_draws_the_most_experts_by_hand():
    """Two devices of two experts, each touched with probability 1/2: the larger of two
    Binomial(2, 1/2) draws is 0, 1, 2 with probability 1/16, 8/16, 7/16: mean 22/16."""
    from perfmodel.cost.routing import expected_max_touched

    assert expected_max_touched(2, np.array([0.5]), 2)[0] == pytest.approx(22 / 16)
    assert expected_max_touched(32, np.array([8 / 256]), 1)[0] == pytest.approx(1.0)
    assert expected_max_touched(32, np.array([1.0]), 8)[0] == 32


def test_expert_parallel_inside_tp_holds_the_same_weights():
    tp, ep = pm.Parallelism(tp=8), pm.Parallelism(tp=8, ep=8)
    assert _moe(1, ep).memory.weights_bytes == pytest.approx(_moe(1, tp).memory.weights_bytes)


def test_small_batches_wait_for_the_device_with_the_most_experts():
    """Batch 1 touches 8 of 256 experts: under TP every device reads 1/8 of each of the 8;
    under EP8 the step waits for the device that holds the most of them (about 2.4 of its
    32, against a mean of 1), so decode is slower. A large prefill touches every expert on
    every device: the same work, in whole experts (n = 2 x 2048) instead of 1/8 slices
    (n = 2 x 256), which fill the GEMM tiles a little better."""
    tp, ep = pm.Parallelism(tp=8), pm.Parallelism(tp=8, ep=8)
    assert _moe(1, ep).tpot_s > 1.05 * _moe(1, tp).tpot_s
    assert 0.95 * _moe(64, tp).ttft_s < _moe(64, ep).ttft_s <= _moe(64, tp).ttft_s


@pytest.mark.parametrize("ep", [8])
def test_more_skew_never_speeds_an_expert_parallel_prefill(ep):
    """Up to an exponent of 1. Past it the hottest experts are in every token's top-k (their
    inclusion probability is capped at 1), and the balanced placement spreads those
    saturated experts a little better: at 1.5 the busiest device's share falls by 0.06%
    (measured; cost.routing's greedy EPLB-style placement), a property this model does not
    keep there."""
    plan = pm.Parallelism(tp=ep, ep=ep)
    times = [_moe(16, plan, skew=s, prompt=1024, gen=2).ttft_s for s in (0.0, 0.5, 1.0)]
    assert all(b >= a * (1 - 1e-9) for a, b in itertools.pairwise(times)), times


# --- data-parallel attention with all-to-all expert dispatch -----------------------------

def test_attention_dp_splits_the_batch_and_the_cache():
    """EP16 with DP attention on 2 x 8 H200: each device runs attention on batch/16
    sequences with whole attention weights, so its KV cache is 1/16 of the batch's (MLA's
    latent is not replicated as it is under TP) and the batch ceiling rises; routed experts
    are 256 / 16 = 16 per device."""
    tp8pp2 = pm.Parallelism(tp=8, pp=2)
    dpa = pm.Parallelism(ep=16, attention_dp=True)
    a, b = _moe(256, tp8pp2, gen=64), _moe(256, dpa, gen=64)
    whole = _moe(256, pm.Parallelism(tp=8), gen=64).memory.kv_cache_bytes_per_sequence
    assert b.memory.kv_cache_bytes == pytest.approx(16 * whole, rel=1e-12)   # 16 of 256
    assert b.memory.max_batch > 2 * a.memory.max_batch
    assert b.to_dict()["devices"] == a.to_dict()["devices"] == 16
    dispatch = next(o for o in b.decode.ops if o.name == "moe_dispatch")
    combine = next(o for o in b.decode.ops if o.name == "moe_combine")
    assert dispatch.op_class == "communication" and combine.bytes.total > dispatch.bytes.total


def test_dispatch_bytes_by_hand():
    """One decode step of 16 sequences per device, top 8 of 7168-wide activations: DeepEP's
    low-latency dispatch (a decode step) sends each of the 16 x 8 pairs as one message of
    7168 x (1 + 4/128) B in fp8 with block scales plus its 16-byte header (internode_ll.cu
    ``num_bytes_per_msg``), (15/16) of them off the device, and receives as much; combine
    sends them back in bf16."""
    from perfmodel.cost.step import Dtypes, Step, price_step

    dpa = pm.Parallelism(ep=16, attention_dp=True)
    cost = price_step(DSV3, H200, dpa, Step.uniform(16, 1, 1024), Dtypes.of("fp8"))
    i = cost.names.index("moe_dispatch")
    per_layer = 16 * 8 * (7168 * (1 + 4 / 128) + 16) * 15 / 16
    assert cost.bytes.act_read[i, 0] == pytest.approx(58 * per_layer, rel=1e-9)


def test_attention_dp_across_nodes_needs_a_network():
    with pytest.raises(pm.SpecError, match="network_bytes_per_s"):
        pm.estimate(pm.hardware("a100-80gb-pcie"), DSV3, pm.Workload(batch=16),
                    pm.Parallelism(ep=16, attention_dp=True))


def test_cli_expert_parallel_plans():
    runner = CliRunner()
    args = ["estimate", "-m", "deepseek-v3", "-H", "h200-sxm", "--ep", "16", "--attention-dp",
            "--batch", "64", "--weights-dtype", "fp8"]
    out = runner.invoke(app, [*args, "--breakdown"])
    assert out.exit_code == 0, out.output
    assert "h200-sxm x16 (EP16, DP attention)" in out.stdout and "moe_dispatch" in out.stdout
    data = json.loads(runner.invoke(app, [*args, "-f", "json"]).stdout)
    assert data["parallelism"]["attention_dp"] is True and data["devices"] == 16
    bad = runner.invoke(app, [*args, "--tp", "2"])
    assert bad.exit_code == 2 and "attention_dp needs tp=1" in bad.stderr


def test_sweep_takes_the_levers_as_dimensions(tmp_path):
    """pp, dp, the shared prefix and the routing skew are sweep axes: 2 x 2 x 2 x 2 batches
    = 16 points, each the estimate of the same flags."""
    import csv

    runner = CliRunner()
    out = runner.invoke(app, ["sweep", "-m", "llama-3-70b", "-H", "h100-sxm", "--tp", "4",
                              "--pp", "1,2", "--dp", "1,2", "--batch", "8,64", "--context",
                              "2048", "--gen", "16", "--shared-prefix", "0,1024",
                              "--kv-models", "llama-3-8b", "--no-figures", "--out",
                              str(tmp_path)])
    assert out.exit_code == 0, out.output
    rows = list(csv.DictReader(open(tmp_path / "sweep.csv")))
    assert len(rows) == 16
    assert {(r["pp"], r["dp"], r["workload_shared_prefix"]) for r in rows} == {
        (p, d, s) for p in "12" for d in "12" for s in ("0", "1024")}
    one = next(r for r in rows if (r["pp"], r["dp"], r["workload_shared_prefix"],
                                   r["workload_batch"]) == ("2", "2", "1024", "64"))
    est = pm.estimate(pm.hardware("h100-sxm"), LLAMA, pm.Workload(
        batch=64, prompt_len=2048, gen_len=16, shared_prefix=1024),
        pm.Parallelism(tp=4, pp=2, dp=2))
    assert float(one["tpot_s"]) == pytest.approx(est.tpot_s, rel=1e-9)
    assert float(one["throughput_tokens_per_s"]) == pytest.approx(
        est.throughput_tokens_per_s, rel=1e-9)


def test_sweep_takes_expert_parallel_plans(tmp_path):
    import csv

    runner = CliRunner()
    out = runner.invoke(app, ["sweep", "-m", "deepseek-v3", "-H", "h200-sxm", "--ep", "8,16",
                              "--attention-dp", "--batch", "64", "--context", "1024", "--gen",
                              "8", "--weights-dtype", "fp8", "--kv-models", "llama-3-8b",
                              "--no-figures", "--out", str(tmp_path)])
    assert out.exit_code == 0, out.output
    rows = list(csv.DictReader(open(tmp_path / "sweep.csv")))
    assert [(r["ep"], r["attention_dp"], r["devices"]) for r in rows] == [
        ("8", "True", "8"), ("16", "True", "16")]


def test_dispatch_sends_each_token_once_per_remote_node():
    """DeepEP's internode dispatch sends a token once to each remote node its experts sit
    on and forwards it there over NVLink: over 2 nodes of 128 experts each, with no group
    limit, a token's 8 distinct experts all miss the other node with probability
    C(128, 8) / C(256, 8), so (1 - that) / 8 = 0.99651 / 8 of the pair bytes cross the NIC,
    not the even half. By hand, against collectives.all_to_all_parts."""
    from math import comb

    from perfmodel.cost.collectives import all_to_all_parts
    from perfmodel.cost.instantiate import remote_share

    free = replace(DSV3.moe, n_groups=1, topk_groups=1)
    share = remote_share(free, 16, 8)
    assert share == pytest.approx((1 - comb(128, 8) / comb(256, 8)) / 8, rel=1e-12)
    nbytes = 1e8
    even = all_to_all_parts(H200, 16, nbytes, 2)
    dedup = all_to_all_parts(H200, 16, nbytes, 2, share)
    assert even.wire_s == pytest.approx(8 / 16 * nbytes / 50e9)
    nvlink = 7 / 16 * nbytes / (450e9 * 0.82)           # the on-node peers, at once
    assert dedup.wire_s == pytest.approx(max(share * nbytes / 50e9, nvlink), rel=1e-9)
    assert remote_share(free, 8, 8) < 0                  # one node: the even rule


def test_a_batch_below_the_attention_devices_is_stated():
    """Each of the 16 DP-attention devices is priced with one sequence when the batch has
    fewer: the idle devices do nothing in reality, and the estimate says so."""
    est = _moe(4, pm.Parallelism(ep=16, attention_dp=True), prompt=512, gen=8)
    assert any("batch below the 16 data-parallel attention devices" in w for w in est.warnings)
    full = _moe(16, pm.Parallelism(ep=16, attention_dp=True), prompt=512, gen=8)
    assert not any("batch below" in w for w in full.warnings)
