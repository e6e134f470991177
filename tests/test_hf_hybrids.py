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
