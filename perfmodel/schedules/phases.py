"""A phase: a run of steps of N configurations, summed per operator (arrays).

``PhaseCost`` is what every schedule returns for each of its phases: per operator (in the
step template's order) and per configuration, the time, FLOPs and bytes summed over the
phase's steps, the instances per step, and the bound that held for most of the time;
``dequant_s``, the part of each operator's time that its weight conversion adds
(``cost.dequant``), which reports show as a ``dequant`` row of their own; ``error_codes``,
each operator's error class, so the phase's uncertainty band is its operators'
(``cost.band``; a row the schedule adds, not a kernel, is ``host``).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from perfmodel.cost.ops import ByteCounts
from perfmodel.cost.step import OperatorTotals, StepCost
from perfmodel.cost.timebase import BOUNDS

DEQUANT = "dequant"     # the kind and class of the conversion's row (``specs.kinds``)


@dataclass(frozen=True, eq=False)
class PhaseCost(OperatorTotals):
    """One phase of N configurations. Operator arrays have shape (operators, N), operators
    in the order of the step cost they come from (``positions`` gives the template's)."""

    name: str
    steps: np.ndarray           # (N,) steps in the phase
    names: tuple[str, ...]
    kinds: tuple[str, ...]
    classes: tuple[str, ...]
    positions: np.ndarray       # each operator's place in the step template (display order)
    count: np.ndarray           # instances per step (0: the operator does not run)
    time_s: np.ndarray          # summed over the steps
    flops: np.ndarray
    bytes: ByteCounts
    bound: np.ndarray           # codes (``BOUNDS``): the bound of most of the time
    first_step_s: np.ndarray    # (N,)
    last_step_s: np.ndarray     # (N,)
    first_step_ops_s: np.ndarray    # (operators, N) each operator's time in the first step
    dequant_s: np.ndarray       # (operators, N) of time_s, the weight conversion's seconds
    error_codes: np.ndarray     # (operators, N) error classes (``cost.error_class``)
    # (N,) of the phase's time, the fixed-cost seconds its kernels pay inside CUDA graphs
    # (``cost.step.composed_seconds``): what the band's composition term moves
    composed_s: np.ndarray | float = 0.0

    @cached_property
    def phase_bound(self) -> np.ndarray:
        """(N,) the bound of most of the phase's time, operators counted by their own (a
        phase of no steps: the bound of most of its first step)."""
        time = np.where(self.steps > 0, self.time_s, self.first_step_ops_s)
        per = np.stack([np.where(self.bound == b, time, 0.0).sum(axis=0)
                        for b in range(len(BOUNDS))])
        return per.argmax(axis=0)

    def class_time(self, op_class: str) -> np.ndarray:
        """(N,) seconds of the operators of ``op_class`` over the phase, the weight
        conversion apart: class "dequant" (``DEQUANT``) is the seconds it adds."""
        if op_class == DEQUANT:
            return self.dequant_s.sum(axis=0)
        rows = [i for i, c in enumerate(self.classes) if c == op_class]
        own = self.time_s[rows] - self.dequant_s[rows]
        return own.sum(axis=0) if rows else np.zeros(self.time_s.shape[1])


def single_step_phase(name: str, cost: StepCost) -> PhaseCost:
    """A phase of one step per configuration (a prefill)."""
    time = cost.time
    return PhaseCost(name, np.ones(len(time), dtype=np.int64), cost.names, cost.kinds,
                     cost.classes, cost.positions, cost.count, cost.time_s, cost.flops,
                     cost.bytes, cost.bound, time, time, cost.time_s, cost.dequant_s,
                     cost.error_codes)
