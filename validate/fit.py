"""Fit a device's efficiency parameters to measured kernel times (no torch here).

``fit_efficiency(samples, hw)`` takes (Op, measured seconds, timing) triples and a base
``Hardware`` and returns a copy whose ``Efficiency`` minimises the robust sum of squared log
errors log(predicted / measured), predictions coming from ``roofline.op_time`` itself (so
the fitted numbers mean exactly what the model means by them). Operator classes are
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

from perfmodel.ops import Op
from perfmodel.roofline import busy_units, kind_memory_fraction, op_time
from perfmodel.specs import Efficiency, Hardware

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
class Sample:
    op: Op
    measured_s: float
    timing: str = "kernel"


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
SHARED_FRACTION = ("gemm", "attention", "all_reduce")   # kinds that keep memory_fraction
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


def free_parameters(samples: Sequence[Sample], hw: Hardware | None = None) -> list[str]:
    """The parameters these samples can determine (see module docstring). The CPU BLAS
    terms (panel packing ``gemm_m_half``, the output-width term ``gemm_n_half``, GEMM and
    GEMV streaming fractions, the GEMV depth ramp ``gemv_k_half``) are fitted only
    for a device that runs each op to completion on the host (``launch_mode: sync``); GPU
    GEMMs keep tile padding and the shared streaming fraction."""
    kinds = {s.op.kind for s in samples}
    timings = {s.timing for s in samples}
    # every kernel kind gets its own fixed cost (so kernel_latency_s itself is not fitted)
    out = ["memory_fraction", "memory_half_bytes"]
    out += [f"kernel_latency_s.{k}" for k in sorted(kinds) if k != "all_reduce"]
    if "gemm" in kinds:
        out += ["gemm_fraction", "gemm_k_half"]
    if hw is not None and hw.efficiency.launch_mode == "sync" and "gemm" in kinds:
        out += ["gemm_m_half", "gemm_memory_fraction"]
        gemv_k = {s.op.shape["k"] for s in samples if s.op.kind == "gemm"
                  and s.op.shape["m"] <= 1}
        if gemv_k:
            out.append("gemv_memory_fraction")
        if len(gemv_k) > 1:                 # a k-trend needs GEMVs of more than one depth
            out.append("gemv_k_half")
        packed_n = [s.op.shape["n"] for s in samples if s.op.kind == "gemm"
                    and s.op.shape["m"] > 1]
        if packed_n and max(packed_n) >= 4 * min(packed_n):   # an n-trend needs n's spread
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


def _thread_limited_kinds(samples: Sequence[Sample], hw: Hardware | None) -> list[str]:
    """Kinds whose per-thread rate the samples determine: with ``parallel_grain_elements``
    set, kinds measured both on fewer threads than the device has and on all of them."""
    if hw is None or not hw.efficiency.parallel_grain_elements:
        return []
    seen: dict[str, set[bool]] = {}     # GEMMs and attention always get every unit
    for s in samples:
        seen.setdefault(s.op.kind, set()).add(busy_units(s.op, hw) < hw.compute_units)
    return sorted(k for k, few in seen.items() if few == {True, False})


def stratified(samples: Sequence[Sample], max_rows: int, seed: int = 0) -> list[Sample]:
    """At most ``max_rows`` samples, shared equally among operator classes (deterministic)."""
    if len(samples) <= max_rows:
        return list(samples)
    rng = np.random.default_rng(seed)
    by_class: dict[str, list[Sample]] = {}
    for s in samples:
        by_class.setdefault(s.op.op_class, []).append(s)
    share = max(1, max_rows // len(by_class))
    out: list[Sample] = []
    for group in by_class.values():
        keep = rng.choice(len(group), size=min(share, len(group)), replace=False)
        out += [group[i] for i in sorted(keep)]
    return out


def _weights(samples: Sequence[Sample]) -> np.ndarray:
    counts: dict[str, int] = {}
    for s in samples:
        counts[s.op.op_class] = counts.get(s.op.op_class, 0) + 1
    return np.array([1.0 / math.sqrt(counts[s.op.op_class]) for s in samples])


def log_errors(samples: Sequence[Sample], hw: Hardware) -> np.ndarray:
    """log(predicted / measured) for every sample."""
    return np.array([math.log(op_time(s.op, hw, s.timing).time_s / s.measured_s)
                     for s in samples])


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
    fractions |= {k: kind_memory_fraction(k, hw) for k in kinds}
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


def _fit_continuous(samples: Sequence[Sample], hw: Hardware, names: list[str],
                    max_nfev: int) -> tuple[Hardware, float]:
    from scipy.optimize import least_squares

    w = _weights(samples)

    def resid(x: np.ndarray) -> np.ndarray:
        trial = _with(hw, {n: float(math.exp(v)) for n, v in zip(names, x, strict=True)})
        return w * log_errors(samples, trial)

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
    fractions = {kind: kind_memory_fraction(kind, hw) if kind in eff.kernel_unit_bytes_per_s
                 else frac for kind, frac in eff.kernel_memory_fraction.items()}
    return replace(hw, efficiency=replace(eff, kernel_memory_fraction=fractions))


def fit_efficiency(samples: Sequence[Sample | tuple], hw: Hardware, *,
                   params: Sequence[str] | None = None, search_tiles: bool = False,
                   max_rows: int = 2000, max_nfev: int = 60) -> FitResult:
    """Fit ``hw``'s efficiency to ``samples`` (see module docstring).

    ``samples``: ``Sample`` or (op, measured_s[, timing]) tuples; ``params``: parameters to
    fit (default: every one the samples determine); ``search_tiles``: also choose
    gemm_tile_m/n from {64, 128, 256} (on a quarter of the rows, then refit on all).
    """
    rows = [s if isinstance(s, Sample) else Sample(*s) for s in samples]
    rows = [s for s in rows if s.measured_s > 0 and math.isfinite(s.measured_s)]
    if not rows:
        raise ValueError("no samples with a positive measured time to fit")
    names = list(params) if params is not None else free_parameters(rows, hw)
    unknown = [n for n in names if not _known(n)]
    if unknown:
        raise ValueError(f"cannot fit {', '.join(unknown)}: expected some of "
                         f"{', '.join(sorted(set(BOUNDS) & _field_names()))}")
    used = stratified(rows, max_rows)
    hw = _uncapped(hw, names)
    base, tiles = hw, {}
    if search_tiles and any(s.op.kind == "gemm" for s in used):
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
    err = float(np.median(np.abs(np.expm1(log_errors(used, fitted_hw)))))
    return FitResult(fitted_hw, fitted, fixed, len(used), err)


def fit_rows(rows: list[dict], hw: Hardware, timing: str = "auto",
             where: str = "row") -> FitResult:
    """``fit_efficiency`` (tiles searched) on measurement rows, each predicted with its own
    timing under ``auto`` (``compare.row_timing``)."""
    from perfmodel.compare import row_op, row_timing

    samples = [Sample(row_op(r, where), float(r["measured_s"]), row_timing(r, timing))
               for r in rows]
    return fit_efficiency(samples, hw, search_tiles=True)
