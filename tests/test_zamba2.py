"""Zamba2 (arXiv 2411.15242): Mamba-2 layers with shared attention + MLP blocks run at listed
layers. Golden values by hand from perfmodel/models/zamba2-2.7b.yaml (d 2560, 54 Mamba-2
layers of 80
heads x 64 with d_state 64 and one group; 2 shared blocks, 32 heads of 160 reading the
5,120-wide concat, a GeGLU MLP of 10,240, a rank-128 gate_up adapter and a 2560 x 2560 linear
at each of 9 invocations; vocabulary 32,000 tied): parameters, KV cache + state per sequence,
the step's invocations, TP as vLLM allows it, the config.json import."""

import json
import math
from pathlib import Path

import numpy as np
import pytest

import perfmodel as pm
from perfmodel.cost.layers import step_template
from perfmodel.cost.memory import kv_bytes_per_sequence, memory_estimate
from perfmodel.cost.params import param_counts, shared_block_params
from perfmodel.cost.step import Dtypes, Step, price_step
from perfmodel.report.pages import _kv_formula
from perfmodel.specs.errors import SpecError
from perfmodel.specs.hf import model_from_hf_config
from perfmodel.specs.load import MODELS_DIR, load_model

torch_reference = pytest.importorskip("tests.torch_reference")

HF = Path(__file__).parent / "data" / "hf"
D, CALLS = 2560, 9
# one Mamba-2 layer: in_proj 2560 x (z 5120 + x 5120 + B, C 2 x 64 + dt 80), out_proj,
# conv (5120 + 128) x (4 + bias), A_log, D, dt_bias (80 each), gated norm 5120, input norm
IN_PROJ = D * (5120 + 5120 + 128 + 80)                      # 26,746,880
MAMBA = IN_PROJ + 5120 * D + 5248 * 5 + 3 * 80 + 5120 + D   # 39,888,240
# one shared block: norms over 2d and d, q/k/v 5120 x 5120 each, o_proj 5120 x 2560, MLP
BLOCK_GEMMS = 3 * 5120 * 5120 + 5120 * D + 3 * D * 10240    # 170,393,600
BLOCK = BLOCK_GEMMS + 2 * D + D                              # 170,401,280
# one invocation: the gate_up adapter 2560 x 128 + 128 x 20480 and the 2560 x 2560 linear
CALL = D * 128 + 128 * 20480 + D * D                        # 9,502,720
TOTAL = 54 * MAMBA + 2 * BLOCK + CALLS * CALL + 32000 * D + D   # + tied embedding, final norm


@pytest.fixture(scope="module")
def zamba():
    return pm.model("zamba2-2.7b")


def test_parameter_total_by_hand(zamba):
    assert (MAMBA, BLOCK, CALL) == (39_888_240, 170_401_280, 9_502_720)
    assert param_counts(zamba).total == TOTAL == 2_662_214_560
    assert param_counts(zamba).active(zamba) == TOTAL            # dense


def test_totals_name_the_published_sizes(zamba):
    """Zyphra publishes 2.7B and 7.4B (arXiv 2411.15242's abstract), two significant
    figures, so each total must round to its figure: 2.66B and 7.36B do. A block counted at
    every invocation (+1.2B), an untied LM head (7B: 7.47B) or Mamba layers with an MLP
    each fail."""
    assert 2.65e9 <= param_counts(zamba).total < 2.75e9
    assert 7.35e9 <= param_counts(pm.model("zamba2-7b")).total < 7.45e9


def test_shared_block_matches_a_torch_module(zamba):
    import torch

    with torch.device("meta"):
        block = torch_reference.SharedTransformer(zamba)
        call = torch_reference.Zamba2Invocation(zamba)
    assert (torch_reference.numel(block), torch_reference.numel(call)) == (BLOCK, CALL)
    assert torch_reference.build(zamba)[0] == TOTAL


def test_shared_params_per_device_under_tp(zamba):
    """TP 2: heads, the MLP and the adapter's rank (A) and output (B) split; the per-layer
    linear and the norms are replicated (vLLM's ReplicatedLinear, RMSNorm)."""
    attention = 2 * (3 * 5120 * 2560 + 2560 * D) + CALLS * D * D          # 150,732,800
    mlp = 2 * 3 * D * 5120 + CALLS * (D * 64 + 128 * 10240)             # 91,914,240
    assert shared_block_params(zamba, 2) == (attention, mlp, 2 * 3 * D)
    assert (attention, mlp) == (150_732_800, 91_914_240)


def test_kv_and_state_bytes_at_4096_by_hand(zamba):
    """4,096 tokens, bf16: each of 9 invocations caches K and V (32 heads x 160); each of 54
    layers keeps 80 x 64 x 64 of state (bf16) and 3 conv positions of 5,248 channels."""
    kv = CALLS * 4096 * 2 * 32 * 160 * 2                # 754,974,720
    state = 54 * 80 * 64 * 64 * 2                       # 35,389,440
    conv = 54 * 3 * 5248 * 2                            # 1,700,352
    got = kv_bytes_per_sequence(zamba, 1, np.array([2.0]), np.array([4096]))
    assert got[0] == kv + state + conv == 792_064_512
    # TP 2: half the heads and state; the conv's x half, its lone B, C group whole
    got2 = kv_bytes_per_sequence(zamba, 2, np.array([2.0]), np.array([4096]))
    assert got2[0] == kv // 2 + state // 2 + 54 * 3 * (2560 + 128) * 2 == 396_052_992


def test_batch_ceiling_holds_the_cache_and_state(zamba):
    hw = pm.hardware("h100-sxm")
    w = pm.Workloads.of(prompt_len=3072, gen_len=1024, batch=1)
    mem = memory_estimate(zamba, hw, pm.Parallelism(), w).item(0)
    assert mem.kv_cache_bytes_per_sequence == 792_064_512
    assert mem.kv_cache_bytes_per_token == CALLS * 2 * 32 * 160 * 2
    assert mem.weights_bytes == TOTAL * 2
    room = mem.usable_bytes - mem.weights_bytes
    logits = zamba.vocab_size * 4
    per_token = (mem.workspace_bytes - logits) / 3072     # batch 1: its 3,072 prompt tokens
    # the batch fills a step (8,192 tokens, chunked prefill's budget) long before the limit
    assert mem.max_batch == math.floor((room - per_token * 8192) / (792_064_512 + logits))


def test_the_step_runs_every_invocation(zamba):
    ops = {s.name: s for s in step_template(zamba, 1)}
    shared = [s for s in ops.values() if s.name.startswith("shared.")]
    assert {s.count for s in shared} == {CALLS}
    assert ops["shared.qkv_proj"].k == 2 * D and ops["shared.input_norm"].n == 2 * D
    assert ops["mamba.scan"].count == ops["attn_norm"].count == ops["residual_add"].count == 54
    assert "gate_up_proj" not in ops and "mlp_norm" not in ops    # no MLP in the Mamba layers
    assert "shared.rotary" not in ops                             # use_mem_rope false


def test_each_invocation_reads_the_block_weights_again(zamba):
    """A decode step of one sequence reads the shared GEMMs' weights at all 9 invocations
    (the block does not stay in L2): 9 x (block GEMMs + adapter + linear) x 2 bytes, though
    the device holds the two blocks once each."""
    cost = price_step(zamba, pm.hardware("h100-sxm"), pm.Parallelism(),
                      Step.mixed([(1, 1, 4096)]), Dtypes.of())
    gemms = [i for i, (n, k) in enumerate(zip(cost.names, cost.kinds, strict=True))
             if n.startswith("shared.") and k == "gemm"]
    read = cost.bytes.weights[gemms, 0].sum()
    assert read == CALLS * (BLOCK_GEMMS + CALL) * 2 == 3_238_133_760
    i = cost.names.index("shared.concat")             # the concat: 2 d read and written
    assert (cost.bytes.act_read[i, 0], cost.bytes.act_write[i, 0]) == (CALLS * 2 * D * 2,) * 2


def test_tp_follows_vllm(zamba):
    """vLLM splits the 32 heads, the 80 Mamba heads (a lone B/C group replicated) and the
    adapters' rank 128: TP 2 to 16 are modelled (an H100 node prices up to 8), TP 32 (80
    heads) and 3 are not; Zamba2-7B's two groups stop at TP 2 (MambaMixer2: groups
    divisible by tp, or one). No pipeline stages: Zamba2ForCausalLM is not SupportsPP."""
    hw = pm.hardware("h100-sxm")
    for tp in (2, 4, 8):
        est = pm.estimate(hw, zamba, pm.Workload(prompt_len=256, gen_len=4), pm.Parallelism(tp=tp))
        assert est.e2e_s > 0
    assert param_counts(zamba, 16).total < param_counts(zamba, 8).total
    ops = {s.name: s for s in step_template(zamba, 2)}
    assert ops["shared.qkv_proj"].n == 3 * 16 * 160 and ops["shared.mlp_adapter_a"].n == 64
    assert ops["shared.all_reduce"].count == 2 * CALLS        # after o_proj and down_proj
    assert ops["shared.linear"].n == ops["shared.linear"].k == D    # replicated
    with pytest.raises(SpecError, match=r"^parallelism: tp=32 must divide mamba heads=80"):
        param_counts(zamba, 32)
    with pytest.raises(SpecError, match=r"^parallelism: tp=3 must divide n_heads=32"):
        param_counts(zamba, 3)
    seven = pm.model("zamba2-7b")
    param_counts(seven, 2)
    with pytest.raises(SpecError, match=r"mamba.n_groups=2"):
        param_counts(seven, 4)
    with pytest.raises(SpecError, match=r"^parallelism: pp=2 with the shared blocks"):
        pm.estimate(hw, zamba, pm.Workload(prompt_len=256, gen_len=4), pm.Parallelism(pp=2))
    narrow = model_from_hf_config(_tiny(adapter_rank=2), "config.json")
    with pytest.raises(SpecError, match=r"^parallelism: tp=4 must divide shared_block.adapter"):
        param_counts(narrow, 4)


def _tiny(**change) -> dict:
    return json.loads((HF / "zamba2.json").read_text()) | change


def test_tiny_config_imports_to_a_hand_count():
    """tests/data/hf/zamba2.json: d 64, 6 Mamba-2 layers (128 wide, 4 heads, d_state 16),
    layers 1, 3, 5 invoking 2 blocks of 4 heads x 32 (2 x 64 / 4), MLP 128, rank 8 with
    q/k/v adapters too, vocabulary 1,000 tied.
    Mamba layer: in_proj 64 x (128 + 160 + 4) = 18,688, out_proj 8,192, conv 160 x 5 = 800,
    A D dt 12, gated norm 128, input norm 64: 27,884. Block: norms 128 + 64, q k v 3 x 128 x
    128 = 49,152, o 8,192, MLP 3 x 64 x 128 = 24,576: 82,112. Invocation: linear 4,096, q k v
    adapters 3 x (128 x 8 + 8 x 128) = 6,144, gate_up adapter 64 x 8 + 8 x 256 = 2,560."""
    model = model_from_hf_config(_tiny(), "config.json")
    total = 6 * 27_884 + 2 * 82_112 + 3 * (4_096 + 6_144 + 2_560) + 64_000 + 64
    assert param_counts(model).total == total == 433_992
    assert torch_reference.build(model)[0] == total
    ops = {s.name: s for s in step_template(model, 1)}
    assert ops["shared.qkv_adapter_a"].count == ops["shared.qkv_adapter_b"].count == 3 * 3
    assert ops["shared.rotary"].count == 3                 # use_mem_rope


def test_both_spellings_import_alike():
    """Zyphra's earlier key names (state_size, conv_dimension, expansion_factor, mamba_headdim,
    ffn_hidden_size, lora_rank, use_shared_attention_lora, use_shared_block_lora, "m"/"g")
    give the model today's names do."""
    new = _tiny()
    old = {k: v for k, v in new.items() if k not in (
        "mamba_d_state", "mamba_d_conv", "mamba_expand", "n_mamba_heads", "intermediate_size",
        "adapter_rank", "use_shared_attention_adapter", "use_shared_mlp_adapter")}
    old |= {"state_size": 16, "conv_dimension": 4, "expansion_factor": 2, "mamba_headdim": 32,
            "ffn_hidden_size": 128, "lora_rank": 8, "use_shared_attention_lora": True,
            "use_shared_block_lora": True, "layers_block_type": list("mgmgmg")}
    assert model_from_hf_config(old, "c.json") == model_from_hf_config(new, "c.json")
    bare = model_from_hf_config(old | {"use_shared_block_lora": False}, "c.json")
    assert param_counts(bare).total == 433_992 - 3 * 2_560


@pytest.mark.parametrize("change, key", [
    ({"layers_block_type": ["mamba", "attention"] * 3}, "layers_block_type"),
    ({"hybrid_layer_ids": [1, 3]}, "hybrid_layer_ids"),
    ({"add_bias_linear": True}, "add_bias_linear"),
    ({"num_attention_heads": 3, "num_key_value_heads": 3}, "num_attention_heads"),
    ({"n_mamba_heads": 3}, "n_mamba_heads"),
    ({"num_key_value_heads": 2}, "num_key_value_heads"),
])
def test_import_mistakes_are_one_line_errors(change, key):
    with pytest.raises(SpecError, match=rf"^config\.json: {key}: ") as info:
        model_from_hf_config(_tiny(**change), "config.json")
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("edit, field", [
    ({"shared_block": {"n_blocks": 2, "layers": [6, 6, 12]}}, "shared_block.layers"),
    ({"shared_block": {"n_blocks": 2, "layers": [60]}}, "shared_block.layers"),
    ({"shared_block": {"n_blocks": 3, "layers": [6, 12]}}, "shared_block.n_blocks"),
    ({"shared_block": {"n_blocks": 1, "layers": [6], "rank": 8}}, "shared_block"),
    ({"head_dim": 80}, "head_dim"),
    ({"attention": {"layer_pattern": ["mamba", "global"]}}, "shared_block"),
])
def test_yaml_mistakes_are_one_line_errors(tmp_path, edit, field):
    import yaml

    data = yaml.safe_load((MODELS_DIR / "zamba2-2.7b.yaml").read_text()) | edit
    path = tmp_path / "z.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(SpecError, match=rf"z\.yaml: {field}") as info:
        load_model(str(path))
    assert "\n" not in str(info.value)


def test_report_kv_note_counts_the_invocations(zamba):
    est = pm.estimate(pm.hardware("h100-sxm"), zamba, pm.Workload(prompt_len=64, gen_len=2))
    assert "x 9 layers" in _kv_formula(est)
