"""The planner's search space and its analytic steady state (``serving.planner`` ranks and
checks what this builds).

- A replica: tensor parallelism inside a node (``TPS``, at most the device's
  ``interconnect.max_devices``); for an MoE model, experts over the same devices (ep = tp),
  or wide expert parallelism with data-parallel attention over ``EPS`` devices, across
  nodes when the group outgrows one (the all-to-all then crosses the network, priced by
  ``cost.collectives`` from ``interconnect.network_bytes_per_s``), inside one NVLink domain
  where the device's ``max_devices`` reaches (an NVL72 rack: 72). Where no node holds the
  model by tensor parallelism alone (``fits_in_node``), pipeline stages too: ``PPS``
  stages of a TP group each (MoE: experts over each stage's group), the stages across
  nodes over the network (``schedules.pipeline``; TP across nodes is not searched: its
  all-reduce on every layer would cross the network).
- A precision recipe (``Precision``): weights, activations and KV cache dtypes, named as
  the engines name them (vLLM ``--quantization fp8`` is W8A8-fp8; ``--kv-cache-dtype fp8``).
- A batch ceiling (``max_num_seqs``) in ``BATCHES``, capped at what the KV cache holds.
- Speculative decoding on and off, where the user offers a drafter (``with_speculation``).
- Replicas: with a rate, the fewest that serve it within the TTFT SLO (aggregated), or
  the fewest copies of each small prefill:decode unit (``RATIOS``); without one, the GPU
  budget filled.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from math import gcd

import numpy as np

from perfmodel.cost.memory import memory_estimate
from perfmodel.schedules.draft_memory import with_draft
from perfmodel.schedules.estimates import estimate_many
from perfmodel.schedules.speculative import Speculation
from perfmodel.serving.disagg import Pool, kv_transfer_s
from perfmodel.serving.planner.energy import energy_times
from perfmodel.specs.errors import SpecError
from perfmodel.specs.hardware import Hardware
from perfmodel.specs.model import Model
from perfmodel.specs.workload import Parallelism, Workload, Workloads

TPS = (1, 2, 4, 8)
PPS = (2, 4, 8)           # pipeline stages, where no node holds the model by TP alone
EPS = (2, 4, 8, 16, 32, 64, 72)       # wide EP with data-parallel attention
BATCHES = (8, 16, 32, 64, 128, 256, 512)
LOADS = np.round(np.arange(1, 19) * 0.05, 2)      # shares of capacity tried, at most 0.9
UNIT = 8                  # replicas in a disaggregated unit at most
RATIOS = tuple((a, b) for a in range(1, UNIT) for b in range(1, UNIT)
               if a + b <= UNIT and gcd(a, b) == 1)    # prefill:decode replica ratios


@dataclass(frozen=True)
class Precision:
    """One precision recipe: the weights, the activations the matmuls take, the KV cache."""

    weights: str
    activations: str
    kv: str

    @property
    def name(self) -> str:
        """'bf16', 'W8A8-fp8', 'W8A8-fp8 + fp8 KV', 'W4A16-fp4'."""
        wide = ("bf16", "fp16", "fp32")
        if self.weights in wide and self.activations in wide:
            head = self.weights
        else:
            bits = {"fp8": 8, "int8": 8, "fp4": 4, "int4": 4}
            a = bits.get(self.activations, 16)
            head = f"W{bits.get(self.weights, 16)}A{a}-{self.weights}"
        return head + (f" + {self.kv} KV" if self.kv not in ("bf16", "fp16") else "")

    def workload(self, model: Model) -> Workload:
        """The workload as ``perfmodel simulate``'s options build it (same memory share and
        KV block, so the plan's KV ceiling is the command's)."""
        q = model.quantization      # the checkpoint's dtype: its format (groups, scales) too
        weights = None if q is not None and q.weights_dtype == self.weights else self.weights
        return Workload.for_model(model, weights_dtype=weights, act_dtype=self.activations,
                                  kv_dtype=self.kv, usable_memory_fraction=0.9,
                                  kv_block_tokens=16)

    def simulate_flags(self) -> str:
        return f"--weights-dtype {self.weights} --act-dtype {self.activations} " \
               f"--kv-dtype {self.kv}"


def recipes(model: Model, hw: Hardware) -> list[Precision]:
    """The checkpoint as stored; where the device has an fp8 rate, W8A8-fp8 (vLLM's
    ``--quantization fp8``: weights cast at load, dynamic per-tensor activation scales),
    and the same with an fp8 KV cache (``--kv-cache-dtype fp8``)."""
    base = Workload.for_model(model)
    out = [Precision(base.weights_dtype, base.act_dtype, base.kv_dtype)]
    if "fp8" in hw.peak_flops_per_s:
        if base.weights_dtype != "fp8" or base.act_dtype != "fp8":
            out.append(Precision("fp8", "fp8", base.kv_dtype))
        out.append(Precision("fp8", "fp8", "fp8"))
    return list(dict.fromkeys(out))


def replica_plans(model: Model, hw: Hardware, gpus: int) -> list[Parallelism]:
    """One replica's plans within ``gpus``: TP in ``TPS`` inside a node; an MoE model's
    experts over the same devices (ep = tp), or over ``EPS`` devices with data-parallel
    attention (tp 1), across nodes where the device has a network between them; where no
    node holds the model by TP alone, TP x PP for PP in ``PPS``, across nodes where the
    device has a network (stages of one node otherwise), on vLLM (``serving.pipeline``
    simulates no other engine's pipeline)."""
    node = hw.interconnect.max_devices
    moe = model.moe is not None
    plans = [Parallelism(tp=t, ep=t if moe else 1) for t in TPS if t <= min(gpus, node)]
    if moe:
        wide = node if not hw.interconnect.network_bytes_per_s else max(EPS)
        plans += [Parallelism(ep=e, attention_dp=True) for e in EPS
                  if e <= min(gpus, wide) and model.moe.n_experts % e == 0]
    if hw.engine == "vllm" and not fits_in_node(model, hw):   # the only PP simulated
        reach = gpus if hw.interconnect.network_bytes_per_s else min(gpus, node)
        plans += [Parallelism(tp=t, pp=p, ep=t if moe else 1) for p in PPS for t in TPS
                  if t <= node and t * p <= reach and p <= model.n_layers
                  and model.shared_block is None]
    return plans


def with_speculation(model: Model, hw: Hardware, gpus: int, offered: object = None
                     ) -> list[tuple]:
    """(plan, ``Speculation`` or None, its ``speculative`` column: None when no drafter is
    offered, "" off, the method on) of every ``replica_plans`` plan without speculation
    and, where the user offers a drafter (``offered``: ``engines.speculation.SpecDecode``)
    the estimate prices (not n-gram lookup), every plan of one stage with it
    (``check_speculation``: no speculative decoding under pipeline parallelism); those are
    searched aggregated only (a disaggregated pool's drafts are not simulated)."""
    plans = replica_plans(model, hw, gpus)
    spec = None if offered is None else offered.speculation()
    out = [(p, None, None if offered is None else "") for p in plans]
    return out + ([(p, spec, offered.method) for p in plans if p.pp == 1]
                  if spec is not None else [])


def fits_in_node(model: Model, hw: Hardware) -> bool:
    """Whether some tensor-parallel plan inside one node holds ``model``'s weights and a
    one-token sequence in any precision recipe (``recipes``)."""
    node = hw.interconnect.max_devices
    rows = [replace(p.workload(model), batch=1, prompt_len=1, gen_len=1)
            for p in recipes(model, hw)]
    ws = Workloads.from_list(rows)
    for t in TPS:
        if t > node:
            continue
        plan = Parallelism(tp=t, ep=t if model.moe is not None else 1)
        try:
            if (memory_estimate(model, hw, plan, ws).max_batch >= 1).any():
                return True
        except SpecError:       # a split the model's heads cannot take
            continue
    return False


def left_out(model: Model, hw: Hardware, gpus: int) -> list[str]:
    """What the search does not try on ``hw``, in words."""
    node = hw.interconnect.max_devices
    out = []
    if gpus > node:
        out.append(f"{hw.name}: tensor parallelism across nodes (TP > {node}) is not searched"
                   + ("" if not fits_in_node(model, hw) else "; nor pipeline parallelism, as "
                      f"one node holds {model.name} by TP alone"))
    if hw.engine != "vllm" and not fits_in_node(model, hw):
        out.append(f"{hw.name}: pipeline parallelism is not searched for --engine {hw.engine} "
                   "(its pipeline loop is not simulated)")
    if model.moe is not None and gpus > node and not hw.interconnect.network_bytes_per_s:
        out.append(f"{hw.name}: no network figure, so expert parallelism stays in a node")
    return out


def replica_times(model: Model, hw: Hardware, plan: Parallelism, prompt: int, gen: int,
                  pessimistic: bool = False, energy: bool = False,
                  speculation: Speculation | None = None, tag: str | None = None) -> dict:
    """For every precision recipe x batch in ``BATCHES`` (capped at the KV ceiling,
    ``memory.max_batch``; a batch above it is the ceiling's row, a recipe that holds no
    sequence is left out): one request's prefill alone (the estimate's TTFT at batch 1),
    the mean decode step at the batch (its TPOT: the mean context) and the static
    request's throughput at the batch, from one ``estimate_many`` call. ``pessimistic``:
    the slow end of the estimate's 80% band (``ttft_s_high``/``tpot_s_high``) where the
    estimate carries one (``banded`` says whether it did). ``energy``: each row's joules
    per output token and watts per device too (``planner.energy``, at the centre).
    ``speculation``: decode by its rounds (``schedules.speculate``: TPOT and throughput),
    the drafter's weights and KV in the ceiling (``schedules.draft_memory.with_draft``);
    ``tag``: its ``speculative`` column, one per row (None: no column)."""
    choices = recipes(model, hw)
    rows = [replace(p.workload(model), batch=b, prompt_len=prompt, gen_len=gen,
                    cuda_graphs=True) for p in choices for b in (1, *BATCHES)]
    ws = Workloads.from_list(rows)
    mem = memory_estimate(model, hw, plan, ws)
    if speculation is not None:
        mem = with_draft(mem, model, hw, plan, ws, speculation)
    ceiling = mem.max_batch
    ws = replace(ws, batch=np.maximum(np.minimum(ws.batch, ceiling), 1))
    e = estimate_many(hw, model, ws, plan, speculation)
    slow_ttft, slow_tpot = getattr(e, "ttft_s_high", None), getattr(e, "tpot_s_high", None)
    banded = pessimistic and slow_ttft is not None and slow_tpot is not None \
        and bool(getattr(e, "has_band", True))
    first, tpot, static = e.ttft_s, e.tpot_s, e.throughput_tokens_per_s
    if banded:      # the band's slow edge; the throughput's own low edge where given
        low = getattr(e, "throughput_tokens_per_s_low", None)
        static = low if low is not None else \
            static * (first + gen * tpot) / (slow_ttft + gen * slow_tpot)
        first, tpot = slow_ttft, slow_tpot
    shape = (len(choices), 1 + len(BATCHES))
    ttft, step, static, batch, ceil = (np.asarray(a).reshape(shape) for a in (
        first, tpot, static, ws.batch, ceiling))
    keep = (ceil[:, 1:] >= 1) & (np.diff(batch, axis=1) > 0)    # capped repeats dropped
    keep[:, 0] = ceil[:, 1] >= 1
    which = np.repeat(np.arange(len(choices)), len(BATCHES)).reshape(keep.shape)[keep]
    spent = {k: np.asarray(v).reshape(shape)[:, 1:][keep]
             for k, v in energy_times(e).items()} if energy else {}
    if tag is not None:
        spent["speculative"] = np.full(len(which), tag)
    return spent | {"recipe": which, "precision": np.array([choices[k].name for k in which]),
            "weights_dtype": np.array([choices[k].weights for k in which]),
            "act_dtype": np.array([choices[k].activations for k in which]),
            "kv_dtype": np.array([choices[k].kv for k in which]),
            "batch": batch[:, 1:][keep], "kv_max_batch": ceil[:, 1:][keep],
            "step_s": step[:, 1:][keep], "static_tokens_per_s": static[:, 1:][keep],
            "prefill_s": np.repeat(ttft[:, :1], len(BATCHES), axis=1)[keep],
            "choices": choices, "banded": banded}


def steady_state(prefill_s: np.ndarray, step_s: np.ndarray, static_tokens_per_s: np.ndarray,
                 batch: np.ndarray, output_len: float, prefill_dp: np.ndarray,
                 decode_dp: np.ndarray, transfer_s: np.ndarray, shares: np.ndarray
                 ) -> dict[str, np.ndarray]:
    """The planner's formulas, all of them, per candidate (arrays; ``shares``: loads as
    shares of capacity, shape (candidates, k)).

    Aggregated (``prefill_dp`` 0: ``decode_dp`` replicas each run prefill and decode,
    prompts chunked into the decode steps): the core's static request at the batch
    (``static_tokens_per_s`` = batch x output_len / (its prefill + decode), as
    ``estimate.throughputs`` has it) read as a steady state, where every step batch /
    output_len requests finish and as many prompts join: TPOT = batch / that throughput,
    the decode step with its share of prefill. Disaggregated: the decode pool's TPOT is its
    step. A sequence holds its slot ``output_len x TPOT``; capacity (req/s) = decode_dp x
    batch / that (``serving.pricing.capacity_rps`` for one aggregated engine), and at most
    ``prefill_dp / prefill_s`` when a prefill pool serves the prompts.

    TTFT p90 at a load = the prompt's compute and the step it rides in (``prefill_s +
    step_s``), the KV transfer, and two queues: prompts wait for the prompt compute ahead
    of them (one server per replica of the pool that runs them, service ``prefill_s``),
    and for a free slot (``batch`` servers per decode replica, each busy ``output_len x
    TPOT``): ``_wait_p90``. Returns TPOT, capacity and the TTFT p90 at every share."""
    agg = prefill_dp == 0
    tpot = np.where(agg, batch / static_tokens_per_s, step_s)
    hold = output_len * tpot
    capacity = decode_dp * batch / hold
    capacity = np.where(agg, capacity, np.minimum(capacity, prefill_dp / prefill_s))
    rate = shares * capacity[:, None]
    runners = np.where(agg, decode_dp, prefill_dp)[:, None]
    prompts = _wait_p90(rate * prefill_s[:, None] / runners, 1, prefill_s[:, None])
    slots = _wait_p90(rate * (hold / (decode_dp * batch))[:, None], batch[:, None],
                      hold[:, None])
    ttft = (prefill_s + step_s + transfer_s)[:, None] + prompts + slots
    return {"tpot_s": tpot, "capacity_req_s": capacity, "ttft_p90_s": ttft}


def _wait_p90(rho: np.ndarray, servers: np.ndarray | int, service: np.ndarray) -> np.ndarray:
    """90th percentile of the wait in an M/D/c queue at utilisation ``rho``: M/M/c's tail,
    P(W > t) = C e^(-t / m) with C the Erlang C chance of waiting and m = service /
    (c (1 - rho)), with m halved for a fixed service time (M/D/c waits about half as long;
    M/D/1 is c = 1, C = rho). Infinite at rho >= 1."""
    c = np.broadcast_to(servers, np.shape(rho)).astype(float)
    load = np.minimum(rho, 1.0) * c
    erlang_b = np.ones_like(load)
    at_c = np.zeros_like(load)
    for k in range(1, int(c.max()) + 1):        # Erlang B by its recursion, kept at k = c
        erlang_b = load * erlang_b / (k + load * erlang_b)
        at_c = np.where(c == k, erlang_b, at_c)
    with np.errstate(divide="ignore", invalid="ignore"):
        wait = np.where(rho < 1, at_c / (1 - rho * (1 - at_c)), 1.0)
        p90 = 0.5 * service / (c * (1 - rho)) * np.log(np.maximum(10 * wait, 1.0))
    return np.where(rho < 1, p90, np.inf)


def replicas(times: dict, output_len: int, slo_ttft_s: float, rate: float | None,
             budget: int, split: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(row, prefill replicas, decode replicas) of every candidate built on ``times``' rows.

    With a ``rate``: aggregated, the fewest replicas whose share of it (rate / dp each: a
    share of a Poisson stream is a Poisson stream) meets the TTFT SLO at most 90% loaded;
    disaggregated (``split``), for every prefill:decode ratio a:b of ``RATIOS``, the fewest
    k a P + k b D with each pool at most 90% loaded. Without one: ``budget`` replicas,
    aggregated, and k a P + k b D with k = budget // (a + b). A split is always k copies
    of a unit of at most ``UNIT`` replicas, which the check simulates (``unit``)."""
    n = len(times["batch"])
    rows = np.arange(n)
    ratios = [(a, b) for a, b in RATIOS if a + b <= budget] if split else []
    if rate is None:
        out = [(rows, np.zeros(n, int), np.full(n, budget))]
        out += [(rows, np.full(n, a * (budget // (a + b))), np.full(n, b * (budget // (a + b))))
                for a, b in ratios]
    else:
        one = steady_state(times["prefill_s"], times["step_s"], times["static_tokens_per_s"],
                           times["batch"], output_len, np.zeros(n), np.ones(n), np.zeros(n),
                           np.broadcast_to(LOADS, (n, len(LOADS))))
        meets = one["ttft_p90_s"] <= slo_ttft_s
        share = np.where(meets.any(axis=1),
                         LOADS[len(LOADS) - 1 - np.argmax(meets[:, ::-1], axis=1)], LOADS[-1])
        dp = np.ceil(rate / (share * one["capacity_req_s"]) - 1e-9)
        out = [(rows, np.zeros(n, int), np.clip(dp, 1, 10**6).astype(int))]
        x0 = np.ceil(rate * times["prefill_s"] / LOADS[-1])
        y0 = np.ceil(rate * output_len * times["step_s"] / (LOADS[-1] * times["batch"]))
        for a, b in ratios:
            k = np.clip(np.maximum(np.ceil(x0 / a), np.ceil(y0 / b)), 1, 10**6).astype(int)
            out.append((rows, k * a, k * b))
    row, pre, dec = (np.concatenate(k) for k in zip(*out, strict=True))
    return row, pre, dec


def unit(prefill_dp: int, decode_dp: int) -> tuple[int, int, int]:
    """The smallest deployment statistically alike the whole: (prefill, decode, copies).
    Replicas of one engine dealt shares of one Poisson stream are alike, so one replica
    at rate / dp stands for dp aggregated replicas, and (x/g)P + (y/g)D at rate / g for
    xP + yD with g = gcd(x, y)."""
    if not prefill_dp:
        return 0, 1, decode_dp
    g = gcd(prefill_dp, decode_dp)
    return prefill_dp // g, decode_dp // g, g


def transfer_times(model: Model, hw: Hardware, plan: Parallelism, choices: list[Precision],
                   prompt: int) -> dict[tuple[int, str], float]:
    """Seconds to move one prompt's KV between two replicas of ``plan``, per recipe and
    link (NVLink inside a node, the NIC between nodes)."""
    out = {}
    links = ["nvlink"] + (["network"] if hw.interconnect.network_bytes_per_s else [])
    for k, p in enumerate(choices):
        for link in links:
            try:
                out[k, link] = float(kv_transfer_s(model, Pool(hw, plan), Pool(hw, plan),
                                                   np.array([prompt]), p.workload(model),
                                                   link)[0])
            except SpecError:       # a replica too big for one node: no NVLink split
                continue
    return out
