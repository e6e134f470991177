"""The ``dequant`` row: the seconds weight-only GEMMs' in-kernel conversion adds to a step,
split off the GEMM rows in --breakdown, the JSON, the sweep's class columns and the report's
levers (cost.dequant's docstring)."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from typer.testing import CliRunner

import perfmodel as pm
from perfmodel.cli.app import app
from perfmodel.cost.ops import Gemm
from perfmodel.cost.roofline import op_time
from perfmodel.report.levers import lever_lines
from perfmodel.schedules.sweep import sweep
from perfmodel.specs.dtypes import CODE, weight_bytes
from perfmodel.specs.kinds import OP_CLASSES
from tests.datasheet import datasheet

H100 = datasheet("h100-sxm")
NO_DEQUANT = dataclasses.replace(H100, efficiency=dataclasses.replace(H100.efficiency,
                                                                      dequant={}))
LLAMA = pm.model("llama-3-8b")
BF16, INT4, INT8, FP8 = CODE["bf16"], CODE["int4"], CODE["int8"], CODE["fp8"]
# H100 SXM: 132 SMs x 128 ALU slots per clock x 1.98 GHz; 989.4 TFLOP/s bf16 x 0.8; 3.35 TB/s
# x 0.9; GEMM tiles 128 x 256, k-depth ramp k / (k + 128)
ALU = 132 * 128 * 1.98e9
BW = 3.35e12 * 0.9


def _gemm(wdtype: int, m: float, group: int = 0, n: float = 4096, k: float = 4096) -> Gemm:
    return Gemm(m=m, n=n, k=k, weight_bytes=float(weight_bytes(wdtype, group)),
                act_bytes=2.0, dtype=BF16, weight_dtype=wdtype)


# --- one GEMM, by hand ---------------------------------------------------------------------

@pytest.mark.parametrize("timing", ["kernel", "stream", "host"])
def test_int4_gemv_row_is_the_whole_conversion(timing):
    """tinygemm converts without overlap, so the row is all of it: 4096 x 4096 weights x
    ceil(1 / 128) tiles x 2.0 slots / the ALU rate = 1.00300 us, whatever the launch rule
    (the device time, 2.96 us of stream + 4 us of fixed cost, outlasts the 2.4 us launch)."""
    t = op_time(_gemm(INT4, 1, group=64), H100, timing)
    assert float(t.dequant_s) == pytest.approx(4096 * 4096 * 2.0 / ALU, rel=1e-12)
    assert float(t.dequant_s) == pytest.approx(1.00300e-6, rel=1e-4)
    bare = op_time(_gemm(INT4, 1, group=64), NO_DEQUANT, timing)
    assert float(t.time_s - t.dequant_s) == pytest.approx(float(bare.time_s), rel=1e-12)


def test_overlapped_fp8_row_is_what_outlasts_the_tensor_cores():
    """Triton's fp8 kernel overlaps: the row is max(c, m, d) - max(c, m). At m = 1024:
    d = 4096^2 x ceil(1024 / 128) x 12 slots / ALU = 48.15 us; tensor cores: 2 x 1024 x
    4096^2 FLOP at 989.4e12 x 0.8 x wave 128/132 (8 x 16 tiles on 132 SMs) x ramp 4096/4224
    = 46.17 us; the stream (16.8 MB of weights, 2 x 8.4 MB of activations) 11.13 us."""
    d = 4096 * 4096 * 8 * 12 / ALU
    c = 2 * 1024 * 4096 * 4096 / (989.4e12 * 0.8 * (128 / 132) * (4096 / 4224))
    m = (4096 * 4096 * 1.0 + 2 * 1024 * 4096 * 2.0) / BW
    assert (d, c, m) == pytest.approx((48.15e-6, 46.17e-6, 11.13e-6), rel=1e-3)
    t = op_time(_gemm(FP8, 1024), H100, "kernel")
    assert float(t.dequant_s) == pytest.approx(d - max(c, m), rel=1e-9)


def test_hidden_conversion_is_a_zero_row_and_bf16_has_none():
    """int8 at batch 1 hides its 8 slots per weight under the 1-byte weight stream."""
    assert float(op_time(_gemm(INT8, 1), H100, "kernel").dequant_s) == 0.0
    assert float(op_time(_gemm(BF16, 1), H100, "kernel").dequant_s) == 0.0


# --- through the estimate ------------------------------------------------------------------

def _est(hw=H100, plan=None, spec=None, **fields):
    wl = pm.Workload(batch=4, prompt_len=700, gen_len=40, **fields)
    return pm.estimate(hw, LLAMA, wl, plan, spec)


INT4_G64 = {"weights_dtype": "int4", "weight_group_size": 64}


def test_row_is_what_the_conversion_adds_and_gemm_rows_are_the_bare_gemms():
    """Per phase, the dequant row is the time with the conversion less the time without it
    (the same device with no dequant kernel listed), and every GEMM row is the GEMM without
    it: the totals are the GEMMs' whole times."""
    with_dq, bare = _est(**INT4_G64), _est(NO_DEQUANT, **INT4_G64)
    for name in ("prefill", "decode"):
        a, b = with_dq.phase(name), bare.phase(name)
        row = [o for o in a.ops if o.name == "dequant"]
        assert len(row) == 1 and row[0].op_class == "dequant" and row[0].time_s > 0
        assert row[0].time_s == pytest.approx(a.time_s - b.time_s, rel=1e-9)
        assert a.dequant_s == row[0].time_s
        theirs = {o.name: o.time_s for o in b.ops}
        for o in a.ops:
            if o.name != "dequant":
                assert o.time_s == pytest.approx(theirs[o.name], rel=1e-9), o.name
        assert not any(o.name == "dequant" for o in b.ops)


@pytest.mark.parametrize("case", ["int4", "int8", "fp8", "pp", "speculation", "moe"])
def test_rows_add_up_to_the_phase(case):
    spec, plan, model, fields = None, None, LLAMA, dict(INT4_G64)
    if case in ("int8", "fp8"):
        fields = {"weights_dtype": case}
    elif case == "pp":
        plan = pm.Parallelism(tp=2, pp=2)
    elif case == "speculation":
        spec = pm.Speculation(3, [0.8, 0.6, 0.4], "heads")
    if case == "moe":
        model = pm.model("mixtral-8x7b")
        e = pm.estimate(H100, model, pm.Workload(batch=16, prompt_len=300, gen_len=20,
                                                 **fields), pm.Parallelism(tp=2))
    else:
        e = _est(plan=plan, spec=spec, **fields)
    for p in e.phases:
        assert sum(o.time_s for o in p.ops) == pytest.approx(p.time_s, rel=1e-12)
        (row,) = [o for o in p.ops if o.name == "dequant"]
        assert row.time_s >= 0 and row.time_s == p.dequant_s
    assert sum(o.time_s for o in e.ops) == pytest.approx(e.e2e_s, rel=1e-12)


@pytest.mark.parametrize("hw, fields", [(H100, {}), (pm.hardware("tpu-v5e"), INT4_G64)])
def test_no_row_where_nothing_is_converted(hw, fields):
    """bf16 weights, or a device whose file lists no conversion kernel: no dequant row,
    and the phases' dequant seconds are 0."""
    e = _est(hw, **fields)
    assert not any(o.kind == "dequant" for o in e.ops)
    assert all(p.dequant_s == 0.0 and p.to_dict()["dequant_s"] == 0.0 for p in e.phases)
    assert not any("converted" in line for line in lever_lines(e))


def test_sweep_splits_the_row_off_the_gemm_class():
    """The sweep's class columns: tpot_dequant_s is the decode row per step, and the classes
    still add up to TTFT and TPOT; bf16 points have 0 there."""
    cols = sweep([LLAMA], [H100], [4], [700], pm.Workload(gen_len=40),
                 weights_dtypes=["bf16", "int4"])
    one = _est(weights_dtype="int4")
    i = list(cols["workload_weights_dtype"]).index("int4")
    assert cols["tpot_dequant_s"][i] == pytest.approx(one.decode.dequant_s / 39, rel=1e-12)
    assert cols["ttft_dequant_s"][i] == pytest.approx(one.prefill.dequant_s, rel=1e-12)
    assert cols["decode_dequant_s"][i] == pytest.approx(one.decode.dequant_s, rel=1e-12)
    assert cols["tpot_dequant_s"][1 - i] == cols["ttft_dequant_s"][1 - i] == 0.0
    for j in range(2):
        assert sum(cols[f"ttft_{c}_s"][j] for c in OP_CLASSES) == \
            pytest.approx(cols["ttft_s"][j], rel=1e-12)
        assert sum(cols[f"tpot_{c}_s"][j] for c in OP_CLASSES) == \
            pytest.approx(cols["tpot_s"][j], rel=1e-12)


def test_report_lever_line_names_the_row():
    e = _est(**INT4_G64)
    (line,) = [x for x in lever_lines(e) if x.startswith("Weight-only int4")]
    assert "dequant row" in line and "in prefill" in line and "in decode" in line
    share = (e.prefill.dequant_s + e.decode.dequant_s) / e.e2e_s
    assert f"({share:.1%} of the request)" in line


def test_cli_breakdown_and_json():
    base = ["estimate", "-m", "llama-3-8b", "-H", "h100-sxm", "--weights-dtype", "int4",
            "--group-size", "64", "--breakdown"]
    runner = CliRunner()
    text = runner.invoke(app, base)
    assert text.exit_code == 0, text.output
    rows = [line.split() for line in text.output.splitlines()]
    assert [r[:3] for r in rows if r[1:2] == ["dequant"]] == [
        ["prefill", "dequant", "dequant"], ["decode", "dequant", "dequant"]]
    assert "The dequant row is the time" in text.output
    done = runner.invoke(app, [*base, "-f", "json"])
    assert done.exit_code == 0, done.output
    data = json.loads(done.stdout)          # strict JSON: no Infinity for the row
    dq = {o["phase"]: o for o in data["operators"] if o["kind"] == "dequant"}
    for phase in ("prefill", "decode"):
        assert dq[phase]["time_s"] == data[phase]["dequant_s"] > 0
        assert dq[phase]["intensity"] == 0.0
        ops = [o["time_s"] for o in data["operators"] if o["phase"] == phase]
        assert sum(ops) == pytest.approx(data[phase]["time_s"], rel=1e-12)
    assert np.isfinite([o["intensity"] for o in data["operators"]]).all()
