"""The deployment planner: which device, tensor parallelism, weights dtype, batch ceiling
(``max_num_seqs``) and aggregated or disaggregated (xP + yD) serving give the most output
tokens per GPU while the p90 TTFT and TPOT stay within their SLOs, on a budget of GPUs.

1. Every candidate is estimated analytically, one ``estimate_many`` call per (device,
   replica plan) over all weights dtypes and batches (``replica_times``); the formulas
   that turn those times into a steady state are in ``steady_state``, and nowhere else.
2. Candidates are filtered by the SLOs and ranked by throughput per GPU, or (``rank``
   "cost", when every device's hardware file has a ``price:``) by output tokens per dollar
   (``serving.dollars``); the first few are confirmed by ``simulate`` (Poisson arrivals
   at the load the estimate says they sustain, seeded).
3. ``PlanResult`` holds every candidate as columns (the CSV), the Pareto front of
   throughput per GPU against tokens per second per user, the confirmations, the winner
   (``cli.plan`` explains it and writes its vLLM and SGLang command lines).

Pipeline parallelism is not searched: the simulator does not run pipeline stages yet.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from perfmodel.cost.memory import memory_estimate
from perfmodel.schedules.estimates import estimate_many
from perfmodel.serving.config import EngineConfig
from perfmodel.serving.disagg import Pool, kv_transfer_s, simulate_disaggregated
from perfmodel.serving.dollars import RANKS, priced
from perfmodel.serving.requests import Requests
from perfmodel.serving.simulate import simulate
from perfmodel.serving.traffic import generate
from perfmodel.specs.errors import SpecError
from perfmodel.specs.hardware import Hardware
from perfmodel.specs.model import Model
from perfmodel.specs.workload import Parallelism, Workload, Workloads

TPS = (1, 2, 4, 8)
BATCHES = (8, 16, 32, 64, 128, 256, 512)
LOADS = np.round(np.arange(1, 19) * 0.05, 2)      # shares of capacity tried, at most 0.9
CONFIRM = 3
SIM_REQUESTS = 300
SIM_SECONDS, SIM_LEAST = 120.0, 30   # a light load's run: ~2 minutes of arrivals, >= 30
NOTES = ("pipeline parallelism (pp > 1) is not searched: the simulator does not run "
         "pipeline stages yet",
         "estimates: M/D/1 queueing for prompt compute, M/D/c for batch slots (Erlang C, "
         "half M/M/c's wait); TPOT at the full batch; the top candidates simulated")


@dataclass(frozen=True, eq=False)
class Target:
    """What the deployment must do: ``gpus`` at most, p90 TTFT and TPOT SLOs (seconds),
    mean prompt and output lengths; ``rate`` (req/s) and ``trace`` (the requests to
    confirm on) when a trace was given."""

    gpus: int
    slo_ttft_s: float
    slo_tpot_s: float
    input_len: float
    output_len: float
    rate: float | None = None
    trace: Requests | None = None

    def __post_init__(self) -> None:
        for flag, value in (("--slo-ttft", self.slo_ttft_s), ("--slo-tpot", self.slo_tpot_s),
                            ("--input-len", self.input_len), ("--output-len", self.output_len)):
            if not value > 0:
                unit = "seconds" if flag.startswith("--slo") else "tokens"
                raise SpecError(f"{flag}: expected a positive number of {unit}, got {value}")
        if isinstance(self.gpus, bool) or not isinstance(self.gpus, (int, np.integer)) \
                or self.gpus < 1:
            raise SpecError(f"--gpus: expected a whole number of GPUs >= 1, got {self.gpus!r}")

    @property
    def lengths(self) -> tuple[int, int]:
        """(prompt, output) tokens per request, whole."""
        return max(1, round(self.input_len)), max(1, round(self.output_len))


@dataclass(frozen=True, eq=False)
class PlanResult:
    """``candidates``: one entry per candidate, as columns (``pareto``: on the front of
    throughput per GPU against tokens/s per user); ``confirmed``: the top few, ranked,
    each with its simulation; ``winner``: the first that met both SLOs when simulated
    (else the top estimate, ``confirmed`` False)."""

    model: Model
    target: Target
    candidates: dict
    confirmed: list[dict]
    winner: dict
    notes: tuple[str, ...] = NOTES
    rank: str = "gpu"                   # the ranking the winner was chosen by (``RANKS``)

    def records(self) -> list[dict]:
        """One dict per candidate (pandas-ready)."""
        cols = self.candidates
        return [{k: _plain(cols[k][i]) for k in cols} for i in range(len(cols["label"]))]


def _plain(value: object) -> object:
    return value.item() if isinstance(value, np.generic) else value


def replica_plans(model: Model, hw: Hardware, gpus: int) -> list[Parallelism]:
    """One replica's plans: TP in ``TPS`` up to the node and the budget; an MoE model's
    experts over the same devices (ep = tp), or with data-parallel attention (tp 1)."""
    sizes = [t for t in TPS if t <= min(gpus, hw.interconnect.max_devices)]
    plans = [Parallelism(tp=t, ep=t if model.moe is not None else 1) for t in sizes]
    if model.moe is not None:
        plans += [Parallelism(ep=t, attention_dp=True) for t in sizes if t > 1]
    return plans


def weight_choices(model: Model, hw: Hardware) -> list[Workload]:
    """The checkpoint's weights, and fp8 (W8A8, as vLLM's ``--quantization fp8`` runs on a
    device with an fp8 rate) where the device has an fp8 rate."""
    base = Workload.for_model(model)
    out = [base]
    if "fp8" in hw.peak_flops_per_s and base.weights_dtype != "fp8":
        out.append(Workload.for_model(model, weights_dtype="fp8", act_dtype="fp8"))
    return out


def replica_times(model: Model, hw: Hardware, plan: Parallelism, target: Target) -> dict:
    """For every weights choice x batch in ``BATCHES`` (capped at the KV ceiling,
    ``memory.max_batch``; a batch above it is the ceiling's row, a choice that holds no
    sequence is left out): one request's prefill alone (the estimate's TTFT at batch 1)
    and the mean decode step at the batch (its TPOT: the mean context), and the static
    request's throughput at the batch, from one ``estimate_many`` call."""
    prompt, gen = target.lengths
    choices = weight_choices(model, hw)
    rows = [replace(w, batch=b, prompt_len=prompt, gen_len=gen, cuda_graphs=True)
            for w in choices for b in (1, *BATCHES)]
    ws = Workloads.from_list(rows)
    ceiling = memory_estimate(model, hw, plan, ws).max_batch
    ws = replace(ws, batch=np.maximum(np.minimum(ws.batch, ceiling), 1))
    e = estimate_many(hw, model, ws, plan)
    shape = (len(choices), 1 + len(BATCHES))
    ttft, step, static, batch, ceil = (a.reshape(shape) for a in (
        e.ttft_s, e.tpot_s, e.throughput_tokens_per_s, ws.batch, ceiling))
    keep = (ceil[:, 1:] >= 1) & (np.diff(batch, axis=1) > 0)    # capped repeats dropped
    keep[:, 0] = ceil[:, 1] >= 1
    names = np.repeat([w.weights_dtype for w in choices], len(BATCHES)).reshape(keep.shape)
    return {"weights_dtype": names[keep], "batch": batch[:, 1:][keep],
            "kv_max_batch": ceil[:, 1:][keep], "step_s": step[:, 1:][keep],
            "static_tokens_per_s": static[:, 1:][keep],
            "prefill_s": np.repeat(ttft[:, :1], len(BATCHES), axis=1)[keep]}


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
    batch / that (``serving.engine.capacity_rps`` for one aggregated engine), and at most
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


def pareto_mask(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Points no other point beats on both (at least as good on both, better on one)."""
    ge = (x[None, :] >= x[:, None]) & (y[None, :] >= y[:, None])
    gt = (x[None, :] > x[:, None]) | (y[None, :] > y[:, None])
    return ~(ge & gt).any(axis=1)


def candidates(model: Model, hardware: list[Hardware], target: Target) -> dict:
    """Every candidate as columns, before the SLOs: per device and replica plan, the
    aggregated deployment (dp = gpus // GPUs per replica) and every xP + yD split of those
    replicas, each at every weights choice and batch of ``replica_times``."""
    parts = []
    for hw in hardware:
        for plan in replica_plans(model, hw, target.gpus):
            try:
                times = replica_times(model, hw, plan, target)
            except SpecError:       # a split the model's heads or the device cannot take
                continue
            if not len(times["batch"]):
                continue
            dp = target.gpus // plan.devices
            link = _link(hw, target.gpus) if dp > 1 else None
            moved = 0.0 if link is None else float(kv_transfer_s(
                model, Pool(hw, plan), Pool(hw, plan), np.array([target.lengths[0]]),
                Workload.for_model(model), link)[0])
            for pre in range(dp if link else 1):
                parts.append(_part(hw, plan, times, pre, dp - pre, moved if pre else 0.0,
                                   link or ""))
    if not parts:
        raise SpecError(f"plan: {model.name} fits on none of {', '.join(h.name for h in hardware)}"
                        f" (-H) within --gpus {target.gpus}: its weights leave no room for a "
                        "sequence at TP up to the budget")
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def _link(hw: Hardware, gpus: int) -> str | None:
    """The link a disaggregated split of ``gpus`` uses: NVLink when they fit in one node,
    else the network; None (no split) when neither is there."""
    if gpus <= hw.interconnect.max_devices:
        return "nvlink"
    return "network" if hw.interconnect.network_bytes_per_s else None


def _part(hw: Hardware, plan: Parallelism, times: dict, prefill_dp: int, decode_dp: int,
          moved: float, link: str) -> dict:
    n = len(times["batch"])
    par = f"EP{plan.ep} DP-attn" if plan.attention_dp else \
        f"TP{plan.tp}" + (f"/EP{plan.ep}" if plan.ep > 1 else "")
    full = {"hardware": np.full(n, hw.name), "parallel": np.full(n, par), "tp": np.full(n, plan.tp),
            "ep": np.full(n, plan.ep), "attention_dp": np.full(n, plan.attention_dp),
            "mode": np.full(n, "disaggregated" if prefill_dp else "aggregated"),
            "prefill_replicas": np.full(n, prefill_dp), "decode_replicas": np.full(n, decode_dp),
            "gpus": np.full(n, (prefill_dp + decode_dp) * plan.devices),
            "transfer_s": np.full(n, moved), "link": np.full(n, link if prefill_dp else "")}
    return full | {k: times[k] for k in ("weights_dtype", "batch", "kv_max_batch",
                                         "prefill_s", "step_s", "static_tokens_per_s")}


def evaluate(cols: dict, target: Target) -> dict:
    """``steady_state`` at every share of ``LOADS``; the largest share whose TTFT p90 meets
    the SLO is the planned load (with a ``target.rate``: that rate, which must fit under
    it); the SLO checks, throughput per GPU, tokens/s per user and the Pareto front."""
    args = (cols["prefill_s"], cols["step_s"], cols["static_tokens_per_s"], cols["batch"],
            target.lengths[1],
            cols["prefill_replicas"], cols["decode_replicas"], cols["transfer_s"])
    st = steady_state(*args, np.broadcast_to(LOADS, (len(cols["batch"]), len(LOADS))))
    meets = st["ttft_p90_s"] <= target.slo_ttft_s
    last = len(LOADS) - 1 - np.argmax(meets[:, ::-1], axis=1)
    some = meets.any(axis=1)
    best = np.where(some, LOADS[last], 0.0) * st["capacity_req_s"]
    ttft = st["ttft_p90_s"][np.arange(len(last)), np.where(some, last, 0)]
    rate = np.where(best > 0, best, LOADS[0] * st["capacity_req_s"])   # none: light load
    if target.rate is not None:
        share = (target.rate / st["capacity_req_s"])[:, None]
        ttft = steady_state(*args, share)["ttft_p90_s"][:, 0]
        rate = np.full(len(best), target.rate)
        some &= best >= target.rate
    out = cols | {"tpot_s": st["tpot_s"], "ttft_p90_s": ttft,
                  "capacity_req_s": st["capacity_req_s"], "slo_rate_req_s": best,
                  "rate_req_s": rate,
                  "load_share": rate / st["capacity_req_s"],
                  "throughput_per_gpu": best * target.lengths[1] / cols["gpus"],
                  "tokens_per_s_per_user": 1.0 / st["tpot_s"], "meets_ttft": some,
                  "meets_tpot": st["tpot_s"] <= target.slo_tpot_s}
    out["feasible"] = out["meets_ttft"] & out["meets_tpot"]
    live = best > 0
    front = np.zeros(len(live), bool)
    front[live] = pareto_mask(out["tokens_per_s_per_user"][live],
                              out["throughput_per_gpu"][live])
    return out | {"pareto": front, "label": [label(out, i) for i in range(len(live))]}


def label(cols: dict, i: int) -> str:
    """'h100-sxm TP4 x2 fp8 B64', 'h100-sxm TP2 1P+3D bf16 B128'."""
    split = f"{cols['prefill_replicas'][i]}P+{cols['decode_replicas'][i]}D" \
        if cols["prefill_replicas"][i] else f"x{cols['decode_replicas'][i]}"
    return f"{cols['hardware'][i]} {cols['parallel'][i]} {split} {cols['weights_dtype'][i]} " \
           f"B{cols['batch'][i]}"


def plan(model: Model, hardware: list[Hardware], target: Target, n_requests: int = SIM_REQUESTS,
         seed: int = 0, confirm: int = CONFIRM, rank: str = "gpu") -> PlanResult:
    """Search, estimate, rank by throughput per GPU (or, ``rank`` "cost", per dollar) within
    the SLOs, and confirm the first ``confirm`` by simulation (see the module docstring)."""
    if not hardware:
        raise SpecError("-H: expected at least one device")
    if rank not in RANKS:
        raise SpecError(f"--rank: expected one of {', '.join(RANKS)}, got {rank!r}")
    longest = sum(target.lengths)
    if model.max_position_embeddings and longest > model.max_position_embeddings:
        raise SpecError(f"--input-len + --output-len: {longest} tokens exceed {model.name}'s "
                        f"context limit {model.max_position_embeddings}")
    cols, note = priced(evaluate(candidates(model, hardware, target), target), hardware, rank)
    order = ranking(cols, target, rank)
    devices = {h.name: h for h in hardware}
    checked = [simulated(model, devices, cols, i, target, n_requests, seed)
               for i in distinct(cols, order, confirm)]
    won = next((c for c in checked if c["meets_slos"]), None)
    winner = dict(won or checked[0], confirmed=won is not None)
    return PlanResult(model, target, cols, checked, winner, (NOTES[0], note, *NOTES[1:]), rank)


def ranking(cols: dict, target: Target, rank: str = "gpu") -> np.ndarray:
    """Candidates meeting both SLOs by ``RANKS[rank]``, throughput per GPU or tokens per
    dollar (highest first, ties to the lower TPOT); when none does, all of them by how far
    they miss (the larger of TTFT p90 / SLO and TPOT / SLO)."""
    if cols["feasible"].any():
        idx = np.flatnonzero(cols["feasible"])
        return idx[np.lexsort((cols["tpot_s"][idx], -cols[RANKS[rank]][idx]))]
    miss = np.maximum(cols["ttft_p90_s"] / target.slo_ttft_s, cols["tpot_s"] / target.slo_tpot_s)
    return np.argsort(miss, kind="stable")


def distinct(cols: dict, order: np.ndarray, count: int) -> list[int]:
    """The first ``count`` of ``order`` that differ in more than the batch (device, plan,
    split and weights), so the simulations confirm different deployments."""
    keys = ("hardware", "tp", "ep", "attention_dp", "prefill_replicas", "weights_dtype")
    seen, out = set(), []
    for i in order.tolist():
        key = tuple(str(cols[k][i]) for k in keys)
        if key not in seen and len(out) < count:
            seen.add(key)
            out.append(i)
    return out


def simulated(model: Model, devices: dict, cols: dict, i: int, target: Target, n: int,
              seed: int) -> dict:
    """Candidate ``i`` simulated at its planned rate (Poisson, ``n`` requests of the mean
    lengths, fewer at a light load: ``SIM_SECONDS`` of arrivals, seeded; or the trace's
    first ``n``): its estimate and simulated p90s."""
    hw = devices[str(cols["hardware"][i])]
    wl = next(w for w in weight_choices(model, hw) if w.weights_dtype == cols["weights_dtype"][i])
    plan = Parallelism(tp=int(cols["tp"][i]), ep=int(cols["ep"][i]),
                       attention_dp=bool(cols["attention_dp"][i]))
    rate = float(cols["rate_req_s"][i])
    reqs = _head(target.trace, n) if target.trace is not None else generate(
        int(np.clip(rate * SIM_SECONDS, SIM_LEAST, n)), rate=rate,
        input_len=target.lengths[0], output_len=target.lengths[1], seed=seed)
    engine = EngineConfig(max_num_seqs=int(cols["batch"][i]))
    pre, dec = int(cols["prefill_replicas"][i]), int(cols["decode_replicas"][i])
    if pre:
        res = simulate_disaggregated(model, reqs, Pool(hw, replace(plan, dp=pre)),
                                     Pool(hw, replace(plan, dp=dec), engine),
                                     str(cols["link"][i]), EngineConfig(), wl)
    else:
        res = simulate(model, hw, reqs, replace(plan, dp=dec), engine, wl)
    s = res.summary(target.slo_ttft_s, target.slo_tpot_s)
    ttft, tpot = s["ttft_s"]["p90"], s["tpot_s"]["p90"]
    return {"index": i, "label": cols["label"][i], "rate_req_s": rate,
            "estimated_ttft_p90_s": float(cols["ttft_p90_s"][i]),
            "estimated_tpot_s": float(cols["tpot_s"][i]),
            "estimated_throughput_per_gpu": float(cols["throughput_per_gpu"][i]),
            **({"estimated_tokens_per_dollar": float(cols["tokens_per_dollar"][i])}
               if "tokens_per_dollar" in cols else {}),
            "simulated_ttft_p90_s": ttft, "simulated_tpot_p90_s": tpot,
            "simulated_throughput_per_gpu":      # the whole run: ramp-up and drain included
                float(s["throughput_tokens_per_s"] / cols["gpus"][i]),
            "goodput_req_s": s["goodput_requests_per_s"], "requests": len(reqs),
            "meets_slos": ttft <= target.slo_ttft_s and tpot <= target.slo_tpot_s}


def _head(requests: Requests, n: int) -> Requests:
    """The first ``n`` requests of an open-loop stream."""
    cut = slice(0, min(n, len(requests)))
    return replace(requests, arrival_s=requests.arrival_s[cut],
                   input_tokens=requests.input_tokens[cut],
                   output_tokens=requests.output_tokens[cut],
                   prefix_id=requests.prefix_id[cut], prefix_tokens=requests.prefix_tokens[cut],
                   prefilled=None)

