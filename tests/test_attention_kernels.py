"""Attention backends as profiles (cost/attention_kernels.py): a profile laid over a block,
the FP8 instantiation an FP8 call runs, the query cast, the YAML reader, and the corpus
scoring each row on the kernel it timed. Hand-derived from the H100 SXM datasheet file."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import yaml

from perfmodel.cost import attention_kernels as ak
from perfmodel.cost.ops import Attention
from perfmodel.cost.roofline import op_time
from perfmodel.kernels.compare import score
from perfmodel.specs.errors import SpecError
from perfmodel.specs.load import load_hardware
from tests.datasheet import datasheet_path

FA3_FP8 = {"attention_fraction": 0.4, "latency_s": 9e-6, "memory_fraction": 0.7}
TRITON = {"attention_fraction": 0.25, "latency_s": 12e-6}


def prefill(act_bytes=2.0, kv_bytes=2.0, q=8192):
    """A compute-bound causal prefill: one sequence, 32 heads of 128."""
    return Attention(batch=np.array([[1]]), q_len=np.array([[q]]), kv_len=np.array([[q]]),
                     n_heads=32, n_kv_heads=8, qk_dim=128, v_dim=128, cache_elems=256,
                     act_bytes=act_bytes, kv_bytes=kv_bytes)


def with_kernels(hw, **eff):
    base = {"attention_backend": "fa3", "attention_q_cast": True,
            "attention_kernels": {"fa3@fp8": FA3_FP8, "triton": TRITON}}
    return replace(hw, efficiency=replace(hw.efficiency, **(base | eff)))


def test_a_profile_lays_its_constants_over_the_block(h100):
    hw = with_kernels(h100)
    triton = ak.for_kernel(hw, "triton")
    assert triton.efficiency.attention_fraction == 0.25
    assert triton.efficiency.latency_for("attention") == 12e-6
    assert triton.efficiency.gemm_fraction == hw.efficiency.gemm_fraction
    # the block's own backend, and a kernel without a profile, price as the block
    assert ak.for_kernel(hw, "fa3") is hw and ak.for_kernel(hw, "") is hw
    # another kernel without a profile: the block's constants, but not fa3's query cast
    other = ak.for_kernel(hw, "flash_attention")
    assert other.efficiency.attention == hw.efficiency.attention
    assert not other.efficiency.attention_q_cast
    assert ak.fp8_view(other) is other
    plain = with_kernels(h100, attention_backend="")
    assert ak.for_kernel(plain, "flash_attention") is plain
    assert ak.for_kernel(hw, "triton") is triton          # one view per profile
    # the query cast is the backend's own: triton's profile does not inherit fa3's, while
    # fa3's FP8 build does
    assert not triton.efficiency.attention_q_cast
    assert ak.for_kernel(hw, "fa3", fp8=True).efficiency.attention_q_cast
    # compute-bound: the time body scales as 1 / attention_fraction (same tiles, waves)
    base = op_time(prefill(), hw, "kernel")
    slow = op_time(prefill(), triton, "kernel")
    assert float(slow.compute_s[0]) == pytest.approx(
        float(base.compute_s[0]) * hw.efficiency.attention / 0.25)


def test_an_fp8_call_runs_the_backends_fp8_profile_at_the_fp8_peak(h100):
    hw = with_kernels(h100)
    bf16 = op_time(prefill(), hw, "kernel")
    fp8 = op_time(prefill(1.0, 1.0), hw, "kernel")
    # FP8 peak 2x the 16-bit one, at the FP8 profile's 0.4 instead of the block's share
    ratio = hw.peak("bf16") * hw.efficiency.attention / (hw.peak("fp8") * 0.4)
    assert float(fp8.compute_s[0]) == pytest.approx(float(bf16.compute_s[0]) * ratio)
    assert float(fp8.fixed_s[0]) == pytest.approx(9e-6)
    # without an FP8 profile: the block's constants at the FP8 peak
    plain = with_kernels(h100, attention_kernels={})
    assert float(op_time(prefill(1.0, 1.0), plain, "kernel").compute_s[0]) == pytest.approx(
        float(bf16.compute_s[0]) * hw.peak("bf16") / hw.peak("fp8"))


def test_a_q_cast_backend_computes_an_fp8_cache_in_fp8_and_pays_the_cast(h100):
    cast = with_kernels(h100, attention_kernels={})
    descale = with_kernels(h100, attention_kernels={}, attention_q_cast=False)
    op = prefill(2.0, 1.0, q=4096)
    a, b = op_time(op, cast, "kernel"), op_time(op, descale, "kernel")
    assert float(a.compute_s[0]) == pytest.approx(
        float(b.compute_s[0]) * h100.peak("bf16") / h100.peak("fp8"))
    # the cast: the query read in bf16 and written in fp8, a kernel of its own
    q_bytes = 4096 * 32 * 128 * 3.0
    m_eff = float(a.memory_efficiency[0])
    assert float(a.memory_s[0] - b.memory_s[0]) == pytest.approx(
        q_bytes / (h100.memory_bytes_per_s * m_eff))
    assert float(a.fixed_s[0] - b.fixed_s[0]) == pytest.approx(h100.efficiency.kernel_latency_s)
    # a bf16 cache: no cast, the 16-bit peak
    plain = op_time(prefill(), cast, "kernel")
    assert float(plain.fixed_s[0]) == pytest.approx(float(b.fixed_s[0]))


def test_a_mixed_batch_prices_each_call_on_its_own_profile(h100):
    hw = with_kernels(h100)
    both = Attention(batch=np.array([[1], [1]]), q_len=np.array([[4096], [4096]]),
                     kv_len=np.array([[4096], [4096]]), n_heads=32, n_kv_heads=8,
                     qk_dim=128, v_dim=128, cache_elems=256,
                     act_bytes=np.array([2.0, 1.0]), kv_bytes=np.array([2.0, 1.0]))
    t = op_time(both, hw, "kernel").time_s
    assert t[0] == pytest.approx(float(op_time(prefill(q=4096), hw, "kernel").time_s[0]))
    assert t[1] == pytest.approx(float(op_time(prefill(1.0, 1.0, 4096), hw, "kernel").time_s[0]))


def test_the_corpus_scores_each_row_on_the_kernel_it_timed(h100):
    hw = with_kernels(h100)
    row = {"op": "attention", "dtype": "bf16", "kv_dtype": "bf16", "batch": 1, "q_len": 8192,
           "kv_len": 8192, "n_heads": 32, "n_kv_heads": 8, "head_dim": 128, "window": 0,
           "measured_s": 1e-3, "timing": "kernel"}
    fa3, triton, other = score([row | {"kernel": "fa3"}, row | {"kernel": "triton"},
                                row | {"kernel": float("nan")}], hw)
    assert other["predicted_s"] == pytest.approx(fa3["predicted_s"])
    assert triton["predicted_s"] > 2 * fa3["predicted_s"]
    assert triton["predicted_s"] == pytest.approx(
        float(op_time(prefill(), ak.for_kernel(hw, "triton"), "kernel").time_s[0]))


def _file(tmp_path, efficiency: dict, engines: dict | None = None):
    data = yaml.safe_load(datasheet_path("h100-sxm").read_text())
    data["efficiency"].update(efficiency)
    if engines:
        data["engines"] = engines
    path = tmp_path / "gpu.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_the_yaml_reader_takes_profiles_and_names_a_bad_field(tmp_path):
    good = {"attention_backend": "fa3", "attention_q_cast": True,
            "attention_kernels": {"fa3@fp8": {"attention_fraction": 0.6, "latency_s": "6 us",
                                              "attention_q_cast": True}}}
    hw = load_hardware(_file(tmp_path, good))
    assert hw.efficiency.attention_kernels == {
        "fa3@fp8": {"attention_fraction": 0.6, "latency_s": 6e-6, "attention_q_cast": 1.0}}
    assert hw.efficiency.attention_backend == "fa3" and hw.efficiency.attention_q_cast
    bad = {"attention_kernels": {"fa3@fp8": {"attention_fractoin": 0.6}}}
    with pytest.raises(SpecError, match=r"attention_fractoin.*expected a profile field.*"
                                        r"did you mean 'attention_fraction'"):
        load_hardware(_file(tmp_path, bad))
    with pytest.raises(SpecError, match=r"attention_fraction.*at most 1"):
        load_hardware(_file(tmp_path, {"attention_kernels": {"x": {"attention_fraction": 2}}}))


def test_an_engine_block_never_inherits_another_engines_backend(tmp_path):
    top = {"attention_backend": "vllm_flash_attn_fa3", "attention_q_cast": True,
           "attention_kernels": {"vllm_flash_attn_fa3@fp8": {"attention_fraction": 0.6}}}
    path = _file(tmp_path, top, {"sglang": {"efficiency": {"gemm_fraction": 0.8}},
                                 "trtllm": {"efficiency": {"attention_backend": "trtllm"}}})
    sg, trt = load_hardware(path, "sglang"), load_hardware(path, "trtllm")
    assert sg.efficiency.attention_backend == "" and not sg.efficiency.attention_kernels
    assert not sg.efficiency.attention_q_cast
    assert trt.efficiency.attention_backend == "trtllm"
    assert load_hardware(path).efficiency.attention_backend == "vllm_flash_attn_fa3"


@pytest.mark.parametrize(("device", "engine", "backend"), [
    ("h100-sxm", "vllm", "vllm_flash_attn_fa3"), ("h100-sxm", "sglang", "fa3"),
    ("h200-sxm", "sglang", "fa3"), ("b200", "sglang", "trtllm_mha")])
def test_a_shipped_engine_prices_an_fp8_cache_on_its_default_backends_fp8_build(
        device, engine, backend):
    import perfmodel as pm

    hw = pm.hardware(device, engine)
    assert hw.efficiency.attention_backend == backend and hw.efficiency.attention_q_cast
    fp8 = ak.fp8_view(hw)
    profile = hw.efficiency.attention_kernels[f"{backend}@fp8"]
    assert fp8.efficiency.attention == profile["attention_fraction"]
    # a 16-bit query on an FP8 cache: the FP8 build, at the FP8 peak, with the cast
    got = op_time(prefill(2.0, 1.0, q=2048), hw, "kernel").time_s
    assert float(got[0]) == pytest.approx(
        float(op_time(prefill(2.0, 1.0, q=2048), fp8, "kernel").time_s[0]))
    assert float(got[0]) != pytest.approx(
        float(op_time(prefill(2.0, 2.0, q=2048), hw, "kernel").time_s[0]), rel=0.02)
