"""Per-layer framework glue (Efficiency.layer_overhead_s): golden values, defaults, fitting."""

from dataclasses import replace

import numpy as np
import pytest

import perfmodel as pm
from perfmodel.compare import shape_key
from perfmodel.cost import step as cost
from perfmodel.cost.ops import LayerOverhead
from perfmodel.cost.roofline import op_time
from perfmodel.specs import Parallelism, SpecError, Workload
from perfmodel.specs.dtypes import CODE
from perfmodel.specs.load import HARDWARE_DIR, load_hardware, shipped
from tests.datasheet import datasheet, datasheet_path
from validate.calibrate import fit_layer_overhead
from validate.report import step_seconds
from validate.suites import (
    CALIB_CPU,
    GLUE_CPU,
    SMALL_LLAMA,
    SUITES,
    TINY_LLAMA,
    Step,
    calibration_rows,
    calibration_steps,
    layer_kernel_rows,
    validation_suite,
)

X = 3e-4   # seconds of glue per layer


def _with(hw, **eff):
    return replace(hw, efficiency=replace(hw.efficiency, **eff))


def test_sync_device_adds_exactly_layers_times_overhead(h100):
    """Hand-derived: a sync device with layer_overhead_s = X takes n_layers * X longer per
    step, prefill and every decode step alike; the glue is its own breakdown line."""
    model = pm.model("llama-3-8b")      # 32 layers
    wl = Workload(batch=2, prompt_len=256, gen_len=10)
    sync = _with(h100, launch_mode="sync")
    off, on = pm.estimate(sync, model, wl), pm.estimate(_with(sync, layer_overhead_s=X), model, wl)
    assert on.ttft_s - off.ttft_s == pytest.approx(32 * X, rel=1e-9)
    assert on.decode.first_step_s - off.decode.first_step_s == pytest.approx(32 * X, rel=1e-9)
    assert on.decode.time_s - off.decode.time_s == pytest.approx(9 * 32 * X, rel=1e-9)
    glue = [o for o in on.prefill.ops + on.decode.ops if o.name == "layer_overhead"]
    assert [(o.phase, o.op_class, o.count, o.flops, o.bytes.total, o.bound) for o in glue] == [
        ("prefill", "framework", 32, 0.0, 0.0, "overhead"),
        ("decode", "framework", 32, 0.0, 0.0, "overhead")]
    assert glue[0].time_s == pytest.approx(32 * X) and glue[1].time_s == pytest.approx(9 * 32 * X)
    assert not any(o.name == "layer_overhead" for o in off.prefill.ops + off.decode.ops)


def test_async_device_and_cuda_graphs_add_nothing(h100):
    model, wl = pm.model("llama-3-8b"), Workload(batch=2, prompt_len=256, gen_len=10)
    base = pm.estimate(h100, model, wl)
    est = pm.estimate(_with(h100, layer_overhead_s=X), model, wl)
    assert (est.ttft_s, est.decode.time_s) == (base.ttft_s, base.decode.time_s)
    assert not any(o.name == "layer_overhead" for o in est.prefill.ops + est.decode.ops)
    graphs = Workload(batch=2, prompt_len=256, gen_len=10, cuda_graphs=True)
    sync = _with(h100, launch_mode="sync")
    assert pm.estimate(_with(sync, layer_overhead_s=X), model, graphs).decode.time_s \
        == pm.estimate(sync, model, graphs).decode.time_s


@pytest.mark.parametrize("hw_name", shipped(HARDWARE_DIR))
def test_shipped_hardware_has_no_overhead_and_unchanged_steps(hw_name):
    """Default 0: every shipped device's steps are exactly the sum of their kernels' times."""
    hw = pm.hardware(hw_name)
    assert hw.efficiency.layer_overhead_s == 0.0
    model, step = pm.model("llama-3-8b"), cost.Step.uniform(4, 1, 600)
    for timing in ("stream", "host", "kernel"):
        recs = cost.step_records(model, hw, Parallelism(), step, cost.Dtypes.of(), timing)
        assert recs and all(r.kind != "layer_overhead" for r in recs)
    forced_sync = _with(hw, launch_mode="sync")
    est = pm.estimate(forced_sync, model, Workload(batch=1, prompt_len=64, gen_len=2))
    assert not any(o.op_class == "framework" for o in est.prefill.ops + est.decode.ops)


def test_op_time_of_the_glue_op():
    hw = _with(datasheet("h100-sxm"), layer_overhead_s=X)
    op = LayerOverhead(name="layer_overhead", count=4.0, dtype=CODE["fp32"])
    assert op_time(op, hw, "host").time_s == pytest.approx(4 * X)
    assert op_time(op, hw, "stream").time_s == 0.0 and op_time(op, hw, "kernel").time_s == 0.0


def test_loader_reads_layer_overhead(tmp_path):
    text = (datasheet_path("h100-sxm")).read_text().replace(
        "  kernel_latency_s:", "  layer_overhead_s: 250 us\n  kernel_latency_s:")
    path = tmp_path / "hw.yaml"
    path.write_text(text)
    assert load_hardware(path).efficiency.layer_overhead_s == pytest.approx(2.5e-4)
    path.write_text(text.replace("250 us", "-1 us"))
    with pytest.raises(SpecError, match="layer_overhead_s"):
        load_hardware(path)
    block = "  kernel_latency_by_kind:\n    rms_norm: 4.3 us\n"
    assert block in text
    path.write_text(text.replace(block, "  kernel_latency_by_kind:\n    layer_overhead: 1 us\n"))
    with pytest.raises(SpecError, match="layer_overhead"):
        load_hardware(path)


def _row(step, measured):
    return step.row() | {"measured_s": measured, "timing": "host"}


def _kernel_rows(step, seconds):
    """One measured row per unique shape of ``step``'s operators, each taking ``seconds``."""
    return [r | {"measured_s": seconds} for r in layer_kernel_rows([step])]


def test_fit_is_the_floored_median_of_measured_layer_minus_measured_kernels():
    """Hand-derived: calib-cpu's decode layer lists 11 operators, 12 kernel calls
    (residual_add twice), over 10 unique shapes (both norms share one); every shape measured
    at 100 us -> the layer's kernels take 1.2 ms. Layers measured at 1.2 ms + 0.1 / 0.3 /
    0.9 ms -> glue = median = 0.3 ms, whatever the hardware predicts for those kernels."""
    hw = _with(datasheet("h100-sxm"), launch_mode="sync", layer_overhead_s=1.0)
    steps = [Step("layer", CALIB_CPU, b, 1, 640) for b in (1, 2, 4)]
    assert [len(s.ops()) for s in steps] == [11, 11, 11]
    assert [float(sum(np.sum(op.count) for op in s.ops())) for s in steps] == [12, 12, 12]
    kernels = [r for s in steps for r in _kernel_rows(s, 1e-4)]
    gaps = (1e-4, 3e-4, 9e-4)
    rows = [_row(s, 12e-4 + g) for s, g in zip(steps, gaps, strict=True)]
    # a validation-model row with a huge gap is ignored
    rows.append(_row(Step("layer", TINY_LLAMA, 1, 1, 512), 10.0))
    fitted, record = fit_layer_overhead(rows, hw, kernels)
    assert fitted.efficiency.layer_overhead_s == pytest.approx(3e-4, rel=1e-6)
    assert record["value_s"] == pytest.approx(3e-4, rel=1e-5) and len(record["steps"]) == 3
    assert [st["measured_kernels_s"] for st in record["steps"]] == pytest.approx([12e-4] * 3)
    assert [st["gap_s"] for st in record["steps"]] == pytest.approx(list(gaps))
    assert record["ops_at_predicted_time"] == 0
    assert all(st["predicted_ops"] == [] for st in record["steps"])
    assert len(record["kernel_shapes"]) == 3 * 10   # batch 1, 2, 4: no shape shared
    # layers faster than their kernels: floored at 0
    slower = [_row(s, 5e-4) for s in steps]
    assert fit_layer_overhead(slower, hw, kernels)[0].efficiency.layer_overhead_s == 0.0
    assert fit_layer_overhead([], hw, kernels) == (hw, {})


def test_fit_falls_back_to_predicted_time_for_unmeasured_ops():
    """One layer, every shape measured at 100 us except down_proj: its predicted time (with
    the given hardware) takes its place and the record names it."""
    hw = _with(datasheet("h100-sxm"), launch_mode="sync")
    step = Step("layer", CALIB_CPU, 1, 1, 640)
    down = next(op for op in step.ops() if op.name == "down_proj")
    kernels = [r for r in _kernel_rows(step, 1e-4) if "down_proj" not in r["name"].split("+")]
    assert len(kernels) == 9
    predicted_down = float(np.sum(op_time(down, hw, "host").time_s))
    measured = 11e-4 + predicted_down + 5e-4
    fitted, record = fit_layer_overhead([_row(step, measured)], hw, kernels)
    assert fitted.efficiency.layer_overhead_s == pytest.approx(5e-4, rel=1e-5)
    assert record["ops_at_predicted_time"] == 1
    assert record["steps"][0]["predicted_ops"] == ["down_proj"]
    # no kernel measured at all: every op at its predicted time (the former fit)
    base = step_seconds(step, hw, "host")
    only_predicted = fit_layer_overhead([_row(step, base + 2e-4)], hw)[1]
    assert only_predicted["value_s"] == pytest.approx(2e-4, rel=1e-4)
    assert only_predicted["ops_at_predicted_time"] == 11


def test_calibration_measures_every_layer_kernel_and_no_validation_shape():
    """Every kernel shape of the calibration layers is in the CPU calibration sweep; the
    GEMM and attention shapes it adds for them occur in no validation suite, and the rows
    the efficiency is fitted to (``layers=False``) are the sweep without them."""
    layer_keys = {shape_key(r) for r in layer_kernel_rows(calibration_steps("cpu"))}
    validation = {shape_key(r) for name in SUITES for r in validation_suite(name).kernels}
    for name in SUITES:
        sweep = {shape_key(r) for r in calibration_rows("cpu", name)}
        fit = {shape_key(r) for r in calibration_rows("cpu", name, layers=False)}
        assert layer_keys <= sweep and fit <= sweep
        added = sweep - fit
        assert added and added <= layer_keys
        assert not added & validation
        assert not {k for k in layer_keys if k.startswith(("gemm", "attention"))} & validation
    assert calibration_rows("cuda", "quick") == calibration_rows("cuda", "quick", False)


def test_step_seconds_counts_one_layer_or_all_layers():
    hw = _with(datasheet("h100-sxm"), launch_mode="sync")
    glue = _with(hw, layer_overhead_s=X)
    layer, model = Step("layer", TINY_LLAMA, 1, 1, 512), Step("model", TINY_LLAMA, 1, 1, 512)
    assert step_seconds(layer, glue, "host") - step_seconds(layer, hw, "host") \
        == pytest.approx(X)
    assert step_seconds(model, glue, "host") - step_seconds(model, hw, "host") \
        == pytest.approx(TINY_LLAMA.n_layers * X)
    # the glue is the step's layer_overhead operator: one per layer, host-timed only
    for step, layers in ((layer, 1), (model, TINY_LLAMA.n_layers)):
        last = step.records(glue, "host")[-1]
        assert (last.name, float(np.sum(last.count))) == ("layer_overhead", layers)
        assert [r.name for r in step.records(glue, "stream")] == [r.name for r in step.ops()]
    assert len(layer.records(glue, "host")) == len(layer.ops()) + 1


def test_calibration_steps_use_only_the_calibration_model():
    steps = calibration_steps("cpu")
    assert steps and all(s.model is GLUE_CPU and s.scope == "layer" and s.q_len == 1
                         for s in steps)
    assert sorted(s.batch for s in steps) == [1, 1, 1, 1, 2, 2, 3, 4]
    assert GLUE_CPU.name not in {m.name for m in (TINY_LLAMA, SMALL_LLAMA)}
    assert calibration_steps("cuda") == ()
