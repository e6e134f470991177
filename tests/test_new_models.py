"""This year's model families (issue 36): parameter totals against their model cards, each
config.json read as its shipped YAML, and DeepSeek Sparse Attention's bytes derived by hand.

Fixtures under tests/data/hf/ are the models' own config.json files as aiconfigurator-core
0.12.0 (NVIDIA, Apache-2.0) ships them in ``model_configs/``: deepseek-v3.2.json
(deepseek-ai/DeepSeek-V3.2), glm-5.json (zai-org/GLM-5), qwen3-coder-480b.json
(Qwen/Qwen3-Coder-480B-A35B-Instruct)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import perfmodel as pm
from perfmodel.cost.memory import kv_bytes_per_token
from perfmodel.cost.params import param_counts
from perfmodel.cost.step import Dtypes, Step, price_step
from perfmodel.specs import Parallelism
from tests.datasheet import datasheet

HF = Path(__file__).parent / "data" / "hf"


@pytest.mark.parametrize(("name", "total", "active", "rel_total", "rel_active"), [
    ("qwen3-coder-480b-a35b", 480e9, 35e9, 0.01, 0.03),
    ("minimax-m2", 230e9, 10e9, 0.01, 0.05),
    ("glm-4.5", 355e9, 32e9, 0.015, 0.03),   # the card's 355B counts the MTP layer too
    ("glm-5", 744e9, 40e9, 0.005, 0.03),
])
def test_totals_match_the_model_card(name, total, active, rel_total, rel_active) -> None:
    counts = param_counts(pm.model(name))
    assert counts.total == pytest.approx(total, rel=rel_total)
    assert counts.active(pm.model(name)) == pytest.approx(active, rel=rel_active)


def test_dsa_adds_exactly_the_indexer() -> None:
    """61 layers x (wq_b 1536 x 64 x 128 + wk 7168 x 128 + k_norm 2 x 128 + weights_proj
    7168 x 64) = 61 x 13,959,424 = 851,524,864 parameters over DeepSeek-V3."""
    v3, v32 = (param_counts(pm.model(n)).total for n in ("deepseek-v3", "deepseek-v3.2"))
    assert v32 - v3 == 851_524_864


@pytest.mark.parametrize(("fixture", "name"), [("deepseek-v3.2.json", "deepseek-v3.2"),
                                               ("glm-5.json", "glm-5"),
                                               ("qwen3-coder-480b.json",
                                                "qwen3-coder-480b-a35b"),
                                               ("minimax-m2.json", "minimax-m2")])
def test_config_json_reads_as_the_yaml(fixture: str, name: str) -> None:
    hf, yaml = pm.model(str(HF / fixture)), pm.model(name)
    assert param_counts(hf).total == param_counts(yaml).total
    assert hf.mla == yaml.mla and hf.moe == yaml.moe
    assert hf.quantization == yaml.quantization
    assert float(kv_bytes_per_token(hf, 1, np.array([2.0]))[0]) == \
        float(kv_bytes_per_token(yaml, 1, np.array([2.0]))[0])


def test_dsa_kv_bytes_per_token() -> None:
    """bf16 latent 61 x 576 x 2 = 70,272 B (V3); V3.2 adds the indexer key, fp8 with one fp32
    scale per 128: 61 x (128 + 4) = 8,052 B."""
    bf16 = np.array([2.0])
    assert float(kv_bytes_per_token(pm.model("deepseek-v3"), 1, bf16)[0]) == 70_272
    assert float(kv_bytes_per_token(pm.model("deepseek-v3.2"), 1, bf16)[0]) == 78_324


def _decode(name: str, batch: int, context: int):
    return price_step(pm.model(name), datasheet("h200-sxm"), Parallelism(),
                      Step.uniform(batch, 1, context), Dtypes.of())


def _op(cost, name: str, field: str) -> float:
    i = list(cost.names).index(name)
    return float(getattr(cost.bytes, field)[i].sum()) if field != "flops" else \
        float(cost.flops[i].sum())


@pytest.mark.parametrize("context", [32768, 131072])
def test_dsa_decode_attention_bytes_and_flops(context: int) -> None:
    """One decode token at context C, per layer: V3 reads C x 576 x 2 B of latent and does
    2 x 128 x C x (576 + 512) FLOPs; V3.2 reads min(C, 2048) latents and C indexer keys of
    132 B, and adds 2 x 64 x C x 128 FLOPs of index scores. The ratios: 0.17708 at 32K,
    0.13021 at 128K."""
    v3, v32 = _decode("deepseek-v3", 1, context), _decode("deepseek-v3.2", 1, context)
    assert _op(v3, "attention", "kv_read") == 61 * context * 1152
    assert _op(v32, "attention", "kv_read") == 61 * 2048 * 1152
    assert _op(v32, "indexer.scores", "kv_read") == 61 * context * 132
    assert _op(v3, "attention", "flops") == 61 * 2 * 128 * context * 1088
    assert _op(v32, "attention", "flops") == 61 * 2 * 128 * 2048 * 1088
    assert _op(v32, "indexer.scores", "flops") == 61 * 2 * 64 * context * 128
    ratio = (2048 * 1152 + context * 132) / (context * 1152)
    got = (_op(v32, "attention", "kv_read") + _op(v32, "indexer.scores", "kv_read")) \
        / _op(v3, "attention", "kv_read")
    assert got == pytest.approx(ratio, rel=1e-12)
    assert ratio == pytest.approx({32768: 0.17708, 131072: 0.13021}[context], abs=1e-5)


def test_dsa_decode_step_ratio() -> None:
    """The step's time follows the bytes once the cache outweighs the weights: at batch 64
    V3.2's decode step is faster than V3's, more so at 128K than at 32K; at batch 1 the
    weights dominate and the two stay within 10% (the indexer's own GEMMs and launches)."""
    def ratio(batch: int, context: int) -> float:
        return float(_decode("deepseek-v3.2", batch, context).time_s.sum()
                     / _decode("deepseek-v3", batch, context).time_s.sum())
    r32, r128 = ratio(64, 32768), ratio(64, 131072)
    assert r128 < r32 < 1.0
    # bounds by hand at batch 64, 128K: the step cannot gain more than its attention bytes
    # (V3: 589.5 GB of latent; V3.2 76.8 GB) leave, out of weights and cache (1,168.8 GB of
    # bf16 weights, every expert touched): (1168.8 + 76.8) / (1168.8 + 589.5) = 0.708 if
    # all were memory-bound; V3's absorbed attention is compute-bound (242 FLOP/B over
    # H200's ridge of 206), so the model's ratio sits below that
    assert 0.5 < r128 < 0.709
    assert abs(ratio(1, 32768) - 1.0) < 0.1 and abs(ratio(1, 131072) - 1.0) < 0.1


def test_dsa_prefill_runs_absorbed() -> None:
    """DSA runs MLA in its latent (MQA) form in prefill too: no expanded attention and no
    kv_b_proj over the context, where V3 at 8K prefill runs expanded."""
    step = Step.uniform(1, 8192, 8192)
    v3 = price_step(pm.model("deepseek-v3"), datasheet("h200-sxm"), Parallelism(), step,
                    Dtypes.of())
    v32 = price_step(pm.model("deepseek-v3.2"), datasheet("h200-sxm"), Parallelism(), step,
                     Dtypes.of())
    assert _op(v3, "attention_expanded", "flops") > 0
    assert _op(v32, "attention_expanded", "flops") == 0
    assert _op(v32, "attention", "flops") > 0


def test_minimax_m2_skip_list_names_the_router_not_the_experts() -> None:
    """MiniMax-M2's ``modules_to_not_convert: [gate, ...]`` is matched as a substring (vLLM
    ``is_layer_skipped``); its router is ``block_sparse_moe.gate`` and its experts
    ``block_sparse_moe.experts.J.w1/w2/w3`` (``MiniMaxM2SparseMoeBlock``), so 'gate' keeps
    the router 16-bit and the experts fp8. Named as the other families name them
    (``mlp.experts.J.gate_proj``), 'gate' would hit a third of the experts' matrices and
    the config would be refused."""
    q = pm.model(str(HF / "minimax-m2.json")).quantization
    assert q.unquantized == ("router",) and q.format == "fp8-block128"
