"""Quantized dense GEMMs as the engines dispatch them: constants per M bucket of the
dispatch (``gemm_kernels`` keys ``<class>@<m_max>``, ``cost.moe.dense_buckets``), the
kernel DeepGEMM's alignment sends other shapes to (``@unaligned``), an eager linear's host
path (``cost.eager``), the activations' quantization with its scale bytes
(``cost.quantize``) and the cited dispatch rules (``validate/corpus/gemm_dispatch.yaml``)."""

from dataclasses import replace

import numpy as np
import pytest

import perfmodel as pm
from perfmodel.compare.errors import predict_rows
from perfmodel.cost import moe
from perfmodel.cost.eager import host_floor
from perfmodel.cost.ops import Gemm
from perfmodel.cost.quantize import ActQuant, act_scale_bytes
from perfmodel.cost.roofline import op_time
from perfmodel.specs.dtypes import CODE, MOE_FORMATS
from perfmodel.specs.errors import SpecError
from validate.corpus import dispatch

FP8, FP4 = CODE["fp8"], CODE["fp4"]
BLOCK = 1.0 + 4.0 / (128 * 128)         # fp8 bytes per weight with a 128 x 128 fp32 scale


def _hw(table: dict, hosts: dict | None = None):
    hw = pm.hardware("h100-sxm")
    return replace(hw, efficiency=replace(hw.efficiency, gemm_kernels=table,
                                          gemm_host_s=hosts or {}, gemm_row_s={}))


def _gemm(m, n=4096.0, k=4096.0, wb=1.0):
    return Gemm(m=np.asarray(m, dtype=float), n=n, k=k, weight_bytes=wb, act_bytes=1.0,
                dtype=FP8, weight_dtype=FP8)


def test_each_m_bucket_prices_with_its_own_row():
    hw = _hw({"fp8@16": (0.5, 0.5, 1e-6), "fp8@64": (0.5, 0.5, 2e-6),
              "fp8": (0.5, 0.5, 3e-6)})
    got = moe.fixed_cost(_gemm([1, 16, 17, 64, 65, 9000]), hw)
    assert np.asarray(got).tolist() == [1e-6, 1e-6, 2e-6, 2e-6, 3e-6, 3e-6]


def test_the_largest_bucket_covers_larger_m_without_a_plain_row():
    hw = _hw({"fp8@16": (0.5, 0.5, 1e-6), "fp8@128": (0.5, 0.5, 4e-6)})
    got = moe.fixed_cost(_gemm([8, 100, 5000]), hw)
    assert np.asarray(got).tolist() == [1e-6, 4e-6, 4e-6]


def test_unaligned_shapes_take_their_own_row():
    hw = _hw({"fp8_block@31": (0.5, 0.5, 1e-6), "fp8_block": (0.5, 0.5, 2e-6),
              "fp8_block@unaligned": (0.5, 0.5, 9e-6)})
    op = Gemm(m=np.array([8.0, 8.0, 512.0, 512.0]), n=np.array([4096.0, 4096, 4096, 96]),
              k=np.array([4096.0, 4000, 4096, 4096]), weight_bytes=BLOCK, act_bytes=1.0,
              dtype=FP8, weight_dtype=FP8)
    assert np.asarray(moe.fixed_cost(op, hw)).tolist() == [1e-6, 9e-6, 2e-6, 9e-6]
    keys = [k for mask, k in moe.dense_key(hw, op) for _ in range(int(mask.sum()))]
    assert sorted(keys) == sorted(["fp8_block@31", "fp8_block@unaligned", "fp8_block",
                                   "fp8_block@unaligned"])


def test_bucket_keys_are_checked(tmp_path):
    path = tmp_path / "hw.yaml"
    path.write_text("version: 1\nbase: h100-sxm\nname: x\nefficiency:\n  gemm_kernels:\n"
                    "    fp8@x: {gemm_fraction: 0.5, memory_fraction: 0.5, latency_s: 1 us}\n"
                    "  source: a test\n")
    with pytest.raises(SpecError, match=r"gemm_kernels\.fp8@x.*@<m_max>"):
        pm.hardware(str(path))


def test_host_s_is_read_beside_the_three_fields(tmp_path):
    path = tmp_path / "hw.yaml"
    path.write_text("version: 1\nbase: h100-sxm\nname: x\nefficiency:\n  gemm_kernels:\n"
                    "    fp8_block@31: {gemm_fraction: 0.5, memory_fraction: 0.5, "
                    "latency_s: 1 us, host_s: 60 us}\n"
                    "    fp8: {gemm_fraction: 0.5, memory_fraction: 0.5, latency_s: 1 us, "
                    "row_s: 0.007 us}\n  source: a test\n")
    hw = pm.hardware(str(path))
    assert hw.efficiency.gemm_kernels["fp8_block@31"] == (0.5, 0.5, 1e-6)   # three fields
    assert hw.efficiency.gemm_host_s == {"fp8_block@31": pytest.approx(60e-6)}
    assert hw.efficiency.gemm_row_s == {"fp8": pytest.approx(7e-9)}


def _row(m, timing):
    return {"op": "gemm", "dtype": "fp8", "weight_format": "fp8-block128",
            "act_quant": "token", "m": m, "n": 4096, "k": 4096, "measured_s": 1e-4,
            "timing": timing}


def test_an_eager_linear_takes_at_least_its_host_path():
    hw = _hw({"fp8_block@31": (0.7, 0.9, 5e-6), "fp8_block": (0.7, 0.9, 5e-6)},
             {"fp8_block@31": 60e-6})
    eager, graph = predict_rows([_row(4, "stream"), _row(4, "kernel")], hw, timing="auto")
    assert eager["predicted_s"] == pytest.approx(60e-6)      # host-bound: the floor
    assert graph["predicted_s"] < 20e-6                        # replayed: device time only
    big = predict_rows([_row(16384, "stream")], hw, timing="auto")[0]["predicted_s"]
    assert big > 60e-6 and host_floor(_gemm([16384], wb=BLOCK), hw) == 0.0  # no @inf host


def test_scale_bytes_of_each_quantization():
    # per token group (fp8, 128 elements): an fp32 scale each; NVFP4: e4m3 per 16
    assert act_scale_bytes(np.array([FP8, FP4, FP8]), np.array([0, 0, 1])).tolist() == [
        4 / 128, 1 / 16, 0.0]
    q = ActQuant(rows=8.0, n=4096.0, act_bytes=2.0, kv_bytes=1.0, scale_bytes=4 / 128,
                 dtype=CODE["bf16"])
    assert float(q.bytes.act_write) == 8 * 4096 * (1 + 4 / 128)
    assert float(q.bytes.act_read) == 8 * 4096 * 2


@pytest.mark.parametrize("device", ["gaudi3", "gb300", "h100-sxm", "b200"])
def test_the_quantization_pass_never_steps_down_with_more_rows(device):
    hw = pm.hardware(device)
    rows = np.arange(1.0, 4097.0)
    q = ActQuant(rows=rows, n=7168.0, act_bytes=2.0, kv_bytes=1.0, scale_bytes=4 / 128,
                 dtype=CODE["bf16"])
    t = np.asarray(op_time(q, hw, "kernel").time_s)
    assert np.all(np.diff(t) >= -1e-15)


def test_dispatch_rules_are_ordered_cited_and_named():
    for engine, archs in dispatch.table().items():
        assert engine in ("vllm", "sglang", "trtllm")
        for arch, classes in archs.items():
            assert arch in dispatch.ARCH.values()
            for cls, rule in classes.items():
                assert cls in MOE_FORMATS and rule["source"]
                assert rule["edges"] == sorted(set(rule["edges"])) and rule["edges"][0] >= 1


def test_buckets_follow_vllms_sm90_cutlass_fp8_dispatch():
    # scaled_mm_sm90_fp8_dispatch.cuh: m <= 16, (16, 64], (64, 128], above
    m = np.array([1.0, 16, 17, 64, 65, 128, 129, 32768])
    got = dispatch.buckets("vllm", "h100-sxm", np.full(len(m), 1), m)
    assert got.tolist() == [16, 16, 64, 64, 128, 128, np.inf, np.inf]
    # fp8 blocks: DeepGEMM from m 32; N % 64 or K % 128 not 0: the unaligned kernel
    n, k = np.full(3, 4096.0), np.array([4096.0, 4096, 4000])
    got = dispatch.buckets("vllm", "b200", np.full(3, 2), np.array([31.0, 32, 32]), n, k)
    assert got.tolist() == [31, np.inf, dispatch.UNALIGNED_BUCKET]
    assert dispatch.key("fp8_block", dispatch.UNALIGNED_BUCKET) == "fp8_block@unaligned"
    assert dispatch.buckets("vllm", "l40s", np.full(1, 1), np.ones(1)).tolist() == [np.inf]


def test_the_per_tensor_quantization_costs_per_token():
    # vLLM's segmented_max_reduction: one block per token, an atomic max each
    hw = _hw({"fp8": (0.5, 0.5, 4e-6)})
    hw = replace(hw, efficiency=replace(hw.efficiency, gemm_row_s={"fp8": 7e-9}))
    got = np.asarray(moe.fixed_cost(_gemm([1.0, 16384.0], n=32.0, k=32.0), hw))
    assert got.tolist() == pytest.approx([4e-6 + 7e-9, 4e-6 + 16384 * 7e-9])
    bf16 = Gemm(m=16384.0, n=32.0, k=32.0, weight_bytes=2.0, act_bytes=2.0,
                dtype=CODE["bf16"])
    assert float(moe.row_cost(bf16, hw)) == 0.0         # a 16-bit GEMM pays none


def test_a_quantized_kernel_of_its_own_never_splits_k():
    # two output tiles over k = 65536: the device's dense plan splits k, CUTLASS's
    # persistent scaled_mm and DeepGEMM do not
    op = _gemm([1.0], n=32.0, k=65536.0)
    _, dense_split = moe.plan(op, _hw({}))
    _, own_split = moe.plan(op, _hw({"fp8": (0.5, 0.5, 4e-6)}))
    assert float(dense_split[0]) > 1.0 and float(own_split[0]) == 1.0


def test_an_engine_whose_quantized_kernels_split_k_splits_as_a_dense_gemm():
    # AITER's CK blockscale GEMM (gemm_kernels_split_k, the AMD files' SGLang blocks) splits
    # k where its tuner found it faster: the tiling rule's split applies again
    op = _gemm([1.0], n=32.0, k=65536.0)
    _, dense_split = moe.plan(op, _hw({}))
    hw = _hw({"fp8": (0.5, 0.5, 4e-6)})
    hw = replace(hw, efficiency=replace(hw.efficiency, gemm_kernels_split_k=True))
    _, split = moe.plan(op, hw)
    assert float(split[0]) == float(dense_split[0]) > 1.0
    assert pm.hardware("mi300x", engine="sglang").efficiency.gemm_kernels_split_k
    assert not pm.hardware("h100-sxm", engine="sglang").efficiency.gemm_kernels_split_k
