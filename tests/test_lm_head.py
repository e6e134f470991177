"""A quantized LM head (``Workload.quantize_lm_head``): the head GEMM and its memory at the
weights' dtype, group size and scales, as TorchAO's ``quantize_`` and GPTQ's ``"lm_head":
true`` store it. Byte figures are derived by hand in the comments."""

import csv
import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import perfmodel as pm
from perfmodel.cli.app import app
from perfmodel.cost.memory import stage_weights
from perfmodel.cost.roofline import BOUNDS
from perfmodel.cost.step import Dtypes, Step, price_step, step_records
from perfmodel.specs import SpecError, load
from perfmodel.specs.model import Quantization
from tests.datasheet import datasheet

DATA = Path(__file__).parent / "data" / "hf"
runner = CliRunner()

# Llama-3-8B's head: vocab 128,256 x d_model 4,096 = 525,336,576 weights
HEAD = 128_256 * 4_096
# int4 in groups of 64 with a bf16 scale and a bf16 zero (tinygemm, int4wo-g64): 4.0 B per
# group, 0.5 + 4 / 64 = 0.5625 B per weight
INT4_G64 = {"weights_dtype": "int4", "weight_group_size": 64, "weight_scale_bytes": 4.0}


def _head(dtypes: Dtypes, model: str = "llama-3-8b", batch: int = 1):
    records = step_records(pm.model(model), None, pm.Parallelism(),
                           Step.uniform(batch, 1, 1024), dtypes)
    (head,) = [r for r in records if r.name == "lm_head"]
    return head


def test_head_gemm_bytes_by_hand():
    """525,336,576 x 0.5625 = 295,501,824 B streamed, against 2 B each = 1,050,673,152 B;
    the quantized head is converted in the kernel (stored int4, computed in bf16)."""
    assert HEAD == 525_336_576
    quantized = _head(Dtypes.of("int4", group_size=64, scale_bytes=4.0, quantize_lm_head=True))
    plain = _head(Dtypes.of("int4", group_size=64, scale_bytes=4.0))
    assert float(np.ravel(quantized.bytes.weights)[0]) == 295_501_824.0
    assert float(np.ravel(plain.bytes.weights)[0]) == 1_050_673_152.0
    assert int(np.ravel(quantized.weight_dtype)[0]) == pm.specs.dtypes.CODE["int4"]
    assert int(np.ravel(plain.weight_dtype)[0]) == -1
    assert quantized.dtype_name() == plain.dtype_name() == "bf16"
    assert np.array_equal(quantized.flops, plain.flops)


def test_memory_difference_by_hand():
    """The head at 2 - 0.5625 = 1.4375 B less per weight: 525,336,576 x 1.4375 =
    755,171,328 B less, on the last pipeline stage only."""
    hw, model = datasheet("h100-sxm"), pm.model("llama-3-8b")
    on, off = (pm.estimate(hw, model, pm.Workload(**INT4_G64, quantize_lm_head=q))
               for q in (True, False))
    assert off.memory.weights_bytes - on.memory.weights_bytes == 755_171_328
    stages = [stage_weights(model, 1, 0.5625, 2.0, 2, head_bytes=b) for b in (0.5625, None)]
    assert stages[1][0] == stages[0][0]
    assert stages[1][1] - stages[0][1] == 755_171_328


@pytest.mark.parametrize("weights", ["bf16", "fp16"])
def test_no_effect_on_16_bit_weights(weights):
    hw, model = datasheet("h100-sxm"), pm.model("llama-3-8b")
    on, off = (pm.estimate(hw, model, pm.Workload(batch=8, weights_dtype=weights,
                                                  quantize_lm_head=q)) for q in (True, False))
    assert (on.ttft_s, on.tpot_s, on.memory.weights_bytes) == \
        (off.ttft_s, off.tpot_s, off.memory.weights_bytes)


def test_per_configuration_in_one_call():
    """The flag is per row of a vectorised call: each row equals its own single call."""
    hw, model = datasheet("h100-sxm"), pm.model("llama-3-8b")
    w = pm.Workloads.of(batch=[1, 1, 64], quantize_lm_head=[False, True, True], **INT4_G64)
    many = pm.estimate_many(hw, model, w)
    for i in range(len(w)):
        one = pm.estimate(hw, model, w.item(i))
        assert many.tpot_s[i] == one.tpot_s and many.memory.weights_bytes[i] == \
            one.memory.weights_bytes


WEIGHTS = [("int4", 64, 4.0), ("int4", 128, 2.5), ("int8", None, 2.0), ("fp8", None, 2.0),
           ("fp4", 32, 1.0)]


def _head_and_step(hw, model, batches: np.ndarray, weights: tuple) -> list:
    """[(head seconds, head bound codes, step seconds)] without and with the head quantized,
    decode steps at context 1,024."""
    out = []
    for q in (False, True):
        d = Dtypes.of(weights[0], group_size=weights[1], scale_bytes=weights[2],
                      quantize_lm_head=q).take(np.zeros(len(batches), dtype=int))
        cost = price_step(model, hw, pm.Parallelism(), Step.uniform(batches, 1, 1024), d)
        i = cost.names.index("lm_head")
        out.append((cost.time_s[i], cost.bound[i], cost.time))
    return out


@pytest.mark.parametrize("hw_name", load.shipped(load.HARDWARE_DIR))
def test_a_small_decode_batch_is_never_slower(hw_name):
    """Up to batch 64 a decode step's head is memory-bound and its conversion (where the
    device converts) costs less than the bytes it saves: on every shipped device, for every
    narrow weights format, neither the head nor the step is slower. On a device that
    converts nothing (CPU, TPU files) that holds at any batch: the same FLOPs at the same
    rate over fewer bytes."""
    hw, model = pm.hardware(hw_name), pm.model("llama-3-8b")
    small = np.array([1, 2, 4, 8, 16, 32, 64])
    batches = small if hw.efficiency.dequant else np.append(small, [256, 1024, 4096])
    for weights in WEIGHTS:
        (h0, _, s0), (h1, _, s1) = _head_and_step(hw, model, batches, weights)
        assert np.all(h1 <= h0) and np.all(s1 <= s0), weights


def test_past_the_ridge_a_non_overlapped_conversion_can_lose():
    """What does not hold: tinygemm converts what it has just loaded, in series with the
    weight stream (``cost.dequant``), and converts the weights again for every tile of rows.
    At decode batch 4,096 on an H100 the 16-bit head is compute-bound, and the int4 head
    adds its conversion on top: quantizing it is slower there. Even a head still
    memory-bound at 16 bits can lose near the ridge (Qwen3-14B at batch 192)."""
    hw = datasheet("h100-sxm")
    (h0, b0, _), (h1, _, _) = _head_and_step(hw, pm.model("llama-3-8b"), np.array([4096]),
                                             WEIGHTS[0])
    assert BOUNDS[int(b0[0])] == "compute" and h1[0] > h0[0]
    (h0, b0, _), (h1, _, _) = _head_and_step(hw, pm.model("qwen3-14b"), np.array([192]),
                                             WEIGHTS[0])
    assert BOUNDS[int(b0[0])] == "memory" and h1[0] > h0[0]


def test_a_tied_head_is_refused():
    """Gemma-2's head is its embedding table: no single price is honest (the docstring of
    ``cost.memory.quantized_head``), so it is a one-line error naming model and field."""
    hw, model = datasheet("h100-sxm"), pm.model("gemma-2-9b")
    with pytest.raises(SpecError) as info:
        pm.estimate(hw, model, pm.Workload(weights_dtype="int4", quantize_lm_head=True))
    message = str(info.value)
    assert "\n" not in message and "gemma-2-9b" in message and "quantize_lm_head" in message
    assert "tie_embeddings" in message
    # on 16-bit weights the flag changes nothing, so nothing is refused
    pm.estimate(hw, model, pm.Workload(quantize_lm_head=True))


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_the_flag_is_a_bool(value):
    with pytest.raises(SpecError, match="workload: quantize_lm_head must be true or false"):
        pm.Workload(quantize_lm_head=value)
    with pytest.raises(SpecError, match="workload: quantize_lm_head must be true or false"):
        pm.Workloads.of(quantize_lm_head=[False, value])


def _gptq(tmp_path, head: bool | None, tied: bool = False) -> pm.Model:
    config = json.loads((DATA / "llama-gptq.json").read_text())
    config["tie_word_embeddings"] = tied
    if head is not None:
        config["quantization_config"]["lm_head"] = head
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return pm.model(str(path))


def test_gptq_lm_head_from_hf(tmp_path):
    """GPTQ ``"lm_head": true`` (vLLM's GPTQConfig.lm_head_quantized) is recorded and is the
    default of the model's workloads; weights asked for explicitly start from a 16-bit
    head, as they start from the workload's own group size."""
    model = _gptq(tmp_path, True)
    assert model.quantization == Quantization("gptq", "int4", 128, 2.5, (), True,
                                              "int4-awq-g128", "fp16")
    assert pm.Workload.for_model(model).quantize_lm_head is True
    assert pm.Workload.for_model(model, quantize_lm_head=False).quantize_lm_head is False
    assert pm.Workload.for_model(model, weights_dtype="int8").quantize_lm_head is False
    assert _gptq(tmp_path, None).quantization.lm_head is False
    # tied: vLLM shares the 16-bit embedding and skips lm_head.* tensors; not recorded
    assert _gptq(tmp_path, True, tied=True).quantization.lm_head is False


def test_gptq_lm_head_estimate_and_assumption(tmp_path):
    """The checkpoint's head is priced quantized by default; asking for a 16-bit head is
    the checkpoint's weights no longer, and the estimate says so."""
    hw, model = datasheet("h100-sxm"), _gptq(tmp_path, True)
    default = pm.estimate(hw, model, pm.Workload.for_model(model))
    plain = pm.estimate(hw, model, pm.Workload.for_model(model, quantize_lm_head=False))
    # tiny head: 100 x 64 = 6,400 weights at 2 - (0.5 + 2.5 / 128) = 1.48046875 B less
    assert plain.memory.weights_bytes - default.memory.weights_bytes == 6_400 * 1.48046875
    assert not any("checkpoint stores" in w for w in default.warnings)
    assert any("checkpoint stores" in w for w in plain.warnings)


def test_yaml_lm_head_on_a_tied_model_is_refused(tmp_path):
    path = tmp_path / "tied.yaml"
    path.write_text("version: 1\nname: tied\nn_layers: 2\nd_model: 64\nn_heads: 4\n"
                    "n_kv_heads: 2\nvocab_size: 100\nintermediate_size: 128\n"
                    "tie_embeddings: true\nquantization:\n  weights_dtype: int4\n"
                    "  lm_head: true\n")
    with pytest.raises(SpecError, match=r"tied\.yaml: quantization\.lm_head: the LM head is "
                                        r"the embedding table"):
        load.load_model(path)


def test_cli_estimate_flag_and_json_field():
    args = ["estimate", "-m", "llama-3-8b", "-H", "h100-sxm", "--weights-format",
            "int4wo-g64", "-f", "json"]
    on, off = (runner.invoke(app, [*args, flag]) for flag in ("--quantize-lm-head",
                                                               "--no-quantize-lm-head"))
    assert on.exit_code == 0 and off.exit_code == 0, on.output + off.output
    on, off = json.loads(on.stdout), json.loads(off.stdout)
    assert (on["workload"]["quantize_lm_head"], off["workload"]["quantize_lm_head"]) == \
        (True, False)
    assert off["weights_bytes"] - on["weights_bytes"] == 755_171_328
    bad = runner.invoke(app, ["estimate", "-m", "gemma-2-9b", "-H", "h100-sxm",
                              "--weights-dtype", "int4", "--quantize-lm-head"])
    assert bad.exit_code == 2 and bad.output.count("\n") == 1
    assert bad.output.startswith("error: workload: quantize_lm_head needs an LM head")


def test_sweep_dimension(tmp_path):
    """``--quantize-lm-head false,true`` is one more dimension; its rows are estimate's."""
    out = runner.invoke(app, ["sweep", "-m", "llama-3-8b", "-H", "h100-sxm", "--batch", "1,8",
                              "--context", "512", "--weights-dtype", "int4",
                              "--group-size", "64", "--quantize-lm-head", "false,true",
                              "--kv-models", "llama-3-8b", "--no-figures",
                              "--out", str(tmp_path)])
    assert out.exit_code == 0, out.output
    rows = list(csv.DictReader((tmp_path / "sweep.csv").open()))
    assert [(r["workload_quantize_lm_head"], r["workload_batch"]) for r in rows] == \
        [("False", "1"), ("False", "8"), ("True", "1"), ("True", "8")]
    ref = pm.estimate(pm.hardware("h100-sxm"), pm.model("llama-3-8b"), pm.Workload(
        batch=8, prompt_len=512, weights_dtype="int4", weight_group_size=64,
        quantize_lm_head=True))
    assert float(rows[3]["tpot_s"]) == pytest.approx(ref.tpot_s, rel=1e-9)
    bad = runner.invoke(app, ["sweep", "-m", "llama-3-8b", "-H", "h100-sxm",
                              "--quantize-lm-head", "yes", "--out", str(tmp_path)])
    assert bad.exit_code == 2
    assert "--quantize-lm-head: expected comma-separated true or false" in bad.output
