"""What the simulator asks of the core: the KV pool an engine gets, and the time of its
steps, priced by ``cost.step.price_step`` on each step's own mix of prompt chunks and
decodes, many steps in one vectorised call.

A step's timing follows the estimate's rule (``schedules.static.phase_timing``): a step
with a prompt chunk pays host launches as a prefill does, a pure-decode step replays a CUDA
graph when the engine captures them (vLLM's default). The estimate and the simulator share
this and ``price_step``, so a lone request costs the same in both. A step is a decode step
when every request in it computes one token (vLLM v1's uniform-decode batch, which it
replays as a graph), so a one-token prompt's step is one: there, and only there, the
estimate (which prices any prompt as a prefill) is the dearer by the launches.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

import perfmodel.serving.engines.speculation as speculation
from perfmodel.cost.band import band
from perfmodel.cost.memory import (
    head_bytes_of,
    kv_bytes_per_token,
    logits_bytes_per_sequence,
    recurrent_state_per_sequence,
    stage_weights,
    usable_bytes,
    workspace_bytes_per_token,
)
from perfmodel.cost.params import stage_layers
from perfmodel.cost.step import Dtypes, Step, StepCost, composed_seconds, price_step
from perfmodel.schedules.estimates import estimate
from perfmodel.schedules.static import phase_timing
from perfmodel.serving import eager, kvtiers
from perfmodel.serving.engines import lora
from perfmodel.serving.engines.state import Batch
from perfmodel.serving.engines.vllm import EngineConfig
from perfmodel.specs.dtypes import BYTES
from perfmodel.specs.errors import SpecError
from perfmodel.specs.hardware import Hardware
from perfmodel.specs.model import Model
from perfmodel.specs.workload import Parallelism, Workload, Workloads


@dataclass(frozen=True)
class KvPoolSize:
    """The engine's KV pool on one device: blocks, and the bytes it was cut from."""

    blocks: int
    usable_bytes: float
    weights_bytes: float
    activation_bytes: float     # peak activations, and recurrent state for the seats
    bytes_per_block: float

    @property
    def tokens(self) -> int:
        return self.blocks


def kv_pool(model: Model, hw: Hardware, plan: Parallelism, w: Workload,
            engine: EngineConfig) -> KvPoolSize:
    """vLLM's rule: the KV cache gets what is left of ``gpu_memory_utilization`` x memory
    after the runtime's reserve, the weights and the peak activations of its profile run
    (a step of ``max_num_batched_tokens`` tokens, and the logits of ``max_num_seqs``
    sequences). A hybrid model's recurrent state (Mamba / linear-attention layers: a fixed
    size per sequence) is set aside for ``max_num_seqs`` sequences. Every attention layer
    is counted at full length per cached token: sliding-window layers' blocks are not
    freed as they leave the window. Under pipeline parallelism each stage's devices hold
    their own layers' blocks after their own weights (``cost.memory.stage_weights``), and
    the engine takes the fewest blocks any stage holds (vLLM's ``get_kv_cache_configs``:
    every rank's ``num_blocks`` cut to the smallest). SpecError when nothing is left."""
    ws = Workloads.from_list([w])
    ab = BYTES[ws.act_dtype]
    usable = float(usable_bytes(hw, engine.gpu_memory_utilization))
    stages = stage_weights(model, plan.tp, ws.weight_bytes_per_param, ab, plan.pp, plan.ep,
                           plan.expert_replicas, head_bytes_of(model, ws))[:, 0]
    acts = float(workspace_bytes_per_token(model, plan.tp, ab)[0]
                 * engine.max_num_batched_tokens
                 + logits_bytes_per_sequence(model, plan.tp) * engine.max_num_seqs)
    kvb = Dtypes.of_workloads(ws).kv_bytes(model)
    state, conv = recurrent_state_per_sequence(model, plan.tp)
    acts += (state + conv * float(kvb[0])) * engine.max_num_seqs
    share = stage_layers(model.n_layers, plan.pp) / model.n_layers
    per_token = float(kv_bytes_per_token(model, plan.tp, kvb)[0])
    if getattr(engine, "speculative", None) is not None:     # the drafter's, beside it
        draft_w, draft_kv = speculation.pool_terms(engine.speculative, model, hw, plan, ws,
                                                   kvb)
        stages, per_token = stages + draft_w, per_token + draft_kv
    per_stage = per_token * engine.block_size * share
    stages = stages + lora.reserved_bytes(model, plan.tp, getattr(engine, "lora", None)) \
        * share                 # each stage's layers' slots
    lefts = [engine.kv_bytes(hw, float(w_s), acts) for w_s in stages]
    s = int(np.argmin([left_s / b for left_s, b in zip(lefts, per_stage, strict=True)]))
    weights, left, per_block = float(stages.max()), lefts[s], float(per_stage[s])
    if left < per_block:
        raise SpecError(
            f"simulate: {model.name} does not fit on {hw.name} "
            f"({plan.describe() or 'one device'}): "
            f"{usable / 1e9:.2f} GB usable at --gpu-memory-utilization "
            f"{engine.gpu_memory_utilization:g}, weights {weights / 1e9:.2f} GB, activations "
            f"{acts / 1e9:.2f} GB, leaving no KV block")
    return KvPoolSize(int(left // per_block), usable, weights, acts, per_block)


class StepPricer:
    """Times of engine steps of one model on one device under one plan and workload's
    dtypes. ``times(batches)`` prices them all in one ``price_step`` call. ``edge`` 0 or 1:
    each step's time at the low or high edge of its 80% band (``cost.band``; the device's
    ``uncertainty:`` block) instead of its centre."""

    def __init__(self, model: Model, hw: Hardware, plan: Parallelism, w: Workload,
                 engine: EngineConfig, edge: int | None = None) -> None:
        if edge is not None and hw.uncertainty is None:
            raise SpecError(f"simulate: {hw.name} has no uncertainty: block, so no band edge "
                            f"to price steps at")
        self.model, self.hw, self.plan, self.edge = model, hw, plan, edge
        ws = Workloads.from_list([w])
        self.dtypes = Dtypes.of_workloads(ws)
        self.act_dtype = w.act_dtype
        self.rows: dict[int, Dtypes] = {}
        self.skew = float(w.expert_skew)
        self.prefill_timing = int(phase_timing(hw, "prefill", False))
        self.decode_timing = int(phase_timing(hw, "decode", engine.cuda_graphs))
        self.host = engine.host
        self.graphs = bool(engine.cuda_graphs) and hw.has_graphs
        self.graph_upto = eager.graph_tokens(model, hw, plan, engine, engine.host)
        self.drafter = None if getattr(engine, "speculative", None) is None else \
            speculation.DraftPricer(engine.speculative, model, hw, plan, self.dtypes,
                                    self.decode_timing)
        off = getattr(engine, "kv_offload", None)
        self.layers = off.layers if off is not None and off.blocks else 0
        self.last_host = np.zeros(0)    # the host time in the last ``times``' steps
        self.calls = 0
        self.priced = 0
        self.lora = lora.pricer(model, hw, plan, engine)   # None with LoRA off

    def times(self, batches: list[Batch]) -> np.ndarray:
        """Seconds of each batch's step: its GPU time (at the band ``edge`` when one is
        set) and the engine's host time that shows (``HostTime.step``; ``last_host`` keeps
        the latter; host time has no band)."""
        gpu, _, seqs = self.gpu(batches)
        if self.layers:             # KV offload tiers' loads (``serving.kvtiers``)
            gpu = kvtiers.step_seconds(gpu, [b.loads for b in batches], self.layers)
        self.last_host = self.host.step(gpu, seqs)
        return gpu + self.last_host

    def tables(self, prompt_upto: int, unit: int, seqs_upto: int) -> tuple:
        """(seconds of a step of one prompt of ``unit``, 2 ``unit``, ... tokens up to
        ``prompt_upto``; of a decode step of 1, 2, ... ``seqs_upto`` sequences of one cached
        token): the dry run's guess reads the GEMMs' tile and wave steps from them. Not
        counted as priced steps."""
        one = np.zeros(1, np.int64)
        prompts = [Batch(one, np.array([m]), np.array([m]), True, False, 0)
                   for m in range(unit, prompt_upto + unit, unit)]
        decodes = [Batch(np.arange(n), np.ones(n, np.int64), np.ones(n, np.int64), False,
                         False, 0) for n in range(1, seqs_upto + 1)]
        return self._total(prompts), self._total(decodes)

    def _total(self, batches: list[Batch]) -> np.ndarray:
        gpu, _, seqs = self._gpu(batches)
        return gpu + self.host.step(gpu, seqs)

    def gpu(self, batches: list[Batch]) -> tuple[np.ndarray, StepCost, np.ndarray]:
        """(GPU seconds of each batch's step, at the band ``edge`` when one is set; their
        ``StepCost`` at the centre; the sequences in each), from one ``price_step`` call,
        counted as priced steps."""
        self.calls += 1
        self.priced += len(batches)
        return self._gpu(batches)

    def _gpu(self, batches: list[Batch]) -> tuple[np.ndarray, StepCost, np.ndarray]:
        k = len(batches)
        g = max(len(b.ids) for b in batches)
        count = np.zeros((k, g), np.int64)
        new = np.ones((k, g), np.int64)
        ctx = np.ones((k, g), np.int64)
        for i, b in enumerate(batches):
            n = len(b.ids)
            count[i, :n] = 1
            new[i, :n] = b.new
            ctx[i, :n] = b.context
        timing = np.array([self.prefill_timing if b.prefill else self.decode_timing
                           for b in batches])
        drafted = None if self.drafter is None else _drafted(batches, count.shape)
        step = Step(count, new, ctx, expert_skew=self.skew, extra_logits=0.0 if drafted is None
                    else speculation.draft_logits(count, drafted))
        if k not in self.rows:      # every row the one workload's dtypes, made once per k
            self.rows[k] = self.dtypes.take(np.zeros(k, np.int64))
        cost = price_step(self.model, self.hw, self.plan, step, self.rows[k], timing)
        gpu = self._banded(cost, timing) + self._eager(batches, cost, count, new)
        if drafted is not None:     # the drafting, on the same GPU after the verify
            gpu = gpu + self.drafter.seconds(count, new, ctx, drafted, timing, self.skew)
        if self.lora is not None:
            gpu = gpu + self.lora.seconds(batches, timing)
        return gpu, cost, count.sum(axis=1)

    def _eager(self, batches: list[Batch], cost: StepCost, count: np.ndarray,
               new: np.ndarray) -> np.ndarray | float:
        """What the host's dispatch adds to the steps that run eagerly (``serving.eager``)."""
        op_s = self.host.eager_op_s
        if not op_s:
            return 0.0
        rows = eager.eager_rows([b.prefill for b in batches], (count * new).sum(axis=1),
                                self.graphs, self.graph_upto)
        return np.where(rows, eager.excess_s(cost, op_s), 0.0) if rows.any() else 0.0

    def _banded(self, cost: StepCost, timing: np.ndarray) -> np.ndarray:
        return cost.time if self.edge is None else band(
            cost.class_seconds(), self.hw.uncertainty,
            composed=self.hw.composition.edges(composed_seconds(cost, timing)))[self.edge]


def _drafted(batches: list[Batch], shape: tuple) -> np.ndarray:
    """(N, G) drafts each row of each batch verifies (``Batch.drafts``; none: 0)."""
    out = np.zeros(shape, np.int64)
    for i, b in enumerate(batches):
        if b.drafts is not None:
            out[i, :len(b.ids)] = b.drafts
    return out


def capacity_rps(model: Model, hw: Hardware, plan: Parallelism, w: Workload,
                 engine: EngineConfig) -> float:
    """Requests per second the static estimate sustains on ``plan.dp`` replicas at the
    engine's largest batch (``max_num_seqs``, or what the KV memory holds at ``w``'s
    lengths): the rate past which a simulation's queue grows without bound."""
    w = replace(w, cuda_graphs=engine.cuda_graphs,
                usable_memory_fraction=engine.gpu_memory_utilization,
                kv_block_tokens=engine.block_size)
    ceiling = estimate(hw, model, w, plan).memory.max_batch
    batch = max(1, min(engine.max_num_seqs, int(ceiling)))
    return estimate(hw, model, replace(w, batch=batch), plan).throughput_tokens_per_s / w.gen_len
