"""Falcon-H1 (arXiv 2507.22448): attention and a Mamba-2 mixer side by side in every layer.
Golden values derived by hand from the shipped perfmodel/models/falcon-h1-7b.yaml: the parameter
total, KV cache + recurrent state per sequence, the step's operators under TP (vLLM's
MambaMixer2 replicating a lone B/C group), the config.json import, the torch module."""

import json
from pathlib import Path

import numpy as np
import pytest

import perfmodel as pm
from perfmodel.cost.layers import step_template
from perfmodel.cost.memory import kv_bytes_per_sequence
from perfmodel.cost.params import attention_params, mamba_params, param_counts
from perfmodel.report.pages import _kv_formula
from perfmodel.specs.errors import SpecError
from perfmodel.specs.hf import model_from_hf_config

torch_reference = pytest.importorskip("tests.torch_reference")

# d 3072, 44 layers, 12 q / 2 KV heads of 128, Mamba-2 of 24 heads x 128 (d_inner 3072),
# one group, d_state 256, d_conv 4, SwiGLU 12288, vocab 130049 untied
ATTENTION = 3072 * 1536 + 2 * 3072 * 256 + 1536 * 3072        # q, k + v, o: 11,010,048
IN_PROJ = 3072 * (3072 + 3072 + 256 + 256 + 24)                # z, x, B, C, dt: 20,520,960
OUT_PROJ = 3072 * 3072                                         # 9,437,184
MAMBA_REST = (3072 + 512) * (4 + 1) + 3 * 24 + 3072            # conv + bias, A D dt, norm
MLP = 3 * 3072 * 12288                                         # 113,246,208
LAYER = ATTENTION + IN_PROJ + OUT_PROJ + MAMBA_REST + MLP + 2 * 3072
TOTAL = 44 * LAYER + 2 * 130049 * 3072 + 3072                  # + embedding, head, final norm


@pytest.fixture(scope="module")
def falcon():
    return pm.model("falcon-h1-7b")


def test_parameter_total_by_hand(falcon):
    assert (ATTENTION, IN_PROJ, MAMBA_REST, LAYER) == (11_010_048, 20_520_960, 21_064,
                                                       154_241_608)
    assert param_counts(falcon).total == TOTAL == 7_585_654_880


def test_parameter_total_against_the_published_size(falcon):
    """The family is published by size only ("7B": the model card, transformers' docs table;
    no exact figure from TII could be cited here), so the total must name that size: 7.59B
    rounds down to 7B as Falcon3-7B's 7.46B does. A layer counted twice (8.3B) or a mixer
    missed (6.3B) fails."""
    assert 7.0e9 <= param_counts(falcon).total < 8.0e9


def test_mixers_match_a_torch_layer(falcon):
    """A torch layer of the same shape (tests/torch_reference: attention and Mamba side by
    side) holds exactly the attention and Mamba parameters counted here."""
    import torch

    with torch.device("meta"):
        block = torch_reference.Block(falcon, moe=False)
    proj, rest = mamba_params(falcon)
    assert torch_reference.numel(block.mamba) == proj + rest == IN_PROJ + OUT_PROJ + MAMBA_REST
    assert torch_reference.numel(block.self_attn) == attention_params(falcon) == ATTENTION
    assert torch_reference.numel(block) == LAYER


def test_mamba_params_per_device_replicate_the_lone_group(falcon):
    """TP 2: 12 Mamba heads and half of d_inner per device, but the one B/C group whole on
    both (vLLM's MambaMixer2 for n_groups == 1)."""
    proj, rest = mamba_params(falcon, 2)
    assert proj == 3072 * (1536 + 1536 + 256 + 256 + 12) + 1536 * 3072 == 15_765_504
    assert rest == (1536 + 512) * 5 + 3 * 12 + 1536 == 11_812


def test_kv_and_state_bytes_at_32k_by_hand(falcon):
    """32,768 tokens, bf16 cache: every layer caches K and V (2 KV heads x 128) and keeps a
    Mamba state (24 x 128 x 256 at bf16) and a conv state (3 x 3,584 channels)."""
    kv = 44 * 32768 * 2 * 2 * 128 * 2                   # 1,476,395,008
    state = 44 * 3072 * 256 * 2                         # 69,206,016
    conv = 44 * 3 * (3072 + 512) * 2                    # 946,176
    got = kv_bytes_per_sequence(falcon, 1, np.array([2.0]), np.array([32768]))
    assert got[0] == kv + state + conv == 1_546_547_200
    # TP 2: one KV head, half the state, the conv's x half and its B, C group whole
    kv2, state2, conv2 = kv // 2, state // 2, 44 * 3 * (1536 + 512) * 2
    got2 = kv_bytes_per_sequence(falcon, 2, np.array([2.0]), np.array([32768]))
    assert got2[0] == kv2 + state2 + conv2 == 773_341_184


def test_the_step_runs_both_mixers_in_every_layer(falcon):
    ops = {spec.name: spec for spec in step_template(falcon, 2)}
    assert ops["attention"].count == ops["mamba.scan"].count == 44
    assert ops["qkv_proj"].n == (6 + 2 * 1) * 128          # 6 q heads, 1 KV head replicated
    assert ops["mamba.in_proj"].n == 1536 + (1536 + 2 * 256) + 12
    assert ops["mamba.conv1d"].count == ops["mixer_sum"].count == 44
    # each mixer's output and the MLP's reduced (vLLM's RowParallelLinear), and the gated
    # norm's sum of squares over the split d_inner (Mixer2RMSNormGated, one group)
    assert ops["all_reduce"].count == 44 + 44 + 44
    assert (ops["mamba.norm_all_reduce"].width, ops["mamba.norm_all_reduce"].count) == (1, 44)
    assert "mamba.norm_all_reduce" not in {s.name for s in step_template(falcon, 1)}


def test_tp_follows_vllm(falcon):
    """TP 2 and 4 are priced (a lone group replicated); TP 8 is refused (12 heads); more than
    one group must split evenly (vLLM asserts it); Mamba-1 stays at TP 1."""
    hw = pm.hardware("h100-sxm")
    for tp in (2, 4):
        est = pm.estimate(hw, falcon, pm.Workload(prompt_len=512, gen_len=8),
                          pm.Parallelism(tp=tp))
        assert est.e2e_s > 0
    with pytest.raises(SpecError, match=r"^parallelism: tp=8 must divide n_heads=12"):
        param_counts(falcon, 8)
    two = model_from_hf_config(_tiny() | {"mamba_n_groups": 2}, "config.json")
    param_counts(two, 2)
    with pytest.raises(SpecError, match=r"mamba.n_groups=2"):
        param_counts(two, 4)
    with pytest.raises(SpecError, match=r"Mamba-1"):
        param_counts(pm.model("jamba-1.5-mini"), 2)


def test_odd_vocabulary_is_split_under_tp(falcon):
    """130,049 rows do not divide by 2: vLLM pads each partition (VocabParallelEmbedding);
    TP is not refused, and each device holds half the table."""
    assert param_counts(falcon, 2).embedding == 130049 / 2 * 3072


def _tiny(**change) -> dict:
    """A small falcon_h1 config.json: d 64, 2 layers, 4 q / 2 KV heads of 16, Mamba-2 of
    4 heads x 32 (d_ssm 128), one group, d_state 16, SwiGLU 96, vocab 1000 untied."""
    return {"model_type": "falcon_h1", "hidden_size": 64, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
            "intermediate_size": 96, "vocab_size": 1000, "tie_word_embeddings": False,
            "max_position_embeddings": 4096, "hidden_act": "silu", "mamba_d_ssm": 128,
            "mamba_n_heads": 4, "mamba_d_head": "auto", "mamba_n_groups": 1,
            "mamba_d_state": 16, "mamba_d_conv": 4, "mamba_chunk_size": 128,
            "mamba_rms_norm": True, "attn_layer_indices": None, "key_multiplier": 0.5,
            "ssm_multipliers": [1.0, 1.0, 1.0, 1.0, 1.0]} | change


def test_tiny_config_imports_to_a_hand_count():
    """Per layer: q 64x64 + k, v 2x64x32 + o 64x64 = 12,288; in_proj 64 x (128 + 128 + 16 +
    16 + 4) = 18,688, out_proj 128x64 = 8,192; conv (128 + 32) x 5 = 800, A D dt 12, norm
    128; MLP 3x64x96 = 18,432; 2 norms 128. Embedding and head 2 x 64,000, final norm 64."""
    layer = 12_288 + 18_688 + 8_192 + 800 + 12 + 128 + 18_432 + 128
    model = model_from_hf_config(_tiny(), "config.json")
    assert model.mamba.parallel and model.mamba.head_dim == 32
    assert param_counts(model).total == 2 * layer + 128_000 + 64 == 245_400
    # without the gated norm (Falcon-H1-0.5B's mamba_rms_norm false): 128 fewer a layer
    bare = model_from_hf_config(_tiny(mamba_rms_norm=False), "config.json")
    assert param_counts(bare).total == 245_400 - 2 * 128
    assert "mamba.norm" not in {s.name for s in step_template(bare, 1)}
    torch_main, _ = torch_reference.build(bare)
    assert torch_main == param_counts(bare).total


def test_shipped_config_imports_to_the_shipped_total(falcon):
    config = json.loads((Path(__file__).parent / "data" / "hf" / "falcon-h1.json").read_text())
    assert param_counts(model_from_hf_config(config, "c.json")).total == TOTAL


@pytest.mark.parametrize("change, key", [
    ({"attn_layer_indices": [0, 1]}, "attn_layer_indices"),
    ({"mamba_proj_bias": True}, "mamba_proj_bias"),
    ({"mamba_n_heads": 5}, "mamba_n_heads"),
])
def test_import_mistakes_are_one_line_errors(change, key):
    with pytest.raises(SpecError, match=rf"^config\.json: {key}: ") as info:
        model_from_hf_config(_tiny(**change), "config.json")
    assert "\n" not in str(info.value)


def test_report_kv_note_counts_the_parallel_mixers(falcon):
    est = pm.estimate(pm.hardware("h100-sxm"), falcon, pm.Workload(prompt_len=64, gen_len=2))
    assert _kv_formula(est).endswith("+ a constant recurrent state")
    assert "x 44 layers" in _kv_formula(est)
