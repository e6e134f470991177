"""The planner's simulated check of a candidate, and the ``perfmodel simulate`` command that
reproduces it.

Replicas of one engine, each dealt a share of one Poisson stream, are statistically alike
(a share of a Poisson stream is a Poisson stream), so one replica at rate / dp stands for
dp aggregated replicas, and (x/g)P + (y/g)D at rate / g for xP + yD (``search.unit``).
The check simulates that unit in steady state: the requests arriving in the
first ``WARM`` slot-holding times (output length x TPOT) are the warm-up and those of the
last one the drain, both left out; ``measure`` requests in between are measured. How sure:
the p90s of ``BATCHES`` consecutive batches of the measured requests (batch means, which
allow for the correlation of neighbours in a queue) give a 95% Student-t interval.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from perfmodel.serving.disagg import Pool, simulate_disaggregated
from perfmodel.serving.engines import engine_config
from perfmodel.serving.engines.speculation_flags import simulate_flags
from perfmodel.serving.planner.search import unit
from perfmodel.serving.results import SimResult
from perfmodel.serving.simulate import simulate
from perfmodel.serving.traffic import generate
from perfmodel.specs.hardware import Hardware
from perfmodel.specs.model import Model

Plan = Target = Any     # serving.planner's records (which import this module)

MEASURE = 1000          # requests measured per check
# each engine's batch ceiling, as its settings and simulate's options name it
BATCH = {"vllm": "max_num_seqs", "sglang": "max_running_requests", "trtllm": "max_batch_size"}
WARM = 2.0              # slot-holding times of warm-up
BATCHES = 10
T95 = 2.262             # Student t, 9 degrees of freedom, two-sided 95%


def requests_for(rate: float, hold_s: float, measure: int) -> tuple[int, int, int]:
    """(warm-up, measured, drain) request counts at ``rate`` (req/s) for a slot held
    ``hold_s`` seconds."""
    return int(np.ceil(rate * WARM * hold_s)), measure, int(np.ceil(rate * hold_s))


def sizes(plan: Plan, cols: dict, i: int, target: Target, measure: int
          ) -> tuple[int, int, int, float, tuple[int, int, int]]:
    """(prefill, decode replicas of the unit, copies of it, the unit's rate, and its
    (warm-up, measured, drain) requests) for candidate ``i``."""
    pre, dec, copies = unit(plan.prefill_dp, plan.dp)
    share = float(cols["rate_req_s"][i]) / copies
    hold = target.lengths[1] * float(cols["tpot_s"][i])
    return pre, dec, copies, share, requests_for(share, hold, measure)


def unchecked_command(model: Model, hw: Hardware, plan: Plan, cols: dict, i: int,
                      target: Target, measure: int, seed: int) -> str:
    """The command a check of candidate ``i`` would run (for the alternatives shown)."""
    pre, dec, _, share, counts = sizes(plan, cols, i, target, measure)
    return command(model, hw, plan, target, share, sum(counts), seed, pre, dec)


def check(model: Model, hw: Hardware, plan: Plan, cols: dict, i: int, target: Target,
          measure: int, seed: int) -> dict:
    """Candidate ``i`` (``plan``) simulated as its unit at its share of the planned rate:
    its estimate, the simulated steady-state p90 TTFT and TPOT with 95% intervals, the
    command that reproduces the run, and whether the SLOs are met."""
    pre, dec, copies, share, (warm, n_measure, drain) = sizes(plan, cols, i, target, measure)
    rate, n = float(cols["rate_req_s"][i]), warm + n_measure + drain
    res = simulated(model, hw, plan, cols, i, target, measure, seed)
    out = res.requests.output_tokens
    tpot = np.where(out > 1, (res.finish_s - res.first_token_s) / np.maximum(out - 1, 1),
                    np.nan)
    cut = slice(warm, warm + n_measure)
    ttft_p90, ttft_band = _p90(res.ttft_s[cut])
    tpot_p90, tpot_band = _p90(tpot[cut])
    upper = ttft_p90 + ttft_band <= target.slo_ttft_s and tpot_p90 + tpot_band <= \
        target.slo_tpot_s
    met = ttft_p90 <= target.slo_ttft_s and tpot_p90 <= target.slo_tpot_s
    summary = res.summary(target.slo_ttft_s, target.slo_tpot_s)
    return {"index": i, "label": cols["label"][i], "rate_req_s": rate,
            "capacity_req_s": float(cols["capacity_req_s"][i]),
            "estimated_ttft_p90_s": float(cols["ttft_p90_s"][i]),
            "estimated_tpot_s": float(cols["tpot_s"][i]),
            "estimated_throughput_per_gpu": float(cols["throughput_per_gpu"][i]),
            **({"estimated_usd_per_hour": float(cols["usd_per_hour"][i])}
               if "usd_per_hour" in cols else {}),
            "simulated_ttft_p90_s": ttft_p90, "simulated_ttft_p90_band_s": ttft_band,
            "simulated_tpot_p90_s": tpot_p90, "simulated_tpot_p90_band_s": tpot_band,
            "whole_run_ttft_p90_s": summary["ttft_s"]["p90"],
            "whole_run_tpot_p90_s": summary["tpot_s"]["p90"],
            "simulated": f"{_unit_words(plan, pre, dec, copies)} at {share:.3g} req/s, "
                         f"{n} requests: {warm} warm-up and {drain} drain left out, "
                         f"{n_measure} measured",
            "requests": n, "warmup_requests": warm, "measured_requests": n_measure,
            "unit_rate_req_s": share, "copies": copies,
            "command": command(model, hw, plan, target, share, n, seed, pre, dec),
            "deployment_command": "" if pre or copies == 1 else command(
                model, hw, plan, target, rate, n * copies, seed) + f" --dp {copies}",
            "meets_slos": bool(met), "sure": bool(upper)}


def simulated(model: Model, hw: Hardware, plan: Plan, cols: dict, i: int, target: Target,
              measure: int, seed: int) -> SimResult:
    """The run ``check`` measures: candidate ``i``'s unit serving its share of the rate
    (what ``command`` reproduces)."""
    pre, dec, _, share, counts = sizes(plan, cols, i, target, measure)
    reqs = generate(sum(counts), rate=share, input_len=target.lengths[0],
                    output_len=target.lengths[1], **_lengths(target), seed=seed)
    wl = plan.precision.workload(model)
    engine = engine_config(hw.engine, **{BATCH[hw.engine]: plan.max_num_seqs},
                           speculative=target.speculative if plan.speculative else None)
    one = plan.parallelism
    if pre:         # each pool an engine with the host time, as simulate adds it
        return simulate_disaggregated(model, reqs, Pool(hw, replace(one, dp=pre)),
                                      Pool(hw, replace(one, dp=dec),
                                           replace(engine, host=target.host)),
                                      plan.link or "network",
                                      replace(engine_config(hw.engine), host=target.host), wl)
    return simulate(model, hw, reqs, one, replace(engine, host=target.host), wl)


def _lengths(target: Target) -> dict:
    if target.trace is not None:
        return {"length_dist": "empirical", "lengths_from": target.trace}
    return {"length_dist": target.length_dist, "spread": target.spread}


def _p90(values: np.ndarray) -> tuple[float, float]:
    """The p90 of ``values`` and the half-width of its 95% interval by batch means."""
    values = values[np.isfinite(values)]
    if not len(values):
        return 0.0, 0.0
    p90 = float(np.percentile(values, 90))
    parts = [np.percentile(p, 90) for p in np.array_split(values, BATCHES) if len(p)]
    if len(parts) < 2:
        return p90, float("inf")
    return p90, float(T95 * np.std(parts, ddof=1) / np.sqrt(len(parts)))


def _unit_words(plan: Plan, pre: int, dec: int, copies: int) -> str:
    if not pre:
        return "one replica" + (f" of {copies} (each gets its share of the Poisson stream)"
                                if copies > 1 else "")
    return f"{pre}P+{dec}D" + (f", one of {copies} alike units" if copies > 1 else "")


def command(model: Model, hw: Hardware, plan: Plan, target: Target, rate: float, n: int,
            seed: int, pre: int = 0, dec: int = 1) -> str:
    """The ``perfmodel simulate`` command of the check: the same requests (rate, count,
    lengths, seed), engine flags, device and parallelism; a disaggregated unit as
    ``pre`` prefill and ``dec`` decode instances, the decode pool's batch ceiling its
    own, the KV over the plan's link without contention, as the check prices it."""
    lengths = (f"--length-dist empirical --lengths-from {target.trace_path}"
               if target.trace is not None else
               f"--length-dist {target.length_dist}"
               + (f" --spread {target.spread:g}" if target.length_dist != "fixed" else ""))
    par = f"--ep {plan.ep} --attention-dp" if plan.attention_dp else \
        f"--tp {plan.tp}" + (f" --pp {plan.pp}" if plan.pp > 1 else "") + \
        (f" --ep {plan.ep}" if plan.ep > 1 else "")
    engine = f" --engine {hw.engine}" if hw.engine != "vllm" else ""
    flag = BATCH[hw.engine].replace("_", "-")
    batch = f"--{flag} {plan.max_num_seqs}" if not pre else \
        f"--prefill-replicas {pre} --decode-replicas {dec} --decode-flag " \
        f"{flag}={plan.max_num_seqs} --kv-link {plan.link or 'network'} --no-kv-contention"
    host = target.host_flags or ("--no-host-time" if target.host.none else "")
    return (f"perfmodel simulate -m {model.name} -H {hw.name}{engine} {par} "
            f"{plan.precision.simulate_flags()} {batch} "
            f"--rate {rate:.6g} --num-requests {n} --input-len {target.lengths[0]} "
            f"--output-len {target.lengths[1]} {lengths} --seed {seed} "
            f"--slo-ttft {target.slo_ttft_s:g} --slo-tpot {target.slo_tpot_s:g}"
            + (f" {host}" if host else "")
            + (f" {simulate_flags(target.speculative, hw.engine)}" if plan.speculative
               else ""))
