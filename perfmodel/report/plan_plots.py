"""The planner's figure: the Pareto front of a trade-off between two columns of a table of
candidates (throughput per GPU against tokens per second per user), with every other
candidate behind it in grey. Built without pyplot, as ``report.plots`` (matplotlib is
imported inside, so ``import perfmodel`` stays light)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from perfmodel.report.plots import new_figure

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def pareto_front(df: Any, x: str, y: str, front_mask: Sequence[bool], labels: Sequence[str],
                 title: str = "", x_min: float | None = None, mark: int | None = None,
                 axis_labels: tuple[str, str] | None = None, log_y: bool = False) -> Figure:
    """Columns ``x`` and ``y`` of ``df`` (a DataFrame or a dict of columns) as points;
    those of ``front_mask`` joined in ``x`` order and named by ``labels``. ``x_min``: a
    dashed line where an SLO starts (points left of it miss it); ``mark``: the row of the
    chosen point, ringed; ``axis_labels``: (x, y) titles, default the column names;
    ``log_y``: a logarithmic y axis. Labels alternate above and below the line so that
    neighbours on a flat stretch of the front do not print over each other."""
    xs, ys = [float(v) for v in df[x]], [float(v) for v in df[y]]
    front = sorted((i for i, f in enumerate(front_mask) if f), key=lambda i: xs[i])
    fig = new_figure(9.5, 5.6)
    ax = fig.subplots()
    ax.scatter(xs, ys, s=14, color="#c8c8c8", zorder=1, label="candidates")
    ax.plot([xs[i] for i in front], [ys[i] for i in front], color="#1f77b4", lw=1.4,
            marker="o", ms=5, zorder=3, label="Pareto front")
    for k, i in enumerate(front):
        ax.annotate(labels[i], (xs[i], ys[i]), xytext=(6, 5 if k % 2 else -11),
                    textcoords="offset points", fontsize=7, color="#1f77b4")
    if log_y:
        ax.set_yscale("log")
    if x_min is not None:
        ax.axvline(x_min, color="#d62728", ls="--", lw=1.0, label="SLO")
    if mark is not None:
        ax.scatter([xs[mark]], [ys[mark]], s=160, facecolors="none", edgecolors="#d62728",
                   lw=1.6, zorder=4, label="chosen")
    xlabel, ylabel = axis_labels or (x.replace("_", " "), y.replace("_", " "))
    ax.set(xlabel=xlabel, ylabel=ylabel)
    ax.grid(True, color="#eeeeee")
    ax.legend(fontsize=8, frameon=False, loc="best")
    fig.suptitle(title or f"{y} against {x}", fontsize=11)
    return fig
