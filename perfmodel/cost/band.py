"""The 80% band on a priced time, from the device's per-class kernel bands.

A priced step carries each operator's error class (``StepCost.error_codes``, codes of
``cost.error_class``); ``class_seconds`` sums its time per class, and sums of steps (a phase,
a request) add those per-class totals, so the band is built from the operators up, never
from a reported total.

The device's ``uncertainty:`` block (``specs.uncertainty``) says a kernel of class ``c``
predicted at ``t`` is measured in ``[t / (1 + q90_c), t / (1 + q10_c)]`` four times in five.
How the operators' errors combine (``band``):

- within a class, fully correlated: one kernel family's bias holds over all its calls, in
  every layer, step and phase, so the class's total ``T_c`` has the band
  ``[lo_c, hi_c] = [T_c / (1 + q90_c), T_c / (1 + q10_c)]`` (a sum of calls does not
  average its error away);
- across classes, independent (a GEMM library's error says nothing of the attention
  kernel's): the deviations below the centre, ``T_c - lo_c``, add in quadrature, and so do
  those above, ``hi_c - T_c``, around the centre ``T = sum T_c``:
  ``low = T - sqrt(sum (T_c - lo_c)^2)``, ``high = T + sqrt(sum (hi_c - T_c)^2)``.
  A class whose band lies wholly on one side of its centre (every held-out kernel
  over- or under-predicted: a bias) first moves the centre by its near edge, linearly, and
  the rest of its band adds in quadrature as above.

A CUDA-graph step's composition (``specs.composition``) is one more independent term: the
seconds of fixed cost its kernels pay inside the graph (``composed``) could be hidden up to
``graph_overlap_max`` (the fast side) or not at all (the slow side); its deviations add in
quadrature with the classes'.

The centre is never moved by the band (the band is around the estimate, which stays the
estimate); a class the block does not list counts as exact. ``rule="linear"`` (classes
fully correlated too: deviations add) is the pessimistic alternative the coverage report
(reports/kernels/coverage.py) compares against.
"""

from __future__ import annotations

import numpy as np

from perfmodel.cost.sums import sum_rows
from perfmodel.specs.uncertainty import ERROR_CLASSES, Uncertainty

RULES = ("quadrature", "linear")


def class_seconds(time_s: np.ndarray, codes: np.ndarray) -> np.ndarray:
    """(classes, N): ``time_s`` (operators, N) summed per error class (``codes``, same shape
    or broadcastable: each operator's class in each row)."""
    codes = np.broadcast_to(codes, time_s.shape)
    out = np.zeros((len(ERROR_CLASSES), *time_s.shape[1:]))
    for k in np.unique(codes).tolist():
        out[k] = sum_rows(np.where(codes == k, time_s, 0.0))
    return out


def kernel_band(t: float | np.ndarray, name: str, unc: Uncertainty
                ) -> tuple[float | np.ndarray, float | np.ndarray]:
    """The band of one class's time ``t`` alone: ``[t / (1 + q90), t / (1 + q10)]``, or
    ``(t, t)`` for a class the block does not list (counted exact)."""
    if name not in unc.q10:
        return t, t
    return t / (1.0 + unc.q90[name]), t / (1.0 + unc.q10[name])


def band(class_s: np.ndarray, unc: Uncertainty, rule: str = "quadrature",
         composed: tuple[np.ndarray, np.ndarray] | None = None
         ) -> tuple[np.ndarray, np.ndarray]:
    """(low, high) of the total of ``class_s`` (classes, ...): the module docstring's rule;
    ``composed``: a graph step's composition term (seconds faster, seconds slower:
    ``Composition.edges``)."""
    if rule not in RULES:
        raise ValueError(f"rule must be one of {', '.join(RULES)}, got {rule!r}")
    class_s = np.asarray(class_s, dtype=float)
    total = sum_rows(class_s)
    shift = np.zeros_like(total)
    below, above = [], []
    for k, name in enumerate(ERROR_CLASSES):
        if name not in unc.q10:
            continue
        t = class_s[k]
        lo, hi = kernel_band(t, name, unc)
        s = np.maximum(lo - t, 0.0) + np.minimum(hi - t, 0.0)     # a one-sided band's bias
        shift = shift + s
        below.append(t + s - lo)
        above.append(hi - t - s)
    if composed is not None:
        below.append(np.broadcast_to(composed[0], total.shape))
        above.append(np.broadcast_to(composed[1], total.shape))
    if not below:
        return total, total
    down, up = np.stack(below), np.stack(above)
    if rule == "linear":
        return total + shift - sum_rows(down), total + shift + sum_rows(up)
    return (total + shift - np.sqrt(sum_rows(down ** 2)),
            total + shift + np.sqrt(sum_rows(up ** 2)))


def edges(time_s: np.ndarray, codes: np.ndarray, unc: Uncertainty | None
          ) -> tuple[np.ndarray, np.ndarray] | None:
    """(low, high) per row of operators ``time_s`` (operators, N) of classes ``codes``;
    None without a band."""
    if unc is None:
        return None
    return band(class_seconds(time_s, codes), unc)
