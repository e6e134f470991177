"""Figures of simulated serving: latency CDFs, a run's time series, latency against
offered load with the estimated capacity (the knee), and the planner's Pareto front.

Built without pyplot, as ``report.plots`` (no global state, no display backend: works
headless); matplotlib is imported inside, so ``import perfmodel`` stays light. Pure: they
return figures and the caller saves them. Times in ``SimResult`` are seconds; the figures
show latencies in ms.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from perfmodel.report.plots import new_figure
from perfmodel.report.sweep_plots import _series_colors

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from perfmodel.serving.results import SimResult, StepLog

MAX_POINTS = 5000          # per line: more points than pixels only slow the drawing down
WIDE = 100.0               # a log x axis when the largest value is this times the smallest
PANELS = (("ttft_s", "TTFT: arrival to first token"),
          ("tpot_s", "TPOT: per output token after the first"),
          ("itl_s", "ITL: gap between two tokens"),
          ("e2e_s", "E2E: arrival to last token"))
GRID = {"color": "#eeeeee", "lw": 0.6}


def _plain_log_ticks(ax: Any, axis: str) -> None:
    """Plain numbers on a log axis (1, 2, 5, 10, ..., 10,000, or decades alone past three
    of them): no 1e+04 that runs into its neighbour."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    a = getattr(ax, f"{axis}axis")
    lo, hi = sorted(getattr(ax, f"get_{axis}lim")())
    wide = lo > 0 and hi / lo > 1e3
    a.set_major_locator(LogLocator(base=10, subs=(1.0,) if wide else (1.0, 2.0, 5.0)))
    a.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}" if v >= 1 else f"{v:g}"))
    a.set_minor_formatter(NullFormatter())


def _ecdf(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sorted values and the share of values at or below each, at most ``MAX_POINTS`` of
    them (evenly spaced ranks, the smallest and largest kept)."""
    v = np.sort(values)
    n = len(v)
    idx = np.unique(np.linspace(0, n - 1, min(n, MAX_POINTS)).round().astype(int))
    return v[idx], (idx + 1) / n


def _cdf_panel(ax: Any, results: Sequence[SimResult], labels: Sequence[str], key: str,
               title: str) -> None:
    positive: list[np.ndarray] = []
    for res, label, color in zip(results, labels, _series_colors(len(results)), strict=True):
        ms = np.asarray(getattr(res, key)) * 1e3
        if not len(ms):
            continue
        x, share = _ecdf(ms)
        ax.plot(np.r_[x[0], x], np.r_[0.0, share], drawstyle="steps-post", color=color,
                lw=1.3, label=label)
        positive.append(x[x > 0])
    pos = np.concatenate(positive) if positive else np.array([])
    if len(pos) and pos.max() > WIDE * pos.min():
        ax.set_xscale("log")
        _plain_log_ticks(ax, "x")
    if not positive:
        ax.text(0.5, 0.5, "no values (every request one token?)", transform=ax.transAxes,
                ha="center", va="center", fontsize=9, color="#666666")
    ax.set(title=title, xlabel=f"{title.split(':')[0]} (ms)", ylim=(0, 1.02),
           ylabel="share of token gaps" if key == "itl_s" else "share of requests")
    ax.grid(True, **GRID)


def latency_cdfs(results: list[SimResult], labels: list[str]) -> Figure:
    """2 x 2 empirical CDFs of TTFT, TPOT, ITL and end-to-end latency (ms), one line per
    run (``labels`` name them); log x where a panel's values span more than two decades."""
    if len(results) != len(labels):
        raise ValueError(f"latency_cdfs: {len(results)} results but {len(labels)} labels")
    fig = new_figure(10.5, 7.5)
    axes = fig.subplots(2, 2)
    for ax, (key, title) in zip(axes.flat, PANELS, strict=True):
        _cdf_panel(ax, results, labels, key, title)
    if any(labels):
        axes[0, 0].legend(fontsize=8, frameon=False, loc="lower right")
    fig.suptitle("Latency distributions (simulated): empirical CDFs", fontsize=11)
    return fig


def _decimate(t: np.ndarray, *ys: np.ndarray) -> tuple[np.ndarray, ...]:
    """At most ``MAX_POINTS`` points per series: past that, each of ``MAX_POINTS // 2``
    bins of consecutive steps becomes two points at the bin's first time, its minimum and
    its maximum, so spikes (a long prefill step, a burst of arrivals) survive."""
    if len(t) <= MAX_POINTS:
        return (t, *ys)
    starts = np.linspace(0, len(t), MAX_POINTS // 2, endpoint=False).astype(int)
    out = [np.repeat(t[starts], 2)]
    for y in ys:
        lo, hi = np.minimum.reduceat(y, starts), np.maximum.reduceat(y, starts)
        out.append(np.column_stack([lo, hi]).reshape(-1))
    return tuple(out)


def time_series(result: SimResult) -> Figure:
    """Stacked panels against the run's time (s): running sequences and waiting requests;
    KV-pool use (% of ``kv_blocks_total``); step time (ms). Long runs are decimated to
    ``MAX_POINTS`` points a line, keeping each stretch's minimum and maximum."""
    s = result.steps
    use = s.kv_blocks / max(result.kv_blocks_total, 1) * 100
    t, seqs, waiting, kv = _decimate(s.start_s, s.seqs, s.waiting, use)
    fig = new_figure(10.5, 8.0)
    a, b, c = fig.subplots(3, 1, sharex=True)
    colors = _series_colors(4)
    a.plot(t, seqs, color=colors[0], lw=0.9, label="running sequences")
    a.plot(t, waiting, color=colors[1], lw=0.9, label="waiting requests")
    a.set(ylabel="requests", title="Running and waiting")
    a.legend(fontsize=8, frameon=False, loc="upper right")
    b.plot(t, kv, color=colors[2], lw=0.9)
    b.axhline(100, color="#999999", ls=":", lw=0.8)
    b.set(ylabel="KV pool used (%)", ylim=(0, 105),
          title=f"KV-cache pool use ({result.kv_blocks_total:,} blocks)")
    _step_times(c, s, colors[3], colors[0])
    for ax in (a, b, c):
        ax.grid(True, **GRID)
    fig.suptitle("Engine over time (simulated)" + (f": {result.label}" if result.label
                                                   else ""), fontsize=11)
    return fig


def _step_times(ax: Any, s: StepLog, prompt_color: str, decode_color: str) -> None:
    """Each step's time as a dot, steps that ran prompt tokens apart from decode-only."""
    prompt = s.prefill_tokens > 0
    for label, mask, color in (("steps with prompt tokens", prompt, prompt_color),
                               ("decode-only steps", ~prompt, decode_color)):
        t, ms = _decimate(s.start_s[mask], s.time_s[mask] * 1e3)
        ax.plot(t, ms, ls="", marker=".", ms=2.5, color=color, label=label)
    ax.set(ylabel="step time (ms)", xlabel="time since the start of the run (s)",
           title="Engine step time", ylim=(0, None))
    ax.legend(fontsize=8, frameon=False, loc="upper right", markerscale=3)


LOAD_SERIES = (("TTFT mean", "ttft_s", "mean", 0, "-"), ("TTFT p90", "ttft_s", "p90", 0, "--"),
               ("queueing mean", "queue_s", "mean", 1, "-"),
               ("TPOT p90", "tpot_s", "p90", 2, "--"))


def load_curve(points: list[tuple[float, dict]], capacity_rps: float | None = None
               ) -> Figure:
    """Mean and p90 TTFT, mean queueing and p90 TPOT (ms, log y) against the offered rate
    (``(rate, SimResult.summary())`` pairs, req/s). ``capacity_rps``: a vertical line
    labelled "estimated capacity", the knee past which the queue grows without bound. A
    zero (no queueing at a low rate) has no place on a log axis and is left out."""
    pts = sorted(points, key=lambda p: p[0])
    rates = [r for r, _ in pts]
    colors = _series_colors(3)
    fig = new_figure(8.5, 5.2)
    ax = fig.subplots()
    for label, key, stat, ci, ls in LOAD_SERIES:
        ms = [s[key][stat] * 1e3 for _, s in pts]
        ax.plot(rates, [v if v > 0 else np.nan for v in ms], color=colors[ci], ls=ls,
                marker="o", ms=4, lw=1.3, label=label)
    if capacity_rps is not None:
        ax.axvline(capacity_rps, color="#d62728", ls=":", lw=1.4, label="estimated capacity")
        ax.annotate(f"estimated capacity\n{capacity_rps:.3g} req/s", (capacity_rps, 0.97),
                    xycoords=("data", "axes fraction"), xytext=(4, 0),
                    textcoords="offset points", fontsize=8, color="#d62728", va="top")
    ax.set(yscale="log", xlabel="offered load (requests/s)", ylabel="latency (ms)")
    _plain_log_ticks(ax, "y")
    ax.grid(True, which="major", **GRID)
    ax.legend(fontsize=8, frameon=False, loc="upper left")
    fig.suptitle("Latency against offered load (simulated)", fontsize=11)
    return fig


def pareto_front(df: Any, x: str, y: str, front_mask: Sequence[bool], labels: Sequence[str],
                 title: str = "", **options: Any) -> Figure:
    """Every candidate (rows of ``df``, a DataFrame or a dict of columns) as a point at
    columns ``x`` and ``y``; those of ``front_mask`` labelled and joined by a step line,
    the edge of what they dominate (larger x and y better when y falls along the front,
    smaller x and larger y when it rises). ``options``: those of
    ``plan_plots.pareto_front`` (``x_min``, ``mark``, ``axis_labels``)."""
    from perfmodel.report.plan_plots import pareto_front as draw

    fig = draw(df, x, y, front_mask, labels, title, **options)
    xs, ys = [float(v) for v in df[x]], [float(v) for v in df[y]]
    front = [ys[i] for i in sorted((i for i, f in enumerate(front_mask) if f),
                                   key=lambda i: xs[i])]
    style = "steps-pre" if len(front) > 1 and front[-1] < front[0] else "steps-post"
    for line in fig.axes[0].get_lines():
        if line.get_label() == "Pareto front":
            line.set_drawstyle(style)
    return fig
