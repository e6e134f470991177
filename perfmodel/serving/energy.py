"""Energy of a simulated run (``simulate --energy``): every committed step of the first
engine re-priced for its roofline utilization, its power from ``cost.power``, idle power
between steps and over host time, scaled to every engine of the run.

A step's log keeps its sequences, its tokens and its prompt tokens, not each sequence's
context, so the re-pricing takes each step as two groups: its decodes (tokens - prompt
tokens sequences of one token) at the run's mean decode context (prompt + half the output),
and its prompt chunks (the other sequences, the prompt tokens shared evenly) each from an
empty cache. Only the step's utilization comes from that: its compute and memory seconds
over the re-priced step's time, applied to the step's own logged GPU seconds. With ``dp``
engines the first engine's joules per token stand for all of them (a router balances them).
"""

from __future__ import annotations

import numpy as np

from perfmodel.cost.power import busy_seconds, device_power, energy_j
from perfmodel.cost.step import Dtypes, Step, price_step
from perfmodel.serving.results import SimResult
from perfmodel.specs.hardware import Hardware
from perfmodel.specs.model import Model
from perfmodel.specs.workload import Parallelism, Workload, Workloads


def _steps(res: SimResult) -> tuple[Step, np.ndarray]:
    """The logged steps as (count, new, context) groups, unique ones only, and each logged
    step's row among them."""
    log, req = res.steps, res.requests
    decodes = np.maximum(log.tokens - log.prefill_tokens, 0)
    prompts = np.where(log.prefill_tokens > 0, np.maximum(log.seqs - decodes, 1), 0)
    chunk = np.where(prompts > 0, -(-log.prefill_tokens // np.maximum(prompts, 1)), 1)
    ctx = int(max(1, round(float(req.input_tokens.mean() + req.output_tokens.mean() / 2))))
    rows = np.stack([decodes, prompts, chunk], axis=1)
    unique, where = np.unique(rows, axis=0, return_inverse=True)
    d, p, c = (unique[:, j].astype(np.int64) for j in range(3))
    count = np.stack([d, p], axis=1)
    new = np.stack([np.ones_like(c), c], axis=1)
    context = np.stack([np.full_like(c, ctx), c], axis=1)
    return Step(count, new, context), np.ravel(where)


def sim_energy(res: SimResult, model: Model, hw: Hardware, plan: Parallelism,
               w: Workload) -> dict | None:
    """Joules, mean watts per device, joules per output token and its prefill and decode
    parts (the steps' prompt-token and decode-token shares of each step's joules) of
    ``res``; None where ``hw`` has no ``power:`` block."""
    dev = device_power(hw)
    if dev is None:
        return None
    log = res.steps
    engines = plan.dp
    devices = plan.devices // plan.dp
    gpu = np.maximum(log.gpu_s, 0.0)
    dynamic = np.zeros(len(gpu))
    if len(gpu):
        step, where = _steps(res)
        dtypes = Dtypes.of_workloads(Workloads.from_list([w]))
        cost = price_step(model, hw, plan, step, dtypes.take(np.zeros(len(step), np.int64)))
        rate = hw.peak_table()[cost.dtype.astype(np.int64)]
        flops = np.where(np.isfinite(rate) & (cost.flops > 0), cost.flops, 0.0)
        compute_s, memory_s = busy_seconds(hw, flops, cost.total_bytes.total,
                                           np.where(np.isfinite(rate), rate, 1.0))
        share_c = compute_s.sum(axis=0) / cost.time
        share_m = memory_s / cost.time
        dynamic = energy_j(dev, gpu, share_c[where] * gpu, share_m[where] * gpu) \
            - dev.idle_w * gpu
    duration = res.duration_s
    # under pipeline parallelism a step's GPU seconds are summed over its stages, each
    # stage one tensor-parallel group busy its own share: the dynamic joules are a group's
    joules = (dev.idle_w * duration * devices + dynamic.sum() * plan.group) * engines
    per_device = joules / (devices * engines)
    tokens = float(res.requests.output_tokens.sum())
    prompt_share = np.divide(log.prefill_tokens, log.tokens, out=np.zeros(len(gpu)),
                             where=log.tokens > 0)
    step_j = dynamic * plan.group + dev.idle_w * log.time_s * devices
    prefill_j = float((step_j * prompt_share).sum()) * engines
    return {"joules": joules, "watts_per_device": per_device / duration,
            "j_per_output_token": joules / tokens,
            "prefill_j_per_prompt_token": prefill_j / max(float(
                res.requests.input_tokens.sum()), 1.0),
            "decode_j_per_token": (joules - prefill_j) / tokens,
            "tdp_watts": dev.tdp_w, "idle_watts": dev.idle_w,
            "idle_assumed": dev.idle_assumed, "devices": devices * engines,
            "note": dev.note}


__all__ = ["sim_energy"]
