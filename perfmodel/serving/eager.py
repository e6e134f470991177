"""The host's dispatch of a step run eagerly (no CUDA graph).

An engine that runs a step without a CUDA graph dispatches every operator from Python, one
after another, into the stream's queue while the GPU runs what was dispatched before. The
stream is a first-in first-out queue deep enough to hold a whole step's launches, and the
forward pass has no host synchronisation, so the host runs ahead during long kernels and
the GPU catches up during short ones: a step of ``n`` operator instances takes
max(n x ``HostTime.eager_op_s``, its device time), to within one operator. (A floor per
operator, max(device, dispatch) each, would hold only if the host could never run ahead.)
``excess_s`` is what the host adds to a priced step; ``eager_rows`` says which steps of a
batch run eagerly. ``eager_op_s`` is the host's time per operator instance of the cost
model (``cost.step``), so it is derived from a whole eager step divided by the instances the
model counts in it (``reports/host/eager_sglang.py``).

Which steps run eagerly, from the engines' source:
- decode steps replay a CUDA graph unless the engine's graphs are off (``cuda_graphs``);
- SGLang's prefill ("extend") runs eagerly up to 0.5.9 (``server_args.py``:
  ``enable_piecewise_cuda_graph: bool = False``). From 0.5.10 the piecewise CUDA graph is on
  by default (``disable_piecewise_cuda_graph: bool = False``; ``_handle_piecewise_cuda_graph``
  turns it off under DP attention, pipeline parallelism, an MoE all-to-all backend, LoRA and
  on ROCm, among others) for prefill steps of at most ``piecewise_cuda_graph_max_tokens``
  tokens: the chunked-prefill size, or 2048 with an MLA attention backend ("the introduction
  of piecewise cuda graph will influence the kernel dispatch ... we set the max tokens to
  2048"); a longer step runs eagerly. The profile's ``prefill_graph`` says which versions.
"""

from __future__ import annotations

import numpy as np

from perfmodel.cost.step import StepCost
from perfmodel.serving.host_time import HostTime
from perfmodel.specs.hardware import Hardware
from perfmodel.specs.model import Model
from perfmodel.specs.workload import Parallelism

MLA_GRAPH_TOKENS = 2048     # server_args.py: piecewise_cuda_graph_max_tokens with MLA


def graph_tokens(model: Model, hw: Hardware, plan: Parallelism, engine: object,
                 host: HostTime) -> int:
    """The most tokens a prefill step may hold and still replay the engine's piecewise
    CUDA graph (0: every prefill step runs eagerly): none under DP attention, pipeline
    parallelism or LoRA, and none off NVIDIA (``_handle_piecewise_cuda_graph``: is_hip)."""
    if not host.prefill_graph or plan.attention_dp or plan.pp > 1 or hw.vendor != "nvidia" \
            or getattr(engine, "lora", None) is not None:
        return 0
    return MLA_GRAPH_TOKENS if model.mla is not None else int(engine.max_num_batched_tokens)


def eager_rows(prefill: np.ndarray, tokens: np.ndarray, graphs: bool, graph_upto: int
               ) -> np.ndarray:
    """Which steps run eagerly: a prefill step longer than ``graph_upto`` tokens, and a
    decode step when the engine replays no CUDA graph (``graphs`` False)."""
    prefill = np.asarray(prefill, dtype=bool)
    return np.where(prefill, np.asarray(tokens) > graph_upto, not graphs)


def excess_s(cost: StepCost, op_s: float) -> np.ndarray:
    """Seconds the host's dispatch adds to each of ``cost``'s steps run eagerly: how much
    its operator instances' dispatch, ``op_s`` each, outlasts the step's device time (0
    where the device is the longer)."""
    host = cost.count.sum(axis=0) * op_s
    return np.maximum(host - cost.time_s.sum(axis=0), 0.0)
