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

from perfmodel.estimate import phase_timing, step_times
from perfmodel.specs import Hardware, Model, Workload
from perfmodel.units import fmt_rate

if TYPE_CHECKING:
    from matplotlib.figure import Figure

CLASS_COLORS = {"gemm": "#1f77b4", "attention": "#ff7f0e", "norm": "#2ca02c",
                "activation": "#d62728", "elementwise": "#9467bd", "embedding": "#8c564b",
                "communication": "#7f7f7f"}
PHASE_MARKERS = {"prefill": "o", "decode": "^"}
DTYPE_COLORS = ("#222222", "#b22222", "#006d6f", "#6a3d9a")
MIN_AREA, AREA_PER_SHARE = 18.0, 900.0     # scatter marker area = MIN + PER * share


def decode_context(wl: Workload) -> int:
    """Representative decode context: prompt + gen // 2 (at least prompt + 1)."""
    return wl.prompt_len + max(1, wl.gen_len // 2)


def roofline_title(model: Model, wl: Workload, phases: Sequence[str]) -> str:
    """Figure title saying what a prefill point and a decode point are."""
    parts = []
    if "prefill" in phases:
        parts.append(f"prefill: one step over the {wl.prompt_len}-token prompt")
    if "decode" in phases:
        parts.append(f"decode: one step at context {decode_context(wl)} "
                     f"(prompt {wl.prompt_len} + gen {wl.gen_len}/2)")
    dt = f"weights {wl.weights_dtype}, activations {wl.act_dtype}, KV {wl.kv_dtype}"
    tp = f", TP {wl.tp}" if wl.tp > 1 else ""
    return f"Roofline of {model.name} ({dt}{tp})\n" + "; ".join(parts)


def roofline_points(model: Model, hw: Hardware, wl: Workload,
                    phases: Sequence[str] = ("prefill", "decode")) -> list[dict]:
    """One record per operator of one prefill step and/or one decode step (see module doc).

    Fields: device, model, batch, phase, new_tokens, context, name, kind, op_class, dtype,
    count, flops and bytes (all layers), time_s, share (of the step), intensity (FLOP/B),
    attained_flops_per_s, bound, plotted (False for ops with no FLOPs or no memory traffic,
    e.g. embedding gathers, KV writes and collectives, which have no place on a roofline).
    """
    rows = []
    for phase in phases:
        timing = phase_timing(hw, wl, phase)
        new, ctx = (wl.prompt_len, wl.prompt_len) if phase == "prefill" \
            else (1, decode_context(wl))
        times = step_times(model, hw, wl, new, ctx, timing)
        total = sum(t.time_s for t in times)
        for t in times:
            op = t.op
            nbytes = op.bytes.total
            rows.append({
                "device": hw.name, "model": model.name, "batch": wl.batch, "phase": phase,
                "new_tokens": new, "context": ctx, "name": op.name, "kind": op.kind,
                "op_class": op.op_class, "dtype": op.dtype, "count": op.count,
                "flops": op.flops * op.count, "bytes": nbytes * op.count, "time_s": t.time_s,
                "share": t.time_s / total if total else 0.0, "intensity": op.intensity,
                "attained_flops_per_s": t.attained_flops_per_s, "bound": t.bound,
                "plotted": op.flops > 0 and nbytes > 0 and op.kind != "all_reduce"})
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


def _new_figure(width: float, height: float) -> Figure:
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
                   marker=PHASE_MARKERS[phase], c=CLASS_COLORS.get(cls, "#000000"),
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
    fig = _new_figure(5.6 * n + 2.6, 5.4)
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
    handles = [Line2D([], [], ls="", marker="s", ms=8, color=CLASS_COLORS.get(c, "k"), label=c)
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


# --- sweep figures ------------------------------------------------------------------------

def _series_colors(n: int) -> list[str]:
    palette = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2",
               "#17becf", "#7f7f7f", "#bcbd22")
    return [palette[i % len(palette)] for i in range(n)]


def _log_ticks(ax: Any, axis: str = "both") -> None:
    """Plain numbers (1, 2, 5, 10, 20, ...) on log axes, including short ranges."""
    from matplotlib.ticker import LogLocator, StrMethodFormatter

    for a in ([ax.xaxis, ax.yaxis] if axis == "both" else [getattr(ax, f"{axis}axis")]):
        a.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        a.set_major_formatter(StrMethodFormatter("{x:,.4g}"))
        a.set_minor_formatter(StrMethodFormatter(""))


def _fits_split(rows: list[dict], x: str, y: str) -> tuple[list, list, list, list]:
    fit = [r for r in rows if r["fits"]]
    over = [r for r in rows if not r["fits"]]
    return [r[x] for r in fit], [r[y] for r in fit], [r[x] for r in over], [r[y] for r in over]


def batch_figure(rows: list[dict], title: str = "") -> Figure:
    """Per-token latency (TPOT) and decode throughput against batch, one line per series;
    the batch ceiling (max_batch, memory) as a dashed vertical line; points that do not fit
    in memory hollow."""
    from matplotlib.lines import Line2D

    from perfmodel.sweep import series

    groups = series(rows, exclude=("workload_batch",))
    fig = _new_figure(12.5, 4.8)
    ax_lat, ax_thr = fig.subplots(1, 2)
    for (label, rs), color in zip(groups.items(), _series_colors(len(groups)), strict=True):
        rs = sorted(rs, key=lambda r: r["workload_batch"])
        for ax, col, scale in ((ax_lat, "tpot_s", 1e3), (ax_thr, "decode_tokens_per_s", 1.0)):
            ax.plot([r["workload_batch"] for r in rs], [r[col] * scale for r in rs],
                    color=color, lw=1.2, label=label)
            fx, fy, ox, oy = _fits_split(rs, "workload_batch", col)
            ax.scatter(fx, [v * scale for v in fy], color=color, s=22, zorder=3)
            ax.scatter(ox, [v * scale for v in oy], facecolors="white", edgecolors=color,
                       s=22, zorder=3)
            ceiling = rs[0]["max_batch"]
            if ceiling >= 1:
                ax.axvline(ceiling, color=color, ls="--", lw=1)
                ax.annotate(f"max batch {ceiling}", (ceiling, 0.02),
                            xycoords=("data", "axes fraction"),
                            rotation=90, fontsize=8, color=color, xytext=(-3, 0),
                            textcoords="offset points", ha="right", va="bottom")
    for ax, ylabel in ((ax_lat, "per-token latency, TPOT (ms)"),
                       (ax_thr, "decode throughput (tokens/s, all sequences)")):
        ax.set(xscale="log", yscale="log", xlabel="batch (concurrent sequences)", ylabel=ylabel)
        _log_ticks(ax)
        ax.grid(True, which="major", color="#eeeeee")
    handles, _ = ax_lat.get_legend_handles_labels()
    handles += [Line2D([], [], ls="", marker="o", mfc="white", mec="black",
                       label="does not fit in memory"),
                Line2D([], [], ls="--", color="black", label="memory ceiling (max batch)")]
    fig.legend(handles=handles, loc="outside right center", fontsize=8, frameon=False)
    fig.suptitle(title or "Latency and throughput against batch", fontsize=11)
    return fig


def tradeoff_figure(rows: list[dict], title: str = "") -> Figure:
    """Throughput against per-token latency, one curve per series, each point a batch size
    (labelled); hollow points do not fit in memory."""
    from perfmodel.sweep import series

    groups = series(rows, exclude=("workload_batch",))
    fig = _new_figure(9.5, 5.2)
    ax = fig.subplots()
    for (label, rs), color in zip(groups.items(), _series_colors(len(groups)), strict=True):
        rs = sorted(rs, key=lambda r: r["workload_batch"])
        ax.plot([r["tpot_s"] * 1e3 for r in rs], [r["decode_tokens_per_s"] for r in rs],
                color=color, lw=1.2, label=label)
        fx, fy, ox, oy = _fits_split(rs, "tpot_s", "decode_tokens_per_s")
        ax.scatter([v * 1e3 for v in fx], fy, color=color, s=22, zorder=3)
        ax.scatter([v * 1e3 for v in ox], oy, facecolors="white", edgecolors=color, s=22,
                   zorder=3)
        for r in rs:
            ax.annotate(f"{r['workload_batch']}", (r["tpot_s"] * 1e3, r["decode_tokens_per_s"]),
                        xytext=(4, -9), textcoords="offset points", fontsize=7, color=color)
    ax.set(xscale="log", yscale="log", xlabel="per-token latency, TPOT (ms)",
           ylabel="decode throughput (tokens/s, all sequences)")
    _log_ticks(ax)
    ax.grid(True, which="major", color="#eeeeee")
    fig.legend(*ax.get_legend_handles_labels(), loc="outside right upper", fontsize=8,
               frameon=False, title="numbers: batch\nhollow: over memory", title_fontsize=8)
    fig.suptitle(title or "Throughput against latency (each point a batch size)", fontsize=11)
    return fig


def _tokens(n: int) -> str:
    """Token counts for tick labels: 4096 -> '4k', 131072 -> '128k', 1000 -> '1,000'."""
    return f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else f"{n:,}"


def kv_figure(kv_rows: list[dict], batch_rows: list[dict] | None = None, title: str = "",
              scope: str = "one device") -> Figure:
    """KV bytes per token (bars), KV cache of one sequence against context, and (with
    ``batch_rows`` from sweep.max_batch_table) the batch ceiling against context.
    ``scope`` names what the KV rows cover ("whole model", "per device, TP 8")."""
    from matplotlib.ticker import NullLocator

    models = list(dict.fromkeys(r["model"] for r in kv_rows))
    colors = dict(zip(models, _series_colors(len(models)), strict=True))
    kinds = {r["model"]: r["attention_kind"] for r in kv_rows}
    n = 3 if batch_rows else 2
    fig = _new_figure(4.6 * n + 2.0, 4.6)
    axes = fig.subplots(1, n, width_ratios=[0.4 + 0.06 * len(models)] + [1.0] * (n - 1))
    per_token = {r["model"]: r["kv_bytes_per_token"] for r in kv_rows}
    bars = axes[0].barh(range(len(models)), [per_token[m] / 1e3 for m in models],
                        color=[colors[m] for m in models], height=0.6)
    axes[0].bar_label(bars, labels=[f"{per_token[m] / 1e3:,.0f}" for m in models], fontsize=8,
                      padding=2)
    axes[0].set_yticks(range(len(models)), [f"{m}\n({kinds[m]})" for m in models], fontsize=8)
    axes[0].set_ylim(max(len(models), 3) - 0.5, -0.5)     # top to bottom, bars of one size
    axes[0].set_xlabel(f"KV cache per token, all layers,\n{scope} (kB)")
    axes[0].margins(x=0.3)
    for m in models:
        _plot_limited(axes[1], [r for r in kv_rows if r["model"] == m], "kv_bytes_per_sequence",
                      1e-9, colors[m], f"{m} ({kinds[m]})")
    axes[1].set(xscale="log", yscale="log", xlabel="context (tokens held per sequence)",
                ylabel=f"KV cache per sequence, {scope} (GB)")
    if batch_rows:
        for m in models:
            rs = [r for r in batch_rows if r["model"] == m and r["max_batch"] > 0]
            _plot_limited(axes[2], rs, "max_batch", 1.0, colors[m], m)
            for r in rs if len(models) <= 4 else []:
                axes[2].annotate(f"{r['max_batch']:,}", (r["context"], r["max_batch"]),
                                 xytext=(3, 3), textcoords="offset points", fontsize=7,
                                 color=colors[m])
        axes[2].set(xscale="log", yscale="log", xlabel="context (prompt + generated tokens)",
                    ylabel="max batch (sequences that fit)")
        missing = sorted({r["model"] for r in batch_rows if not r["fits_weights"]})
        if missing:
            axes[2].text(0.02, 0.02, "weights do not fit: " + ", ".join(missing),
                         transform=axes[2].transAxes, fontsize=8, color="#b22222")
    contexts = sorted({r["context"] for r in kv_rows + (batch_rows or [])})
    for ax in axes[1:]:
        _log_ticks(ax, "y")
        ax.set_xticks(contexts, [_tokens(c) for c in contexts], fontsize=8)
        ax.xaxis.set_minor_locator(NullLocator())
        ax.grid(True, which="major", color="#eeeeee")
    if any(r["beyond_max_position"] for r in kv_rows):
        axes[1].plot([], [], color="#666666", ls=":", label="beyond the model's native context")
    axes[1].legend(fontsize=8, frameon=False)
    fig.suptitle(title or "KV cache against context", fontsize=11)
    return fig


def _plot_limited(ax: Any, rows: list[dict], col: str, scale: float, color: str,
                  label: str) -> None:
    """Solid within the model's native context, dotted beyond it."""
    inside = [r for r in rows if not r["beyond_max_position"]]
    beyond = [r for r in rows if r["beyond_max_position"]]
    if inside:
        ax.plot([r["context"] for r in inside], [r[col] * scale for r in inside], marker="o",
                ms=3, color=color, label=label)
    if beyond:
        edge = inside[-1:] + beyond
        ax.plot([r["context"] for r in edge], [r[col] * scale for r in edge], marker="o", ms=3,
                color=color, ls=":", label=None if inside else label)


def time_split_figure(rows: list[dict], title: str = "") -> Figure:
    """Stacked time per operator class against context: prefill (TTFT) and one mean
    decode step (TPOT), from sweep rows of one series at one batch size."""
    from perfmodel.sweep import time_split_table

    fig = _new_figure(12.0, 4.6)
    axes = fig.subplots(1, 2)
    for ax, phase, ylabel in ((axes[0], "prefill", "TTFT (ms)"),
                              (axes[1], "decode", "mean decode step, TPOT (ms)")):
        table = time_split_table(rows, phase)
        classes = [k for k in (table[0] if table else {}) if k != "context"]
        bottom = [0.0] * len(table)
        for cls in classes:
            vals = [r[cls] * 1e3 for r in table]
            ax.bar(range(len(table)), vals, bottom=bottom, color=CLASS_COLORS.get(cls, "k"),
                   label=cls, width=0.7)
            bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
        ax.set_xticks(range(len(table)), [f"{r['context']:,}" for r in table], fontsize=8)
        ax.set(xlabel="prompt length (tokens)", ylabel=ylabel, title=phase)
        ax.grid(True, axis="y", color="#eeeeee")
    handles, labels = axes[0].get_legend_handles_labels()
    more = axes[1].get_legend_handles_labels()
    for h, lab in zip(*more, strict=True):
        if lab not in labels:
            handles.append(h)
            labels.append(lab)
    fig.legend(handles, labels, loc="outside right center", fontsize=8, frameon=False,
               title="op class", title_fontsize=8)
    fig.suptitle(title or "Time by operator class as the context grows", fontsize=11)
    return fig
