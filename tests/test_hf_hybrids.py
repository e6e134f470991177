"""Hugging Face ``config.json`` import of the hybrid families (Jamba, Nemotron-H, Qwen3-Next,
MiniMax-Text-01, Falcon-H1, Zamba2 in both key spellings): each published config
(tests/data/hf, the real keys with the shipped YAML's numbers) translates to the shipped
YAML's shape; a layer letter or type not understood is a one-line error naming its key."""

import json
from dataclasses import fields
from pathlib import Path

import pytest

import perfmodel as pm
from perfmodel.cost.params import param_counts
from perfmodel.specs.errors import SpecError
from perfmodel.specs.hf import model_from_hf_config

HF = Path(__file__).parent / "data" / "hf"
# HF config in tests/data/hf -> the shipped YAML it must reproduce
SHIPPED = {"jamba": "jamba-1.5-mini", "nemotron-h": "nemotron-h-8b",
           "qwen3-next": "qwen3-next-80b-a3b", "minimax-text-01": "minimax-text-01",
           "falcon-h1": "falcon-h1-7b",     # its muP multipliers written as 1.0: no cost
           "zamba2-2.7b": "zamba2-2.7b",    # today's transformers key names
           "zamba2-7b": "zamba2-7b"}        # Zyphra's earlier ones (lora_rank, state_size)


def _load(config: str) -> dict:
    return json.loads((HF / f"{config}.json").read_text())


@pytest.mark.parametrize("config", sorted(SHIPPED))
def test_hf_hybrid_matches_shipped_yaml(config):
    got, want = pm.model(str(HF / f"{config}.json")), pm.model(SHIPPED[config])
    assert param_counts(got).total == pytest.approx(param_counts(want).total, rel=1e-3)
    # the per-layer kinds (a pattern may be written shorter: Nemotron-H's repeats after 46)
    assert got.layer_kinds() == want.layer_kinds()
    assert (got.mamba, got.linear_attention, got.moe) == (want.mamba, want.linear_attention,
                                                          want.moe)
    same = {f.name for f in fields(want)} - {"name", "source", "family", "layer_pattern"}
    assert {k: getattr(got, k) for k in same} == {k: getattr(want, k) for k in same}


@pytest.mark.parametrize("config", sorted(SHIPPED))
def test_hf_hybrid_estimates(config):
    model = pm.model(str(HF / f"{config}.json"))
    est = pm.estimate(pm.hardware("h100-sxm"), model, pm.Workload(prompt_len=64, gen_len=4))
    assert est.e2e_s > 0


def test_hf_hybrid_patterns_as_the_yamls_write_them():
    for config in ("jamba", "qwen3-next", "minimax-text-01"):
        got = pm.model(str(HF / f"{config}.json")).layer_pattern
        assert got == pm.model(SHIPPED[config]).layer_pattern


@pytest.mark.parametrize("config, change, key", [
    ("nemotron-h", {"hybrid_override_pattern": "M-E" * 17 + "M"}, "hybrid_override_pattern"),
    ("nemotron-h", {"hybrid_override_pattern": "M-*"}, "hybrid_override_pattern"),
    ("minimax-text-01", {"attn_type_list": [0, 2] * 40}, "attn_type_list"),
    ("minimax-text-01", {"attn_type_list": None,
                         "layer_types": ["linear_attention", "mamba"] * 40}, "layer_types"),
    ("qwen3-next", {"layer_types": ["linear_attention", "sliding_attention"] * 24},
     "layer_types"),
    ("jamba", {"expert_layer_offset": 0}, "expert_layer_offset"),
    ("jamba", {"attn_layer_offset": 8}, "attn_layer_offset"),
    ("qwen3-next", {"shared_expert_intermediate_size": 700}, "shared_expert_intermediate_size"),
    ("minimax-text-01", {"shared_intermediate_size": 1024}, "shared_intermediate_size"),
])
def test_hf_hybrid_layers_not_understood_are_one_line_errors(config, change, key):
    with pytest.raises(SpecError, match=rf"^config\.json: {key}: ") as info:
        model_from_hf_config(_load(config) | change, "config.json")
    assert "\n" not in str(info.value)


def test_hf_hybrid_transformers_key_names():
    """transformers' own names: MiniMax ``layer_types``, Nemotron-H ``mamba_*`` arguments,
    Qwen3-Next ``layer_types``, Jamba ``mamba_dt_rank`` "auto" (ceil(d / 16))."""
    mm = _load("minimax-text-01")
    mm["layer_types"] = ["full_attention" if t else "linear_attention"
                         for t in mm.pop("attn_type_list")]
    mm["model_type"] = "minimax"
    assert model_from_hf_config(mm, "c.json").layer_kinds() \
        == pm.model("minimax-text-01").layer_kinds()
    nh = _load("nemotron-h")
    for hub, ctor in (("n_groups", "mamba_n_groups"), ("conv_kernel", "mamba_d_conv"),
                      ("chunk_size", "mamba_chunk_size")):
        nh[ctor] = nh.pop(hub)
    assert model_from_hf_config(nh, "c.json").mamba == pm.model("nemotron-h-8b").mamba
    qn = _load("qwen3-next")
    qn["layer_types"] = ["full_attention" if (i + 1) % 4 == 0 else "linear_attention"
                         for i in range(48)]
    assert model_from_hf_config(qn, "c.json").layer_kinds() \
        == pm.model("qwen3-next-80b-a3b").layer_kinds()
    jb = _load("jamba") | {"mamba_dt_rank": "auto"}
    assert model_from_hf_config(jb, "c.json").mamba.dt_rank == 256


def test_partial_rotary_prices_the_rotated_features_only():
    """vLLM's rotary kernel turns rot_dim of each head in place. Qwen3-Next
    (partial_rotary_factor 0.25 x head_dim 256 = 64) over 12 attention layers, 16 q + 2 kv
    heads: a prefill of 100 tokens rotates 100 x 18 x 64 = 115,200 elements a layer, 3 FLOPs
    each: 12 x 115,200 x 3 = 4,147,200 FLOPs, 12 x 115,200 x 2 = 2,764,800 bytes read and
    as many written (a quarter of the full head's). MiniMax-Text-01 (rotary_dim 64 of 128),
    10 softmax layers of 64 q + 8 kv heads: 10 x 100 x 72 x 64 x 3 = 13,824,000 FLOPs and
    10 x 100 x 72 x 64 x 2 = 9,216,000 bytes each way."""
    for name, flops, moved in (("qwen3-next-80b-a3b", 4_147_200, 2_764_800),
                               ("minimax-text-01", 13_824_000, 9_216_000)):
        assert pm.model(name).rotated_dim == 64
        est = pm.estimate(pm.hardware("h100-sxm"), pm.model(name),
                          pm.Workload(prompt_len=100, gen_len=1, batch=1))
        rotary = next(o for o in est.phases[0].ops if o.name == "rotary")
        assert rotary.flops == flops
        assert rotary.bytes.act_read == rotary.bytes.act_write == moved
    qwen = _load("qwen3-next")
    qwen["partial_rotary_factor"] = 1.0          # every feature: no rotary_dim
    assert model_from_hf_config(qwen, "config.json").rotary_dim == 0


@pytest.mark.parametrize(("extra", "message"), [
    ({"rotary_dim": 63}, "rotary_dim.*even"),
    ({"rotary_dim": 256}, r"rotary_dim.*head_dim \(128\)"),
    ({"rotary_dim": 64, "position": "none"}, "rotary_dim.*position: rope"),
])
def test_rotary_dim_mistakes(tmp_path, extra, message):
    spec = {"version": 1, "name": "t", "n_layers": 2, "d_model": 512, "n_heads": 4,
            "n_kv_heads": 4, "vocab_size": 1000, "intermediate_size": 1024, **extra}
    path = tmp_path / "t.json"
    path.write_text(json.dumps(spec))
    with pytest.raises(SpecError, match=message):
        pm.model(str(path))
