"""Pipeline parallelism: a replica's layers split into ``pp`` stages on consecutive groups of
``Parallelism.group`` devices (the tensor- or expert-parallel group: expert parallelism
shards each stage's experts over its own group, as vLLM's EP group is its TP x DP ranks of
one stage), activations crossing each stage boundary point to point.

Layers go to stages as vLLM splits them (``vllm/distributed/utils.py: get_pp_indices``):
n_layers // pp each, the remainder one more each to the stages before the last; the
embedding runs on the first stage, the final norm and the LM head on the last. A batch runs
as ``m = min(pp, batch)`` micro-batches (vLLM keeps pp batches in flight, one per virtual
engine), each priced as a step of ceil(batch / m) sequences. With T_s the time of stage s on
one micro-batch, F = sum_s T_s and P the point-to-point time of one trip through the pp - 1
boundaries:

    prefill  = F + (m - 1) max_s T_s + P           (fill, then one micro-batch per period)
    decode   = max(F + P, m max_s T_s) per step    (a token's round trip, or the busiest
                                                    stage working through all m)

A lone request (m = 1) pays every stage in series. The phase's operator rows are what one
device does on average (the replica's work x m / pp); two rows close the sum: ``pipeline_p2p``
(the transfers on the critical path) and ``pipeline_bubble`` (idle time: fill and drain,
unequal stages, stages waiting on each other).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from perfmodel.cost.collectives import send_s
from perfmodel.cost.error_class import CODE
from perfmodel.cost.ops import ByteCounts
from perfmodel.cost.params import stage_layers
from perfmodel.cost.timebase import COMMUNICATION, IDLE
from perfmodel.schedules.assumptions import check_network
from perfmodel.schedules.phases import PhaseCost
from perfmodel.schedules.static import static_request
from perfmodel.specs.dtypes import BYTES
from perfmodel.specs.hardware import Hardware
from perfmodel.specs.model import Model
from perfmodel.specs.workload import Parallelism, Workloads

FIRST_STAGE = ("embed", "pos_embed_add")
LAST_STAGE = ("final_norm", "lm_head")


def micro_batches(batch: np.ndarray, pp: int) -> np.ndarray:
    """Micro-batches a batch runs as: one per stage, at most one per sequence."""
    return np.minimum(pp, batch)


def activation_bytes(model: Model, act_codes: np.ndarray | int) -> np.ndarray:
    """Bytes one token's activations take across a stage boundary (its hidden state), at
    the activation dtype codes ``act_codes`` (``specs.dtypes.CODE``)."""
    return model.d_model * BYTES[act_codes]


def boundary_seconds(hw: Hardware, plan: Parallelism, bytes_each: np.ndarray) -> np.ndarray:
    """(pp - 1, N): the send across each stage boundary of ``bytes_each`` (the activations
    of the micro-batch one device steps through): a send over the device's link, latency
    plus bytes over bandwidth; a boundary between nodes (stages of ``plan.group`` devices
    laid out in order, ``interconnect.max_devices`` per node) uses the network. Each of the
    tp devices of a stage sends 1/tp of the activations (vLLM sends a slice per
    tensor-parallel rank and all-gathers it on arrival); under data-parallel attention
    (tp = 1) each device sends its own sequences' whole, the combine having returned every
    token to its attention device."""
    per_node = hw.interconnect.max_devices
    first = np.arange(plan.pp - 1) * plan.group              # first device of each stage
    crosses = (first // per_node) != ((first + plan.group) // per_node)
    if crosses.any():
        check_network(hw, plan)
    size = np.asarray(bytes_each, dtype=float) / plan.tp
    out = np.empty((plan.pp - 1, *np.shape(size)))
    for k, inter in enumerate(crosses.tolist()):
        out[k] = send_s(hw, size, inter=inter)
    return out


def trip_seconds(hw: Hardware, plan: Parallelism, bytes_each: np.ndarray) -> np.ndarray:
    """One pass of ``bytes_each`` through the pp - 1 stage boundaries
    (``boundary_seconds``, summed)."""
    return boundary_seconds(hw, plan, bytes_each).sum(axis=0)


def pipeline_phase(phase: PhaseCost, model: Model, plan: Parallelism, micro: np.ndarray,
                   trip_s: np.ndarray) -> PhaseCost:
    """``phase`` (priced for one micro-batch of a whole replica) as the pipeline runs it:
    the schedule in the module docstring, operator rows per device on average."""
    pp, steps = plan.pp, np.maximum(phase.steps, 1)
    busiest = _busiest(phase.time_s, phase.names, model, pp)
    full = phase.time
    if phase.name == "prefill":
        total = full + (micro - 1) * busiest + trip_s
        first = total
    else:
        total = np.maximum(full + steps * trip_s, micro * busiest)
        total = np.where(phase.steps > 0, total, 0.0)
        ops1 = phase.first_step_ops_s
        first = np.maximum(ops1.sum(axis=0) + trip_s,
                           micro * _busiest(ops1, phase.names, model, pp))
    scale = micro / pp
    ops = phase.time_s * scale
    trips = trip_s if phase.name == "prefill" else np.where(phase.steps > 0, steps, 0) * trip_s
    p2p = np.clip(total - ops.sum(axis=0), 0.0, trips)     # the transfers not hidden
    idle = np.maximum(total - ops.sum(axis=0) - p2p, 0.0)
    ratio = np.divide(total, phase.time * 1.0, out=np.ones_like(total), where=phase.time > 0)
    first_ops = phase.first_step_ops_s * scale
    first_p2p = np.minimum(trip_s, np.maximum(first - first_ops.sum(axis=0), 0.0))
    first_idle = np.maximum(first - first_ops.sum(axis=0) - first_p2p, 0.0)
    zero = np.zeros((1, len(total)))
    return PhaseCost(
        phase.name, phase.steps, (*phase.names, "pipeline_p2p", "pipeline_bubble"),
        (*phase.kinds, "p2p", "pipeline_bubble"),
        (*phase.classes, "communication", "idle"),
        np.concatenate([phase.positions, [phase.positions.max() + 1,
                                          phase.positions.max() + 2]]),
        np.concatenate([phase.count * scale, np.full((2, len(total)), 1.0)]),
        np.concatenate([ops, p2p[None], idle[None]]),
        np.concatenate([phase.flops * scale, zero, zero]),
        ByteCounts(*(np.concatenate([b * scale, zero, zero]) for b in phase.bytes.astuple())),
        np.concatenate([phase.bound, np.full((1, len(total)), COMMUNICATION),
                        np.full((1, len(total)), IDLE)]),
        first, phase.last_step_s * ratio,
        np.concatenate([first_ops, first_p2p[None], first_idle[None]]),
        np.concatenate([phase.dequant_s * scale, zero, zero]),
        np.concatenate([phase.error_codes, np.full((1, len(total)), CODE["collective"]),
                        np.full((1, len(total)), CODE["host"])]).astype(np.int8))


def stage_seconds(time_s: np.ndarray, names: tuple[str, ...], model: Model,
                  pp: int) -> np.ndarray:
    """(pp, N): each stage's share of ``time_s`` (operators x N, a whole replica's step):
    its layers' part of the per-layer operators plus the first or last stage's own
    operators (``FIRST_STAGE``, ``LAST_STAGE``)."""
    first = np.array([n in FIRST_STAGE for n in names])
    last = np.array([n in LAST_STAGE for n in names])
    layers = time_s[~(first | last)].sum(axis=0)
    share = stage_layers(model.n_layers, pp) / model.n_layers
    stages = share[:, None] * layers[None, :]
    stages[0] += time_s[first].sum(axis=0)
    stages[-1] += time_s[last].sum(axis=0)
    return stages


def _busiest(time_s: np.ndarray, names: tuple[str, ...], model: Model, pp: int) -> np.ndarray:
    """(N,) the slowest stage's share of ``time_s`` (``stage_seconds``)."""
    return stage_seconds(time_s, names, model, pp).max(axis=0)


def pipelined_request(model: Model, hw: Hardware, plan: Parallelism,
                      w: Workloads) -> tuple[PhaseCost, PhaseCost]:
    """(prefill, decode) of the static request under pipeline parallelism: each priced for
    one micro-batch of ceil(batch / m) sequences, then scheduled over the stages."""
    micro = micro_batches(w.batch, plan.pp)
    part = replace(w, batch=np.ceil(w.batch / micro).astype(np.int64))
    prefill, decode = static_request(model, hw, plan, part)
    width = activation_bytes(model, w.act_dtype)
    tokens = part.batch * part.prompt_len - part.prefix_hits * part.shared_prefix
    return (pipeline_phase(prefill, model, plan, micro, trip_seconds(hw, plan, tokens * width)),
            pipeline_phase(decode, model, plan, micro,
                           trip_seconds(hw, plan, part.batch * width)))
