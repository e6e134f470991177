"""Figures: the data behind each one, that drawing uses it, and that files come out."""

import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest

import perfmodel as pm
from perfmodel.cost.step import Dtypes, Step, price_step
from perfmodel.report import plots, sweep_plots
from perfmodel.schedules.estimates import estimate
from perfmodel.schedules.sweep import kv_cache_table, max_batch_table, rows, sweep

LLAMA = pm.model("llama-2-13b")


@pytest.fixture(scope="module")
def points_13b(h100):
    return [p for b in (1, 128) for p in plots.roofline_points(LLAMA, h100,
                                                                pm.Workload(batch=b))]


def test_prefill_points_are_the_estimates_operators(h100):
    wl = pm.Workload(batch=4, prompt_len=300, gen_len=40)
    pts = {p["name"]: p for p in plots.roofline_points(LLAMA, h100, wl, ("prefill",))}
    ops = estimate(h100, LLAMA, wl).prefill.ops
    assert set(pts) == {o.name for o in ops}
    for o in ops:
        p = pts[o.name]
        assert p["intensity"] == pytest.approx(o.intensity)
        assert p["flops"] == pytest.approx(o.flops) and p["time_s"] == pytest.approx(o.time_s)
        if o.flops:
            assert p["attained_flops_per_s"] == pytest.approx(o.flops / o.time_s)
        assert p["context"] == 300 and p["new_tokens"] == 300


def test_decode_points_are_one_step_at_the_middle_context(h100):
    wl = pm.Workload(batch=8, prompt_len=512, gen_len=128)
    assert plots.decode_context(wl) == 576
    pts = plots.roofline_points(LLAMA, h100, wl, ("decode",))
    step = price_step(LLAMA, h100, pm.Parallelism(), Step.uniform(8, 1, 576), Dtypes.of())
    order = np.argsort(step.positions).tolist()            # rows in the template's order
    ran = [i for i in order if step.count[i, 0] > 0]
    assert [p["name"] for p in pts] == [step.names[i] for i in ran]
    for p, i in zip(pts, ran, strict=True):
        flops, nbytes, time = (float(a[i, 0]) for a in (step.flops, step.bytes.total,
                                                          step.time_s))
        assert p["flops"] == flops and p["bytes"] == nbytes and p["time_s"] == time
        if nbytes:
            assert p["intensity"] == pytest.approx(flops / nbytes)
        assert p["attained_flops_per_s"] == pytest.approx(flops / time)
        assert p["context"] == 576 and p["phase"] == "decode" and p["new_tokens"] == 1
        assert p["dtype"] == "bf16" and p["batch"] == 8
    assert sum(p["share"] for p in pts) == pytest.approx(1.0)
    hidden = {p["name"] for p in pts if not p["plotted"]}
    assert hidden == {"embed", "kv_cache_write"}            # no FLOPs: not on a roofline


def test_points_under_tensor_parallelism(h100):
    """TP 2: the points are the operators of one device's step, all-reduces included (not
    plotted), and the title says TP; a plan that is not modelled is a SpecError."""
    wl = pm.Workload(batch=4, prompt_len=256, gen_len=32)
    two = pm.Parallelism(tp=2)
    pts = plots.roofline_points(LLAMA, h100, wl, plan=two)
    est = estimate(h100, LLAMA, wl, two)
    prefill = {p["name"]: p for p in pts if p["phase"] == "prefill"}
    assert set(prefill) == {o.name for o in est.prefill.ops}
    assert prefill["all_reduce"]["count"] == 2 * LLAMA.n_layers
    assert not prefill["all_reduce"]["plotted"]
    one = {p["name"]: p for p in plots.roofline_points(LLAMA, h100, wl, ("prefill",))}
    assert prefill["qkv_proj"]["flops"] == pytest.approx(one["qkv_proj"]["flops"] / 2)
    assert "TP 2" in plots.roofline_title(LLAMA, wl, ("prefill", "decode"), two)
    assert "TP" not in plots.roofline_title(LLAMA, wl, ("prefill", "decode"))
    with pytest.raises(pm.SpecError, match="no routed experts"):
        plots.roofline_points(LLAMA, h100, wl, plan=pm.Parallelism(tp=2, ep=2, pp=2))
    with pytest.raises(ValueError, match="prefill or decode"):
        plots.roofline_points(LLAMA, h100, wl, ("verify",))


def test_mla_points_name_each_attention_form():
    """DeepSeek-V3's prefill runs attention in the expanded form, its decode absorbed: the
    points carry the estimate's operator names."""
    h200, ds = pm.hardware("h200-sxm"), pm.model("deepseek-v3")
    wl = pm.Workload(batch=8, prompt_len=100, gen_len=16)
    pts = plots.roofline_points(ds, h200, wl, plan=pm.Parallelism(tp=8))
    names = {ph: {p["name"] for p in pts if p["phase"] == ph} for ph in ("prefill", "decode")}
    assert "attention_expanded" in names["prefill"] and "attention" not in names["prefill"]
    assert {"attention", "q_absorb", "o_absorb"} <= names["decode"]
    est = estimate(h200, ds, wl, pm.Parallelism(tp=8))
    assert names["prefill"] == {o.name for o in est.prefill.ops}


@pytest.mark.parametrize("cuda_graphs", [False, True])
def test_points_time_launches_as_the_estimate_does(h100, cuda_graphs):
    """A sync device (calibrated CPU) adds each host launch and the per-layer glue to the
    step; the figure's points must sum to the estimate's own prefill and decode steps there
    too (they once used the overlapped GPU rule on every device)."""
    sync = replace(h100, efficiency=replace(h100.efficiency, launch_mode="sync",
                                            layer_overhead_s=3e-4))
    wl = pm.Workload(batch=2, prompt_len=64, gen_len=2, cuda_graphs=cuda_graphs)
    est = estimate(sync, LLAMA, wl)      # gen 2: one decode step, at context 65
    assert plots.decode_context(wl) == 65
    for phase, want in (("prefill", est.ttft_s), ("decode", est.tpot_s)):
        pts = plots.roofline_points(LLAMA, sync, wl, (phase,))
        assert sum(p["time_s"] for p in pts) == pytest.approx(want, rel=1e-12)
        assert ("layer_overhead" in {p["name"] for p in pts}) == (phase == "prefill"
                                                                   or not cuda_graphs)


def test_roof_lines_are_peak_and_achievable(h100):
    eff = h100.efficiency
    roofs = plots.roof_lines(h100, ["bf16", "fp8"], 0.1, 1e4)
    assert len(roofs) == 4
    for r in roofs:
        peak = h100.peak(r["dtype"])
        if r["kind"] == "peak":
            assert r["compute_flops_per_s"] == peak
            assert r["bandwidth_bytes_per_s"] == h100.memory_bytes_per_s
            assert r["ridge"] == pytest.approx(h100.ridge_point(r["dtype"]))
            assert r["ridge"] == pytest.approx(peak / h100.memory_bytes_per_s)
        else:
            assert r["compute_flops_per_s"] == pytest.approx(peak * eff.gemm_fraction)
            assert r["bandwidth_bytes_per_s"] == pytest.approx(
                h100.memory_bytes_per_s * eff.memory_fraction)
        assert r["x"] == [0.1, r["ridge"], 1e4]
        assert r["y"][0] == pytest.approx(r["bandwidth_bytes_per_s"] * 0.1)
        assert r["y"][1:] == pytest.approx([r["compute_flops_per_s"]] * 2)
    assert plots.roof_lines(h100, ["bf16"], 1000, 1e4)[0]["x"] == [1000, 1e4]  # knee outside


def test_regimes_of_llama_13b_on_h100(points_13b, h100):
    """Decode at batch 1 and 128 sits on the memory slope left of the ridge; prefill GEMMs
    sit right of it, near the achievable compute roof; nothing beats the achievable roof."""
    ridge = h100.ridge_point("bf16")
    achievable = h100.peak("bf16") * h100.efficiency.gemm_fraction
    bw = h100.memory_bytes_per_s * h100.efficiency.memory_fraction
    for p in points_13b:
        if p["plotted"]:
            assert p["attained_flops_per_s"] <= min(achievable, bw * p["intensity"]) * 1.000001
        if p["kind"] != "gemm" or p["name"] == "lm_head":
            continue
        if p["phase"] == "decode":
            assert p["intensity"] < ridge and p["bound"] == "memory"
            assert p["attained_flops_per_s"] > 0.7 * bw * p["intensity"]
        else:
            assert p["intensity"] > ridge and p["bound"] == "compute"
            assert p["attained_flops_per_s"] > 0.5 * achievable


def _offsets(fig):
    return sorted((float(x), float(y)) for ax in fig.axes for c in ax.collections
                  for x, y in c.get_offsets())


def test_roofline_figure_draws_the_points(points_13b, h100, a100, tmp_path):
    fig = plots.roofline_figure(points_13b, [h100], "t")
    shown = sorted((p["intensity"], p["attained_flops_per_s"]) for p in points_13b
                   if p["plotted"])
    drawn = _offsets(fig)
    assert len(drawn) == len(shown)
    for (x, y), (px, py) in zip(drawn, shown, strict=True):
        assert x == pytest.approx(px) and y == pytest.approx(py)
    two = plots.roofline_points(LLAMA, a100, pm.Workload()) + points_13b
    fig2 = plots.roofline_figure(two, [h100, a100], "two devices")
    assert len([ax for ax in fig2.axes if ax.get_xscale() == "log"]) == 2
    for ext in ("png", "svg"):
        path = tmp_path / f"roof.{ext}"
        fig2.savefig(path)
        assert path.stat().st_size > 10_000
    assert plots.figure_bytes(fig, "png")[:8] == b"\x89PNG\r\n\x1a\n"
    assert b"<svg" in plots.figure_bytes(fig, "svg")[:500]


def test_roof_caption_states_the_numbers(h100):
    text = plots.roof_caption(plots.roof_lines(h100, ["bf16"]))
    assert "989 TFLOP/s" in text and "3.35 TB/s" in text and "ridge (bf16): 295 FLOP/B" in text


def test_sweep_figures_draw_the_rows(h100, tmp_path):
    records = rows(sweep([LLAMA], [h100], [1, 16, 256], [512, 2048]))
    fig = sweep_plots.batch_figure(records)
    lat = fig.axes[0]
    drawn = {tuple(line.get_xydata()[:, 0]) for line in lat.lines
             if len(line.get_xydata()) == 3}
    assert drawn == {(1.0, 16.0, 256.0)}
    tpot = sorted(r["tpot_s"] * 1e3 for r in records if r["workload_prompt_len"] == 512)
    assert any(list(line.get_ydata()) == pytest.approx(tpot) for line in lat.lines)
    ceilings = {r["max_batch"] for r in records}
    vlines = {line.get_xdata()[0] for line in lat.lines if len(set(line.get_xdata())) == 1}
    assert ceilings <= vlines                                # the memory ceiling is marked
    split = [r for r in records if r["workload_batch"] == 16]
    kv = kv_cache_table([LLAMA, pm.model("mistral-7b")], [1024, 8192])
    mb = max_batch_table([LLAMA, pm.model("mistral-7b")], h100, [1024, 8192])
    for name, f in {"batch": fig, "tradeoff": sweep_plots.tradeoff_figure(records),
                    "split": sweep_plots.time_split_figure(split),
                    "kv": sweep_plots.kv_figure(kv, mb)}.items():
        path = tmp_path / f"{name}.png"
        f.savefig(path, dpi=50)
        assert path.stat().st_size > 5_000
    bars = sweep_plots.time_split_figure(split).axes[0].patches   # stacked: class bars per context
    assert sum(b.get_height() for b in bars) == pytest.approx(
        sum(r["ttft_s"] * 1e3 for r in split))


def test_import_stays_light():
    code = ("import sys, perfmodel, perfmodel.report.plots, perfmodel.report.sweep_plots, "
            "perfmodel.report.tables, perfmodel.schedules.sweep, perfmodel.cli.app; "
            "assert 'matplotlib' not in sys.modules, 'matplotlib'; "
            "assert 'pandas' not in sys.modules, 'pandas'")
    subprocess.run([sys.executable, "-c", code], check=True)
