"""Figures of simulated serving: latency CDFs, a run's time series, latency against
offered load with the estimated capacity (the knee). Pure: they return figures."""

from __future__ import annotations

from typing import Any

import numpy as np

MAX_POINTS = 5000
PANELS = (("ttft_s", "TTFT"), ("tpot_s", "TPOT"), ("itl_s", "ITL"), ("e2e_s", "end to end"))


def _figure(rows: int, cols: int, size: tuple[float, float]) -> tuple[Any, Any]:
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    return plt.subplots(rows, cols, figsize=size, layout="constrained", squeeze=False)


def latency_cdfs(results: list, labels: list[str]) -> Any:
    """2 x 2 empirical CDFs of TTFT, TPOT, ITL and end-to-end latency (ms), one line per
    run; log x where the values span more than two decades."""
    fig, axes = _figure(2, 2, (10, 7))
    for ax, (key, name) in zip(axes.flat, PANELS, strict=True):
        lo, hi = np.inf, 0.0
        for res, label in zip(results, labels, strict=True):
            ms = np.sort(getattr(res, key)) * 1e3
            if not len(ms):
                continue
            step = max(1, len(ms) // MAX_POINTS)
            ms = ms[::step]
            ax.plot(ms, np.arange(1, len(ms) + 1) / len(ms), label=label)
            positive = ms[ms > 0]
            if len(positive):
                lo, hi = min(lo, positive.min()), max(hi, positive.max())
        if hi > 0 and hi / lo > 100:
            ax.set_xscale("log")
        ax.set_xlabel(f"{name} (ms)")
        ax.set_ylabel("share of requests" if key != "itl_s" else "share of token gaps")
        ax.set_title(name)
        ax.grid(alpha=0.3)
    axes[0, 0].legend(fontsize=8)
    fig.suptitle("Latency distributions (simulated)")
    return fig


def time_series(result: Any) -> Any:
    """Running and waiting requests, KV-pool use and step time against time."""
    s = result.steps
    step = max(1, len(s.start_s) // MAX_POINTS)
    t = s.start_s[::step]
    fig, axes = _figure(3, 1, (10, 8))
    a, b, c = axes[:, 0]
    a.plot(t, s.seqs[::step], label="running sequences")
    a.plot(t, s.waiting[::step], label="waiting requests")
    a.set_ylabel("requests")
    a.legend(fontsize=8)
    b.plot(t, s.kv_blocks[::step] / max(result.kv_blocks_total, 1) * 100)
    b.set_ylabel("KV pool used (%)")
    b.set_ylim(0, 105)
    c.plot(t, s.time_s[::step] * 1e3, lw=0.6)
    c.set_ylabel("step time (ms)")
    c.set_xlabel("time (s)")
    for ax in (a, b, c):
        ax.grid(alpha=0.3)
    fig.suptitle(f"Engine over time{': ' + result.label if result.label else ''}")
    return fig


def load_curve(points: list[tuple[float, dict]], capacity_rps: float | None = None) -> Any:
    """Mean and p90 TTFT, mean queueing and p90 TPOT against the offered rate (log y);
    the estimated capacity drawn where given: past it the queue grows without bound."""
    fig, axes = _figure(1, 1, (8, 5))
    ax = axes[0, 0]
    rates = [r for r, _ in points]
    series = (("TTFT mean", "ttft_s", "mean"), ("TTFT p90", "ttft_s", "p90"),
              ("queueing mean", "queue_s", "mean"), ("TPOT p90", "tpot_s", "p90"))
    for label, key, stat in series:
        ax.plot(rates, [max(s[key][stat], 1e-6) for _, s in points], marker="o", label=label)
    if capacity_rps is not None:
        ax.axvline(capacity_rps, color="grey", ls="--", label="estimated capacity")
    ax.set_yscale("log")
    ax.set_xlabel("offered load (requests/s)")
    ax.set_ylabel("seconds")
    ax.set_title("Latency against offered load (simulated)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    return fig
