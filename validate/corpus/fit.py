"""Fit a device's efficiency constants to measured kernels (``corpus.sets``; no torch).

The model's structure (roofline, tiles, waves, splits, the collectives' algorithms) stays;
only constants with a physical meaning are fitted, each inside a plausible range
(``PARAMETERS``), by bounded least squares on log(predicted / measured) (scipy
``least_squares``; a soft-L1 loss of 5% on each row's own log error, ``soft_l1``; every
error class weighted equally whatever its row count), in three stages whose parameters act
on disjoint kernels, so each sees only its own:

1. GEMMs (gemv and gemm rows): best-shape ``gemm_fraction``, the k-depth ramp
   ``gemm_k_half``, streaming ``memory_fraction`` (the weight-streaming GEMMs are the
   corpus's memory-bound kernels) and the fixed cost of a kernel ``kernel_latency_s``.
   The size ramp ``memory_half_bytes`` is not fitted: for a memory-bound kernel of b bytes,
   b / (BW x b / (b + h)) = b / BW + h / BW, a second fixed cost indistinguishable from
   ``kernel_latency_s`` on these rows (fitted together on the H100 they split 3.3 us as
   1.4 us + 1.9 us, for 1.4 points less held-out GEMM error), which every unmeasured small
   kernel (norms, rotary) would then pay on top of its own fixed cost;
2. attention (decode and prefill rows, with stage 1's constants): ``attention_fraction`` and
   the attention call's fixed cost ``kernel_latency_s.attention`` (kernel_latency_by_kind);
3. all-reduce: NCCL's ``collective_fraction`` and ``collective_latency_s``, the engine's
   custom all-reduce ``custom_all_reduce_fraction`` and ``custom_all_reduce_latency_s``;
4. fused MoE layers (every weight format the engine's collector timed, with stage 1's
   constants), one fit per format class (``cost.moe``: the engine runs a kernel of its own
   for each): the expert GEMMs' ``gemm_fraction``, ``memory_fraction`` and ``latency_s``
   (``efficiency.moe_kernels.<class>``, parameters ``moe.<class>.<field>``), and the
   routing costs ``slot_s`` and ``scan_s`` on TensorRT-LLM's rows (``ROUTING``).

``fit_devices`` fits one set of constants to several devices at once (each keeps its own
peaks, bandwidth and units): a family rule, used for leave-one-device-out.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from perfmodel.specs.dtypes import DENSE_FORMATS
from perfmodel.specs.hardware import Hardware
from validate.corpus.params import MOE_FIELDS, PARAMETERS, ROUTING, _start, apply, param_entry
from validate.corpus.sets import KernelSet

STAGES: tuple[tuple[tuple[str, ...], tuple[str, ...]], ...] = (
    (("gemv", "gemm"), ("gemm_fraction", "gemm_k_half", "memory_fraction",
                        "kernel_latency_s")),
    (("attention_decode", "attention_prefill"), ("attention_fraction",
                                                 "attention_program_keys",
                                                 "attention_head_dim_half",
                                                 "attention_fallback_fraction",
                                                 "attention_fallback_program_steps",
                                                 "attention_decode_fraction",
                                                 "attention_decode_program_keys",
                                                 "attention_decode_latency_s",
                                                 "attention_decode_head_dim_half",
                                                 "memory_fraction.attention",
                                                 "kernel_latency_s.attention")),
    (("collective",), ("collective_fraction", "collective_latency_s",
                       "custom_all_reduce_fraction", "custom_all_reduce_latency_s")),
)
MAX_ROWS = 2500                     # per error class and device in one fit (deterministic)


def subsample(s: KernelSet, max_rows: int = MAX_ROWS, seed: int = 0) -> KernelSet:
    """At most ``max_rows`` rows of ``s``, the same ones on every run."""
    if len(s) <= max_rows:
        return s
    keep = np.sort(np.random.default_rng(seed).choice(len(s), max_rows, replace=False))
    return s.take(keep)


# the log error at which a row's loss turns from quadratic to linear (5%): larger errors
# (a kernel the model does not describe) pull on the constants by their sign, not their size
ROBUST_SCALE = 0.05


def soft_l1(log_error: np.ndarray, weight: np.ndarray, scale: float = ROBUST_SCALE
            ) -> np.ndarray:
    """Residuals whose squares sum to the weighted soft-L1 cost of ``log_error``,
    weight^2 x 2 scale^2 (sqrt(1 + (log_error / scale)^2) - 1) per row: the loss on each
    row's own log error, then its class weight. (scipy's ``loss="soft_l1"`` applies
    ``f_scale`` to the weighted residual: with weights 1 / sqrt(rows), about 1 / 50, no row's
    residual reached it and the fit was plain least squares.)"""
    z = np.sqrt(2.0 * (np.sqrt(1.0 + (log_error / scale) ** 2) - 1.0))
    return np.sign(log_error) * weight * scale * z


def _stage(devices: Sequence[tuple[Hardware, Sequence[KernelSet]]], names: Sequence[str],
           max_nfev: int) -> dict[str, float]:
    """Shared values of ``names`` minimising the class-weighted robust log error of every
    device's ``sets`` (each device priced on its own hardware record)."""
    from scipy.optimize import least_squares

    count: dict[str, int] = {}
    for _, sets in devices:
        for s in sets:
            count[s.error_class] = count.get(s.error_class, 0) + len(s)
    weights = [[np.full(len(s), 1.0 / math.sqrt(count[s.error_class])) for s in sets]
               for _, sets in devices]

    def residuals(x: np.ndarray) -> np.ndarray:
        values = {n: float(math.exp(v)) for n, v in zip(names, x, strict=True)}
        out = []
        for (hw, sets), ws in zip(devices, weights, strict=True):
            trial = apply(hw, values)
            out += [soft_l1(np.log(s.predict(trial) / s.measured_s), w)
                    for s, w in zip(sets, ws, strict=True)]
        return np.concatenate(out)

    x0 = np.array([_start(n) for n in names])
    lo = np.log([PARAMETERS[param_entry(n)][0] for n in names])
    hi = np.log([PARAMETERS[param_entry(n)][1] for n in names])
    sol = least_squares(residuals, x0, bounds=(lo, hi), diff_step=1e-3, max_nfev=max_nfev)
    return {n: float(math.exp(v)) for n, v in zip(names, sol.x, strict=True)}


def fit_devices(devices: Sequence[tuple[Hardware, Sequence[KernelSet]]], max_nfev: int = 40,
                max_rows: int = MAX_ROWS) -> dict[str, float]:
    """One set of constants for every device (stages in order; a stage without rows is
    skipped, and so are custom all-reduce parameters without custom rows)."""
    fitted: dict[str, float] = {}
    for classes, names in STAGES:
        chosen = [(apply(hw, fitted), [subsample(s, max_rows) for s in sets
                                       if s.error_class in classes])
                  for hw, sets in devices]
        chosen = [(hw, sets) for hw, sets in chosen if sets]
        if not chosen:
            continue
        names = list(names)
        if "collective" in classes and not any(
                np.any(s.columns["algorithm"] == 1) for _, sets in chosen for s in sets):
            names = [n for n in names if not n.startswith("custom_all_reduce")]
        if not any(_has_fallback(hw) for hw, _ in chosen):
            names = [n for n in names if not n.startswith(("attention_fallback",
                                                           "attention_decode_"))]
        fitted |= _stage(chosen, names, max_nfev)
    own = [f for f in MOE_FIELDS if f not in ROUTING]
    fitted |= _class_stage(devices, fitted, "moe", own, max_nfev, max_rows)
    return fitted | _class_stage(devices, fitted, "gemm_quantized", MOE_FIELDS[:3],
                                 max_nfev, max_rows)


def _class_stage(devices: Sequence[tuple[Hardware, Sequence[KernelSet]]], fitted: dict,
                 error_class: str, fields: Sequence[str], max_nfev: int, max_rows: int
                 ) -> dict[str, float]:
    """Stages 4 and 5: each format class's kernel constants on its own rows (fused MoE
    layers, ``moe.<class>.*``; quantized dense linears, ``gemm.<class>.*``)."""
    from perfmodel.cost.moe import FORMATS
    from validate.corpus.dispatch import key

    prefix = "moe" if error_class == "moe" else "gemm"
    out: dict[str, float] = {}
    for i, cls in enumerate(FORMATS):
        if prefix == "gemm" and cls not in DENSE_FORMATS:
            continue            # w4a8 dense linears: priced at the dense fp8 figures
        # the top bucket first: the per-tensor quantization's cost per row (``row_s``,
        # the class's, every bucket's) is seen at large M only
        for bucket in sorted(_buckets(devices, error_class, i), key=lambda b: -b):
            chosen, eager, quantized, local = [], False, False, False
            for hw, sets in devices:
                mine = [s.take(np.flatnonzero((s.columns["format"] == i)
                                              & (s.columns.get("bucket", np.inf) == bucket)))
                        for s in sets if s.error_class == error_class]
                mine = [subsample(s, max_rows) for s in mine if len(s)]
                eager |= any(np.any(s.columns.get("eager", 0) > 0) for s in mine)
                quantized |= any(np.any(s.columns["mode"] >= 0) for s in mine)
                local |= any(np.any(s.columns.get("local_combine", 0) > 0) for s in mine)
                if mine:
                    chosen.append((apply(hw, fitted | out), mine))
            if chosen:
                names = [f"{prefix}.{key(cls, bucket)}.{n}"
                         for n in [*fields, *(["host_s"] if eager else []),
                                   *(ROUTING if local and prefix == "moe" else ())]]
                if quantized and prefix == "gemm" and bucket == np.inf:
                    names.append(f"gemm.{cls}.row_s")
                if prefix == "gemm" and bucket == np.inf and _own_tiles(chosen, cls):
                    names.append(f"gemm.{cls}.k_half")
                out |= _stage(chosen, names, max_nfev)
    return out


def _own_tiles(devices: Sequence[tuple[Hardware, Sequence[KernelSet]]], key: str) -> bool:
    """Whether a device's ``gemm_kernels`` row ``key`` runs a kernel that picks its own
    tile (``efficiency.gemm_kernel_tiles``): only then is its blocks' k-depth ramp
    (``k_half``) a parameter of the row (the engine's ``gemm_k_half`` otherwise). Only
    the top bucket's is fitted: below it the rows are memory bound and leave k_half
    unidentified (fitted per bucket, H100's five lower buckets all went to the bound 8
    and H200's to 280-420 for the same kernel on the same SM)."""
    return any(key in hw.efficiency.gemm_kernel_tiles for hw, _ in devices)


def _has_fallback(hw: Hardware) -> bool:
    """Whether ``hw``'s decode kernel refuses some groups (``cost.decode_fallback``): only
    then is the fallback kernel's fraction a parameter of its rows."""
    eff = hw.efficiency
    return bool(eff.attention_decode_min_group or eff.attention_decode_max_group)


def _buckets(devices: Sequence[tuple[Hardware, Sequence[KernelSet]]], error_class: str,
             fmt: int) -> list[float]:
    """The dispatch buckets (``corpus.dispatch``) the rows of format ``fmt`` fall in
    (inf: the top bucket, or the class's only one)."""
    found = {float(b) for _, sets in devices for s in sets if s.error_class == error_class
             for b in np.asarray(s.columns.get("bucket", np.full(len(s), np.inf)))[
                 s.columns["format"] == fmt]}
    return sorted(found) or [np.inf]


def fit_device(hw: Hardware, sets: Sequence[KernelSet], **kw: int) -> dict[str, float]:
    """Constants of one device fitted to its own kernels."""
    return fit_devices([(hw, sets)], **kw)


def held_out(hw: Hardware, sets: Sequence[KernelSet], folds: int = 5, **kw: int
             ) -> dict[str, np.ndarray]:
    """Error class -> predicted/measured - 1 of every row, each predicted by the fit made
    without its fold (k-fold by shape family, ``corpus.sets.fold_of``)."""
    out: dict[str, list[np.ndarray]] = {}
    for f in range(folds):
        train = [s.take(np.flatnonzero(s.fold != f)) for s in sets]
        test = [s.take(np.flatnonzero(s.fold == f)) for s in sets]
        values = fit_device(hw, [s for s in train if len(s)], **kw)
        trial = apply(hw, values)
        for s in test:
            if len(s):
                out.setdefault(s.error_class, []).append(s.errors(trial))
    return {k: np.concatenate(v) for k, v in out.items()}


def summary(errors: np.ndarray) -> dict[str, float]:
    """Median |error|, signed median, q10, q90 and count of ``errors``."""
    return {"median_abs": float(np.median(np.abs(errors))), "median": float(np.median(errors)),
            "q10": float(np.quantile(errors, 0.1)), "q90": float(np.quantile(errors, 0.9)),
            "n": len(errors)}
