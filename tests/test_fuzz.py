"""Seeded fuzz: random models, devices, dtypes, parallelism and workloads, and random
mutations of valid YAML and JSON specs.

Whatever goes in, the only exception allowed out is ``SpecError`` (the one user-error type),
and every estimate that comes back is finite, non-negative and keeps its identities:
throughput x end-to-end time = generated tokens, decode rate x TPOT = batch (when there are
decode steps), and fits == (batch <= max batch). Each test counts the inputs it tried and
checks that count, so a generator that silently produced nothing would fail.
"""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import yaml

import perfmodel as pm
from perfmodel.specs.dtypes import DTYPES
from perfmodel.specs.load import HARDWARE_DIR, MODELS_DIR, shipped

SEED = 20261124
CONFIGS_PER_PLAN = 24


def _check(est: pm.Estimates) -> None:
    """The invariants of every estimate (``where`` names the configuration that broke)."""
    w, mem = est.workloads, est.memory
    numbers = {"ttft_s": est.ttft_s, "tpot_s": est.tpot_s, "e2e_s": est.e2e_s,
               "throughput": est.throughput_tokens_per_s, "decode_rate": est.decode_tokens_per_s,
               "weights_bytes": mem.weights_bytes, "kv_cache_bytes": mem.kv_cache_bytes,
               "usable_bytes": mem.usable_bytes, "max_batch": mem.max_batch}
    for name, values in numbers.items():
        values = np.broadcast_to(np.asarray(values, dtype=float), (len(est),))
        assert np.isfinite(values).all(), f"{name} not finite: {values}"
        assert (values >= 0).all(), f"{name} negative: {values}"
    assert (est.ttft_s > 0).all() and (est.e2e_s >= est.ttft_s).all()
    tokens = w.batch * w.gen_len
    assert np.allclose(est.throughput_tokens_per_s * est.e2e_s, tokens, rtol=1e-9)
    decoding = w.gen_len > 1
    assert np.allclose((est.decode_tokens_per_s * est.tpot_s)[decoding], w.batch[decoding],
                       rtol=1e-9)
    assert (est.decode_tokens_per_s[~decoding] == 0).all()
    assert (np.asarray(mem.fits) == (w.batch <= mem.max_batch)).all()
    assert len(est.warnings()) == len(est)


def _random_model(rng: random.Random) -> dict:
    """A model YAML mapping: dense, GQA/MQA, windowed, MoE or MLA, odd sizes included."""
    heads = rng.choice([1, 2, 4, 8, 12, 32, 64])
    kv = rng.choice([h for h in (1, 2, 4, 8, heads) if heads % h == 0])
    out = {"version": 1, "name": f"fuzz-{rng.randrange(10**6)}", "n_layers": rng.randint(1, 96),
           "d_model": rng.choice([64, 256, 1000, 4096, 8192]), "n_heads": heads,
           "n_kv_heads": kv, "head_dim": rng.choice([16, 64, 80, 128, 256]),
           "vocab_size": rng.choice([7, 1000, 32000, 256000]),
           "intermediate_size": rng.choice([128, 1000, 11008, 28672]),
           "gated_mlp": rng.random() < 0.7, "max_position_embeddings": rng.choice([0, 2048])}
    if not out["max_position_embeddings"]:   # no limit is the field left out (0 is refused)
        del out["max_position_embeddings"]
    if rng.random() < 0.25:
        out["attention"] = {"sliding_window": rng.choice([1, 16, 4096]),
                            "layer_pattern": rng.choice([["local"], ["local", "global"]])}
    if rng.random() < 0.25:
        n = rng.choice([2, 8, 64, 256])
        out["moe"] = {"n_experts": n, "top_k": rng.randint(1, min(n, 8)),
                      "expert_intermediate_size": rng.choice([64, 2048]),
                      "n_shared_experts": rng.choice([0, 1]),
                      "first_dense_layers": rng.choice([0, 1])}
    elif rng.random() < 0.15:
        out["n_kv_heads"] = heads
        out["head_dim"] = 192
        out["mla"] = {"q_lora_rank": rng.choice([None, 1536]), "kv_lora_rank": 512,
                      "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128}
    return out


def _random_workloads(rng: random.Random, n: int, own_head: bool = True) -> pm.Workloads:
    """``n`` random configurations; a quantized LM head drawn only where the model has a
    head of its own (``own_head``: a tied one is refused for every row alike)."""
    weights = [rng.choice(DTYPES) for _ in range(n)]
    groups = [rng.choice([0, 32, 128]) if pm.Workload(weights_dtype=w).weight_bytes_per_param
              < 2 else 0 for w in weights]
    prompts = [rng.choice([1, 3, 128, 4097, 100_000]) for _ in range(n)]
    quantized = [pm.Workload(weights_dtype=w).weight_bytes_per_param < 2 for w in weights]
    side = random.Random(sum(prompts))     # the quantization formats' draws: rng's untouched
    return pm.Workloads.of(
        batch=[rng.choice([1, 2, 7, 64, 1000]) for _ in range(n)],
        prompt_len=prompts, shared_prefix=[rng.choice([0, p // 2, p - 1]) for p in prompts],
        prefix_hit_rate=[rng.choice([0.0, 0.3, 1.0]) for _ in range(n)],
        gen_len=[rng.choice([1, 2, 50, 3000]) for _ in range(n)],
        weights_dtype=weights, weight_group_size=groups,
        act_dtype=[rng.choice(DTYPES) for _ in range(n)],
        kv_dtype=(kvs := [rng.choice(DTYPES) for _ in range(n)]),
        kv_scale_bytes=[side.choice([1.0, 4.0]) for _ in range(n)],
        kv_group_size=[side.choice([None, 0, 16]) if k in ("fp8", "int8", "int4", "fp4")
                       else None for k in kvs],
        outlier_fraction=[side.choice([0.0, 0.01, 0.5]) if q else 0.0 for q in quantized],
        quantize_lm_head=[own_head and side.random() < 0.5 for _ in range(n)],
        cuda_graphs=[rng.random() < 0.5 for _ in range(n)],
        usable_memory_fraction=[rng.choice([0.05, 0.5, 0.9, 1.0]) for _ in range(n)],
        kv_block_tokens=[rng.choice([1, 16, 256]) for _ in range(n)])


def test_random_configurations_give_sane_numbers_or_a_spec_error(tmp_path):
    rng = random.Random(SEED)
    # shipped models are drawn from their own stream: a model file added to models/ changes
    # which one a draw picks, not every plan, device and workload after it
    pick = random.Random(SEED + 1)
    # and so are devices: a hardware file added changes which device a plan gets, not the
    # plans, models and workloads drawn after it
    device_pick = random.Random(SEED + 2)
    devices = [pm.hardware(n) for n in shipped(HARDWARE_DIR)]
    models = [pm.model(n) for n in shipped(MODELS_DIR)]
    tried = priced = refused = 0
    for i in range(60):
        if i % 2:
            path = tmp_path / f"m{i}.yaml"
            path.write_text(yaml.safe_dump(_random_model(rng)))
            try:
                model = pm.model(str(path))
            except pm.SpecError:
                refused += 1
                continue
        else:
            model = pick.choice(models)
        plan = pm.Parallelism(tp=rng.choice([1, 1, 2, 2, 4, 8, 3, 16]))
        hw = device_pick.choice(devices)
        workloads = _random_workloads(rng, CONFIGS_PER_PLAN, not model.tie_embeddings)
        tried += CONFIGS_PER_PLAN
        try:
            _check(pm.estimate_many(hw, model, workloads, plan))
            priced += CONFIGS_PER_PLAN
            continue
        except pm.SpecError as exc:
            if str(exc).startswith("parallelism:"):    # the plan itself: every row alike
                refused += CONFIGS_PER_PLAN
                continue
        for j in range(CONFIGS_PER_PLAN):     # one refused: price them one at a time
            try:
                _check(pm.estimate_many(hw, model, workloads.take(np.array([j])), plan))
                priced += 1
            except pm.SpecError as exc:
                assert "\n" not in str(exc) and str(exc).strip()
                refused += 1
    assert tried == 60 * CONFIGS_PER_PLAN and priced >= 800 and refused > 0, (priced, refused)


# --- mutated specs -----------------------------------------------------------------------

_VALUES = ["-1", "0", "1e30", "5e9", "abc", "[1, 2]", "{a: 1}", "null", "true", "1.5", "''",
           "80 GB", "-3 TB/s", "nan", ".inf", "0x10", "!!python/object:os.system x"]


def _mutate_text(text: str, rng: random.Random) -> str:
    lines = text.splitlines()
    i = rng.randrange(len(lines))
    op = rng.randrange(5)
    if op == 0:
        del lines[i]
    elif op == 1 and ":" in lines[i]:
        key = lines[i].split(":", 1)[0]
        lines[i] = f"{key}: {rng.choice(_VALUES)}"
    elif op == 2:
        lines.insert(i, lines[i])                      # a duplicate key
    elif op == 3:
        return text[:rng.randrange(len(text))]         # truncated
    else:
        lines.insert(i, rng.choice(["\t- x", ": :", "&a b", "*b", "[", "key"]))
    return "\n".join(lines) + "\n"


def _mutate_mapping(data: dict, rng: random.Random) -> dict:
    data = json.loads(json.dumps(data))
    key = rng.choice(sorted(data))
    value = rng.choice([None, -1, 0, 1e30, 5e9, "abc", [1, 2], {"a": 1}, True, 1.5, "",
                        float("nan")])
    if rng.random() < 0.3:
        del data[key]
    else:
        data[key] = value
    return data


HF_LLAMA = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 512,
            "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2,
            "intermediate_size": 1376, "vocab_size": 32000, "max_position_embeddings": 4096,
            "hidden_act": "silu", "tie_word_embeddings": False}


def _use(spec: object, hw: pm.Hardware, model: pm.Model) -> None:
    """Price a loaded spec: the invariants must hold, or it must be a SpecError."""
    if isinstance(spec, pm.Hardware):
        hw = spec
    else:
        model = spec
    _check(pm.estimate_many(hw, model, pm.Workloads.of(batch=[1, 8], gen_len=[1, 16])))


def test_mutated_specs_load_and_price_or_give_one_line_errors(tmp_path):
    rng = random.Random(SEED)
    h100, llama = pm.hardware("h100-sxm"), pm.model("llama-2-7b")
    sources = [(p, p.read_text()) for d in (HARDWARE_DIR, MODELS_DIR) for p in sorted(
        d.glob("*.yaml"))]
    tried = loaded = 0
    for i in range(240):
        if i % 4 == 3:
            path = tmp_path / f"config{i}.json"
            text = json.dumps(_mutate_mapping(HF_LLAMA, rng))
            if rng.random() < 0.3:                     # a duplicate key, written by hand
                text = text.replace('"hidden_size": ', '"hidden_size": 64, "hidden_size": ', 1)
            path.write_text(text)
            load = pm.model
        else:
            source, text = rng.choice(sources)
            path = tmp_path / f"{source.parent.name}{i}.yaml"
            path.write_text(_mutate_text(text, rng))
            load = pm.hardware if source.parent == HARDWARE_DIR else pm.model
        tried += 1
        try:
            _use(load(str(path)), h100, llama)
            loaded += 1
        except pm.SpecError as exc:
            message = str(exc)
            assert "\n" not in message and message.strip(), repr(message)
    assert tried == 240 and 0 < loaded < tried, (tried, loaded)


@pytest.mark.parametrize("value", [np.int32(4), np.int64(4), np.uint16(4)])
def test_numpy_integers_are_accepted_where_integers_are(value):
    """A vectorised core takes numpy integers as readily as Python ones."""
    wl = pm.Workload(batch=value, prompt_len=value, gen_len=value)
    est = pm.estimate(pm.hardware("h100-sxm"), pm.model("llama-2-7b"), wl,
                      pm.Parallelism(tp=value))
    assert est.workload.batch == 4 and type(est.workload.batch) is int
