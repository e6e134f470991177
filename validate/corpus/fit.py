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
   per-slot routing and sort cost ``slot_s`` on TensorRT-LLM's rows (``SLOT``).

``fit_devices`` fits one set of constants to several devices at once (each keeps its own
peaks, bandwidth and units): a family rule, used for leave-one-device-out.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from perfmodel.specs.dtypes import DENSE_FORMATS, MOE_FORMATS
from perfmodel.specs.hardware import Hardware
from validate.corpus.sets import KernelSet
from validate.fit import _with

# parameter -> (lower, upper, why that range)
PARAMETERS: dict[str, tuple[float, float, str]] = {
    "gemm_fraction": (0.5, 0.95, "best-shape dense GEMM, share of dense peak"),
    "gemm_k_half": (8.0, 2048.0, "pipeline prologue/epilogue of a tile, k elements"),
    "memory_fraction": (0.6, 0.98, "streaming share of HBM peak"),
    "memory_half_bytes": (1e3, 6.4e7, "bytes at which a kernel reaches half its streaming "
                                      "rate (up to about an L2)"),
    "kernel_latency_s": (0.5e-6, 10e-6, "device fixed cost of one kernel (ramp, tail)"),
    "attention_fraction": (0.3, 0.95, "FlashAttention MMA share of dense peak"),
    "attention_program_keys": (1.0, 4096.0, "work of one attention program beyond its keys "
                                            "(queries, page table, output), in keys"),
    "memory_fraction.attention": (0.6, 0.98, "attention's KV streaming, share of HBM peak"),
    "attention_fallback_fraction": (0.01, 0.8, "the fallback decode kernel's CUDA-core dot "
                                               "products (TensorRT-LLM's MMHA), share of the "
                                               "fp32 peak"),
    "attention_fallback_program_steps": (0.05, 256.0, "the fallback decode kernel's work per "
                                                      "program (one query head) beyond its "
                                                      "keys, in its threads' 16-byte loop "
                                                      "steps"),
    "attention_decode_fraction": (0.1, 0.95, "the engine's own decode kernel's MMA share of "
                                             "dense peak (TensorRT-LLM's XQA)"),
    "attention_decode_program_keys": (1.0, 4096.0, "that decode kernel's work per program "
                                                   "(one KV head of one sequence) beyond its "
                                                   "keys, in keys"),
    "attention_decode_latency_s": (0.5e-6, 30e-6, "fixed cost of that decode kernel's call "
                                                  "(its launch, tail and split combine)"),
    "attention_decode_head_dim_half": (1.0, 512.0, "the decode kernel's per-score softmax"),
    "attention_head_dim_half": (1.0, 512.0, "per-score softmax work beyond the MMAs, in "
                                            "head_dim units"),
    "kernel_latency_s.attention": (0.5e-6, 30e-6, "fixed cost of the attention call (cache "
                                                 "write, scheduler metadata, kernel, "
                                                 "combine)"),
    "collective_fraction": (0.3, 1.0, "NCCL bus bandwidth, share of the per-direction link"),
    "collective_latency_s": (1e-6, 50e-6, "NCCL fixed cost of one collective"),
    "custom_all_reduce_fraction": (0.05, 1.0, "custom all-reduce peer loads, share of the "
                                              "link"),
    "custom_all_reduce_latency_s": (1e-6, 30e-6, "custom all-reduce launch and flag "
                                                 "handshake"),
    **{f"moe.{c}.{n}": b for c in MOE_FORMATS for n, b in (
        ("gemm_fraction", (0.1, 0.95, "fused-MoE expert GEMMs of the class's kernel, share "
                                      "of the dtype's peak")),
        ("memory_fraction", (0.2, 0.98, "their weight streaming, share of HBM peak")),
        ("latency_s", (0.5e-6, 60e-6, "fixed cost of one expert GEMM with its share of the "
                                      "layer's routing, sort and un-permutation kernels")),
        ("expert_latency_s", (1e-9, 2e-6, "cost each expert run adds (tile pipeline fill "
                                          "and tail, row-index loads)")),
        ("programs_per_unit", (0.05, 8.0, "programs per SM that saturate the memory "
                                          "(loads in flight)")),
        ("depth_s", (1e-12, 1e-8, "time per k element of one program's serial k loop "
                                  "(memory latency per weight tile)")),
        ("slot_s", (1e-13, 1e-8, "time per (token, top-k) slot of the layer's routing and "
                                 "expert sort, which read every slot (TensorRT-LLM "
                                 "moe_kernels.cu threeStepBuildExpertMapsSortFirstToken)")))},
}
PARAMETERS |= {f"gemm.{c}.{n}": (*PARAMETERS[f"moe.{c}.{n}"][:2], why)
               for c in DENSE_FORMATS for n, why in (
                   ("gemm_fraction", "the class's dense GEMM kernel, share of the dtype's "
                                     "peak"),
                   ("memory_fraction", "its operand streaming, share of HBM peak"),
                   ("latency_s", "its fixed cost with the activations' quantization "
                                 "kernel's launch"))}
# a dense quantized GEMM streams its operands through a TMA-fed pipeline (CUTLASS sm90 /
# sm100 mainloops, DeepGEMM) on every compute unit: at least half the HBM peak, unlike a
# grouped expert GEMM of few programs (the moe.* range's 0.2); fitted lower, the fraction
# stood in for other costs (vLLM B200 fp8 above M 256 at 0.2 made a W8A8 fp8 LM head
# slower than its bf16 one at batch 1,024)
PARAMETERS |= {f"gemm.{c}.memory_fraction": (0.5, 0.98, "its operand streaming, share of "
                                                        "HBM peak (a TMA-fed mainloop)")
               for c in DENSE_FORMATS}
PARAMETERS |= {f"gemm.{c}.host_s": (1e-6, 500e-6, "the engine's host path of one eager "
                                                  "call of the linear (cost.eager)")
               for c in DENSE_FORMATS}
PARAMETERS |= {f"gemm.{c}.row_s": (1e-12, 3e-8, "seconds per token of the activations' "
                                               "quantization beyond its bytes "
                                               "(cost.moe.row_cost)")
               for c in DENSE_FORMATS}
PARAMETERS |= {f"gemm.{c}.k_half": (8.0, 4096.0, "k elements of fixed work of one block of "
                                                 "the class's own-tile kernel (pipeline "
                                                 "fill, output epilogue)")
               for c in DENSE_FORMATS}
INTERCONNECT = ("collective_latency_s", "custom_all_reduce_fraction",
                "custom_all_reduce_latency_s")
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
MOE_FIELDS = ("gemm_fraction", "memory_fraction", "latency_s", "expert_latency_s",
              "programs_per_unit", "depth_s", "slot_s")
# fitted only on rows of the kernels that copy the device's pairs into expert order
# (``compare.forms.LOCAL_COMBINE``: TensorRT-LLM's), whose routing and sort no other term
# prices; 0 (off) in a row that does not fit it (the Triton kernels' un-permutation reads
# every slot already: vLLM / SGLang prices stay as they were)
SLOT = "slot_s"
CUSTOM_AR_MAX_BYTES = 8192 * 1024   # vLLM CustomAllreduce max_size (custom_all_reduce.py)
MAX_ROWS = 2500                     # per error class and device in one fit (deterministic)


def value_of(hw: Hardware, name: str) -> float:
    """The current value of a fitted parameter on ``hw``."""
    if name in INTERCONNECT:
        return float(getattr(hw.interconnect, name))
    if name.startswith(("moe.", "gemm.")):
        table, cls, what = name.split(".")
        if what in EXTRAS:
            return float(getattr(hw.efficiency, EXTRAS[what]).get(
                cls, START[param_entry(name)]))
        row = getattr(hw.efficiency, f"{table}_kernels").get(cls)
        at = MOE_FIELDS.index(what)
        return float(row[at] if len(row) > at else 0.0) if row \
            else float(START[param_entry(name)])
    base, _, kind = name.partition(".")
    if kind:
        return float(hw.efficiency.memory_fraction_for(kind) if base == "memory_fraction"
                     else hw.efficiency.latency_for(kind))
    value = getattr(hw.efficiency, name)
    if value is None and name == "attention_fraction":
        return float(hw.efficiency.attention)
    if value is None and name == "attention_decode_fraction":
        return float(hw.efficiency.attention_decode)
    return float(value)


# the per-class fields of ``gemm_kernels`` beyond its rows' three -> their efficiency table
EXTRAS = {"host_s": "gemm_host_s", "row_s": "gemm_row_s", "k_half": "gemm_kernel_k_half"}


def apply(hw: Hardware, values: dict[str, float]) -> Hardware:
    """``hw`` with fitted ``values`` set (efficiency fields, per-kind latencies, link)."""
    for prefix, count in (("moe", len(MOE_FIELDS)), ("gemm", 3)):
        mine = {k: v for k, v in values.items() if k.startswith(prefix + ".")}
        if not mine:
            continue
        table = dict(getattr(hw.efficiency, f"{prefix}_kernels"))
        extras = {f: dict(getattr(hw.efficiency, f)) for f in EXTRAS.values()}
        for cls in {k.split(".")[1] for k in mine}:
            table[cls] = tuple(mine.get(f"{prefix}.{cls}.{n}",
                                        0.0 if n == SLOT else
                                        START[param_entry(f"{prefix}.{cls}.{n}")])
                               for n in MOE_FIELDS[:count])
            for what, field in EXTRAS.items():
                if f"{prefix}.{cls}.{what}" in mine:
                    extras[field][cls] = mine[f"{prefix}.{cls}.{what}"]
        hw = replace(hw, efficiency=replace(hw.efficiency, **{f"{prefix}_kernels": table},
                                            **extras))
        values = {k: v for k, v in values.items() if k not in mine}
    link = {k: v for k, v in values.items() if k in INTERCONNECT}
    if any(k.startswith("custom_all_reduce") for k in link):
        link.setdefault("custom_all_reduce_max_bytes", CUSTOM_AR_MAX_BYTES)
    eff = {k: v for k, v in values.items() if k not in INTERCONNECT}
    out = _with(hw, eff) if eff else hw
    return replace(out, interconnect=replace(out.interconnect, **link)) if link else out


def subsample(s: KernelSet, max_rows: int = MAX_ROWS, seed: int = 0) -> KernelSet:
    """At most ``max_rows`` rows of ``s``, the same ones on every run."""
    if len(s) <= max_rows:
        return s
    keep = np.sort(np.random.default_rng(seed).choice(len(s), max_rows, replace=False))
    return s.take(keep)


# where every fit starts (the same on every run, whatever the file held before: a rerun
# of the calibration reproduces the shipped values)
START = {"gemm_fraction": 0.8, "gemm_k_half": 128.0, "memory_fraction": 0.85,
         "memory_half_bytes": 1e6, "kernel_latency_s": 2e-6, "attention_fraction": 0.6,
         "attention_program_keys": 64.0, "attention_head_dim_half": 32.0,
         "attention_fallback_fraction": 0.1, "attention_fallback_program_steps": 4.0,
         "attention_decode_fraction": 0.6, "attention_decode_program_keys": 64.0,
         "attention_decode_latency_s": 5e-6, "attention_decode_head_dim_half": 32.0,
         "memory_fraction.attention": 0.85,
         "kernel_latency_s.attention": 5e-6, "collective_fraction": 0.7,
         "collective_latency_s": 8e-6, "custom_all_reduce_fraction": 0.3,
         "custom_all_reduce_latency_s": 5e-6,
         **{f"moe.{c}.{n}": v for c in MOE_FORMATS
            for n, v in zip(MOE_FIELDS, (0.5, 0.8, 8e-6, 5e-8, 1.0, 1e-9, 5e-10),
                            strict=True)},
         **{f"gemm.{c}.{n}": v for c in DENSE_FORMATS
            for n, v in zip((*MOE_FIELDS[:3], "host_s", "row_s", "k_half"),
                            (0.7, 0.8, 4e-6, 50e-6, 1e-9, 128.0), strict=True)}}


def param_entry(name: str) -> str:
    """A parameter's entry in ``PARAMETERS`` / ``START``: a bucket's
    (``gemm.fp8@16.gemm_fraction``) is its class's (``gemm.fp8.gemm_fraction``)."""
    head, at, rest = name.partition("@")
    return head + rest[rest.index("."):] if at else name


def _start(name: str) -> float:
    lo, hi, _ = PARAMETERS[param_entry(name)]
    return math.log(min(max(START[param_entry(name)], lo), hi))


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
    fitted |= _class_stage(devices, fitted, "moe", MOE_FIELDS[:-1], max_nfev, max_rows)
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
                                   *([SLOT] if local and prefix == "moe" else [])]]
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
