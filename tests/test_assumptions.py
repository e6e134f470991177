"""Nothing is silently assumed: an assumption that changes the numbers is a warning in the
table, the JSON and the CSV; one that cannot hold is a one-line error (exit 2). Also the
Python API's argument mistakes, and the checkpoint's quantization as the default weights."""

import json
import shutil

import pytest
from typer.testing import CliRunner

import perfmodel as pm
from perfmodel.cli.app import app
from perfmodel.cost.params import LINEAR_CLASSES, param_counts
from perfmodel.report import tables
from tests.conftest import ROOT

runner = CliRunner()
EST = ["estimate", "-m", "llama-2-7b"]
HF = ROOT / "tests" / "data" / "hf"


def warned(args, *words):
    """Run ``perfmodel estimate ARGS``: exit 0, each of ``words`` in one warning line of the
    table and in the JSON's warnings; returns the JSON."""
    table = runner.invoke(app, [*EST, *args])
    assert table.exit_code == 0, table.output
    lines = [x for x in table.stdout.splitlines() if x.startswith("warning")]
    assert any(all(w in x for w in words) for x in lines), lines
    out = runner.invoke(app, [*EST, *args, "-f", "json"])
    data = json.loads(out.stdout)
    assert any(all(w in x for w in words) for x in data["warnings"]), data["warnings"]
    csv = runner.invoke(app, [*EST, *args, "-f", "csv"]).stdout
    assert words[0] in csv
    return data


def refused(args, *words):
    result = runner.invoke(app, args)
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit), result.output
    lines = [x for x in result.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert all(w in lines[0] for w in words), lines[0]


def test_fp8_by_fp8_on_an_a100_says_it_runs_at_bf16():
    data = warned(["-H", "a100-80gb-sxm", "--weights-dtype", "fp8", "--act-dtype", "fp8"],
                  "a100-80gb-sxm lists no fp8 rate", "priced at its bf16 rate")
    plain = json.loads(runner.invoke(app, [*EST, "-H", "a100-80gb-sxm", "-f", "json"]).stdout)
    # the rate is bf16's: the prefill's compute-bound GEMMs take as long as in bf16
    assert data["prefill"]["flops"] == pytest.approx(plain["prefill"]["flops"])


@pytest.mark.parametrize("hw,dtype,used", [("h100-sxm", "int4", "fp8"),
                                           ("h100-sxm", "fp4", "fp8"),
                                           ("mi210", "fp8", "bf16")])
def test_narrow_activations_without_a_rate_are_stated(hw, dtype, used):
    warned(["-H", hw, "--weights-dtype", dtype, "--act-dtype", dtype],
           f"{hw} lists no {dtype} rate", f"its {used} rate")


def test_hardware_without_a_bf16_rate_says_it_uses_fp16(tmp_path):
    text = (ROOT / "perfmodel" / "hardware" / "h100-sxm.yaml").read_text()
    lines = text.splitlines()
    # the peak table's bf16 rate (other blocks, per-format kernel tables, name bf16 too)
    at = lines.index("  peak_flops_per_s:")
    rate = next(i for i in range(at, len(lines)) if lines[i].strip().startswith("bf16:"))
    del lines[rate]
    path = tmp_path / "no-bf16.yaml"
    path.write_text("\n".join(lines) + "\n")
    warned(["-H", str(path)], "lists no bf16 rate", "at its fp16 rate")


def test_tensor_parallel_past_the_interconnect_is_an_error():
    refused([*EST, "-H", "h100-sxm", "--tp", "16"], "tp=16", "at most 8 devices",
            "interconnect.max_devices")


def test_group_size_on_16_bit_weights_is_an_error():
    refused([*EST, "-H", "h100-sxm", "--group-size", "128", "--weights-dtype", "bf16"],
            "weight_group_size 128", "weights_dtype is bf16")


def test_cuda_graphs_on_a_tpu_are_ignored_and_said_so():
    data = warned(["-H", "tpu-v5e", "--cuda-graphs"], "cuda_graphs ignored", "tpu-v5e")
    plain = json.loads(runner.invoke(app, [*EST, "-H", "tpu-v5e", "-f", "json"]).stdout)
    assert data["e2e_s"] == plain["e2e_s"] and data["tpot_s"] == plain["tpot_s"]


def test_gen_1_reports_no_decode_rate():
    data = warned(["-H", "h100-sxm", "--gen", "1"], "gen_len 1", "no decode step")
    assert data["decode_tokens_per_s"] == 0.0 and data["decode"]["steps"] == 0
    assert data["throughput_tokens_per_s"] * data["e2e_s"] == pytest.approx(1.0)
    table = runner.invoke(app, [*EST, "-H", "h100-sxm", "--gen", "1"]).stdout
    assert "no decode steps" in table and "TPOT (decode mean)  none" in table


def test_breakdown_says_its_rows_are_totals_over_the_steps():
    out = runner.invoke(app, [*EST, "-H", "h100-sxm", "--gen", "64", "--breakdown"]).stdout
    assert "decode: totals over 63 steps" in out and "prefill: totals over 1 step;" in out


# --- the checkpoint's quantization ------------------------------------------------------

def test_a_quantized_checkpoint_sets_the_default_weights():
    awq = str(HF / "llama-awq.json")
    model = pm.model(awq)
    q = model.quantization
    assert (q.method, q.weights_dtype, q.group_size) == ("awq", "int4", 128)
    data = json.loads(runner.invoke(app, ["estimate", "-m", awq, "-H", "h100-sxm",
                                          "-f", "json"]).stdout)
    wl = data["workload"]
    assert (wl["weights_dtype"], wl["weight_group_size"]) == ("int4", 128)
    assert wl["weight_scale_bytes"] == q.scale_bytes
    assert not any("checkpoint" in w for w in data["warnings"])
    bf16 = json.loads(runner.invoke(app, ["estimate", "-m", awq, "-H", "h100-sxm",
                                          "--weights-dtype", "bf16", "-f", "json"]).stdout)
    counts = param_counts(model)
    linear = sum(getattr(counts, c) for c in LINEAR_CLASSES if c not in q.unquantized)
    assert bf16["weights_bytes"] - data["weights_bytes"] == pytest.approx(
        linear * (2 - q.bytes_per_weight))
    assert any("checkpoint stores int4 weights (awq, groups of 128)" in w
               for w in bf16["warnings"])


def test_workload_for_model_keeps_what_is_given():
    model = pm.model(str(HF / "deepseek-v3-fp8.json"))
    assert pm.Workload.for_model(model).weights_dtype == "fp8"
    assert pm.Workload.for_model(model, weights_dtype="int4",
                                 weight_group_size=64).weight_bytes_per_param == 0.5 + 2 / 64
    assert pm.Workload.for_model(pm.model("llama-2-7b")).weights_dtype == "bf16"


def test_configs_of_one_name_are_told_apart_in_a_sweep(tmp_path):
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        shutil.copy(HF / "llama-gptq.json", tmp_path / folder / "config.json")
    out = tmp_path / "out"
    result = runner.invoke(app, ["sweep", "-m", f"{tmp_path}/a/config.json,{tmp_path}/b/"
                                 "config.json", "-H", "h100-sxm", "--batch", "1",
                                 "--context", "128", "--gen", "4", "--kv-models",
                                 "llama-2-7b", "--no-figures", "--out", str(out)])
    assert result.exit_code == 0, result.output
    names = {line.split(",")[0] for line in (out / "sweep.csv").read_text().splitlines()[1:]}
    assert names == {"Llama-tiny-GPTQ", "Llama-tiny-GPTQ-2"}, names


# --- the Python API -----------------------------------------------------------------------

@pytest.mark.parametrize("args,words", [
    (lambda hw, m: (m, hw), ["argument 'hardware'", "got type Model", "order is"]),
    (lambda hw, m: ("h100-sxm", m), ["got type str", "load it first"]),
    (lambda hw, m: (hw, "llama-2-7b"), ["argument 'model'", "got type str"]),
    (lambda hw, m: (hw, m, {"batch": 2}), ["argument 'workload'", "got type dict"]),
    (lambda hw, m: (hw, m, pm.Workload(), 2), ["argument 'plan'", "got type int"]),
    (lambda hw, m: (hw, m, pm.Workloads.of(batch=[1, 2])), ["price it with estimate_many"]),
])
def test_estimate_names_the_argument_that_is_not_a_record(args, words):
    hw, model = pm.hardware("h100-sxm"), pm.model("llama-2-7b")
    with pytest.raises(pm.SpecError) as err:
        pm.estimate(*args(hw, model))
    text = str(err.value)
    assert "\n" not in text and all(w in text for w in words), text


def test_assumptions_are_per_configuration_in_a_vectorised_call():
    est = pm.estimate_many(pm.hardware("a100-80gb-sxm"), pm.model("llama-2-7b"),
                           pm.Workloads.of(act_dtype=["bf16", "fp8"], weights_dtype="fp8",
                                           gen_len=[1, 8]))
    first, second = est.warnings()
    # W8A16: the matmuls run at bf16, but that the A100 has no fp8 rate is said (issue 33)
    assert "gen_len 1" in first and "fp8 matmuls" not in first
    assert "fp8 weights priced as a weight-only kernel runs them" in first
    assert "lists no fp8 rate: fp8 matmuls" in second and "gen_len" not in second
    assert est.item(1).assumed and tables.flat_record(est.item(1))["warnings"] == second
