"""Sweeps: the sampled decode against estimate(), record columns, and physics monotonicity."""

import math
from dataclasses import replace

import pytest

import perfmodel as pm
from perfmodel.estimate import decode_contexts, estimate
from perfmodel.memory import memory_estimate
from perfmodel.report import flat_record
from perfmodel.sweep import (
    OP_CLASSES,
    kv_cache_table,
    max_batch_table,
    point_estimate,
    powers_of_two,
    series,
    sweep,
    time_split_table,
)

LLAMA = pm.model("llama-2-13b")


@pytest.mark.parametrize("prompt,gen", [(512, 128), (100, 5), (3000, 3000), (64, 2)])
def test_sampled_contexts_cover_the_decode_steps(prompt, gen):
    wl = pm.Workload(prompt_len=prompt, gen_len=gen)
    ctx, w = decode_contexts(wl, 9)
    assert sum(w) == pytest.approx(gen - 1)
    assert ctx[0] == prompt + 1 and ctx[-1] == prompt + gen - 1
    assert ctx == sorted(set(ctx)) and len(ctx) <= max(9, gen - 1)
    if gen - 1 <= 9:        # few steps: every step, as the core does
        assert (ctx, w) == decode_contexts(wl)


def test_sampled_contexts_reject_one_sample():
    with pytest.raises(ValueError):
        decode_contexts(pm.Workload(), 1)


@pytest.mark.parametrize("model,hw,wl", [
    ("llama-2-13b", "h100-sxm", pm.Workload(batch=16, prompt_len=512, gen_len=2048)),
    ("mistral-7b", "l4", pm.Workload(batch=256, prompt_len=3000, gen_len=3000)),  # window kink
    ("gemma-2-9b", "a100-80gb-sxm", pm.Workload(batch=8, prompt_len=3500, gen_len=1500)),
    ("deepseek-v3", "h200-sxm", pm.Workload(batch=64, prompt_len=8000, gen_len=500, tp=8)),
])
def test_sampled_decode_within_a_tenth_of_a_percent_of_estimate(model, hw, wl):
    m, h = pm.model(model), pm.hardware(hw)
    exact, fast = estimate(h, m, wl), point_estimate(m, h, wl, 9)
    assert fast.tpot_s == pytest.approx(exact.tpot_s, rel=1e-3)
    assert fast.ttft_s == exact.ttft_s                      # prefill is the same computation
    assert fast.memory == exact.memory
    assert fast.decode.first_step_s == pytest.approx(exact.decode.first_step_s)
    assert fast.decode.last_step_s == pytest.approx(exact.decode.last_step_s)


def test_exact_mode_is_estimate(h100):
    wl = pm.Workload(batch=4)
    assert point_estimate(LLAMA, h100, wl, None) == estimate(h100, LLAMA, wl)


def test_records_extend_flat_record_and_split_by_class(h100):
    rows = sweep([LLAMA], [h100], [1, 8], [256, 1024], pm.Workload(gen_len=64))
    assert len(rows) == 4
    assert [(r["workload_prompt_len"], r["workload_batch"]) for r in rows] == \
        [(256, 1), (256, 8), (1024, 1), (1024, 8)]        # batch varies fastest
    ref = flat_record(point_estimate(LLAMA, h100, pm.Workload(batch=8, prompt_len=1024,
                                                              gen_len=64)))
    assert set(ref) <= set(rows[-1])
    assert rows[-1]["tpot_s"] == ref["tpot_s"]
    for r in rows:
        assert sum(r[f"ttft_{c}_s"] for c in OP_CLASSES) == pytest.approx(r["ttft_s"])
        assert sum(r[f"tpot_{c}_s"] for c in OP_CLASSES) == pytest.approx(r["tpot_s"])
        assert r["context_len"] == r["workload_prompt_len"] + 64
        assert r["decode_samples"] == 9 and r["attention_kind"] == "mha"


def test_one_generated_token_has_no_decode_split(h100):
    (row,) = sweep([LLAMA], [h100], [1], [128], pm.Workload(gen_len=1))
    assert math.isnan(row["tpot_gemm_s"]) and row["tpot_s"] > 0


def test_product_over_devices_and_dtypes(h100, a100):
    rows = sweep([LLAMA], [h100, a100], [1, 4], [512], weights_dtypes=["bf16", "fp8"],
                 kv_dtypes=["bf16", "fp8"])
    assert len(rows) == 2 * 2 * 2 * 2
    assert {r["workload_kv_dtype"] for r in rows} == {"bf16", "fp8"}
    labels = series(rows, exclude=("workload_batch",))
    assert len(labels) == 8 and all(len(v) == 2 for v in labels.values())
    assert "h100-sxm, W fp8, KV bf16" in labels


def test_invalid_workload_is_a_spec_error(h100):
    with pytest.raises(pm.SpecError):
        sweep([LLAMA], [h100], [0], [512])


def _by(rows, key):
    return [r[key] for r in rows]


def test_monotone_where_physics_says_so(h100):
    batches = powers_of_two(1, 256)
    rows = sweep([LLAMA], [h100], batches, [512], pm.Workload(gen_len=128))
    tpot = _by(rows, "tpot_s")
    assert tpot == sorted(tpot)                          # more sequences: never a faster step
    thr = _by(rows, "decode_tokens_per_s")[:8]           # memory-bound region: throughput grows
    assert thr == sorted(thr)
    assert len({r["max_batch"] for r in rows}) == 1      # ceiling does not depend on batch
    assert [r["fits"] for r in rows] == [b <= rows[0]["max_batch"] for b in batches]
    ctx_rows = sweep([LLAMA], [h100], [8], [128, 512, 2048, 8192])
    for key in ("ttft_s", "tpot_s", "kv_cache_bytes_per_sequence", "tpot_attention_s"):
        assert _by(ctx_rows, key) == sorted(_by(ctx_rows, key))
    mb = _by(ctx_rows, "max_batch")
    assert mb == sorted(mb, reverse=True)
    # weights are streamed every decode step: narrower weights, faster memory-bound decode
    bf16, fp8 = sweep([LLAMA], [h100], [1], [512], weights_dtypes=["bf16", "fp8"])
    assert fp8["tpot_s"] < bf16["tpot_s"]
    assert bf16["weights_bytes"] / 2 < fp8["weights_bytes"] < 0.52 * bf16["weights_bytes"]


def test_kv_table_by_attention_kind():
    names = ["llama-2-13b", "llama-3-70b", "falcon-7b", "deepseek-v3", "mistral-7b",
             "gemma-2-9b"]
    contexts = [1024, 4096, 16384]
    rows = kv_cache_table([pm.model(n) for n in names], contexts)
    per_token = {r["model"]: r["kv_bytes_per_token"] for r in rows}
    assert per_token["deepseek-v3"] == 61 * 576 * 2              # MLA latent + rope key
    assert per_token["llama-2-13b"] == 40 * 2 * 40 * 128 * 2     # MHA
    assert per_token["llama-3-70b"] == 80 * 2 * 8 * 128 * 2      # GQA
    assert per_token["falcon-7b"] == 32 * 2 * 1 * 64 * 2         # MQA
    seq = {(r["model"], r["context"]): r["kv_bytes_per_sequence"] for r in rows}
    assert seq[("llama-2-13b", 4096)] == 4096 * per_token["llama-2-13b"]
    assert seq[("mistral-7b", 16384)] == seq[("mistral-7b", 4096)]       # all layers windowed
    gemma_growth = seq[("gemma-2-9b", 16384)] - seq[("gemma-2-9b", 4096)]
    assert gemma_growth == pytest.approx((16384 - 4096) * per_token["gemma-2-9b"] / 2)
    kinds = {r["model"]: r["attention_kind"] for r in rows}
    assert kinds["falcon-7b"] == "mqa" and kinds["mistral-7b"] == "gqa, window 4096"


def test_max_batch_table_matches_memory_estimate(h100):
    base = pm.Workload(gen_len=128)
    rows = max_batch_table([LLAMA], h100, [64, 1024, 4096, 32768], base)
    assert [r["context"] for r in rows] == [1024, 4096, 32768]          # 64 <= gen: skipped
    for r in rows:
        wl = replace(base, prompt_len=r["context"] - 128)
        assert r["max_batch"] == memory_estimate(LLAMA, h100, wl).max_batch
    assert _by(rows, "max_batch") == sorted(_by(rows, "max_batch"), reverse=True)
    gpt3 = max_batch_table([pm.model("gpt-3-175b")], h100, [1024, 4096], base)
    assert not gpt3[0]["fits_weights"] and gpt3[0]["max_batch"] == 0
    assert [r["beyond_max_position"] for r in gpt3] == [False, True]    # n_ctx 2048


def test_time_split_table_sums(h100):
    rows = sweep([LLAMA], [h100], [4], [2048, 512])
    for phase, total in (("prefill", "ttft_s"), ("decode", "tpot_s")):
        table = time_split_table(rows, phase)
        assert [t["context"] for t in table] == [512, 2048]
        by_ctx = {r["workload_prompt_len"]: r[total] for r in rows}
        for t in table:
            assert sum(v for k, v in t.items() if k != "context") == \
                pytest.approx(by_ctx[t["context"]])
        assert "gemm" in table[0] and "communication" not in table[0]


def test_powers_of_two():
    assert powers_of_two(1, 100) == [1, 2, 4, 8, 16, 32, 64]
    assert powers_of_two(3, 16) == [4, 8, 16]
