"""The deployment planner: which device, parallelism (TP in a node, or wide EP across
nodes), precision recipe, batch ceiling (``max_num_seqs``), replica count and aggregated or
disaggregated (xP + yD) serving meet the p90 TTFT and TPOT SLOs at a request rate, chosen
by an objective (fewest GPUs, lowest cost per hour, or most goodput per GPU), within at
most ``--gpus``.

1. Every candidate is estimated analytically, one ``estimate_many`` call per (device,
   replica plan) over all precision recipes and batches (``planner.search``); the formulas
   that turn those times into a steady state are ``planner.search.steady_state``.
2. Candidates are filtered by the SLOs and ranked by the objective (``OBJECTIVES``); the
   first few are checked in simulation (``planner.check``: one replica at its share of the
   rate, warm-up left out, a 95% interval on each p90).
3. ``PlanResult`` holds every candidate as columns (the CSV), the Pareto front, the checks
   and the winner; ``Plan`` is the winner as a record (what the launch lines need).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from perfmodel.serving.host_time import NO_HOST, HostTime
from perfmodel.serving.planner import search
from perfmodel.serving.planner.check import MEASURE, check, unchecked_command
from perfmodel.serving.planner.energy import COLUMNS as ENERGY
from perfmodel.serving.planner.energy import check_energy, energy_cost
from perfmodel.serving.planner.prices import OBJECTIVES, priced
from perfmodel.serving.planner.search import (  # noqa: F401 - the planner's public names
    LOADS,
    Precision,
    _wait_p90,
    recipes,
    replica_plans,
    steady_state,
)
from perfmodel.serving.requests import Requests
from perfmodel.specs.errors import SpecError
from perfmodel.specs.hardware import Hardware
from perfmodel.specs.model import Model
from perfmodel.specs.workload import Parallelism

CONFIRM = 3
NOTES = ("estimates: M/D/1 queueing for prompt compute, M/D/c for batch slots (Erlang C, "
         "half M/M/c's wait); TPOT at the full batch",
         "check: one replica (or the smallest prefill:decode unit) simulated at its share of "
         "the rate, a valid shortcut since replicas dealt shares of one Poisson stream are "
         "statistically alike (a round-robin router smooths arrivals, so a whole deployment's "
         "p90 TTFT is if anything lower); warm-up (2 slot-holding times) and drain (1) left "
         "out; +- is a 95% interval from the p90s of 10 consecutive batches of the measured "
         "requests",
         "precision recipes as the engines name them: W8A8-fp8 is vLLM's --quantization fp8 "
         "(SGLang's too), fp8 KV its --kv-cache-dtype fp8 (SGLang fp8_e4m3)")
LENGTH_DISTS = ("fixed", "uniform", "lognormal")


@dataclass(frozen=True, eq=False)
class Target:
    """What the deployment must do: p90 TTFT and TPOT SLOs (seconds), mean prompt and
    output lengths (``length_dist``/``spread`` as ``simulate`` draws them), ``rate``
    (req/s; None: as much as ``gpus`` serve), ``gpus`` at most (None: no ceiling, only
    with a rate); ``trace``: a trace whose lengths the check draws from; ``host``: the
    engine's host time the simulated check adds (to both pools of a disaggregated plan)
    (``serving.host_time``; ``host_flags``: the simulate options naming it)."""

    gpus: int | None
    slo_ttft_s: float
    slo_tpot_s: float
    input_len: float
    output_len: float
    rate: float | None = None
    trace: Requests | None = None
    length_dist: str = "fixed"
    spread: float = 0.5
    trace_path: str = ""
    host: HostTime = NO_HOST        # the engine's host time in the simulated check
    host_flags: str = ""            # the simulate options that name it
    speculative: object = None      # ``engines.speculation.SpecDecode``: searched on and off

    def __post_init__(self) -> None:
        for flag, value in (("--slo-ttft", self.slo_ttft_s), ("--slo-tpot", self.slo_tpot_s),
                            ("--input-len", self.input_len), ("--output-len", self.output_len)):
            if not value > 0 or not np.isfinite(value):
                unit = "seconds" if flag.startswith("--slo") else "tokens"
                raise SpecError(f"{flag}: expected a positive number of {unit}, got {value}")
        if self.gpus is None and self.rate is None:
            raise SpecError("--gpus: expected a GPU budget, or a --rate to size the fewest")
        if self.gpus is not None and (isinstance(self.gpus, bool) or not isinstance(
                self.gpus, (int, np.integer)) or self.gpus < 1):
            raise SpecError(f"--gpus: expected a whole number of GPUs >= 1, got {self.gpus!r}")
        if self.rate is not None and not (self.rate > 0 and np.isfinite(self.rate)):
            raise SpecError(f"--rate: expected requests per second > 0, got {self.rate}")
        if self.length_dist not in (*LENGTH_DISTS, "empirical"):
            raise SpecError(f"--length-dist: expected one of {', '.join(LENGTH_DISTS)}, "
                            f"got {self.length_dist!r}")

    @property
    def lengths(self) -> tuple[int, int]:
        """(prompt, output) tokens per request, whole."""
        return max(1, round(self.input_len)), max(1, round(self.output_len))


@dataclass(frozen=True)
class Plan:
    """One deployment as the engines launch it: ``dp`` replicas (the decode pool's when
    ``prefill_dp`` > 0), each ``tp`` x ``pp`` x ``ep`` devices over ``nodes`` nodes per
    replica, the precision recipe, and the engine's batch limits."""

    model: str
    hardware: str
    tp: int
    pp: int
    ep: int
    attention_dp: bool
    dp: int
    prefill_dp: int
    precision: Precision
    gpus: int
    nodes: int
    max_num_seqs: int
    max_num_batched_tokens: int = 8192
    link: str = ""
    speculative: str = ""           # the speculative method it serves with ("": none)

    @property
    def parallelism(self) -> Parallelism:
        """One replica's ``Parallelism``."""
        return Parallelism(tp=self.tp, pp=self.pp, ep=self.ep, attention_dp=self.attention_dp)


@dataclass(frozen=True, eq=False)
class PlanResult:
    """``candidates``: one entry per candidate, as columns (``pareto``: on the front);
    ``confirmed``: the top few, ranked, each with its check; ``winner``: the first that met
    both SLOs when simulated (else the top estimate, ``confirmed`` False); ``plan``: it as
    a ``Plan``."""

    model: Model
    target: Target
    candidates: dict
    confirmed: list[dict]
    winner: dict
    notes: tuple[str, ...] = NOTES
    objective: str = "goodput"
    plan: Plan | None = None
    searched: tuple[str, ...] = ()
    alternatives: tuple[dict, ...] = ()     # the best on each other device, unchecked

    def records(self) -> list[dict]:
        """One dict per candidate (pandas-ready)."""
        cols = self.candidates
        return [{k: _plain(cols[k][i]) for k in cols} for i in range(len(cols["label"]))]


def _plain(value: object) -> object:
    return value.item() if isinstance(value, np.generic) else value


def pareto_mask(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Points no other point beats on both (at least as good on both, better on one)."""
    ge = (x[None, :] >= x[:, None]) & (y[None, :] >= y[:, None])
    gt = (x[None, :] > x[:, None]) | (y[None, :] > y[:, None])
    return ~(ge & gt).any(axis=1)


def candidates(model: Model, hardware: list[Hardware], target: Target,
               pessimistic: bool = False, energy: bool = False) -> tuple[dict, list[str]]:
    """Every candidate within ``target.gpus`` as columns, before the SLOs, and what the
    search left out in words (``planner.search`` builds the rows)."""
    prompt, gen = target.lengths
    cap = target.gpus or 10**6
    parts, notes, over, centred = [], [], [], []
    for hw in hardware:
        notes += search.left_out(model, hw, cap)
        count = len(parts)
        for plan, spec, tag in search.with_speculation(model, hw, cap, target.speculative):
            try:
                times = search.replica_times(model, hw, plan, prompt, gen, pessimistic,
                                             energy, spec, tag)
            except SpecError:       # a split the model's heads or the device cannot take
                continue
            if not len(times["batch"]):
                continue
            if pessimistic and not times["banded"] and hw.name not in centred:
                centred.append(hw.name)
            moved = search.transfer_times(model, hw, plan, times["choices"], prompt) \
                if plan.pp == 1 else {}     # a disaggregated pipeline is not simulated
            budget = cap // plan.devices
            row, pre, dec = search.replicas(times, gen, target.slo_ttft_s, target.rate,
                                            budget, bool(moved) and spec is None)
            part = _part(hw, plan, times, row, pre, dec, moved)
            fits = part["gpus"] <= cap
            over += [(int(g), label(part, i)) for i, g in enumerate(part["gpus"]) if g > cap]
            if fits.any():
                parts.append({k: v[fits] for k, v in part.items()})
        if len(parts) == count:
            notes.append(f"{hw.name}: no searched plan holds {model.name} and a sequence "
                         f"within {cap} GPUs" if target.gpus else f"{hw.name}: no searched "
                         f"plan holds {model.name} and a sequence")
    if centred:
        notes.append(f"--pessimistic: no uncertainty band for {', '.join(centred)}: planned "
                     "to the estimate's centre there")
    elif pessimistic:
        notes.append("--pessimistic: planned to the slow end of each estimate's 80% band")
    if over:
        fewest = min(over)
        notes.append(f"{len(over)} candidates need more than --gpus {target.gpus} (the "
                     f"smallest: {fewest[1]}, {fewest[0]} GPUs)")
    if not parts and over:
        what = f"{target.rate:g} req/s" if target.rate else "a sequence"
        raise SpecError(f"--gpus: {target.gpus} GPUs serve {what} on none of "
                        f"{', '.join(h.name for h in hardware)} (-H); the fewest that do: "
                        f"{min(over)[0]} GPUs ({min(over)[1]})")
    if not parts:
        raise SpecError(f"plan: {model.name} fits on none of "
                        f"{', '.join(h.name for h in hardware)} (-H)"
                        + (f" within --gpus {target.gpus}" if target.gpus else "")
                        + " at any searched plan")
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}, notes


def _part(hw: Hardware, plan: Parallelism, times: dict, row: np.ndarray, pre: np.ndarray,
          dec: np.ndarray, moved: dict) -> dict:
    n, node = len(row), hw.interconnect.max_devices
    par = f"EP{plan.ep} DP-attn" if plan.attention_dp else \
        f"TP{plan.tp}" + (f"/EP{plan.ep}" if plan.ep > 1 else "") + \
        (f" PP{plan.pp}" if plan.pp > 1 else "")
    gpus = (pre + dec) * plan.devices
    link = np.where(pre == 0, "", np.where(gpus <= node, "nvlink", "network"))
    recipe = times["recipe"][row]
    transfer = np.array([moved.get((int(r), str(k)), np.nan) if k else 0.0
                         for r, k in zip(recipe, link, strict=True)])
    ok = np.isfinite(transfer)
    full = {"hardware": np.full(n, hw.name), "parallel": np.full(n, par),
            "tp": np.full(n, plan.tp), "pp": np.full(n, plan.pp), "ep": np.full(n, plan.ep),
            "attention_dp": np.full(n, plan.attention_dp),
            "mode": np.where(pre > 0, "disaggregated", "aggregated"),
            "prefill_replicas": pre, "decode_replicas": dec, "gpus": gpus,
            "nodes_per_replica": np.full(n, -(-plan.devices // node)),
            "nodes": -(-gpus // node), "transfer_s": transfer, "link": link}
    full |= {k: times[k][row] for k in ("precision", "weights_dtype", "act_dtype", "kv_dtype",
                                         "batch", "kv_max_batch", "prefill_s", "step_s",
                                         "static_tokens_per_s", "speculative") if k in times}
    full |= {k: times[k][row] for k in ENERGY if k in times}
    return {k: np.asarray(v)[ok] for k, v in full.items()}


def evaluate(cols: dict, target: Target) -> dict:
    """``steady_state`` at every share of ``LOADS``; the largest share whose TTFT p90 meets
    the SLO is the SLO load (``slo_rate_req_s``); the planned rate is ``target.rate``
    (which must fit under it) or, without one, that load; the SLO checks, goodput per GPU
    (the SLO load's output tokens/s per GPU), tokens/s per user and the Pareto front."""
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
        some &= best >= target.rate * (1 - 1e-9)
    out = cols | {"tpot_s": st["tpot_s"], "ttft_p90_s": ttft,
                  "capacity_req_s": st["capacity_req_s"], "slo_rate_req_s": best,
                  "rate_req_s": rate,
                  "load_share": rate / st["capacity_req_s"],
                  "throughput_per_gpu": best * target.lengths[1] / cols["gpus"],
                  "tokens_per_s_per_user": 1.0 / st["tpot_s"], "meets_ttft": some,
                  "meets_tpot": st["tpot_s"] <= target.slo_tpot_s}
    out["feasible"] = out["meets_ttft"] & out["meets_tpot"]
    return out | {"label": [label(out, i) for i in range(len(best))]}


def front(cols: dict, target: Target) -> np.ndarray:
    """The Pareto front: with a rate, of cost (USD/hour where priced, else GPUs) against
    TPOT among the candidates meeting TTFT at it; without, of goodput per GPU against
    tokens/s per user."""
    if target.rate is None:
        live = cols["slo_rate_req_s"] > 0
        x, y = cols["tokens_per_s_per_user"], cols["throughput_per_gpu"]
    else:
        live = cols["meets_ttft"]
        x, y = -cols["tpot_s"], -cols.get("usd_per_hour", cols["gpus"]).astype(float)
    out = np.zeros(len(live), bool)
    out[live] = pareto_mask(x[live], y[live])
    return out


def label(cols: dict, i: int) -> str:
    """'h100-sxm TP4 x2 W8A8-fp8 B64', 'h100-sxm TP2 1P+3D bf16 B128'."""
    split = f"{cols['prefill_replicas'][i]}P+{cols['decode_replicas'][i]}D" \
        if cols["prefill_replicas"][i] else f"x{cols['decode_replicas'][i]}"
    spec = f" +{cols['speculative'][i]}" if "speculative" in cols and \
        cols["speculative"][i] else ""
    return f"{cols['hardware'][i]} {cols['parallel'][i]} {split} {cols['precision'][i]} " \
           f"B{cols['batch'][i]}{spec}"


def plan(model: Model, hardware: list[Hardware], target: Target, measure: int = MEASURE,
         seed: int = 0, confirm: int = CONFIRM, objective: str | None = None,
         prices: dict[str, float] | None = None,
         progress: Callable[[str], None] | None = None,
         pessimistic: bool = False, energy: bool = False,
         usd_per_kwh: float | None = None) -> PlanResult:
    """Search, estimate, rank by ``objective`` (default: fewest GPUs with a rate, most
    goodput per GPU without) within the SLOs, and check the first ``confirm`` in
    simulation, stopping at the first that meets both SLOs beyond its 95% interval.
    ``progress(stage)`` is told each stage. ``energy`` (implied by objective "energy"): each
    candidate's joules per output token and, priced, its $ per million tokens
    (``planner.energy``; ``usd_per_kwh`` the electricity's part)."""
    if not hardware:
        raise SpecError("-H: expected at least one device")
    objective = objective or ("gpus" if target.rate is not None else "goodput")
    if objective not in OBJECTIVES:
        raise SpecError(f"--objective: expected one of {', '.join(OBJECTIVES)}, got "
                        f"{objective!r}")
    longest = sum(target.lengths)
    if model.max_position_embeddings and longest > model.max_position_embeddings:
        raise SpecError(f"--input-len + --output-len: {longest} tokens exceed {model.name}'s "
                        f"context limit {model.max_position_embeddings}")
    tell = progress or (lambda _: None)
    tell(f"estimating candidates on {', '.join(h.name for h in hardware)}")
    energy = energy or objective == "energy"
    cols, searched = candidates(model, hardware, target, pessimistic, energy)
    if objective == "energy":
        check_energy(cols, hardware)
    cols, note = priced(evaluate(cols, target), hardware, objective, prices)
    if energy:
        cols = energy_cost(cols, target.lengths[1], usd_per_kwh)
    cols["pareto"] = front(cols, target)
    order = ranking(cols, target, objective)
    devices = {h.name: h for h in hardware}
    checked = []
    for k, i in enumerate(distinct(cols, order, confirm)):
        tell(f"simulating {k + 1} of at most {confirm}: {cols['label'][i]}")
        checked.append(check(model, devices[str(cols["hardware"][i])], record(model, cols, i),
                             cols, i, target, measure, seed))
        if checked[-1]["meets_slos"] and checked[-1]["sure"]:
            break                  # the first surely met is the winner: no more to check
    won = next((c for c in checked if c["meets_slos"]), None)
    winner = dict(won or checked[0], confirmed=won is not None)
    others = []
    for h in hardware:
        first = next((int(i) for i in order if cols["hardware"][i] == h.name), None)
        if h.name != cols["hardware"][winner["index"]] and first is not None:
            others.append({"index": first, "label": cols["label"][first],
                           "feasible": bool(cols["feasible"][first]),
                           "command": unchecked_command(model, h, record(model, cols, first),
                                                        cols, first, target, measure, seed)})
    return PlanResult(model, target, cols, checked, winner, (note, *NOTES), objective,
                      record(model, cols, winner["index"]), tuple(searched), tuple(others))


def record(model: Model, cols: dict, i: int) -> Plan:
    """Candidate ``i`` as a ``Plan``."""
    return Plan(model.name, str(cols["hardware"][i]), int(cols["tp"][i]), int(cols["pp"][i]),
                int(cols["ep"][i]), bool(cols["attention_dp"][i]),
                int(cols["decode_replicas"][i]), int(cols["prefill_replicas"][i]),
                Precision(str(cols["weights_dtype"][i]), str(cols["act_dtype"][i]),
                          str(cols["kv_dtype"][i])),
                int(cols["gpus"][i]), int(cols["nodes_per_replica"][i]), int(cols["batch"][i]),
                link=str(cols["link"][i]),
                speculative=str(cols["speculative"][i]) if "speculative" in cols else "")


def ranking(cols: dict, target: Target, objective: str = "goodput") -> np.ndarray:
    """Candidates meeting both SLOs by the objective (``OBJECTIVES``; ties to aggregated
    serving, one engine kind and no KV transfer, then more goodput per GPU, then the lower
    TPOT); when none does, all of them by how far they miss (the
    larger of TTFT p90 / SLO and TPOT / SLO)."""
    if cols["feasible"].any():
        idx = np.flatnonzero(cols["feasible"])
        key, sign = OBJECTIVES[objective]
        keys = [cols["tpot_s"][idx], -cols["throughput_per_gpu"][idx]]
        if key != "throughput_per_gpu":       # at equal GPUs or cost: the simpler first
            keys += [cols["prefill_replicas"][idx] > 0, sign * np.asarray(cols[key][idx], float)]
        return idx[np.lexsort(tuple(keys))]
    miss = np.maximum(cols["ttft_p90_s"] / target.slo_ttft_s, cols["tpot_s"] / target.slo_tpot_s)
    return np.argsort(miss, kind="stable")


def distinct(cols: dict, order: np.ndarray, count: int) -> list[int]:
    """The first ``count`` of ``order`` that differ in more than the batch (device, plan,
    split and precision), so the simulations check different deployments."""
    keys = ("hardware", "tp", "pp", "ep", "attention_dp", "prefill_replicas", "precision",
            "speculative")
    seen, out = set(), []
    for i in order.tolist():
        key = tuple(str(cols[k][i]) for k in keys if k in cols)
        if key not in seen and len(out) < count:
            seen.add(key)
            out.append(i)
    return out
