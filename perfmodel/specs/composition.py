"""The hardware file's ``composition:`` block: how a device's kernels compose into a
CUDA-graph-replayed step (``docs/composition.md``).

A kernel's fixed cost (``efficiency.kernel_latency_s`` and its per-kind values) is fitted
on isolated kernels: NVIDIA's aiconfigurator collector replays a graph of a handful of
calls (six GEMM forwards, ``collector/vllm/collect_gemm.py``) a few times between two CUDA
events (``collector/helper.py`` ``benchmark_with_power``), so each call's figure carries its
share of a graph launch, of the first call's ramp and of the last one's drain. Inside a
decode step replayed as one graph of hundreds of kernels the GPU front end sets up kernel
i + 1 while kernel i drains, and the graph's launch is paid once. ``graph_overlap`` is the
fraction of each kernel's fixed cost hidden that way: under timing ``graph``
(``cost.timebase``) a kernel pays ``(1 - graph_overlap) x`` its fixed cost. It is fitted
only on whole-step measurements (graph-replayed steps; ``reports/composition/fit.py``),
bounded to ``[0, MAX_OVERLAP]``: 0 is the sum of isolated kernels, and a graph cannot hide
the whole of a kernel's fixed cost (a one-element kernel replayed in a graph still takes
0.85-1.0 us, ``reports/h200/probe.csv``, ``reports/h100/probe.csv``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

COMPOSITION_KEYS = ("graph_overlap", "graph_overlap_max", "source", "note", "fit")
MAX_OVERLAP = 0.9


@dataclass(frozen=True)
class Composition:
    """``graph_overlap``: the share of each kernel's fixed cost its neighbours hide in a
    graph-replayed step; ``source``: whose fit (or which family rule) it is."""

    graph_overlap: float = 0.0
    source: str = ""
    # the largest overlap the whole-step data allow (a graph of empty kernels: 1 - its
    # per-kernel time / the isolated fixed cost): the band's fast edge (``cost.band``)
    graph_overlap_max: float = 0.0

    def exposed(self) -> float:
        """The share of a kernel's fixed cost a graph-replayed step pays."""
        return 1.0 - self.graph_overlap

    def edges(self, composed_s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(how much faster, how much slower) a step whose kernels pay ``composed_s`` of
        fixed cost inside a graph can be: every overlap from 0 (the sum of isolated
        kernels) to ``graph_overlap_max``."""
        share = self.exposed()
        top = max(self.graph_overlap_max, self.graph_overlap)
        return composed_s * (top - self.graph_overlap) / share, \
            composed_s * self.graph_overlap / share


def read_composition(f: Any) -> Composition:
    """The ``composition:`` block ``f`` (a ``specs.fields.Fields``; None: absent, no
    overlap); every error is one SpecError line naming the field."""
    if f is None:
        return Composition()
    overlap = f.quantity("graph_overlap", "number", positive=False, maximum=MAX_OVERLAP)
    top = f.quantity("graph_overlap_max", "number", overlap, positive=False,
                     maximum=MAX_OVERLAP)
    if top < overlap:
        raise f.error("graph_overlap_max", f"expected at least graph_overlap ({overlap:g}), "
                      f"got {top:g}")
    source = f.text("source")
    if not source.strip():
        raise f.error("source", "expected text saying which whole-step measurements (or "
                      "which family rule) the overlap comes from")
    f.raw("note", None)
    f.raw("fit", None)
    f.finish()
    return Composition(float(overlap), source, float(top))
