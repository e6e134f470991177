"""Figures. Data first (pure functions returning plain records), drawing second.

Every ``*_figure`` function returns a ``matplotlib.figure.Figure`` built without pyplot
(no global state, no display backend: works headless); the caller decides where to save it
(``fig.savefig(path)`` or ``figure_bytes``). matplotlib is imported inside the drawing
functions so that ``import perfmodel`` stays light.

Roofline coordinates
--------------------
A point is one operator of one step (all its layers): x = arithmetic intensity
(FLOPs / bytes moved to or from device memory), y = attained FLOP/s (FLOPs / modelled time,
launch and kernel overheads included). Prefill is the one step over the whole prompt;
decode is ONE decode step at the representative context prompt + gen // 2 (the middle of
the generation), not the sum over the generation. Roofs: the memory slope
y = bandwidth * x and one compute ceiling per dtype; "peak" uses the datasheet figures,
"achievable" multiplies them by hw.efficiency.gemm_fraction and memory_fraction (the best
case the model assumes; small shapes get less, which is why points sit below it).
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from perfmodel.cost.step import Dtypes, Step, price_step
from perfmodel.cost.timebase import BOUNDS
from perfmodel.report.palette import class_color
from perfmodel.schedules.assumptions import check_plan
from perfmodel.schedules.static import phase_timing
from perfmodel.specs.dtypes import DTYPES
from perfmodel.specs.hardware import Hardware
from perfmodel.specs.model import Model
from perfmodel.specs.units import fmt_rate
from perfmodel.specs.workload import Parallelism, Workload

if TYPE_CHECKING:
    from matplotlib.figure import Figure

PHASE_MARKERS = {"prefill": "o", "decode": "^"}
DTYPE_COLORS = ("#222222", "#b22222", "#006d6f", "#6a3d9a")
MIN_AREA, AREA_PER_SHARE = 18.0, 900.0     # scatter marker area = MIN + PER * share


def decode_context(wl: Workload) -> int:
    """Representative decode context: prompt + gen // 2 (at least prompt + 1)."""
    return wl.prompt_len + max(1, wl.gen_len // 2)


def roofline_title(model: Model, wl: Workload, phases: Sequence[str],
                   plan: Parallelism | None = None) -> str:
    """Figure title saying what a prefill point and a decode point are."""
    parts = []
    if "prefill" in phases:
        parts.append(f"prefill: one step over the {wl.prompt_len}-token prompt")
    if "decode" in phases:
        parts.append(f"decode: one step at context {decode_context(wl)} "
                     f"(prompt {wl.prompt_len} + gen {wl.gen_len}/2)")
    dt = f"weights {wl.weights_dtype}, activations {wl.act_dtype}, KV {wl.kv_dtype}"
    tp = f", TP {plan.tp}" if plan is not None and plan.tp > 1 else ""
    return f"Roofline of {model.name} ({dt}{tp})\n" + "; ".join(parts)


def roofline_points(model: Model, hw: Hardware, wl: Workload,
                    phases: Sequence[str] = ("prefill", "decode"),
                    plan: Parallelism | None = None) -> list[dict]:
    """One record per operator of one prefill step and/or one decode step (see module doc).

    Fields: device, model, batch, phase, new_tokens, context, name, kind, op_class, dtype,
    count, flops and bytes (all layers), time_s, share (of the step), intensity (FLOP/B),
    attained_flops_per_s, bound, plotted (False for ops with no FLOPs or no memory traffic,
    e.g. embedding gathers, KV writes and collectives, which have no place on a roofline).
    """
    plan = plan or Parallelism()
    check_plan(hw, model, plan)
    shapes = {"prefill": (wl.prompt_len, wl.prompt_len), "decode": (1, decode_context(wl))}
    for phase in phases:
        if phase not in shapes:
            raise ValueError(f"phase must be prefill or decode, got {phase!r}")
    new = [shapes[p][0] for p in phases]
    ctx = [shapes[p][1] for p in phases]
    timing = np.array([phase_timing(hw, p, wl.cuda_graphs) for p in phases])
    dtypes = Dtypes.of(wl.weights_dtype, wl.act_dtype, wl.kv_dtype, wl.weight_group_size,
                       wl.weight_scale_bytes)
    dtypes = dtypes.take([0] * len(phases))
    cost = price_step(model, hw, plan, Step.uniform([wl.batch] * len(phases), new, ctx), dtypes,
                      timing)
    rows = []
    for j, phase in enumerate(phases):
        total = float(cost.time_s[:, j].sum())
        for i in np.argsort(cost.positions).tolist():
            count = float(cost.count[i, j])
            if count == 0:
                continue
            flops, nbytes = float(cost.flops[i, j]), float(cost.bytes.total[i, j])
            time = float(cost.time_s[i, j])
            rows.append({
                "device": hw.name, "model": model.name, "batch": wl.batch, "phase": phase,
                "new_tokens": new[j], "context": ctx[j], "name": cost.names[i],
                "kind": cost.kinds[i], "op_class": cost.classes[i],
                "dtype": DTYPES[int(cost.dtype[i, j])], "count": count,
                "flops": flops, "bytes": nbytes, "time_s": time,
                "share": time / total if total else 0.0,
                "intensity": flops / nbytes if nbytes else float("inf"),
                "attained_flops_per_s": flops / time if time > 0 else 0.0,
                "bound": BOUNDS[int(cost.bound[i, j])],
                "plotted": flops > 0 and nbytes > 0 and cost.kinds[i] != "all_reduce"})
    return rows


def roof_lines(hw: Hardware, dtypes: Sequence[str], x_min: float = 0.1,
               x_max: float = 1e4) -> list[dict]:
    """Peak and achievable roofs per dtype, as polylines over [x_min, x_max] (FLOP/B).

    Fields: device, dtype, kind ("peak" | "achievable"), compute_flops_per_s,
    bandwidth_bytes_per_s, ridge (compute / bandwidth, FLOP/B), x and y (the vertices of
    y = min(compute, bandwidth * x), knee included when inside the range).
    """
    eff = hw.efficiency
    rows = []
    for dtype in dict.fromkeys(dtypes):
        for kind, fc, fm in (("peak", 1.0, 1.0),
                             ("achievable", eff.gemm_fraction, eff.memory_fraction)):
            compute = hw.peak(dtype) * fc
            bandwidth = hw.memory_bytes_per_s * fm
            ridge = compute / bandwidth
            xs = sorted({x_min, x_max} | ({ridge} if x_min < ridge < x_max else set()))
            rows.append({"device": hw.name, "dtype": dtype, "kind": kind,
                         "compute_flops_per_s": compute, "bandwidth_bytes_per_s": bandwidth,
                         "ridge": ridge, "x": xs, "y": [min(compute, bandwidth * x) for x in xs]})
    return rows


_SUPERSCRIPT = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")


def _pow10_ticks(ax: Any) -> None:
    """Decade ticks labelled 10ⁿ in plain unicode (mathtext labels are slow to lay out)."""
    import math

    from matplotlib.ticker import FuncFormatter, LogLocator, NullLocator

    def label(v: float, _pos: object) -> str:
        e = round(math.log10(v)) if v > 0 else 0
        return f"10{str(e).translate(_SUPERSCRIPT)}" if v > 0 and abs(v / 10.0**e - 1) < 1e-9 \
            else ""

    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_locator(LogLocator(base=10))
        axis.set_major_formatter(FuncFormatter(label))
        axis.set_minor_locator(NullLocator())


def new_figure(width: float, height: float) -> Figure:
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), layout="constrained")


def figure_bytes(fig: Figure, fmt: str = "png", dpi: int = 100) -> bytes:
    """The figure encoded as PNG or SVG bytes (for embedding in HTML)."""
    buf = io.BytesIO()
    fig.savefig(buf, format=fmt, dpi=dpi)
    return buf.getvalue()


def _draw_roofs(ax: Any, roofs: list[dict], others: list[dict], dtypes: list[str]) -> None:
    for r in others:
        ax.plot(r["x"], r["y"], color="#bbbbbb", lw=1.0, ls="-" if r["kind"] == "achievable"
                else "--", zorder=1)
    for r in roofs:
        color = DTYPE_COLORS[dtypes.index(r["dtype"]) % len(DTYPE_COLORS)]
        ax.plot(r["x"], r["y"], color=color, lw=1.8 if r["kind"] == "achievable" else 1.2,
                ls="-" if r["kind"] == "achievable" else "--", zorder=2)


def roof_caption(roofs: list[dict]) -> str:
    """The numbers behind the roofs: ceilings per dtype, bandwidths, ridge points."""
    peak = [r for r in roofs if r["kind"] == "peak"]
    ach = [r for r in roofs if r["kind"] == "achievable"]

    def ceilings(rs: list[dict]) -> str:
        return ", ".join(f"{r['dtype']} {fmt_rate(r['compute_flops_per_s'], 'FLOP/s', 3)}"
                         for r in rs)

    lines = [f"peak: {ceilings(peak)}; HBM {fmt_rate(peak[0]['bandwidth_bytes_per_s'], 'B/s', 3)}",
             f"achievable: {ceilings(ach)}; HBM "
             f"{fmt_rate(ach[0]['bandwidth_bytes_per_s'], 'B/s', 3)}"]
    lines += [f"ridge ({r['dtype']}): {r['ridge']:.0f} FLOP/B peak, {a['ridge']:.0f} achievable"
              for r, a in zip(peak, ach, strict=True)]
    return "\n".join(lines)


def _draw_points(ax: Any, pts: list[dict]) -> None:
    pts = sorted(pts, key=lambda p: -p["share"])      # big markers first, small ones on top
    for (phase, cls), group in _groups(pts, ("phase", "op_class")).items():
        ax.scatter([p["intensity"] for p in group], [p["attained_flops_per_s"] for p in group],
                   s=[MIN_AREA + AREA_PER_SHARE * p["share"] for p in group],
                   marker=PHASE_MARKERS[phase], c=class_color(cls),
                   edgecolors="black", linewidths=0.5, alpha=0.85, zorder=4)
    # the same operator at each batch size, joined: how batching moves it along the roof
    for group in _groups(pts, ("phase", "name")).values():
        if len(group) > 1 and group[0]["op_class"] in ("gemm", "attention"):
            group = sorted(group, key=lambda p: p["batch"])
            ax.plot([p["intensity"] for p in group], [p["attained_flops_per_s"] for p in group],
                    color="#999999", lw=0.6, zorder=3)
    batches = sorted({p["batch"] for p in pts})
    for (phase, batch), group in _groups(pts, ("phase", "batch")).items():
        top = max(group, key=lambda p: p["flops"])    # label the FLOP-heaviest op (a GEMM)
        i = batches.index(batch)
        ax.annotate(f"{phase} B={batch}", (top["intensity"], top["attained_flops_per_s"]),
                    xytext=(12, -18 - 13 * i) if phase == "decode" else (0, 14 + 13 * i),
                    ha="left" if phase == "decode" else "center", textcoords="offset points",
                    fontsize=8, fontweight="bold",
                    arrowprops={"arrowstyle": "-", "color": "#555555", "lw": 0.6})


def _groups(rows: list[dict], keys: tuple[str, ...]) -> dict[tuple, list[dict]]:
    out: dict[tuple, list[dict]] = {}
    for r in rows:
        out.setdefault(tuple(r[k] for k in keys), []).append(r)
    return out


def roofline_figure(points: list[dict], hardware: Sequence[Hardware], title: str = "") -> Figure:
    """Log-log roofline, one panel per device (other devices' roofs in grey behind)."""
    from matplotlib.lines import Line2D

    shown = [p for p in points if p["plotted"]]
    dtypes = list(dict.fromkeys(p["dtype"] for p in shown)) or ["bf16"]
    xs = [p["intensity"] for p in shown] or [1.0]
    ridges = [hw.ridge_point(d) for hw in hardware for d in dtypes]
    x_lo, x_hi = min(min(xs), min(ridges)) / 4, max(max(xs), max(ridges)) * 6
    roofs = {hw.name: roof_lines(hw, dtypes, x_lo, x_hi) for hw in hardware}
    y_hi = max(r["compute_flops_per_s"] for rs in roofs.values() for r in rs) * 5
    ys = [p["attained_flops_per_s"] for p in shown if p["attained_flops_per_s"] > 0]
    y_lo = min([*ys, min(hw.memory_bytes_per_s for hw in hardware) * x_lo]) / 3
    n = len(hardware)
    fig = new_figure(5.6 * n + 2.6, 5.4)
    axes = fig.subplots(1, n, sharex=True, sharey=True, squeeze=False)[0]
    for ax, hw in zip(axes, hardware, strict=True):
        ax.set(xscale="log", yscale="log", xlim=(x_lo, x_hi), ylim=(y_lo, y_hi))
        _pow10_ticks(ax)
        others = [r for name, rs in roofs.items() if name != hw.name for r in rs]
        _draw_roofs(ax, roofs[hw.name], others, dtypes)
        ax.text(0.02, 0.98, roof_caption(roofs[hw.name]), transform=ax.transAxes, fontsize=8,
                va="top", ha="left", color="#333333",
                bbox={"boxstyle": "round", "fc": "white", "ec": "#cccccc", "alpha": 0.9})
        ridge = hw.ridge_point(dtypes[0])
        ax.axvline(ridge, color="#666666", ls=":", lw=1, zorder=1)
        ax.annotate(f"ridge {ridge:.0f} FLOP/B\n({dtypes[0]} peak)", (ridge, y_lo),
                    xytext=(4, 6), textcoords="offset points", fontsize=8, color="#444444")
        _draw_points(ax, [p for p in shown if p["device"] == hw.name])
        ax.set_title(f"{hw.name}: {hw.description}" if hw.description else hw.name,
                     fontsize=10)
        ax.set_xlabel("arithmetic intensity (FLOP / byte of device-memory traffic)")
        ax.grid(True, which="major", color="#eeeeee", lw=0.6)
    axes[0].set_ylabel("attained FLOP/s (FLOPs / modelled time)")
    classes = list(dict.fromkeys(p["op_class"] for p in shown))
    phases = list(dict.fromkeys(p["phase"] for p in shown))
    handles = [Line2D([], [], ls="", marker="s", ms=8, color=class_color(c), label=c)
               for c in classes]
    handles += [Line2D([], [], ls="", marker=PHASE_MARKERS[ph], ms=8, mfc="white", mec="black",
                       label=ph) for ph in phases]
    handles += [Line2D([], [], ls="", marker="o", mfc="#cccccc", mec="black", label=f"{s:.0%}",
                       ms=(MIN_AREA + AREA_PER_SHARE * s) ** 0.5) for s in (0.05, 0.2, 0.5)]
    handles += [Line2D([], [], color="black", ls="--", label="peak roof"),
                Line2D([], [], color="black", lw=1.8, label="achievable roof"),
                Line2D([], [], color="#999999", lw=0.6, label="same op across batch")]
    if n > 1:
        handles.append(Line2D([], [], color="#bbbbbb", label="other devices' roofs"))
    hidden = sorted({p["name"] for p in points if not p["plotted"]})
    if hidden:
        handles.append(Line2D([], [], ls="", label="not shown (no FLOPs or\nno memory "
                              "traffic):\n" + ",\n".join(hidden)))
    fig.legend(handles=handles, loc="outside right center", fontsize=8, frameon=False,
               title="colour: op class\nshape: phase\narea: share of step", title_fontsize=8,
               labelspacing=1.0)
    fig.suptitle(title, fontsize=11)
    return fig
