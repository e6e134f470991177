"""What the weights' formats and kernel paths assume, said out loud: the assumptions'
lines for quantized linears (``specs.matmul_path``) and the per-class line the reports
print ("weights by class").

A quantized linear runs W8A8 / W4A4 where the device lists the rate of its format's
activations, else weight-only; each case an estimate prices is one line over the
configurations it covers (a mask, as ``schedules.assumptions`` keeps them).
"""

from __future__ import annotations

import numpy as np

from perfmodel.cost.params import LINEAR_CLASSES, other_formats, param_counts, unquantized
from perfmodel.specs.dtypes import BYTES, CODE, DTYPES
from perfmodel.specs.formats import WeightFormat, format_of, weight_format
from perfmodel.specs.hardware import Hardware
from perfmodel.specs.matmul_path import matmul_path
from perfmodel.specs.model import SUBCLASSES, Model
from perfmodel.specs.workload import Workload, Workloads

Assumption = tuple[np.ndarray, str]

# why an engine runs a format weight-only on a device without its activations' rate
_FALLBACK = {
    "fp8": "vLLM's Marlin fp8 W8A16 (Fp8LinearMethod: use_marlin below compute capability "
           "8.9); TensorRT-LLM and SGLang run fp8 only where the device has fp8 tensor cores",
    "fp4": "vLLM's Marlin FP4 W4A16 (ModelOptNvFp4LinearMethod below SM100); TensorRT-LLM "
           "runs NVFP4 only on Blackwell",
}


def path_assumptions(hw: Hardware, model: Model, w: Workloads) -> list[Assumption]:
    """One line per (format, path) the configurations of ``w`` price their quantized
    linears with: the main weights (per row) and the classes the checkpoint stores in
    another format (``params.other_formats``)."""
    wide = BYTES[w.act_dtype] == 2.0
    narrow = wide & (BYTES[w.weights_dtype] < 2.0)
    out = []
    pairs = set(zip(w.weights_dtype[narrow].tolist(), w.weight_group_size[narrow].tolist(),
                    strict=True))
    said = set()
    for code, group in sorted(pairs):
        mask = narrow & (w.weights_dtype == code) & (w.weight_group_size == group)
        fmt = format_of(DTYPES[code], group or None)
        out += _line(hw, fmt, mask)
        said.add(fmt.name if fmt is not None else "")
    for name in sorted(set(other_formats(model).values()) - said):
        out += _line(hw, weight_format(name), wide, "the checkpoint's ")
    return out


def _line(hw: Hardware, fmt: WeightFormat | None, mask: np.ndarray,
          whose: str = "") -> list[Assumption]:
    if fmt is None or not mask.any():
        return []
    path = matmul_path(hw, fmt.weights, fmt.group_size, fmt.scale_bytes)
    what = f"{whose}{fmt.name} weights"
    if path.act_dtype is not None:
        return [(mask, f"{what} run {path.describe()} on {hw.name}, as vLLM, SGLang and "
                       f"TensorRT-LLM run them there; the activation-quantization pass "
                       f"is not priced")]
    if fmt.act_dtype is not None:
        return [(mask, f"{what} run {path.describe()} on {hw.name}: it lists no "
                       f"{fmt.act_dtype} tensor-core rate; priced as "
                       f"{_FALLBACK.get(fmt.act_dtype, 'a weight-only kernel')}")]
    if fmt.weights in hw.peak_flops_per_s:
        return [(mask, f"{what} run {path.describe()} as vLLM's default kernels do; "
                       f"engines that quantize the activations too (TensorRT-LLM's "
                       f"MXFP4 x MXFP8 MoE, vLLM with VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8=1) "
                       f"would run faster on {hw.name}")]
    return []


def class_formats(hw: Hardware, model: Model, wl: Workload) -> list[tuple[str, list[str]]]:
    """(what, classes) of the weights as priced: the workload's format and its path for
    the classes stored at it, the checkpoint's other formats, and the 16-bit ones, for the
    linear classes ``model`` has (embedding, LM head and norms at 16 bits unless the head
    is quantized)."""
    counts = param_counts(model)
    kept, other = unquantized(model), other_formats(model)
    present = [c for c in LINEAR_CLASSES if getattr(counts, c) > 0] \
        + [c for c in SUBCLASSES if c in kept or c in other]
    groups: dict[str, list[str]] = {}
    main = _name(hw, wl.weights_dtype, wl.weight_group_size, wl.weight_scale_bytes)
    for c in present:
        key = wl.act_dtype if c in kept or BYTES[CODE[wl.weights_dtype]] >= 2.0 else \
            _name(hw, *weight_format(other[c]).scheme) if c in other else main
        groups.setdefault(key, []).append(c)
    head = "lm_head" if wl.quantize_lm_head and BYTES[CODE[wl.weights_dtype]] < 2.0 else None
    if head:
        groups.setdefault(main, []).append(head)
    groups.setdefault(wl.act_dtype, []).extend(
        ["embedding", *([] if head else ["lm_head"]), "norms"])
    return list(groups.items())


def _name(hw: Hardware, dtype: str, group: int | None, scale: float) -> str:
    fmt = format_of(dtype, group, scale)
    if fmt is None:
        return dtype
    exact = fmt.scheme == (dtype, group, scale)
    path = matmul_path(hw, dtype, group, scale)
    label = fmt.name if exact else f"{dtype} (groups of {group})" if group else dtype
    return f"{label}, {path.describe()}"

