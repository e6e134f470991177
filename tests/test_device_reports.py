"""The lent-GPU measurements (reports/h200, reports/h100) and their analysis
(reports/device/analyse.py): the committed CSVs read through ``perfmodel.compare`` and the
harness's step records, and the analysis prices a few rows as the model's own constructors
would (CPU only, no torch)."""

from __future__ import annotations

import math

import numpy as np
import pytest

import perfmodel as pm
from perfmodel.compare import SUPPORTED_OPS, drop_unsupported, read_measurements
from perfmodel.cost.roofline import op_time
from perfmodel.specs.dtypes import CODE
from reports.device.analyse import (
    DEVICES,
    STEP_PRICING,
    analyse,
    family,
    probe_record,
    probe_table,
    read_steps,
)
from reports.device.write import write_readme
from tests.datasheet import datasheet
from validate.suites import Step

H200 = datasheet("h200-sxm")    # the hand derivations name its datasheet constants


@pytest.mark.parametrize("dev", DEVICES, ids=lambda d: d.key)
def test_probe_csv_reads_through_compare(dev):
    """295 kernels; every op but the fp8 quantization pass (40 rows, no model operator) is
    one compare predicts, and every row has a family or is that pass."""
    rows = read_measurements(dev.path("probe.csv"))
    assert len(rows) == 295
    kept, notes = drop_unsupported(rows)
    assert len(kept) == 255 and {r["op"] for r in kept} <= set(SUPPORTED_OPS)
    assert notes == ["skipped 40 rows of op 'quant_act' (first at row 99): no formula for it"]
    assert all((family(r) is None) == (r["op"] == "quant_act") for r in rows)


@pytest.mark.parametrize("dev", DEVICES, ids=lambda d: d.key)
def test_steps_csv_rows_are_harness_steps(dev):
    """26 steps of two shipped models, each a ``Step`` the harness prices, each measured
    as one of the pricings the analysis knows."""
    rows = read_steps(dev.path("steps.csv"))
    assert len(rows) == 26
    models = {name: pm.model(name) for name in ("llama-3-8b", "llama-2-13b")}
    for row in rows:
        step = Step.from_row(row, models)
        assert step.phase == row["phase"] and float(row["measured_s"]) > 0
        assert (row["phase"], row["timing"]) in STEP_PRICING


def test_int4_probe_row_is_the_model_weight_only_gemm():
    """tinygemm's int4 with a bf16 scale and a bf16 zero per 128 weights: 0.5 + 4 / 128 bytes
    per weight, converted in the kernel at bf16. On h200-sxm, 1 x 4096 x 4096 by hand: the
    weights and 2 x 4096 x 2 bytes of activations at 0.88 x 4.8 TB/s, plus tinygemm's
    conversion without overlap (4096^2 x 2 slots at 132 SMs x 128 x 1.98 GHz), plus twice
    the 2 us fixed cost (the model splits this GEMM over k)."""
    row = {"op": "gemm", "dtype": "bf16", "m": "1", "n": "4096", "k": "4096",
           "weight_dtype": "int4", "group_size": "128", "kernel": "aten._weight_int4pack_mm"}
    rec = probe_record(row)
    assert float(rec.weight_bytes) == 0.5 + 4 / 128
    assert int(rec.weight_dtype) == CODE["int4"] and rec.dtype_name(0) == "bf16"
    nbytes = 4096 * 4096 * (0.5 + 4 / 128) + 2 * 4096 * 2
    convert = 4096 * 4096 * 2.0 / (132 * 128 * 1.98e9)
    want = nbytes / (4.8e12 * 0.88) + convert + 2 * 2e-6
    assert float(op_time(rec, H200, "stream").time_s[0]) == pytest.approx(want, rel=1e-9)


def test_int8_and_fp8_rows():
    """int8 weight-only: one byte per weight (a per-row scale is negligible), bf16 compute;
    W8A8 fp8: the row's own fp8 GEMM, untouched."""
    base = {"op": "gemm", "m": "8", "n": "4096", "k": "14336"}
    int8 = probe_record(base | {"dtype": "bf16", "weight_dtype": "int8", "group_size": ""})
    assert float(int8.weight_bytes) == 1.0 and int8.dtype_name(0) == "bf16"
    assert int(int8.weight_dtype) == CODE["int8"]
    fp8 = probe_record(base | {"dtype": "fp8", "weight_dtype": ""})
    assert fp8.dtype_name(0) == "fp8" and int(np.ravel(fp8.weight_dtype)[0]) == -1


def test_fp8_with_its_quantization_pass():
    """The model has no quantization operator: W8A8 + pass is the GEMM's prediction against
    the two measured times added."""
    gemm = {"op": "gemm", "dtype": "fp8", "m": "4", "n": "4096", "k": "4096",
            "measured_s": "2e-5", "kernel": "torch._scaled_mm"}
    quant = {"op": "quant_act", "dtype": "bf16", "m": "4", "n": "4096", "measured_s": "5e-5",
             "kernel": "quant_act_fp8"}
    table = probe_table([gemm, quant], {"shipped": H200})
    alone, both, pass_ = (next(r for r in table if r["family"] == f) for f in (
        "fp8 W8A8 GEMM (_scaled_mm)", "fp8 W8A8 + quant pass", "fp8 quant pass alone (eager)"))
    assert both["measured_s"] == pytest.approx(7e-5)
    assert both["shipped"] == alone["shipped"] > 0
    assert math.isnan(pass_["shipped"])


def test_analysis_of_the_first_rows():
    """The first rows of each file: the launch rows priced as measured (eager: host, with the
    launch; graph replay: kernel, without), every prediction finite and positive, and one
    step row per pricing of each measured step."""
    for dev in DEVICES:
        res = analyse(dev, limit=4)
        eager, graph = res["probe"][0], res["probe"][1]
        assert (eager["family"], graph["family"]) == ("launch: eager add_",
                                                      "launch: graph replay")
        for name, hw in res["files"].items():
            assert eager[name] - graph[name] == pytest.approx(
                hw.efficiency.launch_overhead_s, rel=1e-6)
        assert all(r[n] > 0 and math.isfinite(r[n]) for r in res["probe"] + res["steps"]
                   for n in res["files"])
        steps = read_steps(dev.path("steps.csv"))[:4]
        assert len(res["steps"]) == sum(len(STEP_PRICING[(r["phase"], r["timing"])])
                                        for r in steps)


def test_readme_writes_from_a_few_rows():
    text = write_readme([analyse(dev, limit=8) for dev in DEVICES])
    for heading in ("## Findings", "## Kernel families, all sizes", "## Whole steps: summary",
                    "## Constants: shipped against calibrated, H100 against H200"):
        assert heading in text


@pytest.mark.slow
def test_committed_report_is_current():
    """reports/device/README.md is what ``python -m reports.device.analyse`` writes now."""
    from reports.device.analyse import HERE

    text = write_readme([analyse(dev) for dev in DEVICES])
    assert (HERE / "README.md").read_text() == text
