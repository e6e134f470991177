"""Speculative decoding in the estimate: the decode phase as rounds of drafts and a verify.

With speculation on, the prefill still emits the first token; the other G - 1 tokens of each
sequence come from rounds (``schedules.speculative``): K draft steps (a draft model, MTP
modules or heads) and one verify step of the target over K + 1 tokens. A round emits E
tokens per sequence in expectation (``expected_tokens``), so the decode phase is

    rounds = (G - 1) / E          (an expectation: fractional rounds are fine)
    decode = rounds x (draft + verify)      TPOT = decode / (G - 1) = (draft + verify) / E

with the round priced once, at the generation's mean context P + G // 2 (``mean_context``),
not summed step by step as plain decode is (``schedules.decode``); the estimate says so.
The phase's operator rows are the verify step's operators x rounds plus one ``draft`` row
(kind and class "draft": the drafting's time, FLOPs and bytes x rounds; a quantized draft's
weight conversion stays in it, the ``dequant`` row is the verify step's). ``plain_tpot_s`` is
the same configuration's TPOT without speculation (the static schedule's exact sum), and the
speedup is plain TPOT / TPOT. The break-even batch (a search, ``break_even_batch``) is added
only for a single estimate (``with_break_even``), never for a sweep.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from perfmodel.cost.error_class import CODE
from perfmodel.cost.ops import ByteCounts
from perfmodel.cost.step import Dtypes
from perfmodel.schedules.assumptions import Assumption, check_speculation, speculation_assumptions
from perfmodel.schedules.estimate import SpeculationSummary, mean_step
from perfmodel.schedules.phases import PhaseCost
from perfmodel.schedules.speculative import (
    RoundCost,
    Speculation,
    acceptance_rates,
    break_even_batch,
    mean_context,
    round_cost,
)
from perfmodel.specs.hardware import Hardware
from perfmodel.specs.model import Model
from perfmodel.specs.workload import Parallelism, Workload, Workloads


@dataclass(frozen=True, eq=False)
class SpeculationArrays:
    """The speculation figures of N configurations, arrays (N,) (``SpeculationSummary``
    holds one)."""

    spec: Speculation
    rates: np.ndarray               # (N, K) acceptance per drafted position
    tokens_per_round: np.ndarray
    draft_s_per_round: np.ndarray
    verify_s_per_round: np.ndarray
    plain_tpot_s: np.ndarray
    speedup: np.ndarray

    def item(self, i: int) -> SpeculationSummary:
        row = self.rates[i]
        rate = float(row[0]) if np.all(row == row[0]) else row.tolist()
        return SpeculationSummary(self.spec.k, rate, self.spec.draft,
                                  *(float(getattr(self, f)[i]) for f in _PER_ROW))

    def columns(self) -> dict[str, np.ndarray | list]:
        """``speculation_*`` columns for ``Estimates.columns`` (no break-even batch)."""
        n = len(self.speedup)
        return {"speculation_k": np.full(n, self.spec.k),
                "speculation_draft": [self.spec.draft] * n,
                "speculation_acceptance_mean": self.rates.mean(axis=1)} | {
            f"speculation_{f}": getattr(self, f) for f in _PER_ROW}


_PER_ROW = ("tokens_per_round", "draft_s_per_round", "verify_s_per_round", "plain_tpot_s",
            "speedup")


def speculative_decode(model: Model, hw: Hardware, plan: Parallelism, w: Workloads,
                       spec: Speculation, plain: PhaseCost) -> tuple[PhaseCost, RoundCost]:
    """The decode phase of every configuration of ``w`` under ``spec`` (module docstring);
    ``plain`` is its decode phase without speculation (for its step count)."""
    rc = round_cost(model, hw, plan, spec, w.batch, mean_context(w.prompt_len, w.gen_len),
                    Dtypes.of_workloads(w), w.cuda_graphs, w.expert_skew)
    rounds = plain.steps / rc.tokens_per_round          # (G - 1) / E, (N,)
    v, n = rc.verify, len(w)
    draft_steps = 1 if spec.draft == "heads" else spec.k
    per_round = np.concatenate([v.time_s, rc.draft_s[None]])
    def row(x: object) -> np.ndarray:        # a draft figure as one operator row (1, N)
        return np.broadcast_to(np.asarray(x, dtype=float), (n,))[None]

    nbytes = ByteCounts(*(np.concatenate([b, row(d)]) * rounds for b, d in
                          zip(v.bytes.astuple(), rc.draft_bytes.astuple(), strict=True)))
    per_token = rc.round_s / rc.tokens_per_round
    phase = PhaseCost(
        plain.name, plain.steps, (*v.names, "draft"), (*v.kinds, "draft"),
        (*v.classes, "draft"), np.concatenate([v.positions, [v.positions.max() + 1]]),
        np.concatenate([v.count, np.full((1, n), float(draft_steps))]), per_round * rounds,
        np.concatenate([v.flops, row(rc.draft_flops)]) * rounds, nbytes,
        np.concatenate([v.bound, row(rc.draft_bound)]), per_token, per_token,
        per_round / rc.tokens_per_round, np.concatenate([v.dequant_s, row(0.0)]) * rounds,
        np.concatenate([v.error_codes, np.full((1, n), CODE["host"], np.int8)]))
    return phase, rc


def speculate(model: Model, hw: Hardware, plan: Parallelism, w: Workloads, spec: Speculation,
              phases: tuple[PhaseCost, ...], found: tuple[Assumption, ...]
              ) -> tuple[tuple[PhaseCost, ...], tuple[Assumption, ...], SpeculationArrays]:
    """``phases`` of a static request with the decode phase replaced by speculative rounds,
    ``found`` with speculation's assumptions added, and the speculation figures."""
    if not isinstance(spec, Speculation):
        raise_not_speculation(spec)
    check_speculation(model, plan, spec)
    plain = next(p for p in phases if p.name == "decode")
    decode, rc = speculative_decode(model, hw, plan, w, spec, plain)
    plain_tpot = mean_step(plain.time, plain.steps, plain.first_step_s)
    tpot = mean_step(decode.time, decode.steps, decode.first_step_s)
    rates = np.broadcast_to(acceptance_rates(spec.acceptance, spec.k), (len(w), spec.k))
    arrays = SpeculationArrays(spec, rates, rc.tokens_per_round, rc.draft_s, rc.verify_s,
                               plain_tpot, plain_tpot / tpot)
    out = tuple(decode if p is plain else p for p in phases)
    return out, (*found, *speculation_assumptions(w, spec)), arrays


def raise_not_speculation(value: object) -> None:
    from perfmodel.specs.errors import SpecError

    raise SpecError(f"estimate: speculation must be a Speculation record like "
                    f"pm.Speculation(k=4, acceptance=0.7, draft_model=pm.model('llama-3-8b')), "
                    f"got type {type(value).__name__}")


def with_break_even(summary: SpeculationSummary, model: Model, hw: Hardware,
                    plan: Parallelism, spec: Speculation, w: Workload) -> SpeculationSummary:
    """``summary`` with the break-even batch of its configuration (``break_even_batch`` at
    the mean context, the workload's dtypes, graphs and routing skew)."""
    one = replace(spec, acceptance=summary.acceptance)
    batch = break_even_batch(model, hw, plan, one, int(mean_context(w.prompt_len, w.gen_len)),
                             Dtypes.of_workloads(Workloads.from_list([w])), w.cuda_graphs,
                             expert_skew=w.expert_skew)
    return replace(summary, break_even_batch=batch, searched=True)


__all__ = ["SpeculationArrays", "speculate", "speculative_decode", "with_break_even"]
