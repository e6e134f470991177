"""KV cache, weights, workspace and the batch ceiling."""

import pytest

import perfmodel as pm
from perfmodel.memory import kv_bytes_per_sequence, memory_estimate, weights_bytes
from perfmodel.specs import Workload


@pytest.mark.parametrize(("name", "expected"), [
    ("llama-2-13b", 819_200),     # 40 layers x 2 x 40 heads x 128 x 2 B
    ("llama-3-70b", 327_680),     # 80 x 2 x 8 x 128 x 2
    ("deepseek-v3", 70_272),      # 61 x (512 + 64) x 2
    ("falcon-7b", 8_192),         # 32 x 2 x 1 x 64 x 2 (MQA)
])
def test_kv_bytes_per_token_exact(name, expected):
    est = memory_estimate(pm.model(name), pm.hardware("h100-sxm"), Workload())
    assert est.kv_cache_bytes_per_token == expected


def test_kv_dtype_scales_cache():
    wl = Workload(kv_dtype="fp8")
    est = memory_estimate(pm.model("llama-2-13b"), pm.hardware("h100-sxm"), wl)
    assert est.kv_cache_bytes_per_token == 409_600


def test_sliding_window_caps_every_layer_of_mistral():
    wl = Workload(kv_block_tokens=1)
    # 32 layers x 4096 kept positions x (2 x 8 x 128 x 2 B)
    assert kv_bytes_per_sequence(pm.model("mistral-7b"), wl, 10_000) == 32 * 4096 * 4096


def test_gemma2_local_global_hybrid():
    wl = Workload(kv_block_tokens=1)
    per_token_layer = 2 * 8 * 256 * 2
    # 21 local layers keep 4096, 21 global layers keep all 8192
    assert kv_bytes_per_sequence(pm.model("gemma-2-9b"), wl, 8192) == \
        21 * 4096 * per_token_layer + 21 * 8192 * per_token_layer


def test_paging_rounds_up_to_whole_blocks():
    model = pm.model("llama-2-7b")
    per_token = 32 * 2 * 32 * 128 * 2
    assert kv_bytes_per_sequence(model, Workload(kv_block_tokens=16), 17) == 32 * per_token
    assert kv_bytes_per_sequence(model, Workload(kv_block_tokens=1), 17) == 17 * per_token


def test_max_batch_by_hand():
    # llama-2-7b bf16 on A100-80GB, prompt 512 + 128 generated, 90% usable
    wl = Workload(batch=1, prompt_len=512, gen_len=128)
    est = memory_estimate(pm.model("llama-2-7b"), pm.hardware("a100-80gb-sxm"), wl)
    weights = 6_738_415_616 * 2
    kv_seq = 640 * 32 * 2 * 32 * 128 * 2                 # 40 whole blocks of 16
    ws_seq = (2 * 4096 + 3 * 11008) * 2 * 512 + 32000 * 4
    assert est.weights_bytes == weights
    assert est.kv_cache_bytes_per_sequence == kv_seq
    assert est.max_batch == (72e9 - weights) // (kv_seq + ws_seq) == 154
    assert est.fits


def test_too_big_reports_numbers_not_crash():
    wl = Workload(batch=1)
    est = memory_estimate(pm.model("llama-3.1-405b"), pm.hardware("h100-sxm"), wl)
    assert not est.fits and est.max_batch == 0
    assert est.weights_bytes > est.usable_bytes and est.free_bytes < 0


def test_group_quantized_int4_weights():
    model = pm.model("llama-2-7b")
    counts = pm.estimate(pm.hardware("h100-sxm"), model).params_total
    plain = weights_bytes(model, Workload(weights_dtype="int4"))
    grouped = weights_bytes(model, Workload(weights_dtype="int4", weight_group_size=128))
    vocab_rows = 2 * 32000 * 4096 + (2 * 32 + 1) * 4096     # embedding, head, norms at bf16
    linear = counts - vocab_rows
    assert plain == linear * 0.5 + vocab_rows * 2
    assert grouped - plain == pytest.approx(linear * 2 / 128)


@pytest.mark.parametrize("name", ["llama-3-70b", "deepseek-v3", "mixtral-8x7b"])
def test_tp_never_increases_weight_bytes_or_kv(name):
    model = pm.model(name)
    prev_w = prev_kv = float("inf")
    for tp in (1, 2, 4, 8):
        wl = Workload(tp=tp)
        w = weights_bytes(model, wl)
        kv = kv_bytes_per_sequence(model, wl, 1000)
        assert w <= prev_w and kv <= prev_kv
        prev_w, prev_kv = w, kv
