"""Estimates: decode integration, physical lower bounds, MoE reads, and properties."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import perfmodel as pm
from perfmodel.estimate import step_times
from perfmodel.load import HARDWARE_DIR, MODELS_DIR, shipped
from perfmodel.params import param_counts
from perfmodel.specs import SpecError, Workload
from perfmodel.transformer import experts_touched, step_ops


def _step(model, hw, wl, context):
    return sum(t.time_s for t in step_times(model, hw, wl, 1, context))


@pytest.mark.parametrize("gen", [2, 40, 65, 300, 2000])
def test_decode_sums_every_step(h100, gen):
    model = pm.model("llama-3-8b")
    wl = Workload(batch=8, prompt_len=1000, gen_len=gen)
    est = pm.estimate(h100, model, wl)
    brute = sum(_step(model, h100, wl, c) for c in range(1001, 1000 + gen))
    assert est.decode.steps == gen - 1
    assert est.decode.time_s == pytest.approx(brute, rel=1e-4)
    assert est.decode.first_step_s == pytest.approx(_step(model, h100, wl, 1001))
    assert est.decode.last_step_s == pytest.approx(_step(model, h100, wl, 999 + gen))
    assert est.e2e_s == pytest.approx(est.ttft_s + brute, rel=1e-4)


def test_single_token_generation_has_no_decode_steps(h100):
    est = pm.estimate(h100, pm.model("llama-2-7b"), Workload(gen_len=1))
    assert est.decode.steps == 0 and est.decode.time_s == 0
    assert est.e2e_s == est.ttft_s and est.tpot_s > 0


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
    wl = Workload(batch=batch)
    return sum(op.bytes.weights * op.count for op in step_ops(model, wl, 1, 600))


@pytest.mark.parametrize("name", ["mixtral-8x7b", "deepseek-v3"])
def test_moe_decode_reads_active_at_batch_1_and_all_at_large_batch(name):
    model = pm.model(name)
    counts = param_counts(model)
    gather = model.vocab_size * model.d_model - model.d_model   # table minus the row read
    active = (counts.active(model) - gather) * 2
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
    wl = Workload(batch=2, prompt_len=64)
    ops_ = step_ops(model, wl, 64, 64)
    layer_gemm = sum(o.flops * o.count for o in ops_ if o.kind == "gemm" and o.name != "lm_head")
    counts = param_counts(model)
    assert layer_gemm == 2 * 128 * (counts.attention + counts.mlp)


def test_prefill_is_compute_bound_and_decode_memory_bound(h100):
    est = pm.estimate(h100, pm.model("llama-2-13b"), Workload(batch=1, prompt_len=2048))
    assert est.prefill.bound == "compute" and est.decode.bound == "memory"


def test_mla_uses_expanded_form_for_prefill_and_absorbed_for_decode():
    model = pm.model("deepseek-v3")
    names_prefill = {o.name for o in step_ops(model, Workload(), 512, 512)}
    names_decode = {o.name for o in step_ops(model, Workload(), 1, 513)}
    assert "kv_b_proj" in names_prefill and "q_absorb" not in names_prefill
    assert "q_absorb" in names_decode and "kv_b_proj" not in names_decode


def test_throughput_grows_with_batch_up_to_the_ceiling(h100):
    model = pm.model("llama-2-13b")
    ceiling = pm.estimate(h100, model, Workload()).memory.max_batch
    previous = 0.0
    for batch in sorted({1, 2, 4, 8, 16, 32, 64, ceiling}):
        est = pm.estimate(h100, model, Workload(batch=batch))
        assert est.throughput_tokens_per_s >= previous
        previous = est.throughput_tokens_per_s


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 256), st.integers(1, 20_000), st.integers(1, 4000))
def test_longer_context_never_shortens_a_step(batch, context, extra):
    hw, model = pm.hardware("h100-sxm"), pm.model("gemma-2-9b")
    wl = Workload(batch=batch)
    assert _step(model, hw, wl, context + extra) >= _step(model, hw, wl, context)


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 512), st.integers(1, 4096))
def test_more_tokens_never_cost_less(batch, prompt):
    hw, model = pm.hardware("a100-80gb-sxm"), pm.model("mixtral-8x7b")
    small = pm.estimate(hw, model, Workload(batch=batch, prompt_len=prompt, gen_len=2))
    big = pm.estimate(hw, model, Workload(batch=batch + 1, prompt_len=prompt, gen_len=2))
    assert big.ttft_s >= small.ttft_s


def test_tensor_parallel_adds_communication_and_cuts_weight_time():
    hw, model = pm.hardware("h100-sxm"), pm.model("llama-3-70b")
    one = pm.estimate(hw, model, Workload(tp=1))
    eight = pm.estimate(hw, model, Workload(tp=8))
    assert eight.memory.weights_bytes < one.memory.weights_bytes / 7
    assert any(o.kind == "all_reduce" for o in eight.decode.ops)
    assert eight.tpot_s < one.tpot_s


def test_operators_dataframe():
    est = pm.estimate(pm.hardware("h100-sxm"), pm.model("llama-2-7b"))
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


def test_fewer_decode_samples_is_close_and_exact_when_few_steps(h100):
    model = pm.model("llama-3-8b")
    wl = Workload(batch=32, prompt_len=2000, gen_len=2000)
    full = pm.estimate(h100, model, wl)
    quick = pm.estimate(h100, model, wl, decode_samples=9)
    assert quick.tpot_s == pytest.approx(full.tpot_s, rel=1e-3)
    short = Workload(gen_len=8)
    assert pm.estimate(h100, model, short, decode_samples=9).tpot_s == \
        pm.estimate(h100, model, short).tpot_s


def test_sync_launch_mode_adds_dispatch_to_every_op():
    from dataclasses import replace

    from perfmodel.roofline import op_time

    hw = pm.hardware("a100-80gb-sxm")
    sync = replace(hw, efficiency=replace(hw.efficiency, launch_mode="sync"))
    model, wl = pm.model("llama-2-7b"), Workload(prompt_len=64, gen_len=2)
    est = pm.estimate(sync, model, wl)
    expected = sum(op_time(o, sync, "host").time_s for o in step_ops(model, wl, 64, 64))
    assert est.ttft_s == pytest.approx(expected)
    assert est.ttft_s > pm.estimate(hw, model, wl).ttft_s


_MODELS = shipped(MODELS_DIR)
_HARDWARE = shipped(HARDWARE_DIR)
_DTYPES = ("fp32", "bf16", "fp16", "fp8", "int8", "int4")


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(_MODELS), st.sampled_from(_HARDWARE), st.integers(1, 2048),
       st.integers(1, 200_000), st.integers(1, 5000), st.sampled_from(_DTYPES),
       st.sampled_from(("bf16", "fp16", "fp32")), st.sampled_from(_DTYPES),
       st.sampled_from((1, 2, 4, 8)), st.booleans())
def test_every_configuration_gives_finite_positive_numbers(model_name, hw_name, batch, prompt,
                                                           gen, wdt, adt, kvdt, tp, graphs):
    import math

    model = pm.model(model_name)
    if model.n_heads % tp or (model.n_kv_heads % tp and tp % model.n_kv_heads):
        return
    wl = Workload(batch=batch, prompt_len=prompt, gen_len=gen, weights_dtype=wdt,
                  act_dtype=adt, kv_dtype=kvdt, tp=tp, cuda_graphs=graphs)
    hw = pm.hardware(hw_name)
    try:
        d = pm.estimate(hw, model, wl, decode_samples=5).to_dict()
    except SpecError as exc:   # only refusal allowed: a dtype the device has no rate for
        assert "has no rate for fp32" in str(exc) and "fp32" not in hw.peak_flops_per_s
        assert wdt == "fp32" or adt == "fp32" or kvdt == "fp32"
        return
    for key in ("ttft_s", "tpot_s", "e2e_s", "throughput_tokens_per_s", "weights_bytes",
                "kv_cache_bytes"):
        assert math.isfinite(d[key]) and d[key] > 0, key
    assert d["max_batch"] >= 0 and d["fits"] == (batch <= d["max_batch"])
