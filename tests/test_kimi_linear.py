"""Kimi-Linear (moonshotai/Kimi-Linear-48B-A3B-Instruct; issue 36): Kimi Delta Attention on
20 layers beside MLA on 7, by hand. Parameters against the model card (48B total, 3B
activated), its config.json read as the shipped YAML, MLA's latent cache on the 7 global
layers only, KDA's fp32 state per sequence, the scan's FLOPs and bytes, decode cost flat in
the context on the KDA layers and growing on the MLA ones, and the reader's errors.

The fixture tests/data/hf/kimi-linear.json copies the fields of the checkpoint's
config.json that the reader uses, as the vLLM and transformers ports of ``KimiLinearConfig``
quote them (hidden 2304, 27 layers, linear_attn_config with its 1-based layer lists, MLA
kv_lora_rank 512 without q_lora, 256 experts of 1024, top 8, one shared, the first layer
dense)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import perfmodel as pm
from perfmodel.cost.memory import (
    kv_bytes_per_sequence,
    kv_bytes_per_token,
    recurrent_state_per_sequence,
)
from perfmodel.cost.params import linear_attention_params, param_counts
from perfmodel.cost.scan import chunk_flops, kda_flops
from perfmodel.cost.step import Dtypes, Step, price_step
from perfmodel.specs import Parallelism
from perfmodel.specs.errors import SpecError
from perfmodel.specs.fields import Fields
from perfmodel.specs.schema import model_from_fields
from tests.datasheet import datasheet

NAME = "kimi-linear-48b-a3b"
FIXTURE = Path(__file__).parent / "data" / "hf" / "kimi-linear.json"
KDA, MLA = 20, 7
# one KDA layer: q, k, v 2304 x 4096 each, beta 2304 x 32, f_a and g_a 2304 x 128, f_b and
# g_b 128 x 4096, o_proj 4096 x 2304; conv 3 x 4096 x 4, A_log 32, dt_bias 4096, norm 128
KDA_PROJ = 3 * 2304 * 4096 + 2304 * 32 + 2 * 2304 * 128 + 2 * 128 * 4096 + 4096 * 2304
KDA_REST = 3 * 4096 * 4 + 32 + 4096 + 128
# one MLA layer: q_proj 2304 x 32 x 192, kv_a 2304 x 576, its norm 512, kv_b 512 x 32 x 256,
# o_proj 32 x 128 x 2304
MLA_PARAMS = 2304 * 32 * 192 + 2304 * 576 + 512 + 512 * 32 * 256 + 32 * 128 * 2304


def test_parameters_by_hand_and_against_the_card() -> None:
    """Every class by hand; the total 49.12B and the active 3.11B (routed 8 of 256, the
    embedding gather left out) sit within 2.4% and 3.6% of the card's rounded 48B / 3B."""
    m = pm.model(NAME)
    c = param_counts(m)
    assert KDA_PROJ == 39_460_864 and MLA_PARAMS == 29_114_880
    assert c.attention == KDA * KDA_PROJ + MLA * MLA_PARAMS == 993_021_440
    assert c.norms == (27 * 2 + 1) * 2304 + KDA * KDA_REST == 1_194_880
    assert c.experts == 26 * 256 * 3 * 2304 * 1024
    assert c.shared_experts == 26 * 3 * 2304 * 1024
    assert c.mlp == 3 * 2304 * 9216 and c.router == 26 * 2304 * 256
    assert c.embedding == c.lm_head == 163840 * 2304
    assert c.total == 49_122_675_072
    assert c.total == pytest.approx(48e9, rel=0.03)
    assert c.active(m) == pytest.approx(3e9, rel=0.04)


def test_kda_parameters_under_tensor_parallelism() -> None:
    """vLLM's f_a_proj and g_a_proj are ReplicatedLinear: at tp 2 each device holds half of
    the rest and all of those two (2 x 2304 x 128)."""
    m = pm.model(NAME)
    replicated = 2 * 2304 * 128
    assert linear_attention_params(m, 2)[0] == (KDA_PROJ - replicated) / 2 + replicated
    assert linear_attention_params(m, 2)[1] == KDA_REST / 2 + 128 - 64


def test_config_json_reads_as_the_yaml() -> None:
    hf, yaml = pm.model(str(FIXTURE)), pm.model(NAME)
    assert param_counts(hf).total == param_counts(yaml).total
    assert hf.mla == yaml.mla and hf.moe == yaml.moe
    assert hf.linear_attention == yaml.linear_attention
    assert hf.layer_kinds() == yaml.layer_kinds()
    assert hf.quantization == yaml.quantization is None
    assert (hf.position, hf.max_position_embeddings) == ("none", 1_048_576)
    # 1-based full_attn_layers 4, 8, ..., 24, 27 are the global ones
    assert [i + 1 for i, k in enumerate(hf.layer_kinds()) if k == "global"] == \
        [4, 8, 12, 16, 20, 24, 27]


def test_kv_bytes_only_on_the_mla_layers() -> None:
    """7 MLA layers x (kv_lora_rank 512 + rope 64) x 2 bytes = 8,064 B a token (the 20 KDA
    layers cache nothing per token); fp8: 4,032. Full MLA on all 27 would be 31,104."""
    m = pm.model(NAME)
    assert float(kv_bytes_per_token(m, 1, np.array([2.0]))[0]) == MLA * 576 * 2 == 8064
    assert float(kv_bytes_per_token(m, 1, np.array([1.0]))[0]) == 4032
    assert float(kv_bytes_per_token(m, 8, np.array([2.0]))[0]) == 8064   # latent replicated


def test_recurrent_state_per_sequence_by_hand() -> None:
    """20 KDA layers x 32 heads x 128 x 128 x 4 bytes (fp32: vLLM kda_state_dtype) =
    41,943,040 B, and the q, k, v convs' (4 - 1) x 3 x 4096 elements a layer at the KV
    dtype; halved at tp 2. A sequence of 128K tokens: 7 x 131,072 x 1,152 B of latent."""
    m = pm.model(NAME)
    state, conv = recurrent_state_per_sequence(m)
    assert state == KDA * 32 * 128 * 128 * 4 == 41_943_040
    assert conv == KDA * 3 * 3 * 4096 == 737_280
    assert recurrent_state_per_sequence(m, 2) == (state / 2, conv / 2)
    got = kv_bytes_per_sequence(m, 1, np.array([2.0]), np.array([131072]))
    assert got[0] == MLA * 131072 * 1152 + state + conv * 2 == 1_100_382_208


def test_kda_chunk_flops_by_hand() -> None:
    """Over a chunk of 64 tokens, one head of d_k 128: scores from 16-token sub-chunks,
    2 x 128 x 3,072 off-diagonal pairs (786,432) + their scalings 5 x 128 x 3,072 / 16
    (122,880) + the diagonal blocks 7 x 64 x 16 x 128 (917,504), less the whole-block
    q k^T and k k^T 4 x 64^2 x 128, plus the gate's cumsum 2 x 64^2 x 128 and its
    per-channel work 15 x 64 x 128 + 128: 901,248 over the gated delta rule (7.7% of its
    11,654,485). Decode adds 7 x 128 a head."""
    assert kda_flops(np.array(64.0), 128) == 901_248
    assert kda_flops(np.array(1.0), 128) == 896
    dims = (32, 32, 128, 128, True)
    gdn, kda = chunk_flops(64, *dims), chunk_flops(64, *dims, channel=True)
    assert kda - gdn == 32 * 901_248
    assert (kda - gdn) / gdn == pytest.approx(0.0773, abs=1e-4)


def _decode(batch: int, contexts, tp: int = 1):
    c = np.asarray(contexts)
    return price_step(pm.model(NAME), datasheet("h200-sxm"), Parallelism(tp=tp),
                      Step.uniform(batch, np.ones_like(c), c), Dtypes.of())


def _row(cost, name: str) -> int:
    return list(cost.names).index(name)


def test_decode_scan_bytes_and_flops_by_hand() -> None:
    """A decode token per sequence per KDA layer: reads v, q, k, beta and the raw gate
    (4,096 + 8,192 + 32 + 4,096 at 2 B), the fp32 gate (16,384 B) and the state
    (2,097,152 B); writes the output (8,192 B), the fp32 gate and the state: 4,268,096 B.
    FLOPs: the gated delta rule's recurrent step (3,162,112 + 1,073,162.67), KDA's 32 x 896
    and the q/k L2 norm 3 x 8,192."""
    cost = _decode(8, [4096])
    i = _row(cost, "linear.scan")
    per = 2 * (4096 + 8192 + 32 + 4096) + 16384 + 2097152 + 8192 + 16384 + 2097152
    assert per == 4_268_096
    assert float(cost.bytes.total[i, 0]) == 8 * KDA * per
    flops = 2 * 8192 + 32 * 6 * 16384 + 32 * (768 + 32768 + 1 / 3) + 32 * 896 + 3 * 8192
    assert float(cost.flops[i, 0]) == pytest.approx(8 * KDA * flops, rel=1e-12)


def test_prefill_scan_by_hand() -> None:
    """An 8,192-token prompt per KDA layer: reads 8,192 x 2 x 16,416 B of inputs, the fp32
    gate (8,192 x 4,096 x 4), and the chunked path's 128 chunk states (2,097,152 B each) and
    its q/k L2-norm passes (8,192 x 8,192 x 2) once more; writes the output, the gate, the
    same intermediates and the final state. FLOPs: 128 chunks of 64 x 32 heads x
    (11,654,485.33 of the gated delta rule + KDA's 901,248) and the norms 3 x 8,192^2."""
    cost = price_step(pm.model(NAME), datasheet("h200-sxm"), Parallelism(),
                      Step.uniform(1, 8192, 8192), Dtypes.of())
    i = _row(cost, "linear.scan")
    inter = 128 * 2097152 + 8192 * 8192 * 2
    gate = 8192 * 4096 * 4
    assert float(cost.bytes.act_read[i].sum()) == KDA * (8192 * 2 * 16416 + gate + inter)
    assert float(cost.bytes.act_write[i].sum()) == KDA * (8192 * 4096 * 2 + gate + inter)
    assert float(cost.bytes.kv_read[i].sum()) == 0          # a fresh prompt has no state
    assert float(cost.bytes.kv_write[i].sum()) == KDA * 2097152
    per_head = 6_324_224 + 5_330_261 + 1 / 3 + 901_248
    flops = KDA * (128 * 32 * per_head + 3 * 8192 * 8192)
    assert float(cost.flops[i].sum()) == pytest.approx(flops, rel=1e-12)


def test_decode_kda_flat_in_context_mla_grows() -> None:
    """From 4K to 128K context at batch 8, every KDA operator costs the same; MLA's
    attention reads 7 x C x 1,152 B of latent per sequence (x 32 from 4K to 128K), and the
    step's time grows only by the attention's."""
    cost = _decode(8, [4096, 131072])
    for i, name in enumerate(cost.names):
        if name.startswith("linear."):
            assert cost.time_s[i, 0] == cost.time_s[i, 1], name
            assert cost.flops[i, 0] == cost.flops[i, 1], name
    att = _row(cost, "attention")
    assert float(cost.bytes.kv_read[att, 0]) == 8 * MLA * 4096 * 1152
    assert float(cost.bytes.kv_read[att, 1]) == 8 * MLA * 131072 * 1152
    grow = cost.time_s[:, 1] - cost.time_s[:, 0]
    assert grow.sum() == pytest.approx(grow[att], rel=1e-9)
    assert "rotary" not in cost.names          # mla_use_nope: no rotary on the MLA layers


def test_decode_under_tensor_parallelism() -> None:
    """At tp 4 the scan's state traffic splits 4 ways (8 heads a device)."""
    one, four = (_decode(8, [4096], tp) for tp in (1, 4))
    i = _row(one, "linear.scan")
    assert float(four.bytes.kv_read[i, 0]) == float(one.bytes.kv_read[i, 0]) / 4


def _config(**linear) -> Path:
    data = json.loads(FIXTURE.read_text())
    data["linear_attn_config"] |= linear
    return data


def _read(tmp_path: Path, data: dict) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    pm.model(str(path))


@pytest.mark.parametrize(("change", "key"), [
    ({"kda_layers": [1, 2, 3, 5, 6, 7, 9, 10, 11, 13, 14, 15, 17, 18, 19, 21, 22, 23, 25]},
     r"linear_attn_config\.kda_layers: layer 26 \(1-based\) is in neither"),
    ({"full_attn_layers": [3, 4, 8, 12, 16, 20, 24, 27]},
     r"linear_attn_config\.full_attn_layers: layer 3 \(1-based\) is listed twice"),
    ({"kda_layers": [0, 1]}, r"linear_attn_config\.kda_layers: expected a list of 1-based"),
    ({"full_attn_layers": "4,8"}, r"linear_attn_config\.full_attn_layers: expected a list"),
    ({"use_full_rank_gate": True}, r"linear_attn_config\.use_full_rank_gate"),
])
def test_inconsistent_layer_lists_are_one_clear_error(tmp_path, change, key) -> None:
    with pytest.raises(SpecError, match=key) as err:
        _read(tmp_path, _config(**change))
    assert "\n" not in str(err.value)


def test_the_yaml_schema_for_kda() -> None:
    base = {"version": 1, "name": "t", "n_layers": 2, "d_model": 256, "n_heads": 4,
            "n_kv_heads": 4, "vocab_size": 1000, "intermediate_size": 512,
            "attention": {"layer_pattern": ["linear", "global"]},
            "mla": {"q_lora_rank": None, "kv_lora_rank": 64, "qk_nope_head_dim": 32,
                    "qk_rope_head_dim": 16, "v_head_dim": 32}}
    kda = {"kind": "kda", "n_heads": 4, "n_k_heads": 4, "head_k_dim": 32, "head_v_dim": 32,
           "d_conv": 4, "chunk_size": 64}
    m = model_from_fields(Fields({**base, "linear_attention": kda}, "t.yaml"))
    assert (m.attention_layers, m.layer_count("linear")) == (1, 1)
    with pytest.raises(SpecError, match=r"linear_attention\.kind: kda has one num_heads"):
        model_from_fields(Fields({**base, "linear_attention": {**kda, "n_k_heads": 2}},
                                 "t.yaml"))
    mamba = {"attention": {"layer_pattern": ["mamba", "global"]},
             "mamba": {"d_inner": 512, "d_state": 16, "head_dim": 64, "chunk_size": 64}}
    with pytest.raises(SpecError, match="Mamba or MLP-only layers with MLA"):
        model_from_fields(Fields({**base, **mamba}, "t.yaml"))
