"""KV cache, weights, workspace and the batch ceiling."""

import numpy as np
import pytest

import perfmodel as pm
from perfmodel.cost.memory import kv_bytes_per_sequence, memory_estimate, weights_bytes
from perfmodel.specs import Parallelism, Workload, Workloads


def memory(model, hw, tp=1, **workload):
    """The memory estimate of one workload, as numbers."""
    w = Workloads.from_list([Workload(**workload)])
    return memory_estimate(model, hw, Parallelism(tp=tp), w).item(0)


@pytest.mark.parametrize(("name", "expected"), [
    ("llama-2-13b", 819_200),     # 40 layers x 2 x 40 heads x 128 x 2 B
    ("llama-3-70b", 327_680),     # 80 x 2 x 8 x 128 x 2
    ("deepseek-v3", 70_272),      # 61 x (512 + 64) x 2
    ("falcon-7b", 8_192),         # 32 x 2 x 1 x 64 x 2 (MQA)
])
def test_kv_bytes_per_token_exact(name, expected):
    est = memory(pm.model(name), pm.hardware("h100-sxm"))
    assert est.kv_cache_bytes_per_token == expected


def test_kv_dtype_scales_cache():
    est = memory(pm.model("llama-2-13b"), pm.hardware("h100-sxm"), kv_dtype="fp8")
    assert est.kv_cache_bytes_per_token == 409_600


def test_sliding_window_caps_every_layer_of_mistral():
    # 32 layers x 4096 kept positions x (2 x 8 x 128 x 2 B)
    assert kv_bytes_per_sequence(pm.model("mistral-7b"), 1, 2.0, 10_000, 1) == 32 * 4096 * 4096


def test_gemma2_local_global_hybrid():
    per_token_layer = 2 * 8 * 256 * 2
    # 21 local layers keep 4096, 21 global layers keep all 8192
    assert kv_bytes_per_sequence(pm.model("gemma-2-9b"), 1, 2.0, 8192, 1) == \
        21 * 4096 * per_token_layer + 21 * 8192 * per_token_layer


def test_paging_rounds_up_to_whole_blocks():
    model = pm.model("llama-2-7b")
    per_token = 32 * 2 * 32 * 128 * 2
    assert kv_bytes_per_sequence(model, 1, 2.0, 17, 16) == 32 * per_token
    assert kv_bytes_per_sequence(model, 1, 2.0, 17, 1) == 17 * per_token
    # arrays of lengths and blocks at once (one entry per configuration)
    lengths, blocks = np.array([17, 17, 32, 33]), np.array([16, 1, 16, 16])
    np.testing.assert_array_equal(kv_bytes_per_sequence(model, 1, 2.0, lengths, blocks),
                                  np.array([32, 17, 32, 48]) * per_token)


def test_max_batch_by_hand():
    # llama-2-7b bf16 on A100-80GB, prompt 512 + 128 generated, 90% usable: the driver's
    # 81,920 MiB x 0.9 less the 1,833 MiB runtime reserve (perfmodel/hardware/a100-80gb-sxm.yaml)
    est = memory(pm.model("llama-2-7b"), pm.hardware("a100-80gb-sxm"), batch=1, prompt_len=512,
                 gen_len=128)
    weights = 6_738_415_616 * 2
    kv_seq = 640 * 32 * 2 * 32 * 128 * 2                 # 40 whole blocks of 16
    # activations: a step of at most 8,192 tokens (chunked prefill, vLLM's default budget),
    # whatever the batch, and each sequence's fp32 logits
    ws_token, logits = (2 * 4096 + 3 * 11008) * 2, 32000 * 4
    assert est.weights_bytes == weights
    assert est.kv_cache_bytes_per_sequence == kv_seq
    usable = 0.9 * 81920 * 2**20 - 1833 * 2**20
    assert est.max_batch == (usable - weights - ws_token * 8192) // (kv_seq + logits) == 182
    assert est.workspace_bytes == ws_token * 512 + logits           # batch 1: 512 tokens
    assert est.fits


def test_too_big_reports_numbers_not_crash():
    est = memory(pm.model("llama-3.1-405b"), pm.hardware("h100-sxm"), batch=1)
    assert not est.fits and est.max_batch == 0
    assert est.weights_bytes > est.usable_bytes and est.free_bytes < 0


def test_group_quantized_int4_weights():
    model = pm.model("llama-2-7b")
    counts = pm.estimate(pm.hardware("h100-sxm"), model).params_total
    plain = weights_bytes(model, 1, Workload(weights_dtype="int4").weight_bytes_per_param, 2.0)
    grouped = weights_bytes(model, 1, Workload(weights_dtype="int4", weight_group_size=128)
                            .weight_bytes_per_param, 2.0)
    vocab_rows = 2 * 32000 * 4096 + (2 * 32 + 1) * 4096     # embedding, head, norms at bf16
    linear = counts - vocab_rows
    assert plain == linear * 0.5 + vocab_rows * 2
    assert grouped - plain == pytest.approx(linear * 2 / 128)


@pytest.mark.parametrize("name", ["llama-3-70b", "deepseek-v3", "mixtral-8x7b"])
def test_tp_never_increases_weight_bytes_or_kv(name):
    model = pm.model(name)
    prev_w = prev_kv = float("inf")
    for tp in (1, 2, 4, 8):
        w = weights_bytes(model, tp, 2.0, 2.0)
        kv = kv_bytes_per_sequence(model, tp, 2.0, 1000)
        assert w <= prev_w and kv <= prev_kv
        prev_w, prev_kv = w, kv


def test_vectorised_memory_equals_one_at_a_time():
    """Each entry of an array estimate is the estimate of that workload alone."""
    model, hw = pm.model("mixtral-8x7b"), pm.hardware("h100-sxm")
    grid = Workloads.grid(batch=[1, 64, 300], prompt_len=[100, 4000], kv_dtype=["bf16", "fp8"],
                          weights_dtype="int4",
                          weight_group_size=[None, 64])
    many = memory_estimate(model, hw, Parallelism(tp=2), grid)
    for i in range(len(grid)):
        one = memory_estimate(model, hw, Parallelism(tp=2), Workloads.from_list([grid.item(i)]))
        assert many.item(i) == one.item(0)
