"""The CUDA branch of calibrate and validate, end to end through the CLI, on a CPU.

No GPU is needed: ``torch.cuda`` is replaced by a fake device (four SMs, 1 MiB of L2, events
timed with ``perf_counter``) whose tensors live on the CPU, and the CUDA sweep and suites
are shrunk to micro shapes. What runs is the code a real GPU would run: device selection,
event timing, the CUDA calibration sweep and fit (async launches, overlapped GEMM
streaming, SMs as compute units), the CUDA validation suite, and the report.
"""

import csv
import math
import time
import types
from dataclasses import replace

import pytest
from typer.testing import CliRunner

import perfmodel as pm
from perfmodel.cli.app import app, load_plugins
from perfmodel.compare import predict_rows, shape_key
from perfmodel.specs import Model
from perfmodel.specs.load import load_hardware
from validate.suites import (
    GPU_2K,
    GPU_5K,
    SUITES,
    SWEEPS,
    Plan,
    Step,
    Sweep,
    calibration_rows,
    validation_suite,
)

runner = CliRunner()
load_plugins(app)       # the harness's commands, through the perfmodel.commands entry point
CAL_MICRO = Model(name="calib-micro", n_layers=1, d_model=64, n_heads=4, n_kv_heads=2,
                  head_dim=16, vocab_size=128, intermediate_size=96)
GPU_MICRO = Model(name="gpu-micro", n_layers=2, d_model=96, n_heads=6, n_kv_heads=2,
                  head_dim=16, vocab_size=256, intermediate_size=160)
MICRO_STEPS = ((1, 8, 8), (2, 1, 24))


class FakeEvent:
    """``torch.cuda.Event`` on the host clock."""

    def __init__(self, enable_timing: bool = False) -> None:
        self.t = 0.0

    def record(self, stream=None) -> None:
        self.t = time.perf_counter()

    def synchronize(self) -> None:
        pass

    def elapsed_time(self, end: "FakeEvent") -> float:
        return (end.t - self.t) * 1e3


@pytest.fixture
def fake_cuda(monkeypatch):
    torch = pytest.importorskip("torch")
    from validate import device, suites
    from validate import runner as run

    props = types.SimpleNamespace(name="Fake GPU", L2_cache_size=2**20,
                                  multi_processor_count=4, total_memory=8 * 2**30)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index=0: props)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *args: None)
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(device.DeviceInfo, "torch_device",
                        property(lambda self: torch.device("cpu")))
    monkeypatch.setattr(run, "KERNEL_BUDGET_S", 0.005)
    monkeypatch.setattr(run, "STEP_BUDGET_S", 0.005)
    monkeypatch.setitem(suites.SWEEPS, "cuda", Sweep(("fp16", "bf16"), (32, 64, 128),
                                                     ((128, 128),), (1, 16), 256))
    monkeypatch.setitem(suites.CALIB_MODELS, "cuda", CAL_MICRO)
    monkeypatch.setitem(suites._CALIB_STEPS, "cuda", [(1, 16, 16), (2, 1, 32)])
    plans = (Plan(GPU_MICRO, MICRO_STEPS, "bf16"),)
    monkeypatch.setitem(suites.VALIDATION, "cuda", {"quick": plans, "full": plans})
    monkeypatch.setitem(suites.MODELS, GPU_MICRO.name, GPU_MICRO)


def test_calibrate_and_validate_on_cuda(tmp_path, fake_cuda):
    yaml_path = tmp_path / "fake-gpu.yaml"
    result = runner.invoke(app, ["calibrate", "--device", "cuda", "--out", str(yaml_path),
                                 "--no-progress", "--passes", "1"])
    assert result.exit_code == 0, result.output
    hw = load_hardware(yaml_path)
    eff, cal = hw.efficiency, hw.calibration
    assert hw.vendor == "nvidia" and hw.compute_units == 4 and hw.l2_bytes == 2**20
    assert set(hw.peak_flops_per_s) == {"fp16", "bf16"}
    assert eff.launch_mode == "async" and eff.gemm_overlap and not eff.parallel_grain_elements
    assert eff.attention_decode_pack_gqa          # FlashAttention's decode, not the CPU's
    assert cal["device"] == "cuda" and cal["timing"] == "stream" and cal["threads"] == 0
    assert cal["device_name"] == "Fake GPU" and "layer_overhead" not in cal
    assert cal["command"].startswith("perfmodel calibrate --device cuda")

    out = tmp_path / "report"
    result = runner.invoke(app, ["validate", "--device", "cuda", "-H", str(yaml_path),
                                 "--out", str(out), "--suite", "full", "--no-progress",
                                 "--no-plots", "--passes", "1"])
    assert result.exit_code == 0, result.output
    with open(out / "predictions.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(validation_suite("full", "cuda").kernels) > 5
    for r in rows:
        assert r["timing"] == "stream" and r["dtype"] == "bf16" and r["model"] == "gpu-micro"
        assert 0 < float(r["predicted_s"]) < math.inf and float(r["measured_s"]) > 0
    with open(out / "step_predictions.csv", newline="") as f:
        steps = list(csv.DictReader(f))
    assert len(steps) == 2 * len(MICRO_STEPS)              # each as a layer and a model step
    assert {s["dtype"] for s in steps} == {"bf16"} and {s["timing"] for s in steps} == {"stream"}
    summary = (out / "summary.md").read_text()
    assert "Fake GPU, 4 SMs" in summary and "timing `stream`" in summary
    assert "Full-suite kernels whose shape" in summary and "--suite full" in summary


def test_cuda_suites_use_calibrated_dtypes_and_unfitted_shapes():
    """Every CUDA validation row is predictable on a calibrated GPU file (peaks only for the
    sweep's dtypes: an fp32 row would have no rate) and none of its shapes is fitted."""
    calibrated = pm.hardware("h100-sxm")
    calibrated = replace(calibrated, peak_flops_per_s={
        d: calibrated.peak(d) for d in SWEEPS["cuda"].dtypes})
    for name in SUITES:
        suite = validation_suite(name, "cuda")
        assert {r["dtype"] for r in suite.kernels} <= set(SWEEPS["cuda"].dtypes)
        assert {s.model for s in suite.steps} == {GPU_2K, GPU_5K}
        fitted = {shape_key(r) for r in calibration_rows("cuda", name)}
        assert not {shape_key(r) for r in suite.kernels} & fitted
        rows = [dict(r, measured_s=1e-3) for r in suite.kernels]
        times = [r["predicted_s"] for r in predict_rows(rows, calibrated, timing="stream")]
        assert all(0 < t < 1 for t in times)
    assert len(validation_suite("full", "cuda").kernels) \
        > len(validation_suite("quick", "cuda").kernels)


def test_gpu_models_run_as_local_layers():
    """The GPU-width models build and run (one bf16 decode layer, on the CPU)."""
    torch = pytest.importorskip("torch")
    from validate.device import open_device
    from validate.runner import step_call

    cpu = open_device("cpu", threads=1)
    model = replace(GPU_2K, vocab_size=256)
    call = step_call(Step("layer", model, 1, 1, 32, "bf16"), cpu)
    out = call(0)
    assert tuple(out.shape) == (1, GPU_2K.d_model) and out.dtype == torch.bfloat16
    assert torch.isfinite(out.float()).all()


@pytest.mark.parametrize("command", [["calibrate", "--out", "gpu.yaml"],
                                     ["validate", "-H", "h100-sxm", "--out", "report"]])
def test_no_cuda_device_is_a_one_line_error(tmp_path, monkeypatch, command):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, [*command, "--device", "cuda", "--no-progress"])
    assert result.exit_code == 2
    lines = [x for x in result.stderr.splitlines() if x.strip()]
    assert lines == ["error: --device cuda: torch sees no CUDA device"]
    assert not (tmp_path / "gpu.yaml").exists()
