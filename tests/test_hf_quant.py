"""Quantized checkpoints: a HF ``quantization_config`` or a model YAML ``quantization:`` block
read into ``Model.quantization``, and the cost model keeping its unquantized classes at the
activation dtype. Byte figures are derived by hand in the comments."""

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import perfmodel as pm
from perfmodel.cli.app import app
from perfmodel.cost.memory import weights_bytes
from perfmodel.cost.step import Dtypes, Step, step_records
from perfmodel.specs import SpecError
from perfmodel.specs.load import load_model
from perfmodel.specs.model import Quantization

DATA = Path(__file__).parent / "data" / "hf"

# (file, name, method, dtype, group, scale bytes per group, unquantized, bytes per weight)
SHIPPED = [
    # DeepSeek-V3: fp8 e4m3, one fp32 scale per 128 x 128 block; the router stays 16-bit
    ("deepseek-v3-fp8.json", "DeepSeek-V3-tiny", "fp8", "fp8", 16384, 4.0, ("router",),
     1 + 4 / 16384),
    # AWQ int4 g128: a 16-bit scale and a 4-bit zero point per 128 weights
    ("llama-awq.json", "Llama-tiny-AWQ", "awq", "int4", 128, 2.5, ("attention",),
     0.5 + 2.5 / 128),
    ("llama-gptq.json", "Llama-tiny-GPTQ", "gptq", "int4", 128, 2.5, (), 0.5 + 2.5 / 128),
    # W4A16 symmetric: a 16-bit scale per group, no zero point; attention ignored by regex
    ("llama-compressed-tensors.json", "Llama-tiny-W4A16", "compressed-tensors", "int4", 128,
     2.0, ("attention",), 0.5 + 2 / 128),
    # nf4 blocks of 64, double quantization: an 8-bit absmax + an fp32 scale per 256 blocks
    ("llama-bnb-nf4.json", "Llama-tiny-bnb-4bit", "bitsandbytes", "int4", 64, 1 + 4 / 256, (),
     0.5 + (1 + 4 / 256) / 64),
    # MXFP4: 4-bit floats, an 8-bit shared scale per 32; gpt-oss-style glob skip patterns;
    # an empty _name_or_path falls back to architectures[0] and the shape
    ("mixtral-mxfp4.json", "MixtralForCausalLM-64x2", "mxfp4", "fp4", 32, 1.0,
     ("attention", "router"), 0.5 + 1 / 32),
]


@pytest.mark.parametrize("case", SHIPPED, ids=[c[0] for c in SHIPPED])
def test_shipped_quantized_configs(case):
    file, name, method, dtype, group, scale, kept, per_weight = case
    model = pm.model(str(DATA / file))
    assert model.name == name
    q = model.quantization
    assert (q.method, q.weights_dtype, q.group_size, q.scale_bytes, q.unquantized) == \
        (method, dtype, group, scale, kept)
    assert model.quantization.bytes_per_weight == pytest.approx(per_weight)


TINY = """version: 1
name: tiny-int4
n_layers: 2
d_model: 64
n_heads: 4
n_kv_heads: 2
head_dim: 16
vocab_size: 100
intermediate_size: 128
quantization:
  weights_dtype: int4
  group_size: 128
  unquantized: [attention]
  method: awq
"""


def _tiny(tmp_path, text=TINY):
    path = tmp_path / "tiny.yaml"
    path.write_text(text)
    return load_model(path)


def test_yaml_quantization_weights_bytes_by_hand(tmp_path):
    model = _tiny(tmp_path)
    assert model.quantization == Quantization("awq", "int4", 128, 2.0, ("attention",))
    # attention per layer: QKV 64 x (4 + 2 x 2) x 16 = 8192, O 4 x 16 x 64 = 4096 -> x2 layers
    attention = 2 * (8192 + 4096)                    # 24,576 at 2 bytes (unquantized)
    mlp = 2 * 3 * 64 * 128                           # 49,152 at 0.5 + 2/128 bytes
    embeddings = 100 * 64 + 100 * 64 + (2 * 2 + 1) * 64   # embed, LM head, norms at 2 bytes
    expected = attention * 2 + mlp * (0.5 + 2 / 128) + embeddings * 2
    assert expected == 100_736
    assert float(weights_bytes(model, 1, model.quantization.bytes_per_weight, 2.0)) == expected
    wl = pm.Workload(prompt_len=16, gen_len=2, weights_dtype="int4", weight_group_size=128)
    est = pm.estimate(pm.hardware("h100-sxm"), model, wl)
    assert float(est.memory.weights_bytes) == pytest.approx(expected)
    # without the block every linear class is at the workload's dtype
    plain = replace(model, quantization=None)
    assert float(weights_bytes(plain, 1, 0.5 + 2 / 128, 2.0)) == \
        (attention + mlp) * (0.5 + 2 / 128) + embeddings * 2


def test_unquantized_classes_are_priced_at_the_activation_dtype(tmp_path):
    model = _tiny(tmp_path)
    records = {r.name: r for r in step_records(model, None, pm.Parallelism(),
                                               Step.uniform(1, 1, 16),
                                               Dtypes.of("int4", "bf16", "bf16", 128))}
    for name in ("qkv_proj", "o_proj"):
        assert _one(records[name].weight_bytes) == 2.0
        assert records[name].dtype_name() == "bf16"
    # o_proj: 4 heads x 16 x 64 weights per layer, 2 layers, at 2 bytes
    assert _one(records["o_proj"].bytes.weights * records["o_proj"].count) == 2 * 4096 * 2
    for name in ("gate_up_proj", "down_proj"):
        assert _one(records[name].weight_bytes) == pytest.approx(0.5 + 2 / 128)
        assert records[name].dtype_name() == "bf16"      # int4 x bf16 runs at bf16


def _one(value) -> float:
    return float(np.ravel(value)[0])


def test_moe_classes_follow_the_checkpoint():
    model = pm.model(str(DATA / "mixtral-mxfp4.json"))
    records = {r.name: r for r in step_records(model, None, pm.Parallelism(),
                                               Step.uniform(1, 1, 16),
                                               Dtypes.of("fp4", "bf16", "bf16", 32))}
    assert _one(records["qkv_proj"].weight_bytes) == 2.0
    assert _one(records["experts.down_proj"].weight_bytes) == pytest.approx(0.5 + 2 / 32)


def test_cli_estimates_a_quantized_config():
    result = CliRunner().invoke(app, ["estimate", "-m", str(DATA / "deepseek-v3-fp8.json"),
                                      "-H", "h100-sxm", "-f", "json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["weights_bytes"] > 0


LLAMA = json.loads((DATA / "llama-awq.json").read_text())
BAD = [
    ({"quant_method": "hqq", "nbits": 4}, "quantization_config.quant_method: unsupported "
     "'hqq', expected one of fp8, awq, gptq, bitsandbytes, mxfp4, compressed-tensors, modelopt"),
    ({"quant_method": "gptq", "bits": 3, "group_size": 128}, "quantization_config.bits: "
     "expected 4 or 8"),
    ({"quant_method": "awq", "bits": 4, "group_size": 128,
      "modules_to_not_convert": ["model.layers.0.self_attn"]},
     "quantization_config.modules_to_not_convert: names only some attention modules "
     "(3 of 6"),
    ({"quant_method": "fp8", "weight_block_size": [128]}, "weight_block_size: expected "
     "[rows, cols]"),
    ({"quant_method": "compressed-tensors", "config_groups": {
        "a": {"targets": ["re:.*self_attn.*"], "weights": {"num_bits": 8, "type": "float"}},
        "b": {"targets": ["re:.*mlp.*"], "weights": {"num_bits": 4, "type": "int",
                                                    "strategy": "group", "group_size": 128}}}},
     "config_groups: the mlp class's weights (int4, groups of 128) differ from the others'"),
    ({"quant_method": "compressed-tensors", "config_groups": {"g": {"targets": ["Linear"],
      "weights": {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128}}},
      "ignore": ["re:("]}, "quantization_config.ignore: 're:(' is not a valid regex"),
    ({"quant_method": "bitsandbytes", "load_in_4bit": False, "load_in_8bit": False},
     "load_in_4bit: expected load_in_4bit or load_in_8bit to be true"),
]


@pytest.mark.parametrize(("quant", "message"), BAD, ids=[b[0]["quant_method"] + str(i)
                                                          for i, b in enumerate(BAD)])
def test_bad_quantization_config(tmp_path, quant, message):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(LLAMA | {"quantization_config": quant}))
    with pytest.raises(SpecError) as info:
        pm.model(str(path))
    assert "\n" not in str(info.value) and str(path) in str(info.value)
    assert message in str(info.value)


def test_compressed_tensors_targets_and_channel_fp8(tmp_path):
    """FP8-dynamic (per-channel fp8) on the MLP only: attention is not a target."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(LLAMA | {"quantization_config": {
        "quant_method": "compressed-tensors", "config_groups": {"g": {
            "targets": ["re:.*mlp.*"], "weights": {"num_bits": 8, "type": "float",
                                                    "strategy": "channel"}}},
        "ignore": ["lm_head"]}}))
    q = pm.model(str(path)).quantization
    assert (q.weights_dtype, q.group_size, q.unquantized) == ("fp8", None, ("attention",))
    assert q.bytes_per_weight == 1.0


def test_bitsandbytes_8bit_and_fp8_per_tensor(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(LLAMA | {"quantization_config": {
        "quant_method": "bitsandbytes", "load_in_8bit": True, "load_in_4bit": False,
        "llm_int8_skip_modules": ["self_attn", "lm_head"]}}))
    q = pm.model(str(path)).quantization
    assert (q.weights_dtype, q.group_size, q.unquantized) == ("int8", None, ("attention",))
    path.write_text(json.dumps(LLAMA | {"quantization_config": {"quant_method": "fp8",
                                                                "activation_scheme": "static"}}))
    assert pm.model(str(path)).quantization.bytes_per_weight == 1.0


BAD_YAML = [
    ("  unquantized: [attention]\n", "  unquantized: [attn]\n",
     "quantization.unquantized: expected a list of attention, mlp, experts"),
    ("  weights_dtype: int4\n", "  weights_dtype: bf16\n",
     "quantization.weights_dtype: expected one of fp8, int8, int4, fp4"),
    ("  group_size: 128\n", "  group_size: 0\n", "quantization.group_size: expected an "
     "integer >= 1"),
    ("  method: awq\n", "  methd: awq\n", "quantization.methd: unknown field; did you mean "
     "'method'?"),
]


@pytest.mark.parametrize(("old", "new", "message"), BAD_YAML)
def test_bad_quantization_block(tmp_path, old, new, message):
    with pytest.raises(SpecError, match=r"tiny\.yaml: ") as info:
        _tiny(tmp_path, TINY.replace(old, new))
    assert message in str(info.value)
