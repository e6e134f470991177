"""Checkpoints as they ship: each shipped model's quantization against its checkpoint's own
config.json (tests/data/checkpoints, README there), weight bytes and fits derived by hand,
the formats per linear class, the kernel path per device (W8A8 / W4A4 or weight-only), and
--weights-format on estimate, simulate and plan."""

from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import perfmodel as pm
from perfmodel.cli.app import app
from perfmodel.cost.memory import memory_estimate
from perfmodel.cost.params import param_counts
from perfmodel.cost.step import Dtypes, Step, step_records
from perfmodel.specs import SpecError, load
from perfmodel.specs.dtypes import CODE
from perfmodel.specs.formats import format_names, weight_format, with_weights_format
from perfmodel.specs.matmul_path import matmul_codes, matmul_path
from perfmodel.specs.workload import Parallelism, Workload, Workloads

DATA = Path(__file__).parent / "data" / "checkpoints"
runner = CliRunner()

# shipped model -> its checkpoint's folder, and each class's format as that config says
SHIPPED = {
    "deepseek-v3": ("DeepSeek-V3", {"attention": "fp8-block128", "mlp": "fp8-block128",
                                    "experts": "fp8-block128", "router": "16-bit"}),
    "deepseek-r1-fp4": ("DeepSeek-R1-FP4", {"attention": "16-bit", "mlp": "nvfp4",
                                            "experts": "nvfp4", "shared_experts": "nvfp4",
                                            "router": "16-bit"}),
    "kimi-k2": ("Kimi-K2-Instruct", {"attention": "fp8-block128", "experts": "fp8-block128",
                                     "router": "16-bit"}),
    "gpt-oss-120b": ("gpt-oss-120b", {"attention": "16-bit", "experts": "mxfp4",
                                      "router": "16-bit"}),
    "gpt-oss-20b": ("gpt-oss-20b", {"attention": "16-bit", "experts": "mxfp4",
                                    "router": "16-bit"}),
    "qwen3-32b-fp8": ("Qwen3-32B-FP8", {"attention": "fp8-block128", "mlp": "fp8-block128"}),
    "qwen3-235b-a22b-fp8": ("Qwen3-235B-A22B-FP8", {"attention": "fp8-block128",
                                                    "experts": "fp8-block128",
                                                    "router": "16-bit"}),
    "qwen3-30b-a3b-fp8": ("Qwen3-30B-A3B-FP8", {"attention": "fp8-block128",
                                                "experts": "fp8-block128", "router": "16-bit"}),
}


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_model_matches_its_checkpoint_config(name):
    folder, classes = SHIPPED[name]
    shipped, read = pm.model(name), pm.model(str(DATA / folder / "config.json"))
    qs, qr = shipped.quantization, read.quantization
    fields = ("weights_dtype", "group_size", "scale_bytes", "unquantized", "format",
              "scale_dtype", "act_dtype", "formats")
    assert {f: getattr(qs, f) for f in fields} == {f: getattr(qr, f) for f in fields}
    assert {c: f for c, f in qr.class_formats().items() if c in classes} == classes
    assert param_counts(shipped).total == param_counts(read).total    # the same shape


def _weights(name, hw, tp):
    m = pm.model(name)
    w = Workloads.from_list([Workload.for_model(m)])
    return memory_estimate(m, load.hardware(hw), Parallelism(tp=tp), w)


# DeepSeek-V3 / R1 on one device of TP8, by hand: MLA per layer q_a 7168 x 1536 and its
# 1536-wide norm, q_b 1536 x (16 heads x 192), kv_a 7168 x 576 and its 512-wide norm,
# kv_b 512 x 16 x 256, o 16 x 128 x 7168; 3 dense MLPs 3 x 7168 x 2304; 58 MoE layers of
# 256 routed + 1 shared experts 3 x 7168 x 256 each; the router 7168 x 256 per MoE layer,
# 123 norms of 7168, the embedding and the LM head 129280 / 8 x 7168 each, all 16-bit
MLA = 7168 * 1536 + 1536 + 1536 * 16 * 192 + 7168 * 576 + 512 + 512 * 16 * 256 \
    + 16 * 128 * 7168
FFN = 3 * 3 * 7168 * 2304 + 58 * 257 * 3 * 7168 * 256
HALF = 58 * 7168 * 256 + 123 * 7168 + 2 * 129280 // 8 * 7168


def test_deepseek_v3_fp8_block_fits_8xh200():
    mem = _weights("deepseek-v3", "h200-sxm", 8)
    # fp8: 1 byte per weight + one fp32 scale per 128 x 128 block
    expect = (61 * MLA + FFN) * (1 + 4 / 16384) + HALF * 2
    assert float(mem.weights_bytes[0]) == pytest.approx(expect, rel=1e-12)
    assert expect == pytest.approx(85.14e9, rel=1e-4)
    assert bool(mem.fits[0]) and float(mem.usable_bytes[0]) < 169.6e9   # bf16 did not fit


def test_deepseek_r1_fp4_weights_on_b200():
    mem = _weights("deepseek-r1-fp4", "b200", 8)
    # NVFP4 MLPs and experts: half a byte + one fp8 scale per 16; attention 16-bit
    expect = FFN * (0.5 + 1 / 16) + (61 * MLA + HALF) * 2
    assert float(mem.weights_bytes[0]) == pytest.approx(expect, rel=1e-12)
    assert bool(mem.fits[0])


def test_gpt_oss_120b_mxfp4_weights_on_one_h100():
    mem = _weights("gpt-oss-120b", "h100-sxm", 1)
    d = 2880     # 128 experts x 36 layers of 3 d x d and their biases, mxfp4 (1 B per 32)
    experts = 36 * 128 * (3 * d * d + 3 * d)
    attention = (d * 80 * 64 + 80 * 64 + 64 * 64 * d + d + 64) * 36    # + biases, sinks
    half = attention + 36 * d * 128 + 73 * d + 2 * 201088 * d
    expect = experts * (0.5 + 1 / 32) + half * 2
    assert float(mem.weights_bytes[0]) == pytest.approx(expect, rel=1e-12)
    assert bool(mem.fits[0])


@pytest.mark.parametrize("hw, dtype, group, kind, compute", [
    ("h200-sxm", "fp8", 16384, "w8a8", "fp8"),        # block fp8: 1 x 128 activation groups
    ("h200-sxm", "fp8", None, "w8a8", "fp8"),         # --weights-dtype fp8 alone
    ("mi300x", "fp8", None, "w8a8", "fp8"),
    ("a100-80gb-sxm", "fp8", 16384, "weight-only", "bf16"),   # Marlin fp8 W8A16
    ("b200", "fp4", 16, "w4a4", "fp4"),               # NVFP4 on Blackwell
    ("h200-sxm", "fp4", 16, "weight-only", "bf16"),   # Marlin FP4 on Hopper
    ("b200", "fp4", 32, "weight-only", "bf16"),       # MXFP4: vLLM's default 16-bit acts
    ("h200-sxm", "int4", 128, "weight-only", "bf16"),
])
def test_matmul_path_per_device(hw, dtype, group, kind, compute):
    device = load.hardware(hw)
    path = matmul_path(device, dtype, group)
    assert (path.kind, path.compute) == (kind, compute)
    codes = matmul_codes(device, np.array([CODE[dtype]]), np.array([group or 0]),
                         np.array([CODE["bf16"]]))
    assert codes.tolist() == [CODE[compute]]


def _gemm(model, hw, name, dtypes):
    plan = Parallelism()
    recs = step_records(model, load.hardware(hw), plan, Step.uniform(4, 1, 64), dtypes)
    return next(r for r in recs if r.name == name)


def test_fp8_weights_price_an_fp8_mma_on_hopper_and_a_dequant_on_ampere():
    m = pm.model("qwen3-32b-fp8")
    d = Dtypes.of(weights="fp8", group_size=16384, scale_bytes=4.0)
    hopper, ampere = _gemm(m, "h200-sxm", "o_proj", d), _gemm(m, "a100-80gb-sxm", "o_proj", d)
    assert int(np.ravel(hopper.dtype)[0]) == CODE["fp8"]
    assert int(np.ravel(hopper.weight_dtype)[0]) == -1   # no conversion: same dtype
    assert int(np.ravel(ampere.dtype)[0]) == CODE["bf16"]          # weight-only
    assert float(np.ravel(hopper.weight_bytes)[0]) == pytest.approx(1 + 4 / 16384)


def test_estimate_says_the_path():
    out = runner.invoke(app, ["estimate", "-m", "deepseek-v3", "-H", "a100-80gb-sxm",
                              "--tp", "8"])
    assert out.exit_code == 0
    assert "fp8-block128 weights run weight-only (bf16 MMA) on a100-80gb-sxm" in out.output
    assert "Marlin fp8 W8A16" in out.output
    out = runner.invoke(app, ["estimate", "-m", "deepseek-v3", "-H", "h200-sxm", "--tp", "8"])
    assert "fits                yes" in out.output
    assert "fp8-block128, W8A8 (fp8 activations per 128, fp8 MMA): attention, mlp, " \
           "experts, shared_experts; bf16: router, embedding, lm_head, norms" in out.output


MIXED = """version: 1
name: tiny-mixed
family: deepseek
n_layers: 2
d_model: 256
n_heads: 4
n_kv_heads: 4
head_dim: 64
vocab_size: 1000
intermediate_size: 512
moe: {n_experts: 8, top_k: 2, expert_intermediate_size: 128}
quantization:
  format: nvfp4
  formats: {attention: fp8-block128}
  unquantized: [router]
"""


def test_fp4_experts_beside_fp8_attention(tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text(MIXED)
    m = pm.model(str(path))
    assert m.quantization.class_formats() == {
        "attention": "fp8-block128", "mlp": "nvfp4", "experts": "nvfp4",
        "shared_experts": "nvfp4", "router": "16-bit", "o_proj": "fp8-block128"}
    c = param_counts(m)
    mem = memory_estimate(m, load.hardware("b200"), Parallelism(),
                          Workloads.from_list([Workload.for_model(m)]))
    expect = c.attention * (1 + 4 / 16384) + c.experts * (0.5 + 1 / 16) \
        + (c.router + c.norms + c.embedding + c.lm_head) * 2
    assert float(mem.weights_bytes[0]) == pytest.approx(expect, rel=1e-12)
    d = Dtypes.of(weights="fp4", group_size=16, scale_bytes=1.0)
    q = _gemm(m, "b200", "qkv_proj", d)
    assert int(np.ravel(q.dtype)[0]) == CODE["fp8"]     # W8A8 attention on Blackwell
    assert float(np.ravel(q.weight_bytes)[0]) == pytest.approx(1 + 4 / 16384)
    e = _gemm(m, "b200", "experts.gate_up_proj", d)
    assert int(np.ravel(e.dtype)[0]) == CODE["fp4"]     # W4A4 experts


def test_modelopt_mixed_precision_config(tmp_path):
    import json

    cfg = json.loads((DATA / "DeepSeek-V3" / "config.json").read_text())
    cfg["quantization_config"] = {
        "quant_method": "modelopt", "quant_algo": "MIXED_PRECISION",
        "exclude_modules": ["lm_head", "model.layers.*.mlp.gate"],
        "quantized_layers": {
            **{f"model.layers.{i}.self_attn": {"quant_algo": "FP8"} for i in range(61)},
            **{f"model.layers.{i}.mlp": {"quant_algo": "NVFP4", "group_size": 16}
               for i in range(61)}}}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    q = pm.model(str(tmp_path / "config.json")).quantization
    assert (q.format, q.formats, q.unquantized) == ("nvfp4", (("attention", "fp8-tensor"),),
                                                    ("router",))


def test_r1_fp4_reads_hf_quant_config_beside_its_config():
    q = pm.model(str(DATA / "DeepSeek-R1-FP4" / "config.json")).quantization
    assert (q.method, q.format, q.scale_dtype, q.act_dtype) == ("modelopt", "nvfp4",
                                                                "fp8-e4m3", "fp4")


def test_format_vocabulary():
    assert {"fp8-tensor", "fp8-channel", "fp8-block128", "nvfp4", "mxfp4", "int4-awq-g128",
            "w4a16"} <= set(format_names())
    f = weight_format("fp8-block128")
    assert (f.weights, f.group_size, f.block, f.scale_dtype, f.scale_bytes) == \
        ("fp8", 16384, (128, 128), "fp32", 4.0)
    assert (weight_format("mxfp4").scale_dtype, weight_format("nvfp4").scale_dtype,
            weight_format("nvfp4").group_size) == ("e8m0", "fp8-e4m3", 16)
    assert weight_format("w4a16").name == "w4a16-g128"
    with pytest.raises(SpecError, match="--weights-format: unknown 'fp9'"):
        weight_format("fp9")


def test_with_weights_format_keeps_the_checkpoints_16_bit_classes():
    m = with_weights_format(pm.model("gpt-oss-120b"), "nvfp4")
    assert (m.quantization.format, m.quantization.unquantized) == ("nvfp4",
                                                                   ("attention", "router"))
    dense = with_weights_format(pm.model("qwen3-32b"), "fp8-tensor")
    assert dense.quantization.unquantized == () and dense.quantization.act_dtype == "fp8"


@pytest.mark.parametrize("command", [
    ["estimate", "-m", "qwen3-8b", "-H", "h100-sxm"],
    ["simulate", "-m", "qwen3-8b", "-H", "h100-sxm", "--num-requests", "2"],
    ["plan", "-m", "qwen3-8b", "-H", "h100-sxm", "--input-len", "64", "--output-len", "8"],
])
def test_weights_format_flag_errors(command):
    out = runner.invoke(app, [*command, "--weights-format", "fp9"])
    assert out.exit_code != 0
    text = out.output
    assert "--weights-format" in text and "fp8-block128" in text and "nvfp4" in text
    assert "Traceback" not in text


def test_weights_format_beside_weights_dtype_is_one_line():
    out = runner.invoke(app, ["estimate", "-m", "qwen3-8b", "-H", "h100-sxm",
                              "--weights-format", "fp8-block128", "--weights-dtype", "fp8"])
    assert out.exit_code != 0
    assert out.output.strip().count("\n") == 0 and "drop --weights-dtype" in out.output


def test_weights_format_on_estimate_and_simulate():
    out = runner.invoke(app, ["estimate", "-m", "qwen3-8b", "-H", "h100-sxm",
                              "--weights-format", "fp8-block128"])
    assert out.exit_code == 0 and "fp8-block128, W8A8" in out.output
    out = runner.invoke(app, ["simulate", "-m", "qwen3-8b", "-H", "h100-sxm",
                              "--weights-format", "nvfp4", "--num-requests", "4", "--rate", "2",
                              "--no-band", "--no-progress"])
    assert out.exit_code == 0, out.output


def test_model_yaml_format_errors(tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text(MIXED.replace("format: nvfp4", "format: nvfp5"))
    with pytest.raises(SpecError, match=r"quantization\.format: unknown weights format"):
        pm.model(str(path))
    path.write_text(MIXED.replace("format: nvfp4", "format: nvfp4\n  weights_dtype: fp4"))
    with pytest.raises(SpecError, match=r"quantization\.format: sets weights_dtype"):
        pm.model(str(path))
    path.write_text(MIXED.replace("{attention: fp8-block128}", "{router: fp8-block128}"))
    with pytest.raises(SpecError, match=r"quantization\.formats\.router: expected a quantized"):
        pm.model(str(path))


def test_deepseek_v3_1_nvfp4_quantizes_o_proj_alone():
    # the real ModelOpt export: q_a, q_b, kv_a, kv_b excluded, o_proj NVFP4 (as R1-FP4-v2)
    m = pm.model(str(DATA / "DeepSeek-V3.1-NVFP4" / "config.json"))
    q = m.quantization
    assert (q.unquantized, q.formats) == (("attention", "router"), (("o_proj", "nvfp4"),))
    mem = memory_estimate(m, load.hardware("b200"), Parallelism(tp=8),
                          Workloads.from_list([Workload.for_model(m)]))
    o_proj = 61 * 16 * 128 * 7168
    expect = (FFN + o_proj) * (0.5 + 1 / 16) + (61 * MLA - o_proj + HALF) * 2
    assert float(mem.weights_bytes[0]) == pytest.approx(expect, rel=1e-12)
    d = Dtypes.of(weights="fp4", group_size=16, scale_bytes=1.0)
    o, qa = _gemm(m, "b200", "o_proj", d), _gemm(m, "b200", "q_a_proj", d)
    assert int(np.ravel(o.dtype)[0]) == CODE["fp4"]
    assert int(np.ravel(qa.dtype)[0]) == CODE["bf16"]
