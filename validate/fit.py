"""Fit a device's efficiency parameters to measured kernel times (no torch here).

``fit_efficiency(samples, hw)`` takes (operator record, measured seconds, timing) triples
(or ``samples.Samples``) and a base ``Hardware`` and returns a copy whose ``Efficiency``
minimises the robust sum of squared log errors log(predicted / measured), predictions coming
from ``roofline.op_time`` itself (so the fitted numbers mean exactly what the model means by
them), one call per record type for all samples at once. Operator classes are
weighted equally, whatever their row counts. Continuous parameters are fitted in log space
within physical bounds (scipy ``least_squares``, soft-L1 loss); integer GEMM tiles are
chosen by a small grid search. Parameters the samples cannot determine are left as they are:
launch overhead when every sample is kernel-timed, or when every sample is host-timed (it
then only adds to the kernel latency); GEMM parameters without GEMM rows.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace

import numpy as np

from perfmodel.cost.roofline import TIMINGS, kind_memory_fraction
from perfmodel.specs import Efficiency, Hardware
from perfmodel.specs.kinds import KINDS, OWN_FRACTION, OWN_LATENCY
from validate.samples import Sample, Samples

__all__ = ["BOUNDS", "FitResult", "Sample", "Samples", "fit_efficiency", "fit_rows",
           "free_parameters", "log_errors", "stratified"]

# parameter -> (lower, upper) bound; "off" refinements sit at their lower bound
BOUNDS: dict[str, tuple[float, float]] = {
    "gemm_fraction": (0.02, 1.0),
    "attention_fraction": (0.02, 1.0),
    "memory_fraction": (0.02, 1.0),
    "kernel_latency_s": (1e-8, 1e-3),
    "launch_overhead_s": (1e-8, 1e-3),
    "gemm_k_half": (1e-2, 1e5),
    "memory_half_bytes": (1.0, 1e10),
    "gemm_m_half": (1e-2, 1e4),
    "gemm_n_half": (1e2, 1e8),
    "gemm_memory_fraction": (0.01, 1.0),
    "gemv_memory_fraction": (0.01, 1.0),
    "gemv_k_half": (1e-2, 1e5),
    "thread_share": (0.02, 1.0),
}
OFF_ABOVE = {"gemm_n_half": 1e7}    # a half-width this far beyond any real n: no effect
OFF_BELOW = {"gemm_k_half": 0.1, "gemm_m_half": 0.1, "gemv_k_half": 0.1,
             "memory_half_bytes": 10.0,
             "kernel_latency_s": 1e-7}
TILE_CHOICES = (64, 128, 256)


@dataclass(frozen=True)
class FitResult:
    hardware: Hardware
    fitted: dict[str, float]         # parameter -> value (tiles included when searched)
    fixed: tuple[str, ...]           # parameters left at the base value, and why not fitted
    n_rows: int                      # rows used (after the stratified subsample)
    median_abs_error: float          # on those rows, after fitting


# "<parameter>.<kind>" names a per-kernel-kind value: the Efficiency mapping it lives in
PER_KIND_FIELDS = {"memory_fraction": "kernel_memory_fraction",
                   "kernel_latency_s": "kernel_latency_by_kind"}
# kinds that keep memory_fraction: the registry's kinds without their own streaming fraction
SHARED_FRACTION = tuple(k for k in KINDS if k not in OWN_FRACTION)
# "thread_share.<kind>": one thread's rate over the kind's rate on all the units, s. It
# sets kernel_unit_bytes_per_s[kind] = s x the kind's fraction x bandwidth (s = 1: no cap),
# so the fraction holds the rate of a kernel with every thread and s that of one with
# one: fitting the cap itself stalls wherever min(fraction, cap) leaves it unbinding
SHARE = "thread_share"
SHARE_OFF = 0.99        # a thread within 1% of all of them: no cap


def _field_names() -> set[str]:
    return {f.name for f in fields(Efficiency)}


def _split(name: str) -> tuple[str, str | None]:
    base, _, kind = name.partition(".")
    return (base, kind) if kind and (base in PER_KIND_FIELDS or base == SHARE) \
        else (name, None)


def _bounds(name: str) -> tuple[float, float]:
    return BOUNDS[_split(name)[0]]


def _known(name: str) -> bool:
    _, kind = _split(name)
    return kind is not None or (name in BOUNDS and name in _field_names())


def _value(hw: Hardware, name: str) -> float | None:
    base, kind = _split(name)
    if kind is None:
        return getattr(hw.efficiency, name)
    if base == SHARE:
        rate = hw.efficiency.kernel_unit_bytes_per_s.get(kind)
        full = hw.efficiency.memory_fraction_for(kind) * hw.memory_bytes_per_s
        return min(1.0, rate / full) if rate else 1.0
    table = getattr(hw.efficiency, PER_KIND_FIELDS[base])
    return table.get(kind, getattr(hw.efficiency, base))


def free_parameters(samples: Samples | Sequence[Sample], hw: Hardware | None = None
                    ) -> list[str]:
    """The parameters these samples can determine (see module docstring). The CPU BLAS
    terms (panel packing ``gemm_m_half``, the output-width term ``gemm_n_half``, GEMM and
    GEMV streaming fractions, the GEMV depth ramp ``gemv_k_half``) are fitted only
    for a device that runs each op to completion on the host (``launch_mode: sync``); GPU
    GEMMs keep tile padding and the shared streaming fraction."""
    samples = Samples.of(samples)
    kinds = set(samples.kinds)
    timings = {TIMINGS[c] for c in set(samples.timing.tolist())}
    # every kernel kind gets its own fixed cost (so kernel_latency_s itself is not fitted)
    out = ["memory_fraction", "memory_half_bytes"]
    out += [f"kernel_latency_s.{k}" for k in sorted(kinds) if k in OWN_LATENCY]
    if "gemm" in kinds:
        out += ["gemm_fraction", "gemm_k_half"]
    if hw is not None and hw.efficiency.launch_mode == "sync" and "gemm" in kinds:
        out += ["gemm_m_half", "gemm_memory_fraction"]
        gemm, m = samples.kinds == "gemm", samples.field("m")
        gemv_k = set(samples.field("k")[gemm & (m <= 1)].tolist())
        if gemv_k:
            out.append("gemv_memory_fraction")
        if len(gemv_k) > 1:                 # a k-trend needs GEMVs of more than one depth
            out.append("gemv_k_half")
        packed_n = samples.field("n")[gemm & (m > 1)]
        if len(packed_n) and packed_n.max() >= 4 * packed_n.min():   # an n-trend: n's spread
            out.append("gemm_n_half")
    if "attention" in kinds:
        out.append("attention_fraction")
    if "stream" in timings:
        out.append("launch_overhead_s")
    # each memory-bound kernel kind gets its own streaming fraction (a two-pass norm and a
    # vectorised add differ by 2-3x on the same device)
    out += [f"memory_fraction.{k}" for k in sorted(kinds) if k not in SHARED_FRACTION]
    out += [f"{SHARE}.{k}" for k in _thread_limited_kinds(samples, hw)]
    return [p for p in dict.fromkeys(out) if _known(p)]


def _thread_limited_kinds(samples: Samples, hw: Hardware | None) -> list[str]:
    """Kinds whose per-thread rate the samples determine: with ``parallel_grain_elements``
    set, kinds measured both on fewer threads than the device has and on all of them."""
    if hw is None or not hw.efficiency.parallel_grain_elements:
        return []
    seen: dict[str, set[bool]] = {}     # GEMMs and attention always get every unit
    partial = samples.busy_units(hw) < hw.compute_units
    for kind, below in zip(samples.kinds, partial.tolist(), strict=True):
        seen.setdefault(kind, set()).add(below)
    return sorted(k for k, few in seen.items() if few == {True, False})


def stratified_index(classes: Sequence[str], max_rows: int, seed: int = 0) -> np.ndarray:
    """Positions of at most ``max_rows`` of ``classes``, shared equally among the classes
    (deterministic; each class's positions in order, classes in order of appearance)."""
    classes = np.asarray(classes, dtype=object)
    if len(classes) <= max_rows:
        return np.arange(len(classes))
    rng = np.random.default_rng(seed)
    by_class = [np.flatnonzero(classes == c) for c in dict.fromkeys(classes.tolist())]
    share = max(1, max_rows // len(by_class))
    out = []
    for group in by_class:
        keep = rng.choice(len(group), size=min(share, len(group)), replace=False)
        out.append(group[np.sort(keep)])
    return np.concatenate(out)


def stratified(samples: Samples | Sequence[Sample], max_rows: int, seed: int = 0) -> Samples:
    """At most ``max_rows`` samples, shared equally among operator classes (deterministic)."""
    samples = Samples.of(samples)
    return samples.take(stratified_index(samples.classes, max_rows, seed))


def _weights(samples: Samples) -> np.ndarray:
    counts = dict(zip(*np.unique(samples.classes.astype(str), return_counts=True),
                      strict=True))
    return np.array([1.0 / math.sqrt(counts[c]) for c in samples.classes])


def log_errors(samples: Samples | Sequence[Sample], hw: Hardware) -> np.ndarray:
    """log(predicted / measured) for every sample."""
    return Samples.of(samples).log_errors(hw)


def _with(hw: Hardware, values: dict[str, float]) -> Hardware:
    plain: dict = {}
    shares = {}
    for name, value in values.items():
        base, kind = _split(name)
        if kind is None:
            plain[name] = value
            continue
        if base == SHARE:
            shares[kind] = value
            continue
        field = PER_KIND_FIELDS[base]
        table = plain.setdefault(field, dict(getattr(hw.efficiency, field)))
        table[kind] = value
    out = replace(hw, efficiency=replace(hw.efficiency, **plain))
    if not shares:
        return out
    rates = dict(out.efficiency.kernel_unit_bytes_per_s)
    for kind, share in shares.items():
        rates.pop(kind, None)
        if share < SHARE_OFF:
            rates[kind] = share * out.efficiency.memory_fraction_for(kind) \
                * hw.memory_bytes_per_s
    return replace(out, efficiency=replace(out.efficiency, kernel_unit_bytes_per_s=rates))


def _uncapped(hw: Hardware, names: Sequence[str]) -> Hardware:
    """``hw`` with the fitted kinds' streaming fractions made explicit and their per-SM caps
    dropped: a fitted fraction replaces a sourced cap, starting from the rate it gave."""
    caps = dict(hw.efficiency.kernel_unit_bytes_per_s)
    kinds = [_split(n)[1] for n in names if _split(n)[0] == "memory_fraction"]
    kinds = [k for k in kinds if k in caps and f"{SHARE}.{k}" not in names]
    if not kinds:
        return hw
    fractions = dict(hw.efficiency.kernel_memory_fraction)
    fractions |= {k: float(kind_memory_fraction(k, hw)) for k in kinds}
    for k in kinds:
        del caps[k]
    return replace(hw, efficiency=replace(hw.efficiency, kernel_unit_bytes_per_s=caps,
                                          kernel_memory_fraction=fractions))


def _start(hw: Hardware, name: str) -> float:
    lo, hi = _bounds(name)
    value = _value(hw, name)
    if _split(name)[0] == SHARE:
        value = min(value, 0.7)           # inside the bounds: a cap that binds at first
    if value is None and name == "attention_fraction":
        value = hw.efficiency.attention
    if value is None and name in ("gemm_memory_fraction", "gemv_memory_fraction"):
        value = hw.efficiency.memory_fraction
    if not value and name in OFF_ABOVE:       # off = beyond the upper end: start there
        value = OFF_ABOVE[name]
    return math.log(min(max(value or lo, lo), hi))


class _Residuals:
    """Weighted log errors of ``samples`` at log parameter values ``x`` (scipy's ``fun``).

    An entry of a per-kind table (``memory_fraction.<kind>``, ``kernel_latency_s.<kind>``,
    ``thread_share.<kind>``) acts on kernels of its kind alone, so a vector that differs from
    the last full evaluation only in such entries (a column of the finite-difference
    Jacobian) prices again only the record types that hold those kinds: the same numbers,
    fewer ``op_time`` calls."""

    def __init__(self, samples: Samples, hw: Hardware, names: list[str]) -> None:
        self.samples, self.hw, self.names = samples, hw, names
        self.weights = _weights(samples)
        self.kind = np.array([_split(n)[1] for n in names], dtype=object)
        self.last: tuple[np.ndarray, np.ndarray] | None = None

    def __call__(self, x: np.ndarray) -> np.ndarray:
        trial = _with(self.hw, {n: float(math.exp(v))
                                for n, v in zip(self.names, x, strict=True)})
        if self.last is not None:
            kinds = set(self.kind[x != self.last[0]].tolist())
            if None not in kinds:
                return self.weights * self.samples.log_errors(trial, kinds, self.last[1])
        errors = self.samples.log_errors(trial)
        self.last = (np.array(x, dtype=float), errors)
        return self.weights * errors


def _fit_continuous(samples: Samples, hw: Hardware, names: list[str],
                    max_nfev: int) -> tuple[Hardware, float]:
    from scipy.optimize import least_squares

    resid = _Residuals(samples, hw, names)
    x0 = np.array([_start(hw, n) for n in names])
    lo = np.log([_bounds(n)[0] for n in names])
    hi = np.log([_bounds(n)[1] for n in names])
    sol = least_squares(resid, x0, bounds=(lo, hi), loss="soft_l1", f_scale=0.1,
                        diff_step=1e-3, max_nfev=max_nfev, x_scale=1.0)
    values = {n: float(math.exp(v)) for n, v in zip(names, sol.x, strict=True)}
    values = {n: (0.0 if v < OFF_BELOW.get(_split(n)[0], -1.0)
                  or v > OFF_ABOVE.get(_split(n)[0], math.inf) else v)
              for n, v in values.items()}
    return _tidy_caps(_with(hw, values)), float(sol.cost)


def _tidy_caps(hw: Hardware) -> Hardware:
    """A kind's own streaming fraction above what all the units deliver at its per-unit
    rate has no effect: written as that rate (the same times, read as they act)."""
    eff = hw.efficiency
    fractions = {kind: float(kind_memory_fraction(kind, hw))
                 if kind in eff.kernel_unit_bytes_per_s else frac
                 for kind, frac in eff.kernel_memory_fraction.items()}
    return replace(hw, efficiency=replace(eff, kernel_memory_fraction=fractions))


def fit_efficiency(samples: Samples | Sequence[Sample | tuple], hw: Hardware, *,
                   params: Sequence[str] | None = None, search_tiles: bool = False,
                   max_rows: int = 2000, max_nfev: int = 60) -> FitResult:
    """Fit ``hw``'s efficiency to ``samples`` (see module docstring).

    ``samples``: ``Samples``, or ``Sample`` or (op, measured_s[, timing]) tuples of one
    operator instance each; ``params``: parameters to fit (default: every one the samples
    determine); ``search_tiles``: also choose gemm_tile_m/n from {64, 128, 256} (on a
    quarter of the rows, then refit on all).
    """
    rows = Samples.of(samples)
    rows = rows.take(np.flatnonzero((rows.measured > 0) & np.isfinite(rows.measured)))
    if not len(rows):
        raise ValueError("no samples with a positive measured time to fit")
    names = list(params) if params is not None else free_parameters(rows, hw)
    unknown = [n for n in names if not _known(n)]
    if unknown:
        raise ValueError(f"cannot fit {', '.join(unknown)}: expected some of "
                         f"{', '.join(sorted(set(BOUNDS) & _field_names()))}")
    used = stratified(rows, max_rows)
    hw = _uncapped(hw, names)
    base, tiles = hw, {}
    if search_tiles and (used.kinds == "gemm").any():
        probe = stratified(used, max(200, len(used) // 4), seed=1)
        best = min(((tm, tn) for tm in TILE_CHOICES for tn in TILE_CHOICES),
                   key=lambda t: _fit_continuous(
                       probe, _with(hw, {"gemm_tile_m": t[0], "gemm_tile_n": t[1]}), names,
                       max(10, max_nfev // 3))[1])
        tiles = {"gemm_tile_m": best[0], "gemm_tile_n": best[1]}
        base = _with(hw, tiles)
    fitted_hw, _ = _fit_continuous(used, base, names, max_nfev) if names else (base, 0.0)
    fitted = {n: _value(fitted_hw, n) for n in names} | tiles
    fixed = tuple(sorted((set(BOUNDS) & _field_names()) - set(names)))
    err = float(np.median(np.abs(np.expm1(used.log_errors(fitted_hw)))))
    return FitResult(fitted_hw, fitted, fixed, len(used), err)


def fit_rows(rows: list[dict], hw: Hardware, timing: str = "auto",
             where: str = "row") -> FitResult:
    """``fit_efficiency`` (tiles searched) on measurement rows, each predicted with its own
    timing under ``auto`` (``compare.row_timing``)."""
    return fit_efficiency(Samples.from_rows(rows, timing, where), hw, search_tiles=True)
