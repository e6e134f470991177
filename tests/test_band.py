"""The 80% uncertainty band: the hardware file's per-class kernel band (``uncertainty:``),
combined over a step's operators (``cost.band``) and carried to TTFT, TPOT, E2E, throughput,
the JSON, the table and the serving simulation."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import perfmodel as pm
from perfmodel.cli.app import app
from perfmodel.cost.band import band, class_seconds
from perfmodel.cost.error_class import CODE
from perfmodel.specs.errors import SpecError
from perfmodel.specs.load import load_hardware
from perfmodel.specs.uncertainty import ERROR_CLASSES, Uncertainty
from tests.datasheet import datasheet, datasheet_path

# a device file without an uncertainty: block (the calibrated files carry one)
UNBANDED = str(datasheet_path("h100-sxm"))

runner = CliRunner()
BLOCK = """uncertainty:
  source: "a test band"
  error_q10: {gemm: -0.1, gemv: -0.1, attention_prefill: -0.15, attention_decode: -0.1,
              memory: -0.05, collective: -0.2}
  error_q90: {gemm: 0.2, gemv: 0.1, attention_prefill: 0.15, attention_decode: 0.1,
              memory: 0.05, collective: 0.2}
"""


def _hw(tmp_path: Path, block: str = BLOCK, name: str = "banded") -> Path:
    """h100-sxm's datasheet file (no band of its own) named ``name``, with ``block``."""
    text = datasheet_path("h100-sxm").read_text().replace("name: h100-sxm\n",
                                                          f"name: {name}\n", 1)
    path = tmp_path / f"{name}.yaml"
    path.write_text(f"{text.rstrip()}\n{block}")
    return path


def _classes(**seconds: float) -> np.ndarray:
    out = np.zeros((len(ERROR_CLASSES), 1))
    for name, t in seconds.items():
        out[CODE[name], 0] = t
    return out


def test_two_class_band_by_hand() -> None:
    """A GEMM of 10 ms (q10 -0.1, q90 +0.2) and a memory-bound op of 5 ms (+-0.05).
    GEMM: [10 / 1.2, 10 / 0.9] = [8.3333, 11.1111] ms; memory: [5 / 1.05, 5 / 0.95] =
    [4.7619, 5.2632] ms. Below the centre 15 ms: sqrt(1.6667^2 + 0.2381^2) = 1.6836;
    above: sqrt(1.1111^2 + 0.2632^2) = 1.1418. Band [13.316, 16.142] ms; the linear rule
    (classes correlated too) [15 - 1.9048, 15 + 1.3743] = [13.095, 16.374] ms."""
    unc = Uncertainty("t", {"gemm": -0.1, "memory": -0.05}, {"gemm": 0.2, "memory": 0.05})
    low, high = band(_classes(gemm=10e-3, memory=5e-3), unc)
    assert low[0] == pytest.approx(13.316e-3, abs=1e-6)
    assert high[0] == pytest.approx(16.142e-3, abs=1e-6)
    low, high = band(_classes(gemm=10e-3, memory=5e-3), unc, rule="linear")
    assert low[0] == pytest.approx(13.095e-3, abs=1e-6)
    assert high[0] == pytest.approx(16.374e-3, abs=1e-6)


def test_one_class_is_its_own_band_and_unlisted_classes_are_exact() -> None:
    unc = Uncertainty("t", {"gemm": -0.1}, {"gemm": 0.25})
    low, high = band(_classes(gemm=1.0, memory=0.5), unc)
    assert (low[0], high[0]) == pytest.approx((1.0 / 1.25 + 0.5, 1.0 / 0.9 + 0.5))


def test_a_one_sided_class_moves_the_band_off_the_centre() -> None:
    """Every held-out kernel over-predicted (q10 > 0): the measured time is below the
    estimate, band [1 / 1.3, 1 / 1.1] for a 1 s class alone."""
    unc = Uncertainty("t", {"gemm": 0.1}, {"gemm": 0.3})
    low, high = band(_classes(gemm=1.0), unc)
    assert (low[0], high[0]) == pytest.approx((1 / 1.3, 1 / 1.1))


def test_band_holds_the_centre_and_widens_with_the_quantiles() -> None:
    """Seeded fuzz: q10 <= 0 <= q90 puts the centre inside, never a negative edge; a
    wider quantile never narrows the band; the linear rule is never narrower."""
    rng = np.random.default_rng(7)
    for _ in range(200):
        names = [c for c in ERROR_CLASSES if rng.random() < 0.7] or ["gemm"]
        q10 = {c: -rng.uniform(0, 0.9) for c in names}
        q90 = {c: rng.uniform(0, 2.0) for c in names}
        t = rng.uniform(0, 1, (len(ERROR_CLASSES), 3)) * (rng.random((len(ERROR_CLASSES), 1))
                                                          < 0.8)
        low, high = band(t, Uncertainty("t", q10, q90))
        centre = t.sum(axis=0)
        assert np.all(low >= 0) and np.all(low <= centre + 1e-15)
        assert np.all(high >= centre - 1e-15)
        c = names[0]
        wider = Uncertainty("t", q10 | {c: q10[c] - 0.05}, q90 | {c: q90[c] + 0.1})
        low2, high2 = band(t, wider)
        assert np.all(low2 <= low + 1e-15) and np.all(high2 >= high - 1e-15)
        low3, high3 = band(t, Uncertainty("t", q10, q90), rule="linear")
        assert np.all(low3 <= low + 1e-15) and np.all(high3 >= high - 1e-15)


def test_class_seconds_add_up_to_the_step() -> None:
    hw, m = pm.hardware("h100-sxm"), pm.model("llama-3-8b")
    step = pm.cost.step.Step.uniform([1, 8, 64], [1, 1, 512], [100, 2048, 512])
    cost = pm.cost.step.price_step(m, hw, pm.Parallelism(), step, pm.Dtypes.of())
    per = cost.class_seconds()
    assert per.sum(axis=0) == pytest.approx(cost.time)
    decode, prefill = CODE["attention_decode"], CODE["attention_prefill"]
    assert per[decode, :2].all() and not per[prefill, :2].any()    # one new token each
    assert per[prefill, 2] > 0 and per[decode, 2] == 0
    assert per[CODE["gemv"], 0] > 0 and per[CODE["gemm"], 2] > 0
    assert np.array_equal(class_seconds(cost.time_s, cost.error_codes), per)


def test_no_block_no_band(tmp_path: Path) -> None:
    hw, m = datasheet("h100-sxm"), pm.model("llama-3-8b")
    assert hw.uncertainty is None
    es = pm.estimate_many(hw, m, pm.Workloads.grid(batch=[1, 8]))
    assert es.bands is None and not es.has_band
    assert np.array_equal(es.ttft_s_high, es.ttft_s)       # the planner's edge: the centre
    e = es.item(0)
    assert e.band is None and e.edges("ttft_s") is None
    d = e.to_dict()
    assert d["band"] == "no band: device has no kernel measurements"
    assert not any(k.endswith(("_low", "_high")) for k in d)
    assert "ttft_s_low" not in es.columns()


def test_estimate_band_figures(tmp_path: Path) -> None:
    hw, m = load_hardware(_hw(tmp_path)), pm.model("llama-3-8b")
    w = pm.Workloads.grid(batch=[1, 8, 64], prompt_len=[512, 2048], gen_len=[1, 128])
    es = pm.estimate_many(hw, m, w, pm.Parallelism(tp=2))
    for figure in ("ttft_s", "tpot_s", "e2e_s", "throughput_tokens_per_s",
                   "decode_tokens_per_s"):
        low, high = getattr(es, f"{figure}_low"), getattr(es, f"{figure}_high")
        centre = getattr(es, figure)
        assert np.all(low <= centre) and np.all(centre <= high)
    decode = es.decode_tokens_per_s > 0
    assert np.all(es.ttft_s_low < es.ttft_s) and np.all(es.tpot_s_high[decode] >
                                                        es.tpot_s[decode])
    # throughput's low edge is the time's high edge
    assert es.throughput_tokens_per_s_low == pytest.approx(w.batch * w.gen_len / es.e2e_s_high)
    # one class's error holds over both phases, so E2E's band is at most the sum of theirs
    decode_s = es.e2e_s - es.ttft_s
    _, dec_hi = band(es.phase("decode").class_seconds(), hw.uncertainty)
    assert np.all(es.e2e_s_high - es.e2e_s <= es.ttft_s_high - es.ttft_s + dec_hi - decode_s
                  + 1e-12)
    assert np.all(es.e2e_s_low >= 0)
    # the vectorised arrays and each item agree
    for i in range(len(w)):
        e = es.item(i)
        assert e.edges("e2e_s") == pytest.approx((es.e2e_s_low[i], es.e2e_s_high[i]))
        assert e.to_dict()["tpot_s_high"] == pytest.approx(es.tpot_s_high[i])
    assert "e2e_s_high" in es.columns()


@pytest.mark.parametrize("kind", ["speculation", "pipeline", "diffusion"])
def test_every_schedule_carries_a_band(tmp_path: Path, kind: str) -> None:
    hw = load_hardware(_hw(tmp_path))
    m = pm.model("llama-3-8b")
    kw: dict = {}
    plan = pm.Parallelism()
    if kind == "speculation":
        kw["speculation"] = pm.Speculation(3, [0.8, 0.6, 0.4], "heads")
    elif kind == "pipeline":
        plan = pm.Parallelism(pp=2)
    else:
        kw["diffusion"] = pm.Diffusion(8)
    e = pm.estimate(hw, m, pm.Workload(batch=4, prompt_len=256, gen_len=64), plan, **kw)
    for figure in ("ttft_s", "tpot_s", "e2e_s"):
        low, high = e.edges(figure)
        assert 0 < low < getattr(e, figure) < high


def test_leave_one_device_out_band(tmp_path: Path) -> None:
    text = BLOCK.replace('"a test band"', '"leave-one-device-out, hopper"')
    hw = load_hardware(_hw(tmp_path, text))
    assert hw.uncertainty.family == "hopper"
    e = pm.estimate(hw, pm.model("llama-3-8b"), pm.Workload(batch=2))
    assert "hopper family's leave-one-device-out" in e.band_note
    assert e.band is not None
    assert load_hardware(_hw(tmp_path, BLOCK, "own")).uncertainty.family is None


@pytest.mark.parametrize(("block", "match"), [
    ("uncertainty:\n  source: x\n  error_q10: {gemm: -0.1}\n  error_q90: {gemm: 0.1}\n"
     "  extra: 1\n", r"uncertainty\.extra: unknown field"),
    ("uncertainty:\n  source: x\n  error_q10: {gemm: -0.1, gpu: -0.1}\n"
     "  error_q90: {gemm: 0.1}\n", r"uncertainty\.error_q10\.gpu: unknown error class"),
    ("uncertainty:\n  source: x\n  error_q10: {gemm: 0.2}\n  error_q90: {gemm: 0.1}\n",
     r"uncertainty\.error_q10\.gemm: expected at most error_q90\.gemm"),
    ("uncertainty:\n  source: x\n  error_q10: {gemm: -1.0}\n  error_q90: {gemm: 0.1}\n",
     r"uncertainty\.error_q10\.gemm: expected a number > -1"),
    ("uncertainty:\n  source: x\n  error_q10: {gemm: '8%'}\n  error_q90: {gemm: 0.1}\n",
     r"uncertainty\.error_q10\.gemm: expected a number"),
    ("uncertainty:\n  source: x\n  error_q10: {gemm: -0.1, memory: -0.1}\n"
     "  error_q90: {gemm: 0.1}\n", r"uncertainty\.error_q90\.memory: missing"),
    ("uncertainty:\n  source: x\n  error_q10: {}\n  error_q90: {gemm: 0.1}\n",
     r"uncertainty\.error_q10: expected a mapping"),
    ("uncertainty:\n  error_q10: {gemm: -0.1}\n  error_q90: {gemm: 0.1}\n",
     r"uncertainty\.source: missing required field"),
    ("uncertainty:\n  source: leave-one-device-out\n  error_q10: {gemm: -0.1}\n"
     "  error_q90: {gemm: 0.1}\n", r"uncertainty\.source: expected 'leave-one-device-out, "),
])
def test_loader_errors(tmp_path: Path, block: str, match: str) -> None:
    path = _hw(tmp_path, block)
    with pytest.raises(SpecError, match=match):
        load_hardware(path)
    result = runner.invoke(app, ["estimate", "-m", "llama-3-8b", "-H", str(path)])
    assert result.exit_code == 2
    assert result.output.startswith("error: ") and result.output.count("\n") == 1
    assert "Traceback" not in result.output


def test_record_checks_itself() -> None:
    with pytest.raises(SpecError, match="q10 <= q90"):
        Uncertainty("t", {"gemm": 0.3}, {"gemm": 0.1})
    with pytest.raises(SpecError, match="error class"):
        Uncertainty("t", {"gemm": -0.1}, {"gemm": 0.1, "memory": 0.1})


def test_cli_table_and_json(tmp_path: Path) -> None:
    path = str(_hw(tmp_path))
    args = ["estimate", "-m", "llama-3-8b", "-H", path, "--batch", "8"]
    table = runner.invoke(app, args)
    assert table.exit_code == 0, table.output
    rows = {line.split("  ")[0]: line for line in table.output.splitlines()}
    for row in ("TTFT (prefill)", "TPOT (decode mean)", "end to end", "throughput"):
        assert "(80%: " in rows[row]
    assert rows["band"].endswith("independent across classes")
    out = json.loads(runner.invoke(app, [*args, "-f", "json"]).output)
    for figure in ("ttft_s", "tpot_s", "e2e_s", "throughput_tokens_per_s"):
        assert out[f"{figure}_low"] <= out[figure] <= out[f"{figure}_high"]
    plain = runner.invoke(app, ["estimate", "-m", "llama-3-8b", "-H", UNBANDED]).output
    assert "(80%: " not in plain
    assert plain.count("no band: device has no kernel measurements") == 1


def test_simulation_band(tmp_path: Path) -> None:
    from perfmodel.serving.bands import banded_summary
    from perfmodel.serving.pricing import StepPricer
    from perfmodel.serving.simulate import simulate
    from perfmodel.serving.traffic import generate

    hw, m = load_hardware(_hw(tmp_path)), pm.model("llama-3-8b")
    reqs = generate(40, rate=20.0, input_len=512, output_len=32, seed=1)
    runs = [simulate(m, hw, reqs, edge=edge).summary() for edge in (None, 0, 1)]
    assert runs[1]["e2e_s"]["mean"] < runs[0]["e2e_s"]["mean"] < runs[2]["e2e_s"]["mean"]
    s = banded_summary(*runs, "note")
    for key in ("e2e_s", "ttft_s", "itl_s"):
        assert s[key]["p50_low"] <= s[key]["p50"] <= s[key]["p50_high"]
    assert s["throughput_tokens_per_s_low"] <= s["throughput_tokens_per_s"]
    assert s["band"] == "note"
    with pytest.raises(SpecError, match="no uncertainty: block"):
        StepPricer(m, datasheet("h100-sxm"), pm.Parallelism(), pm.Workload(), None, edge=1)
    result = runner.invoke(app, ["simulate", "-m", "llama-3-8b", "-H", str(_hw(tmp_path)),
                                 "--rate", "20", "--num-requests", "30", "--no-progress",
                                 "-f", "json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert out["e2e_s"]["p50_low"] <= out["e2e_s"]["p50"] <= out["e2e_s"]["p50_high"]
    assert math.isfinite(out["throughput_tokens_per_s_high"])


def test_a_band_in_code() -> None:
    """A Hardware built in Python takes an Uncertainty record as well."""
    hw = replace(pm.hardware("h100-sxm"),
                 uncertainty=Uncertainty("t", {"memory": -0.2}, {"memory": 0.2}))
    e = pm.estimate(hw, pm.model("llama-3-8b"), pm.Workload(batch=1))
    low, high = e.edges("tpot_s")
    assert low < e.tpot_s < high


def test_breakdown_shows_each_operators_band(tmp_path: Path) -> None:
    """An operator's own band is its class's alone: qkv_proj at batch 1 decodes as a GEMV,
    [t / 1.1, t / 0.9]; the breakdown gains the class and band columns only with a band."""
    hw, m = load_hardware(_hw(tmp_path)), pm.model("llama-3-8b")
    e = pm.estimate(hw, m, pm.Workload(batch=1, prompt_len=256, gen_len=8))
    op = next(o for o in e.ops if o.phase == "decode" and o.name == "qkv_proj")
    assert op.error_class == "gemv"
    assert op.band == pytest.approx((op.time_s / 1.1, op.time_s / 0.9))
    assert op.to_dict()["time_s_high"] == pytest.approx(op.time_s / 0.9)
    args = ["estimate", "-m", "llama-3-8b", "--batch", "1", "--breakdown"]
    with_band = runner.invoke(app, [*args, "-H", str(_hw(tmp_path))]).output
    assert "80% band" in with_band and "attention_decode" in with_band
    assert "80% band" not in runner.invoke(app, [*args, "-H", UNBANDED]).output


def test_step_codes_are_error_class_of_each_record() -> None:
    """The codes ``price_step`` carries are ``error_class`` of the records the harness
    times, operator by operator and row by row (an MoE model: gemm, gemv, moe, both
    attention classes, memory)."""
    from perfmodel.cost.error_class import error_class
    from perfmodel.cost.step import Step, price_step, step_records

    hw, m = pm.hardware("h100-sxm"), pm.model("mixtral-8x7b")
    step = Step.uniform([1, 16, 4], [1, 1, 300], [64, 900, 300])
    plan = pm.Parallelism(tp=2)
    cost = price_step(m, hw, plan, step, pm.Dtypes.of())
    row = {n: i for i, n in enumerate(cost.names)}
    seen = set()
    for rec in step_records(m, hw, plan, step, pm.Dtypes.of()):
        want = np.asarray(error_class(rec)).reshape(-1)
        got = np.asarray(ERROR_CLASSES)[cost.error_codes[row[rec.name]]]
        live = cost.count[row[rec.name]] > 0
        assert list(got[live]) == list(np.broadcast_to(want, got.shape)[live]), rec.name
        seen |= set(want.tolist())
    assert {"gemm", "gemv", "moe", "attention_decode", "attention_prefill", "memory"} <= seen


def test_a_configuration_band_does_not_depend_on_its_neighbours() -> None:
    """Bit for bit: a column's class seconds and band are the same priced alone or beside
    others (seeded; 15 operators of 8 classes, numpy's pairwise sum of a lone column would
    add them in another order)."""
    rng = np.random.default_rng(7)
    time_s = rng.uniform(1e-6, 1e-3, (15, 16))
    codes = rng.integers(0, len(ERROR_CLASSES), (15, 1))
    unc = Uncertainty("t", dict.fromkeys(ERROR_CLASSES, -0.1),
                      dict.fromkeys(ERROR_CLASSES, 0.2))
    wide = class_seconds(time_s, codes)
    low, high = band(wide, unc)
    for j in range(16):
        alone = class_seconds(time_s[:, j:j + 1], codes)
        assert np.array_equal(alone[:, 0], wide[:, j])
        lo, hi = band(alone, unc)
        assert lo[0] == low[j] and hi[0] == high[j]
