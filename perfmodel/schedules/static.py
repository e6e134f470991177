"""The static-request schedule: one prefill step over the prompt, then the decode steps.

Prefill runs the prompt in one step (T = C = prompt) and emits the first token, so
TTFT = prefill time. The other G - 1 tokens each take one decode step; the step that emits
token i + 1 processes token i at context S + i, so decode reads contexts S+1 ... S+G-1, summed
exactly (``decode``). Decode steps run as a CUDA graph when asked (no host launch cost);
prefill and decode otherwise count launches as the device does (``step.default_timing``).
"""

from __future__ import annotations

import numpy as np

from perfmodel.cost.step import Dtypes, Step, default_timing, price_step
from perfmodel.cost.timebase import GRAPH
from perfmodel.schedules.decode import decode_phase
from perfmodel.schedules.phases import PhaseCost, single_step_phase
from perfmodel.specs.hardware import Hardware
from perfmodel.specs.model import Model
from perfmodel.specs.workload import Parallelism, Workloads


def phase_timing(hw: Hardware, phase: str, cuda_graphs: np.ndarray | bool) -> np.ndarray:
    """Timing codes of a phase's steps (``roofline``): the device's own (launches added on a
    sync device, overlapped elsewhere), except decode steps replayed as CUDA graphs, which pay
    no launches and only the part of each kernel's fixed cost its neighbours do not hide
    (timing ``graph``, ``specs.composition``), on a device that has graphs
    (``Hardware.has_graphs``; elsewhere the flag is ignored and the estimate says so). One
    rule for the estimate and its figures."""
    if phase not in ("prefill", "decode"):
        raise ValueError(f"phase must be prefill or decode, got {phase!r}")
    base = default_timing(hw)
    graphs = np.asarray(cuda_graphs) & (phase == "decode") & hw.has_graphs
    return np.where(graphs, GRAPH, base)


def static_request(model: Model, hw: Hardware, plan: Parallelism,
                   w: Workloads) -> tuple[PhaseCost, PhaseCost]:
    """(prefill, decode) of every configuration of ``w``. The prefill step (the requests
    that hit a cached prefix in their own group, ``Workloads.prefix_hits``) and the first
    decode step are priced together in one call (2N rows)."""
    plan.require_modelled()
    n = len(w)
    decode_timing = phase_timing(hw, "decode", w.cuda_graphs)
    both = np.concatenate
    hits = w.prefix_hits
    ones = np.ones(n, np.int64)
    step = Step(np.stack([both([w.batch - hits, w.batch]), both([hits, 0 * ones])], axis=1),
                np.stack([both([w.prompt_len, ones]),
                          both([w.prompt_len - w.shared_prefix, ones])], axis=1),
                np.stack([both([w.prompt_len, w.prompt_len + 1])] * 2, axis=1),
                expert_skew=both([w.expert_skew, w.expert_skew]))
    dtypes = Dtypes.of_workloads(w)
    timing = both([phase_timing(hw, "prefill", w.cuda_graphs), decode_timing])
    cost = price_step(model, hw, plan, step, dtypes.take(np.tile(np.arange(n), 2)), timing)
    prefill = single_step_phase("prefill", cost.take(slice(0, n)))
    decode = decode_phase(model, hw, plan, w, dtypes, decode_timing, cost.take(slice(n, 2 * n)))
    return prefill, decode
