"""Fused MoE layers as the engines run them and as aiconfigurator's collector timed them:
the collector's routing (``compare.moe_routing``), the format classes and expert-GEMM
constants (``cost.moe``), and their hardware-file block."""

import numpy as np
import pytest

import perfmodel as pm
from perfmodel.compare.moe_routing import is_known, rank_counts, routed_load
from perfmodel.cost import moe
from perfmodel.cost.ops import Gemm
from perfmodel.cost.roofline import op_time
from perfmodel.specs.dtypes import CODE, weight_bytes
from perfmodel.specs.errors import SpecError


def test_balanced_routing_is_the_collectors_stride_assignment():
    # E 8, k 2: stride 4; token t picks (t + 4j) mod 8: t=0 -> 0, 4; 1 -> 1, 5; ...
    (counts,) = rank_counts(8, 2, 1, 4, "balanced")
    assert counts.tolist() == [1] * 8
    (rank0,) = rank_counts(8, 2, 2, 4, "balanced")      # EP 2: experts 0-3 on rank 0
    assert rank0.tolist() == [1, 1, 1, 1]
    # T 1 < stride: floor(0 + 4j) mod 8 = experts 0 and 4, one each
    (one,) = rank_counts(8, 2, 1, 1, "balanced")
    assert one.tolist() == [1, 0, 0, 0, 1, 0, 0, 0]
    assert routed_load(8, 2, 1, 1, "balanced", block=16) == (2.0, 2.0, 32.0)


@pytest.mark.parametrize("tokens, experts, top_k, ep", [(1, 256, 8, 8), (16, 256, 8, 1),
                                                        (4096, 128, 8, 4), (7, 64, 6, 2)])
def test_power_law_draws_conserve_pairs_and_time_the_busiest_rank(tokens, experts, top_k,
                                                                  ep):
    draws = rank_counts(experts, top_k, ep, tokens, "power_law_1.2")
    assert len(draws) == 5
    for counts in draws:
        assert len(counts) == experts // ep
        assert counts.min() >= 0 and counts.max() <= tokens     # a token picks an expert once
        # the timed rank holds at least the mean rank's share of the T k pairs
        assert counts.sum() >= tokens * top_k / ep - 1e-9
    assert rank_counts(experts, top_k, ep, tokens, "power_law_1.2") is draws   # cached


def test_power_law_at_large_batches_touches_nearly_every_local_expert():
    # at T k > E each draw is at least 1 of up to 0.8 T before scaling to T k; an
    # expected-distinct (Zipf over ranks) model at s = 1.01 touches far fewer
    pairs, touched, _ = routed_load(256, 8, 8, 2048, "power_law_1.01")
    assert 28.0 <= touched <= 32.0 and pairs > 2048 * 8 / 8


def test_known_distributions():
    assert is_known("balanced") and is_known("power_law_1.01") and is_known("power_law_1.2")
    assert not is_known("power_law_1") and not is_known("zipf") and not is_known("")


def _gemm(dtype: str, fmt: str = "", stored: str = "", **kw) -> Gemm:
    wb = weight_bytes(CODE[stored or dtype], 0, 0.0)
    if fmt:
        from perfmodel.specs.formats import weight_formats

        name, group, scale = weight_formats()[fmt].scheme
        wb, stored = weight_bytes(CODE[name], group, scale), (name if name != dtype else "")
    return Gemm(m=kw.get("m", 1.0), n=kw.get("n", 4096.0), k=kw.get("k", 2048.0),
                groups=kw.get("groups", 8.0), weight_bytes=float(wb), dtype=CODE[dtype],
                weight_dtype=CODE[stored] if stored else -1, experts=True)


@pytest.mark.parametrize("gemm, cls", [
    (dict(dtype="bf16"), "bf16"), (dict(dtype="fp8"), "fp8"),
    (dict(dtype="fp8", fmt="fp8-block128"), "fp8_block"),
    (dict(dtype="fp4", fmt="nvfp4"), "fp4"), (dict(dtype="bf16", fmt="mxfp4"), "w4a16"),
    (dict(dtype="bf16", fmt="w4a16-g128"), "w4a16"), (dict(dtype="fp8", fmt="mxfp4"), "w4a8"),
    (dict(dtype="bf16", stored="int8"), "w8a16")])
def test_format_class(gemm, cls):
    assert moe.FORMATS[int(moe.format_class(_gemm(**gemm)))] == cls


def _with_kernels(hw, row):
    from dataclasses import replace

    table = {"bf16": row} if row else {}
    return replace(hw, efficiency=replace(hw.efficiency, moe_kernels=table))


def test_expert_gemm_fixed_cost_is_the_kernels_own():
    hw = _with_kernels(pm.hardware("h100-sxm"), None)
    # latency 10 us, 0.1 us per expert, 1 ns per k element: 10 + 8 x 0.1 + 2048 x 0.001
    fitted = _with_kernels(hw, (0.5, 0.8, 10e-6, 0.1e-6, 0.0, 1e-9))
    op = _gemm("bf16")
    assert float(moe.fixed_cost(op, fitted)) == pytest.approx(12.848e-6)
    assert float(moe.fixed_cost(op, hw)) == hw.efficiency.latency_for("gemm")
    dense = Gemm(m=1.0, n=4096.0, k=2048.0, groups=8.0)
    assert float(moe.fixed_cost(dense, fitted)) == hw.efficiency.latency_for("gemm")


def test_stream_fill_counts_programs():
    hw = pm.hardware("h100-sxm")        # 132 SMs
    # one expert of n 4096 at one token: ceil(1/16) x ceil(4096/64) = 64 programs; at one
    # program per SM needed, 64 / 132 of the rate
    op = _gemm("bf16", groups=1.0)
    assert float(moe.stream_fill(op, hw, 1.0)) == pytest.approx(64 / 132)
    assert float(moe.stream_fill(_gemm("bf16", groups=8.0), hw, 1.0)) == 1.0


def test_expert_gemm_never_splits_k_and_uses_the_kernels_rates():
    hw = pm.hardware("h100-sxm")
    op = _gemm("bf16", m=1.0, n=256.0, k=8192.0, groups=1.0)
    _, split = moe.plan(op, hw)
    assert float(split) == 1.0
    fitted = _with_kernels(hw, (0.5, 0.4, 5e-6, 0.0, 0.0, 0.0))
    big = _gemm("bf16", m=1.0, n=8192.0, k=8192.0, groups=64.0)
    t = op_time(big, fitted, "kernel")
    bytes_ = 8192 * 8192 * 2 * 64 + (8192 + 8192) * 2 * 64
    assert float(t.time_s) == pytest.approx(bytes_ / (hw.memory_bytes_per_s * 0.4) + 5e-6,
                                            rel=1e-6)


def test_moe_kernels_block_is_checked(tmp_path):
    base = pm.hardware("h100-sxm")
    assert base.efficiency.moe_kernels      # the fitted vLLM figures ship
    path = tmp_path / "hw.yaml"
    path.write_text("version: 1\nbase: h100-sxm\nname: x\nefficiency:\n  moe_kernels:\n"
                    "    fp9: {gemm_fraction: 0.5, memory_fraction: 0.5, latency_s: 1 us}\n"
                    "  source: a test\n")
    with pytest.raises(SpecError, match=r"moe_kernels\.fp9.*format class"):
        pm.hardware(str(path))


@pytest.mark.parametrize("engine", ["vllm", "sglang", "trtllm"])
def test_each_engine_prices_its_own_moe_kernels(engine):
    hw = pm.hardware("h100-sxm", engine)
    assert "bf16" in hw.efficiency.moe_kernels
    row = hw.efficiency.moe_kernels["bf16"]
    assert 0 < row[0] <= 1 and 0 < row[1] <= 1 and row[2] > 0
    assert np.isfinite(np.asarray(row)).all()
