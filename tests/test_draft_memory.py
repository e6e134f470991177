"""Speculative decoding's memory: the draft's weights and cache on the target's devices."""

import numpy as np
import pytest

import perfmodel as pm
from perfmodel.cost.params import param_counts

H100, TP4 = pm.hardware("h100-sxm"), pm.Parallelism(tp=4)
WL = pm.Workload(batch=16, prompt_len=1536, gen_len=1024)


def test_a_draft_model_adds_its_weights_and_cache_by_hand():
    target, draft = pm.model("llama-3-70b"), pm.model("llama-3-8b")
    plain = pm.estimate(H100, target, WL, TP4)
    spec = pm.estimate(H100, target, WL, TP4, pm.Speculation(4, 0.8, draft_model=draft))
    alone = pm.estimate(H100, draft, WL, TP4)
    assert spec.memory.weights_bytes == pytest.approx(
        plain.memory.weights_bytes + alone.memory.weights_bytes)
    # llama-3-8b under TP4: 2 of its 8 KV heads x 128 x 2 (K, V) x 2 B x 32 layers = 32 kB
    # per token, 2,560 tokens in whole blocks
    assert alone.memory.kv_cache_bytes_per_sequence == 2560 * 2 * 128 * 2 * 2 * 32
    per_seq = plain.memory.kv_cache_bytes_per_sequence + alone.memory.kv_cache_bytes_per_sequence
    # beside one full step's activations (8,192 tokens: d 8,192 twice and the gate + up +
    # activated 3 x 28,672 / 4 per token, bf16) and each sequence's fp32 logits
    step, logits = (2 * 8192 + 3 * 28672 // 4) * 2 * 8192, 128256 // 4 * 4
    room = plain.memory.usable_bytes - spec.memory.weights_bytes
    assert spec.memory.max_batch == int(np.floor((room - step) / (per_seq + logits)))
    assert spec.memory.max_batch * 1536 >= 8192
    assert spec.memory.max_batch < plain.memory.max_batch
    assert not any("not counted" in w for w in spec.warnings)


def test_mtp_modules_are_counted():
    dsv3, h200 = pm.model("deepseek-v3"), pm.hardware("h200-sxm")
    wl = pm.Workload(batch=4, prompt_len=1024, gen_len=64, weights_dtype="fp8")
    plan = pm.Parallelism(tp=8)
    plain = pm.estimate(h200, dsv3, wl, plan)
    mtp = pm.estimate(h200, dsv3, wl, plan, pm.Speculation(1, 0.85, "mtp"))
    added = mtp.memory.weights_bytes - plain.memory.weights_bytes
    assert added == pytest.approx(param_counts(dsv3, 8).mtp * 1.0)     # fp8: 1 byte each
    assert mtp.memory.kv_cache_bytes_per_sequence == pytest.approx(
        plain.memory.kv_cache_bytes_per_sequence * 62 / 61)            # one more layer
