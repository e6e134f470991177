"""Figures: the data behind each one, that drawing uses it, and that files come out."""

import subprocess
import sys
from dataclasses import replace

import pytest

import perfmodel as pm
from perfmodel import plots, sweep_plots
from perfmodel.estimate import estimate, step_times
from perfmodel.sweep import kv_cache_table, max_batch_table, sweep

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
    times = step_times(LLAMA, h100, wl, 1, 576)
    assert [p["name"] for p in pts] == [t.op.name for t in times]
    for p, t in zip(pts, times, strict=True):
        assert p["intensity"] == pytest.approx(t.op.intensity)
        assert p["attained_flops_per_s"] == pytest.approx(t.attained_flops_per_s)
        assert p["context"] == 576 and p["phase"] == "decode"
    assert sum(p["share"] for p in pts) == pytest.approx(1.0)
    hidden = {p["name"] for p in pts if not p["plotted"]}
    assert hidden == {"embed", "kv_cache_write"}            # no FLOPs: not on a roofline


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
    rows = sweep([LLAMA], [h100], [1, 16, 256], [512, 2048])
    fig = sweep_plots.batch_figure(rows)
    lat = fig.axes[0]
    drawn = {tuple(line.get_xydata()[:, 0]) for line in lat.lines
             if len(line.get_xydata()) == 3}
    assert drawn == {(1.0, 16.0, 256.0)}
    tpot = sorted(r["tpot_s"] * 1e3 for r in rows if r["workload_prompt_len"] == 512)
    assert any(list(line.get_ydata()) == pytest.approx(tpot) for line in lat.lines)
    ceilings = {r["max_batch"] for r in rows}
    vlines = {line.get_xdata()[0] for line in lat.lines if len(set(line.get_xdata())) == 1}
    assert ceilings <= vlines                                # the memory ceiling is marked
    split = [r for r in rows if r["workload_batch"] == 16]
    kv = kv_cache_table([LLAMA, pm.model("mistral-7b")], [1024, 8192])
    mb = max_batch_table([LLAMA, pm.model("mistral-7b")], h100, [1024, 8192])
    for name, f in {"batch": fig, "tradeoff": sweep_plots.tradeoff_figure(rows),
                    "split": sweep_plots.time_split_figure(split),
                    "kv": sweep_plots.kv_figure(kv, mb)}.items():
        path = tmp_path / f"{name}.png"
        f.savefig(path, dpi=50)
        assert path.stat().st_size > 5_000
    bars = sweep_plots.time_split_figure(split).axes[0].patches   # stacked: class bars per context
    assert sum(b.get_height() for b in bars) == pytest.approx(
        sum(r["ttft_s"] * 1e3 for r in split))


def test_import_stays_light():
    code = ("import sys, perfmodel, perfmodel.plots, perfmodel.sweep_plots, perfmodel.sweep, "
            "perfmodel.cli; "
            "assert 'matplotlib' not in sys.modules, 'matplotlib'; "
            "assert 'pandas' not in sys.modules, 'pandas'")
    subprocess.run([sys.executable, "-c", code], check=True)
