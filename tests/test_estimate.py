"""Estimates: the exact decode sum, physical lower bounds, MoE reads, and properties."""

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import perfmodel as pm
from perfmodel.cost.layers import experts_touched
from perfmodel.cost.params import param_counts
from perfmodel.cost.step import Dtypes, Step, price_step
from perfmodel.specs import Parallelism, SpecError, Workload
from perfmodel.specs.load import HARDWARE_DIR, MODELS_DIR, shipped
from tests.datasheet import datasheet

PLAN = Parallelism()


def _step(model, hw, wl, context, plan=PLAN):
    """Seconds of the decode step at ``context`` (priced alone)."""
    timing = "kernel" if wl.cuda_graphs else None
    d = Dtypes.of(wl.weights_dtype, wl.act_dtype, wl.kv_dtype, wl.weight_group_size)
    return float(price_step(model, hw, plan, Step.uniform(wl.batch, 1, context), d,
                            timing).time[0])


def _brute_decode(model, hw, wl, plan=PLAN):
    """Every decode step priced alone, in one vectorised call, summed."""
    contexts = np.arange(wl.prompt_len + 1, wl.prompt_len + wl.gen_len)
    d = Dtypes.of(wl.weights_dtype, wl.act_dtype, wl.kv_dtype, wl.weight_group_size)
    d = d.take(np.zeros(len(contexts), dtype=int))
    timing = np.full(len(contexts), 0 if wl.cuda_graphs else (
        2 if hw.efficiency.launch_mode == "sync" else 1))
    cost = price_step(model, hw, plan, Step.uniform(wl.batch, 1, contexts), d, timing)
    return cost.time


@pytest.mark.parametrize("gen", [2, 40, 65, 300, 2000])
def test_decode_sums_every_step_exactly(h100, gen):
    model = pm.model("llama-3-8b")
    wl = Workload(batch=8, prompt_len=1000, gen_len=gen)
    est = pm.estimate(h100, model, wl)
    brute = _brute_decode(model, h100, wl)
    assert est.decode.steps == gen - 1
    assert est.decode.time_s == pytest.approx(brute.sum(), rel=1e-12)
    assert est.decode.first_step_s == pytest.approx(_step(model, h100, wl, 1001), rel=1e-12)
    assert est.decode.last_step_s == pytest.approx(_step(model, h100, wl, 999 + gen), rel=1e-12)
    assert est.e2e_s == pytest.approx(est.ttft_s + brute.sum(), rel=1e-12)


# the piecewise-linear sum meets every kind of bend: windows (gemma-2, mistral), MLA's
# latent attention with its 64-key split tiles (deepseek-v3), a split count that changes
# (batch 1), launch-bound steps (tiny model steps), CUDA graphs, a host-timed CPU without GQA
# packing, and a calibrated bandwidth ramp (every context priced)
@pytest.mark.parametrize(("model", "hw", "wl", "tp"), [
    ("gemma-2-9b", "h100-sxm", Workload(batch=3, prompt_len=3000, gen_len=2500), 1),
    ("mistral-7b", "a100-80gb-sxm", Workload(batch=1, prompt_len=4000, gen_len=300), 1),
    ("deepseek-v3", "h200-sxm", Workload(batch=2, prompt_len=700, gen_len=700), 8),
    ("llama-3-70b", "h100-sxm", Workload(batch=1, prompt_len=10, gen_len=1200,
                                         cuda_graphs=True), 2),
    ("llama-2-7b", "tpu-v5e", Workload(batch=17, prompt_len=5, gen_len=400), 1),
    ("falcon-7b", "mi300x", Workload(batch=5, prompt_len=100, gen_len=900,
                                     kv_dtype="fp8"), 1),
])
def test_decode_sum_matches_every_step_on_hard_cases(model, hw, wl, tp):
    m, h, plan = pm.model(model), pm.hardware(hw), Parallelism(tp=tp)
    est = pm.estimate(h, m, wl, plan)
    brute = _brute_decode(m, h, wl, plan)
    assert est.decode.time_s == pytest.approx(brute.sum(), rel=1e-9)
    assert est.decode.last_step_s == pytest.approx(brute[-1], rel=1e-12)


def test_decode_sum_on_a_calibrated_cpu_with_a_bandwidth_ramp():
    cpu = pm.hardware("reports/cpu/hardware.yaml")
    ramp = replace(cpu, efficiency=replace(cpu.efficiency, memory_half_bytes=2e6))
    wl = Workload(batch=2, prompt_len=40, gen_len=120, weights_dtype="fp32", act_dtype="fp32",
                  kv_dtype="fp32")
    m = pm.model("llama-2-7b")
    for hw in (cpu, ramp):
        assert pm.estimate(hw, m, wl).decode.time_s == \
            pytest.approx(_brute_decode(m, hw, wl).sum(), rel=1e-9)


def test_single_token_generation_has_no_decode_steps(h100):
    est = pm.estimate(h100, pm.model("llama-2-7b"), Workload(gen_len=1))
    assert est.decode.steps == 0 and est.decode.time_s == 0
    assert est.e2e_s == est.ttft_s and est.tpot_s == est.decode.first_step_s > 0
    # no step, so the decode bound is the one step's (memory-bound at batch 1), not a default
    assert est.decode.bound == "memory"


def test_vectorised_estimates_equal_one_at_a_time(h100):
    model = pm.model("mixtral-8x7b")
    grid = pm.Workloads.grid(batch=[1, 7, 64], prompt_len=[31, 2048], gen_len=[1, 130],
                             weights_dtype=["bf16", "fp8"], cuda_graphs=[False, True])
    many = pm.estimate_many(h100, model, grid, Parallelism(tp=2))
    for i in range(len(grid)):
        alone = pm.estimate(h100, model, grid.item(i), Parallelism(tp=2))
        # equal up to the last bits of numpy's SIMD loops over longer arrays
        got, want = _flat(many.item(i).to_dict()), _flat(alone.to_dict())
        assert got.keys() == want.keys()
        for key, value in want.items():
            close = pytest.approx(value, rel=1e-12) if isinstance(value, float) else value
            assert got[key] == close, key
        assert many.tpot_s[i] == pytest.approx(alone.tpot_s, rel=1e-12)


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        out |= _flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v}
    return out


@pytest.mark.parametrize("hw_name", shipped(HARDWARE_DIR))
@pytest.mark.parametrize("model_name", shipped(MODELS_DIR))
def test_decode_never_beats_weight_streaming(hw_name, model_name):
    hw, model = pm.hardware(hw_name), pm.model(model_name)
    est = pm.estimate(hw, model, Workload(batch=1, prompt_len=128, gen_len=8))
    weights_read = sum(o.bytes.weights for o in est.decode.ops) / est.decode.steps
    assert est.tpot_s >= weights_read / hw.memory_bytes_per_s
    if model.moe is None:   # dense: every weight but the embedding table is read each step
        assert est.tpot_s >= (est.memory.weights_bytes
                              - model.vocab_size * model.d_model * 2) / hw.memory_bytes_per_s
    for value in (est.ttft_s, est.tpot_s, est.e2e_s, est.throughput_tokens_per_s):
        assert value > 0 and value == value   # positive, not NaN


def _decode_weight_bytes(model, batch):
    cost = price_step(model, datasheet("h100-sxm"), Parallelism(),
                      Step.uniform(batch, 1, 600), Dtypes.of())
    return float(cost.total_bytes.weights[0])


@pytest.mark.parametrize("name", ["mixtral-8x7b", "deepseek-v3"])
def test_moe_decode_reads_active_at_batch_1_and_all_at_large_batch(name):
    model = pm.model(name)
    counts = param_counts(model)
    gather = model.vocab_size * model.d_model - model.d_model   # table minus the row read
    active = (counts.active(model) + model.d_model) * 2   # active leaves the table out
    total = (counts.total - gather) * 2
    assert _decode_weight_bytes(model, 1) == pytest.approx(active, rel=0.01)
    assert _decode_weight_bytes(model, 4096) == pytest.approx(total, rel=0.01)
    assert _decode_weight_bytes(model, 16) < _decode_weight_bytes(model, 64)


def test_experts_touched():
    assert experts_touched(8, 2, 1) == pytest.approx(2)
    assert experts_touched(8, 2, 2) == pytest.approx(8 * (1 - 0.75**2))
    assert experts_touched(256, 8, 10_000) == pytest.approx(256)


def test_linear_flops_are_two_per_param_per_token():
    model = pm.model("llama-2-7b")
    cost = price_step(model, datasheet("h100-sxm"), Parallelism(), Step.uniform(2, 64, 64),
                      Dtypes.of())
    layer_gemm = sum(cost.flops[i, 0] for i, (k, n) in enumerate(zip(cost.kinds, cost.names,
                                                                     strict=True))
                     if k == "gemm" and n != "lm_head")
    counts = param_counts(model)
    assert layer_gemm == 2 * 128 * (counts.attention + counts.mlp)


def test_prefill_is_compute_bound_and_decode_memory_bound(h100):
    est = pm.estimate(h100, pm.model("llama-2-13b"), Workload(batch=1, prompt_len=2048))
    assert est.prefill.bound == "compute" and est.decode.bound == "memory"


def test_mla_uses_expanded_form_for_prefill_and_absorbed_for_decode(h100):
    est = pm.estimate(h100, pm.model("deepseek-v3"), Workload(prompt_len=512, gen_len=4),
                      Parallelism(tp=8))
    prefill = {o.name for o in est.prefill.ops}
    decode = {o.name for o in est.decode.ops}
    assert {"kv_b_proj", "attention_expanded"} <= prefill and "q_absorb" not in prefill
    assert {"q_absorb", "attention", "o_absorb"} <= decode and "kv_b_proj" not in decode


def test_throughput_grows_with_batch_up_to_the_ceiling(h100):
    model = pm.model("llama-2-13b")
    ceiling = pm.estimate(h100, model, Workload()).memory.max_batch
    batches = sorted({1, 2, 4, 8, 16, 32, 64, ceiling})
    many = pm.estimate_many(h100, model, pm.Workloads.of(batch=batches))
    assert np.all(np.diff(many.throughput_tokens_per_s) >= 0)


@settings(max_examples=40, deadline=None, derandomize=True)
@given(st.integers(1, 256), st.integers(1, 20_000), st.integers(1, 4000))
def test_longer_context_never_shortens_a_step(batch, context, extra):
    hw, model = datasheet("h100-sxm"), pm.model("gemma-2-9b")
    wl = Workload(batch=batch)
    assert _step(model, hw, wl, context + extra) >= _step(model, hw, wl, context)


@settings(max_examples=25, deadline=None, derandomize=True)
@given(st.integers(1, 512), st.integers(1, 4096))
def test_more_tokens_never_cost_less(batch, prompt):
    hw, model = datasheet("a100-80gb-sxm"), pm.model("mixtral-8x7b")
    w = pm.Workloads.of(batch=[batch, batch + 1], prompt_len=prompt, gen_len=2)
    small, big = pm.estimate_many(hw, model, w).ttft_s
    assert big >= small


def test_tensor_parallel_adds_communication_and_cuts_weight_time():
    hw, model = datasheet("h100-sxm"), pm.model("llama-3-70b")
    one = pm.estimate(hw, model, Workload(), Parallelism(tp=1))
    eight = pm.estimate(hw, model, Workload(), Parallelism(tp=8))
    assert eight.memory.weights_bytes < one.memory.weights_bytes / 7
    assert any(o.kind == "all_reduce" for o in eight.decode.ops)
    assert not any(o.kind == "all_reduce" for o in one.decode.ops)
    assert eight.tpot_s < one.tpot_s


def test_plans_that_cannot_hold_are_errors(h100):
    with pytest.raises(SpecError, match="ep=2 must equal tp=1"):
        Parallelism(ep=2)
    with pytest.raises(SpecError, match="ep=2: llama-2-7b has no routed experts"):
        pm.estimate(h100, pm.model("llama-2-7b"), Workload(), Parallelism(tp=2, ep=2))
    with pytest.raises(SpecError, match="attention_dp needs tp=1"):
        Parallelism(tp=2, ep=2, attention_dp=True)
    with pytest.raises(SpecError, match="tp must be a positive integer"):
        Parallelism(tp=0)


def test_operators_dataframe():
    est = pm.estimate(datasheet("h100-sxm"), pm.model("llama-2-7b"))
    df = est.operators()
    assert set(df.phase) == {"prefill", "decode"}
    assert df.loc[df.phase == "decode", "time_s"].sum() == pytest.approx(est.decode.time_s)


def test_warnings_for_context_limit_and_fit(h100):
    est = pm.estimate(h100, pm.model("llama-2-7b"), Workload(prompt_len=4000, gen_len=200))
    assert any("exceeds llama-2-7b's context limit" in w for w in est.warnings)
    ok = pm.estimate(h100, pm.model("llama-2-7b"), Workload(prompt_len=2000, gen_len=200))
    assert ok.warnings == []
    big = pm.estimate(h100, pm.model("llama-3.1-405b"), Workload())
    assert any(w.startswith("does not fit") for w in big.warnings)
    assert big.to_dict()["warnings"] == big.warnings
    many = pm.estimate_many(h100, pm.model("llama-3.1-405b"), pm.Workloads.of(batch=[1, 2]))
    assert many.warnings() == [big.memory_warning, many.item(1).memory_warning]


def test_sync_launch_mode_adds_dispatch_to_every_op():
    hw = datasheet("a100-80gb-sxm")
    sync = replace(hw, efficiency=replace(hw.efficiency, launch_mode="sync"))
    model, wl = pm.model("llama-2-7b"), Workload(prompt_len=64, gen_len=2)
    est = pm.estimate(sync, model, wl)
    host = price_step(model, sync, Parallelism(), Step.uniform(1, 64, 64), Dtypes.of(), "host")
    assert est.ttft_s == pytest.approx(float(host.time[0]))
    assert est.ttft_s > pm.estimate(hw, model, wl).ttft_s


def test_decode_in_chunks_equals_one_call(h100, monkeypatch):
    """Long generations of many configurations are priced in chunks of points (memory);
    the chunking changes nothing."""
    from perfmodel.schedules import decode

    grid = pm.Workloads.grid(batch=[1, 2, 5], prompt_len=[100, 5000], gen_len=[2, 3000])
    model = pm.model("gemma-2-9b")
    whole = pm.estimate_many(h100, model, grid)
    monkeypatch.setattr(decode, "CHUNK_POINTS", 7)
    parts = pm.estimate_many(h100, model, grid)
    np.testing.assert_array_equal(parts.tpot_s, whole.tpot_s)
    np.testing.assert_array_equal(parts.phase("decode").time_s, whole.phase("decode").time_s)
