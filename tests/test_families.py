"""The attention-based families of the "architectures" issue: q/k norms, attention sinks,
chunked attention, MoE every other layer; their shipped YAMLs against published parameter
totals; KV bytes by hand; their Hugging Face configs."""

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

import perfmodel as pm
from perfmodel.cost.layers import step_template
from perfmodel.cost.memory import kv_bytes_per_sequence
from perfmodel.cost.ops import Attention
from perfmodel.cost.params import param_counts
from perfmodel.cost.positions import attended_positions, kept_positions
from perfmodel.specs.errors import SpecError
from perfmodel.specs.hf import model_from_hf_config

HF = Path(__file__).parent / "data" / "hf"
NEW = ("qwen3-8b", "qwen3-30b-a3b", "qwen3-235b-a22b", "gemma-3-27b", "llama-4-scout",
       "llama-4-maverick", "gpt-oss-20b", "gpt-oss-120b", "phi-4", "deepseek-v2-lite",
       "kimi-k2")

# Llama 4's vision tower, not modelled (text only): 34 ViT layers of 1408 wide (q/k/v/o and
# fc1/fc2 5632, with biases, 2 LayerNorms) 809.5M, patch/position embeddings and norms 1.6M,
# the pixel-shuffle adapter (5632 -> 4096 -> 4096) 39.8M, the projector 4096 -> 5120 21.0M
# (vision_config of either config.json). The published totals include it.
LLAMA4_VISION = 0.872e9

# (published total, published active) in billions, and what "active" counts there
PUBLISHED = {
    # Qwen3 model cards (huggingface.co/Qwen/Qwen3-8B, -30B-A3B, -235B-A22B): 8.2B;
    # 30.5B / 3.3B activated; 235B / 22B activated
    "qwen3-8b": (8.2, None),
    "qwen3-30b-a3b": (30.5, 3.3),
    "qwen3-235b-a22b": (235.0, 22.0),
    # Gemma 3 technical report (arXiv 2503.19786) Table 1, 27B: 1,416M embedding +
    # 25,600M non-embedding parameters (the 417M vision encoder apart)
    "gemma-3-27b": (27.016, None),
    # Llama 4 model cards: Scout 17B active / 109B total, Maverick 17B / 400B (both with
    # the vision tower: LLAMA4_VISION is added to the text count below)
    "llama-4-scout": (109.0, 17.0),
    "llama-4-maverick": (400.0, 17.0),
    # Phi-4 technical report (arXiv 2412.08905): 14B; model card 14.7B
    "phi-4": (14.7, None),
}
# active counts without the embedding table (a gather), as these publishers count them:
# gpt-oss model card (arXiv 2508.10925) Table 1: 20.91B total / 3.61B active, 116.83B /
# 5.13B; DeepSeek-V2 paper (arXiv 2405.04434) appendix: V2-Lite 15.7B / 2.4B activated
NO_EMBEDDING = {"gpt-oss-20b": (20.91, 3.61), "gpt-oss-120b": (116.83, 5.13),
                "deepseek-v2-lite": (15.7, 2.4)}


def _counts(name: str) -> tuple[float, float, float]:
    model = pm.model(name)
    c = param_counts(model)
    vision = LLAMA4_VISION if name.startswith("llama-4") else 0.0
    # (total, active as these cards count it: with the input embedding, active without it)
    return ((c.total + vision) / 1e9, (c.active(model) + c.embedding) / 1e9,
            c.active(model) / 1e9)


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_totals_against_published(name):
    total, active, _ = _counts(name)
    want_total, want_active = PUBLISHED[name]
    assert total == pytest.approx(want_total, rel=0.01)
    if want_active is not None:
        # active figures are published to two significant digits: 3.3B is 3.25-3.35B
        # (the count gives 3.353B), 22B 21.5-22.5B (22.19B), 17B (17.17B, 17.19B)
        assert active == pytest.approx(want_active, rel=0.02)


@pytest.mark.parametrize("name", sorted(NO_EMBEDDING))
def test_totals_without_embedding_in_active(name):
    total, _, active = _counts(name)
    want_total, want_active = NO_EMBEDDING[name]
    assert total == pytest.approx(want_total, rel=0.01)
    # V2-Lite: 2.451B counted, published "2.4B"
    assert active == pytest.approx(want_active, rel=0.025)


def test_kimi_k2_total_between_its_two_published_figures():
    # model card: "1T total, 32B activated"; tech report (arXiv 2507.20534): 1.04T / 32.6B.
    # The shipped shape (61 layers, 60 MoE of 384 experts, no MTP) counts 1.0264T: 1.3% under
    # 1.04T, the size of one more MoE layer (17.1B), e.g. an MTP module not in the release.
    total, active, _ = _counts("kimi-k2")
    assert 1.0e3 < total < 1.04e3 and total == pytest.approx(1026.4, abs=0.1)
    assert active == pytest.approx(32.6, rel=0.01)


def test_gemma_3_kv_at_32k_by_hand():
    # 62 layers: (i + 1) % 6 == 0 global -> 10 global, 52 local of window 1024; per token
    # and layer 2 x 16 KV heads x 128 x 2 bytes = 8192
    model = pm.model("gemma-3-27b")
    assert model.layer_kinds().count("global") == 10
    want = (10 * 32768 + 52 * 1024) * 8192
    assert kv_bytes_per_sequence(model, 1, 2.0, 32768) == want == 3_120_562_176


def test_gpt_oss_kv_at_8k_by_hand():
    # 24 layers alternating window 128 and full; per token and layer 2 x 8 x 64 x 2 = 2048
    model = pm.model("gpt-oss-20b")
    want = (12 * 8192 + 12 * 128) * 2048
    assert kv_bytes_per_sequence(model, 1, 2.0, 8192) == want == 204_472_320


def test_llama_4_chunked_kv_holds_one_chunk():
    # 36 chunked layers of 8192 + 12 global; 2 x 8 x 128 x 2 = 4096 bytes per token, layer
    model = pm.model("llama-4-scout")
    want = (12 * 32768 + 36 * 8192) * 4096
    assert kv_bytes_per_sequence(model, 1, 2.0, 32768) == want


def test_chunk_attended_positions_by_hand():
    # chunks of 4; positions 0..9 attend 1 2 3 4 | 1 2 3 4 | 1 2
    assert attended_positions(10, 10, 0, 4) == 1 + 2 + 3 + 4 + 1 + 2 + 3 + 4 + 1 + 2
    assert attended_positions(3, 10, 0, 4) == 4 + 1 + 2       # positions 7, 8, 9
    assert attended_positions(1, 9, 0, 4) == 1                 # position 8 opens a chunk
    assert attended_positions(1, 8, 0, 4) == 4
    # reads: from the chunk of the first new token (position 7: chunk 4..7) to the end
    assert kept_positions(3, 10, 0, 4) == 6
    assert kept_positions(1, 9, 0, 4) == 1
    assert attended_positions(np.array([5, 2]), np.array([5, 9]), 0, 0).tolist() == [15, 17]


def test_chunk_attention_record_flops_and_bytes():
    # decode at context 8193 of a chunk of 8192: one key; 2 x heads x 1 x (qk + v) FLOPs
    op = Attention(batch=np.array([1]), q_len=np.array([1]), kv_len=np.array([8193]),
                   n_heads=40, n_kv_heads=8, qk_dim=128, v_dim=128, cache_elems=256,
                   window=8192, chunk=8192)
    assert op.flops == 2 * 40 * 1 * 256
    assert op.bytes.kv_read == 8 * 1 * 256 * 2


def test_qk_norm_is_a_pass_over_q_and_k_rows_and_2_head_dim_params():
    model = pm.model("qwen3-8b")
    spec = next(s for s in step_template(model) if s.name == "qk_norm")
    assert spec.kind == "rms_norm" and spec.n == (32 + 8) * 128 and spec.count == 36
    no_norm = pm.model("qwen3-8b")
    object.__setattr__(no_norm, "qk_norm", None)
    no_norm.memo.clear()
    assert param_counts(model).attention - param_counts(no_norm).attention == 36 * 2 * 128
    assert param_counts(pm.model("llama-4-scout")).attention == 48 * (
        5120 * (40 + 16) * 128 + 40 * 128 * 5120)          # l2: no weights


def test_qk_norm_weight_bytes_rms_head_dim_each_l2_none():
    """The q/k norm reads the weights it has, once a layer: rms (Qwen3-8B) head_dim for q
    and head_dim for k, shared by the heads, 36 x 2 x 128 x 2 bytes = 18,432 (not the row
    width's (32 + 8) x 128 = 5120 of them, 368,640); l2 (Llama 4 Scout) none. A prefill of
    100 tokens: activations 36 x 100 x 5120 x 2 = 36,864,000 bytes read and as many written."""
    def qk_norm(name: str) -> object:
        est = pm.estimate(pm.hardware("h100-sxm"), pm.model(name),
                          pm.Workload(prompt_len=100, gen_len=1, batch=1))
        return next(o for o in est.phases[0].ops if o.name == "qk_norm").bytes

    qwen = qk_norm("qwen3-8b")
    assert qwen.weights == 36 * 2 * 128 * 2 == 18_432
    assert qwen.act_read == qwen.act_write == 36 * 100 * 5120 * 2 == 36_864_000
    assert qk_norm("llama-4-scout").weights == 0


def test_sinks_count_one_per_head_and_change_nothing_else():
    c = param_counts(pm.model("gpt-oss-20b"))
    per_layer = 2880 * (64 + 16) * 64 + (64 + 16) * 64 + 64 * 64 * 2880 + 2880 + 64
    assert c.attention == 24 * per_layer


def test_maverick_interleaves_moe_and_dense_layers():
    model = pm.model("llama-4-maverick")
    assert [model.is_moe_layer(i) for i in range(4)] == [False, True, False, True]
    c = param_counts(model)
    assert c.mlp == 24 * 3 * 5120 * 16384
    assert c.experts == 24 * 128 * 3 * 5120 * 8192 and c.shared_experts == 24 * 3 * 5120 * 8192


@pytest.mark.parametrize("name", NEW)
def test_new_yaml_estimates_on_h100(name):
    model = pm.model(name)
    est = pm.estimate(pm.hardware("h100-sxm"), model,
                      pm.Workload(prompt_len=256, gen_len=16, batch=1))
    assert est.e2e_s > 0 and np.isfinite(est.e2e_s)


def test_decode_sum_is_exact_across_a_chunk_boundary():
    # tiny Llama 4 (chunk 32, 3 chunked layers, 4 heads, 2 KV heads, head_dim 16), batch 2,
    # prompt 20, 30 tokens: decode steps at contexts 21..49 read (c - 1) mod 32 + 1 keys:
    # 21..32 (sum 318), then 1..17 after the chunk boundary (153): 471 keys
    model = pm.model(str(HF / "llama4.json"))
    est = pm.estimate(pm.hardware("h100-sxm"), model,
                      pm.Workload(prompt_len=20, gen_len=30, batch=2))
    op = next(o for o in est.phases[-1].ops if o.name == "attention_chunk")
    assert op.flops == 3 * 2 * 2 * 4 * 471 * (16 + 16)
    assert op.bytes.kv_read == 3 * 2 * 2 * 471 * 32 * 2


FAMILIES = {
    "qwen3": lambda m: m.qk_norm == "rms" and m.moe is None,
    "qwen3-moe": lambda m: m.qk_norm == "rms" and m.moe.n_experts == 8,
    "gemma3": lambda m: m.layer_kinds() == ["local"] * 5 + ["global"] and m.tie_embeddings
    and m.name == "Gemma3ForConditionalGeneration-64x6",
    "phi3": lambda m: m.sliding_window is None and m.moe is None,
    "deepseek-v2-lite": lambda m: m.mla.q_lora_rank is None and m.moe.n_shared_experts == 2,
    "kimi-k2": lambda m: m.moe.n_experts == 12 and m.quantization.weights_dtype == "fp8",
    "llama4": lambda m: m.layer_kinds() == ["chunk"] * 3 + ["global"]
    and m.attention_chunk == 32 and m.moe.layer_step == 2 and m.intermediate_size == 256
    and m.qk_norm == "l2" and m.moe.n_shared_experts == 1,
    "gpt-oss": lambda m: m.attention_sinks and m.sliding_window == 8
    and m.quantization.unquantized == ("attention", "router") and m.linear_bias,
}


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_hf_family_imports(name):
    model = pm.model(str(HF / f"{name}.json"))
    assert FAMILIES[name](model)
    est = pm.estimate(pm.hardware("h100-sxm"), model, pm.Workload(prompt_len=64, gen_len=4))
    assert est.e2e_s > 0


@pytest.mark.parametrize("change, words", [
    ({"model_type": "mamba"}, "unsupported text of 5 characters.*expected one of llama"),
    ({"layer_types": ["sliding_attention", "linear_attention"] * 2}, "layer_types"),
    ({"layer_types": ["full_attention"] * 3}, "one per layer"),
])
def test_hf_cost_fields_not_understood_are_errors(change, words):

    data = json.loads((HF / "gpt-oss.json").read_text()) | change
    with pytest.raises(SpecError, match=words):
        model_from_hf_config(data, "config.json")


def test_hf_llama4_moe_layers_off_the_step_is_an_error():

    data = json.loads((HF / "llama4.json").read_text())
    data["text_config"]["moe_layers"] = [0, 3]
    with pytest.raises(SpecError, match=r"text_config\.moe_layers"):
        model_from_hf_config(data, "config.json")


def test_llama4_nope_layers_run_no_rotary_nor_qk_norm():
    # vLLM llama4.py Llama4Attention: rotary_emb and qk_norm only when not self.nope; every
    # 4th of 48 layers NoPE: 48 - 12 = 36. Prefill of 100 tokens in bf16, one pass over the
    # q and k rows, (40 + 8) x 128 = 6144 wide: rotary 36 x 100 x 6144 x 3 FLOPs, qk_norm
    # (rms_norm) x 4, each reading and writing 36 x 100 x 6144 x 2 activation bytes (was 48)
    est = pm.estimate(pm.hardware("h100-sxm"), pm.model("llama-4-scout"),
                      pm.Workload(prompt_len=100, gen_len=1, batch=1))
    ops = {o.name: o for o in est.phases[0].ops}
    assert ops["rotary"].flops == 36 * 100 * 6144 * 3 == 66_355_200
    assert ops["qk_norm"].flops == 36 * 100 * 6144 * 4 == 88_473_600
    for name in ("rotary", "qk_norm"):
        assert ops[name].bytes.act_read == ops[name].bytes.act_write == 36 * 100 * 6144 * 2
    maverick = pm.model("llama-4-maverick")            # use_qk_norm false: rotary only
    assert [(s.name, s.count) for s in step_template(maverick)
            if s.name in ("rotary", "qk_norm")] == [("rotary", 36)]


def test_nope_layers_only_among_attention_layers_and_without_their_norm_weights(tmp_path):
    # pattern [linear, global] x 4 over 8 layers: attention at 1, 3, 5, 7; NoPE every 4th
    # layer: 3 and 7; rotary and the rms q/k norm on 1 and 5; the norm's 2 x head_dim (16)
    # weights only there
    base = {"version": 1, "name": "t", "n_layers": 8, "d_model": 64, "n_heads": 4,
            "n_kv_heads": 2, "vocab_size": 100, "intermediate_size": 128, "qk_norm": "rms",
            "linear_attention": {"kind": "lightning", "n_heads": 4, "n_k_heads": 4,
                                 "head_k_dim": 16, "head_v_dim": 16, "chunk_size": 16}}
    pattern = {"layer_pattern": ["linear", "global"]}

    def load(**change):
        path = tmp_path / "t.yaml"
        path.write_text(yaml.safe_dump(base | change))
        return pm.model(str(path))

    plain, nope = load(attention=pattern), load(attention=pattern | {"nope_interval": 4})
    assert (plain.nope_layers, nope.nope_layers) == (0, 2)
    assert {s.name: s.count for s in step_template(nope) if s.name in ("rotary", "qk_norm")} \
        == {"rotary": 2, "qk_norm": 2}
    assert param_counts(plain).attention - param_counts(nope).attention == 2 * 2 * 16
    with pytest.raises(SpecError, match=r"attention\.nope_interval.*position: rope"):
        load(position="none", attention=pattern | {"nope_interval": 4})


def test_hf_llama4_nope_layers_off_the_interval_are_an_error():
    data = json.loads((HF / "llama4.json").read_text())
    assert pm.model(str(HF / "llama4.json")).nope_interval == 4     # [1, 1, 1, 0]
    data["text_config"]["no_rope_layers"] = [1, 0, 1, 1]
    with pytest.raises(SpecError, match=r"no_rope_layers.*every n-th"):
        model_from_hf_config(data, "config.json")
