"""The autoscaling figure (``simulate --autoscale --out``): the offered rate and the
replicas serving and starting over time, and each fleet's GPU-hours against its SLO
attainment. Built without pyplot, as ``report.serving_plots``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from perfmodel.report.plots import new_figure
from perfmodel.report.serving_plots import GRID
from perfmodel.report.sweep_plots import _series_colors

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def autoscale_figure(requests: Any, scaled: Any, fleets: list[dict], interval_s: float
                     ) -> Figure:
    """Rate (requests per ``interval_s``, as req/s) and replicas against time; GPU-hours
    against SLO attainment (the share of requests within the SLOs; 0 without SLOs)."""
    fig = new_figure(10.5, 7.5)
    top, bottom = fig.subplots(2, 1)
    colors = _series_colors(3)
    arrivals = np.asarray(requests.arrival_s)
    edges = np.arange(0.0, float(arrivals.max()) + interval_s, interval_s)
    counts, _ = np.histogram(arrivals, edges)
    top.step(edges[:-1], counts / interval_s, where="post", color=colors[0], lw=0.9,
             label="offered rate (req/s)")
    top.set(xlabel="time (s)", ylabel="requests/s", title="Offered rate and replicas")
    right = top.twinx()
    start = [(0.0, scaled.policy.min_replicas, 0)]      # the fleet before any decision
    d = np.array([*start, *(row[:3] for row in scaled.decisions)], dtype=float)
    right.step(d[:, 0], d[:, 1], where="post", color=colors[1], lw=1.2, label="serving")
    right.step(d[:, 0], d[:, 1] + d[:, 2], where="post", color=colors[2], lw=0.9, ls="--",
               label="serving + starting")
    right.set(ylabel="replicas", ylim=(0, max(1.0, float((d[:, 1] + d[:, 2]).max())) + 1))
    right.legend(fontsize=8, frameon=False, loc="upper right")
    top.legend(fontsize=8, frameon=False, loc="upper left")
    top.grid(True, **GRID)
    for row in fleets:
        met = row["slo_attainment"] or 0.0
        bottom.scatter([row["gpu_hours"]], [met * 100], s=30)
        bottom.annotate(row["fleet"], (row["gpu_hours"], met * 100), fontsize=8,
                        xytext=(4, 4), textcoords="offset points")
    bottom.set(xlabel="GPU-hours", ylabel="requests within the SLOs (%)",
               title="Cost against SLO attainment", ylim=(0, 105))
    bottom.grid(True, **GRID)
    fig.suptitle("Autoscaling replay (simulated)", fontsize=11)
    return fig
