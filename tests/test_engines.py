"""The ``calibration:`` and ``engines:`` blocks of a hardware YAML, and ``--engine``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

import perfmodel as pm
from perfmodel.cli.app import app
from perfmodel.specs.errors import SpecError
from perfmodel.specs.load import load_hardware
from tests.datasheet import datasheet_path

runner = CliRunner()
CAL = {"source": "aiconfigurator-core 0.12.0: systems/data/h100_sxm/*/vllm/0.24.0",
       "engine": "vllm", "engine_version": "0.24.0", "method": "bounded least squares",
       "fitted": ["gemm_fraction", "kernel_latency_by_kind.attention"],
       "rows": {"gemm": 35742, "attention_decode": 1200},
       "held_out_median_abs_error": {"gemm": 0.061, "attention_decode": 0.09}}
SGLANG = {"efficiency": {"gemm_fraction": 0.5, "kernel_latency_by_kind": {"attention": 9e-6}},
          "calibration": {"source": "sglang rows", "engine": "sglang",
                          "engine_version": "0.5.1"}}


def _device(tmp_path: Path, **blocks: object) -> Path:
    """h100-sxm's datasheet file (no engine blocks) with ``blocks`` added (None removes a
    block)."""
    data = yaml.safe_load(datasheet_path("h100-sxm").read_text())
    data["efficiency"]["kernel_latency_by_kind"] = {"attention": 4e-6, "rms_norm": 3e-6}
    for key, value in blocks.items():
        data.pop(key) if value is None else data.__setitem__(key, value)
    path = tmp_path / "gpu.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_an_engine_block_lays_its_efficiency_over_the_top_level_one(tmp_path):
    path = _device(tmp_path, calibration=CAL, engines={"sglang": SGLANG})
    base, sg = load_hardware(path), load_hardware(path, "sglang")
    assert base.engine == "vllm" and not base.engine_warning
    assert base.calibration["engine_version"] == "0.24.0"
    assert sg.engine == "sglang" and not sg.engine_warning
    assert sg.efficiency.gemm_fraction == 0.5
    # a per-kind mapping merges kind by kind; every other key is the top level's
    assert sg.efficiency.kernel_latency_by_kind == {"attention": 9e-6, "rms_norm": 3e-6}
    assert sg.efficiency.memory_fraction == base.efficiency.memory_fraction
    assert sg.calibration == SGLANG["calibration"]
    assert sg.provenance() == {"engine": "sglang", "calibration": {
        "source": "sglang rows", "engine": "sglang", "engine_version": "0.5.1"}}
    # the block priced is the engine's: another engine has no block, so the top level's
    trt = load_hardware(path, "trtllm")
    assert trt.efficiency == base.efficiency and trt.calibration == base.calibration
    assert trt.engine_warning == "h100-sxm has no trtllm calibration: vLLM's kernels priced"


def test_a_shipped_device_without_engine_blocks_warns_once():
    hw = pm.hardware("h100-pcie", engine="sglang")
    assert hw.efficiency == pm.hardware("h100-pcie").efficiency
    assert hw.engine_warning == "h100-pcie has no sglang calibration: vLLM's kernels priced"
    assert hw.provenance() == {"engine": "sglang", "calibration": None}


def test_the_top_level_engine_is_the_calibrations(tmp_path):
    """A file fitted to SGLang's kernels: sglang asks for no warning, vllm gets one."""
    path = _device(tmp_path, calibration=CAL | {"engine": "sglang"})
    assert not load_hardware(path, "sglang").engine_warning
    assert "no vllm calibration: SGLang's kernels priced" in load_hardware(path).engine_warning


def test_a_variant_inherits_its_bases_engines(tmp_path):
    _device(tmp_path, engines={"sglang": SGLANG})
    child = tmp_path / "child.yaml"
    child.write_text("version: 1\nbase: gpu.yaml\nname: child\nengines:\n  trtllm:\n"
                     "    efficiency: {gemm_fraction: 0.7}\n")
    assert load_hardware(child, "sglang").efficiency.gemm_fraction == 0.5
    assert load_hardware(child, "trtllm").efficiency.gemm_fraction == 0.7


@pytest.mark.parametrize(("blocks", "match"), [
    ({"engines": {"sglangg": SGLANG}}, r"engines\.sglangg: expected an engine: .*'sglang'"),
    ({"engines": {"sglang": {"effciency": {}}}},
     r"engines\.sglang: 1 unknown field; did you mean 'efficiency'"),
    ({"engines": {"sglang": {"efficiency": {"gemm_fraction": 2}}}},
     r"engines\.sglang\.efficiency\.gemm_fraction: expected a finite value of at most 1"),
    ({"engines": {"trtllm": {"efficiency": {"gemm_fractoin": 0.5}}}},
     r"engines\.trtllm\.efficiency: 1 unknown field; did you mean 'gemm_fraction'"),
    ({"engines": {"sglang": {"calibration": {"engine": "vllm"}}}},
     r"engines\.sglang\.calibration\.engine: expected sglang"),
    ({"engines": {}}, r"engines: expected at least one engine block"),
    ({"calibration": {"sorce": "x"}}, r"calibration: 1 unknown field.*'source'"),
    ({"calibration": {"engine": "tgi"}}, r"calibration\.engine: expected one of vllm"),
    ({"calibration": {"engine_version": 0.24}}, r"calibration\.engine_version: expected text"),
    ({"calibration": {"rows": {"gemms": 3}}}, r"calibration\.rows\.gemms: expected an error"),
    ({"calibration": {"rows": {"gemm": -3}}}, r"calibration\.rows\.gemm: expected an integer"),
    ({"calibration": {"held_out_median_abs_error": {"gemm": "x"}}},
     r"held_out_median_abs_error\.gemm"),
    ({"calibration": {"fitted": ["gemm_fractoin"]}}, r"calibration\.fitted: .*'gemm_fraction'"),
    ({"calibration": ["x"]}, r"calibration: expected a mapping"),
])
def test_bad_blocks_are_one_line_errors_naming_the_field(tmp_path, blocks, match):
    """Every engine's blocks are checked, whichever engine is asked for."""
    path = _device(tmp_path, **blocks)
    with pytest.raises(SpecError, match=match) as err:
        load_hardware(path)
    assert str(path) in str(err.value) and "\n" not in str(err.value)


def test_an_unknown_engine_is_a_one_line_error():
    with pytest.raises(SpecError, match=r"--engine: expected one of vllm, sglang, trtllm, "
                                        r"got 'sglng'; did you mean 'sglang'"):
        pm.hardware("h100-sxm", engine="sglng")


def test_perfmodel_calibrates_block_still_loads():
    """``perfmodel calibrate``'s provenance (host, threads, fitted values) is a calibration."""
    hw = pm.load_hardware("reports/cpu/hardware.yaml")
    assert hw.calibration["threads"] == 2 and hw.calibration["fit_shapes"]


def test_estimate_engine_option_warns_and_json_carries_it(tmp_path):
    base = ["estimate", "-m", "llama-3-8b", "-H", "h100-pcie", "--gen", "4"]
    result = runner.invoke(app, [*base, "--engine", "sglang"])
    assert result.exit_code == 0, result.output
    assert "h100-pcie has no sglang calibration: vLLM's kernels priced" in result.output
    path = _device(tmp_path, calibration=CAL, engines={"sglang": SGLANG})
    result = runner.invoke(app, [*base[:4], str(path), "--gen", "4", "--engine", "sglang",
                                 "-f", "json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert out["engine"] == "sglang" and out["calibration"]["engine_version"] == "0.5.1"
    assert not any("calibration" in w for w in out["warnings"])
    plain = json.loads(runner.invoke(app, [*base[:4], str(path), "--gen", "4", "-f",
                                           "json"]).output)
    assert plain["engine"] == "vllm" and plain["calibration"]["source"] == CAL["source"]
    assert out["tpot_s"] > plain["tpot_s"]       # a slower GEMM fraction


def test_bad_engine_option_is_exit_2():
    result = runner.invoke(app, ["estimate", "-m", "llama-3-8b", "-H", "h100-sxm",
                                 "--engine", "tgi"])
    assert result.exit_code == 2 and "--engine" in result.output


@pytest.mark.parametrize(("args", "extra"), [
    (["roofline", "-m", "llama-3-8b", "-H", "h100-pcie,a100-80gb-pcie", "--batch", "1"],
     ["--out", "r.png"]),
    (["sweep", "-m", "llama-3-8b", "-H", "h100-pcie", "--batch", "1", "--context", "128",
      "--gen", "2", "--no-figures"], ["--out", "s"]),
])
def test_figure_commands_take_engine_and_warn_once_per_device(tmp_path, args, extra):
    result = runner.invoke(app, [*args, extra[0], str(tmp_path / extra[1]),
                                 "--engine", "trtllm"])
    assert result.exit_code == 0, result.output
    assert result.output.count("has no trtllm calibration: vLLM's kernels priced") == \
        args[4].count(",") + 1


def test_compare_serving_prices_each_run_with_its_engine_column():
    from perfmodel.compare.serving import _kernels

    assert _kernels({"engine": "vLLM (AsyncLLM in-process)"}) == ("vllm", [])
    assert _kernels({"engine": "SGLang"}) == ("sglang", [])
    assert _kernels({"engine": "TensorRT-LLM"}) == ("trtllm", [])
    name, notes = _kernels({"engine": "tgi"})
    assert name == "vllm" and "'tgi' not known" in notes[0]


def test_harness_compare_prices_the_engine_asked_for(tmp_path):
    """``compare --engine``: another engine's efficiency block prices every row; a device
    without one warns once on stderr and prices its own figures."""
    from perfmodel.cli.app import load_plugins

    load_plugins(app)
    csv = tmp_path / "m.csv"
    csv.write_text("device,source,model,tp,op,dtype,m,n,k,batch,q_len,kv_len,n_heads,"
                   "n_kv_heads,head_dim,measured_s,measured_std_s\n"
                   "h100,t,m-a,1,gemm,bf16,4096,4096,4096,,,,,,,0.0002,\n")
    path = _device(tmp_path, engines={"sglang": SGLANG})
    out = {}
    for engine in ("vllm", "sglang"):
        result = runner.invoke(app, ["compare", str(csv), "-H", str(path), "--any-device",
                                     "--engine", engine, "--out",
                                     str(tmp_path / f"{engine}.csv")])
        assert result.exit_code == 0, result.output
        out[engine] = _predicted(tmp_path / f"{engine}.csv")
    assert out["sglang"] > out["vllm"]        # gemm_fraction 0.5 against the file's own
    result = runner.invoke(app, ["compare", str(csv), "-H", "h100-pcie", "--engine", "trtllm",
                                 "--any-device"])
    assert result.exit_code == 0, result.output
    assert result.output.count("h100-pcie has no trtllm calibration") == 1


def _predicted(path: Path) -> float:
    import csv as csv_module

    return float(next(csv_module.DictReader(path.open()))["predicted_s"])
