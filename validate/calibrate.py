"""``perfmodel calibrate``: measure a device, fit its efficiency, write a hardware YAML.

1. Measure the calibration sweep (``suites.calibration_rows``): streaming adds over sizes,
   GEMMs per dtype, a one-element add back to back.
2. Peak FLOP/s per dtype = the best GEMM rate measured at that dtype; bandwidth = the best
   streaming rate (for a CPU these are achieved MKL/oneDNN and STREAM-like rates, not
   datasheet peaks). Launch overhead = the one-element add per call.
3. Fit the efficiency (``fit.fit_efficiency``) to every calibration row.
   On a sync device (CPU), time whole decode layers of the narrow calibration-only model
   (``suites.calibration_steps``; every kernel shape of those layers is in the sweep):
   ``layer_overhead_s`` = the median over them of measured layer time minus the sum of the
   layer's measured kernel times, floored at 0.
4. Write the YAML in the perfmodel/hardware/README.md schema with a ``calibration:`` block (how,
   where, when, on which shapes) and load it back with
   ``perfmodel.specs.load.load_hardware``.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import fields, replace
from pathlib import Path

import numpy as np
import yaml

from perfmodel.compare import op_row, row_op, shape_key
from perfmodel.cost.ops import OpRecord
from perfmodel.cost.roofline import op_time
from perfmodel.specs import Efficiency, Hardware, Interconnect
from perfmodel.specs.load import load_hardware
from validate.device import DeviceInfo
from validate.fit import FitResult


def _meminfo_bytes() -> float:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return float(line.split()[1]) * 1024
    except OSError:
        pass
    return 16e9


def capacity_bytes(dev: DeviceInfo) -> float:
    if dev.kind == "cuda":
        import torch

        return float(torch.cuda.get_device_properties(0).total_memory)
    return _meminfo_bytes()


def measured_peaks(rows: list[dict]) -> dict[str, float]:
    """Best attained FLOP/s per dtype over the GEMM rows."""
    peaks: dict[str, float] = {}
    for r in rows:
        if r["op"] == "gemm":
            op = row_op(r)
            dtype, flops = op.dtype_name(0), float(np.sum(op.flops))
            peaks[dtype] = max(peaks.get(dtype, 0.0), flops / float(r["measured_s"]))
    return peaks


def measured_bandwidth(rows: list[dict]) -> float:
    """Best attained bytes/s over the streaming rows (every add except the launch probe)."""
    rates = [float(np.sum(row_op(r).bytes.total)) / float(r["measured_s"]) for r in rows
             if r["op"] == "add" and r.get("name") == "stream"]
    if not rates:
        raise ValueError("calibration rows hold no streaming measurements")
    return max(rates)


def launch_seconds(rows: list[dict]) -> float:
    """Seconds per call of the one-element add (the host cost of one kernel)."""
    probes = [float(r["measured_s"]) for r in rows if r.get("name") == "launch"]
    return min(probes) if probes else 0.0


# PyTorch's CPU flash attention (aten/src/ATen/native/cpu/FlashAttentionKernel.cpp) takes
# 32 query rows per block below q_len 192, 64 below 768, then 256, and walks the keys in
# 512-key splits from key 0 while a split starts before the block's last causal key; each
# split is a GEMM over min(512, kv_len - start) keys (the causal mask is applied after), so
# a block computes every key up to the end of its last split, clipped at kv_len. (CUDA:
# torch's SDPA runs FlashAttention-2, whose 128 x 64 tiles are the Efficiency default.)
# Neither packs the query heads of a KV group into one block for prefill.
# For one query row (decode) it runs each query head as its own program: a matrix-vector
# product over its KV head's keys, with no key split.
CPU_ATTENTION_TILES = {"attention_tile_q": ((1, 32), (192, 64), (768, 256)),
                       "attention_tile_kv": 512, "attention_clip_kv": True,
                       "attention_decode_pack_gqa": False}


# PyTorch's CPU kernels split their elements among threads with at::parallel_for, which
# gives each thread at least at::internal::GRAIN_SIZE (aten/src/ATen/Parallel.h) elements:
# a kernel of at most 32768 elements runs on one thread (measured on this project's CPU
# VM, reports/cpu/parallel_grain.txt: from 32768 to 33792 elements silu_and_mul drops from
# 69.9 to 44.3 us on two threads and rises from 68.7 to 77.5 us on one).
TORCH_CPU_GRAIN = 32768


def base_hardware(rows: list[dict], dev: DeviceInfo, name: str) -> Hardware:
    """Measured roofs with neutral efficiencies, the starting point of the fit."""
    bandwidth = measured_bandwidth(rows)
    threads = f", {dev.threads} threads" if dev.kind == "cpu" else ""
    return Hardware(
        name=name, peak_flops_per_s=measured_peaks(rows), memory_bytes=capacity_bytes(dev),
        memory_bytes_per_s=bandwidth, compute_units=dev.compute_units, l2_bytes=dev.llc_bytes,
        interconnect=Interconnect(link_bytes_per_s=bandwidth, latency_s=0.0, topology="none",
                                  max_devices=1),
        efficiency=Efficiency(gemm_fraction=1.0, memory_fraction=1.0, kernel_latency_s=0.0,
                              launch_overhead_s=launch_seconds(rows),
                              # a CPU runs each op to completion: dispatch adds, never overlaps
                              launch_mode="sync" if dev.kind == "cpu" else "async",
                              gemm_overlap=dev.kind != "cpu",
                              # no fused scan kernel on a CPU: the torch references' chain
                              scan_kernel="unfused" if dev.kind == "cpu" else "fused",
                              attention_pack_gqa=False,
                              parallel_grain_elements=TORCH_CPU_GRAIN if dev.kind == "cpu" else 0,
                              **(CPU_ATTENTION_TILES if dev.kind == "cpu" else {})),
        vendor="nvidia" if dev.kind == "cuda" else "other",
        description=f"{dev.name}{threads} (measured by perfmodel calibrate)")


def fit_layer_overhead(step_rows: list[dict], hw: Hardware,
                       kernel_rows: list[dict] | tuple[dict, ...] = ()) -> tuple[Hardware, dict]:
    """``hw`` with ``layer_overhead_s`` fitted to measured whole-layer rows (steps.csv
    schema, calibration-only model) and the record of how.

    Per layer: glue = measured layer time - sum over the layer's operators of their measured
    kernel time (``corpus.rows``, matched by ``shape_key``, times ``op.count``), so kernel
    prediction error does not leak into the glue. An operator without a measured row counts
    at its predicted time (``hw``'s fitted efficiency, no layer overhead) and is listed under
    ``predicted_ops`` of its step. Value = the median over the layers, floored at 0. ``hw``
    unchanged (and an empty record) without layer rows."""
    from validate.report import step_seconds
    from validate.suites import CALIB_CPU, CALIB_CUDA, GLUE_CPU, Step

    models = {m.name: m for m in (CALIB_CPU, CALIB_CUDA, GLUE_CPU)}
    measured_kernels = {shape_key(r): float(r["measured_s"]) for r in kernel_rows}
    base = replace(hw, efficiency=replace(hw.efficiency, layer_overhead_s=0.0))
    gaps, steps, fallbacks, used = [], [], 0, set()
    for r in step_rows:
        if r["scope"] != "layer" or r["model"] not in models:
            continue
        step = Step.from_row(r, models)       # scope is "layer" (checked above)
        timing = r.get("timing") or "host"
        kernels, predicted_ops = _layer_kernel_time(step.ops(), measured_kernels, base, timing,
                                                    used)
        measured = float(r["measured_s"])
        gaps.append(measured - kernels)
        fallbacks += len(predicted_ops)
        steps.append({"model": step.model.name, "batch": step.batch, "q_len": step.q_len,
                      "kv_len": step.kv_len, "dtype": step.dtype,
                      "measured_s": float(f"{measured:.6g}"),
                      "measured_kernels_s": float(f"{kernels:.6g}"),
                      "gap_s": float(f"{measured - kernels:.6g}"),
                      "predicted_ops_s": float(f"{step_seconds(step, base, timing):.6g}"),
                      "predicted_ops": predicted_ops})
    if not gaps:
        return hw, {}
    value = max(0.0, statistics.median(gaps))
    record = {"value_s": float(f"{value:.6g}"),
              "method": "median over whole decode layers of the calibration-only model of "
                        "(measured layer time - sum of the MEASURED kernel times of the "
                        "layer's operators, same shapes in this calibration's sweep, times "
                        "each operator's count), floored at 0; an operator without a measured "
                        "kernel counts at its predicted time and is listed under predicted_ops "
                        "(predicted_ops_s: the layer's predicted operator time, for "
                        "reference); applied once per decoder layer per step on a sync device",
              "ops_at_predicted_time": fallbacks,
              "kernel_shapes": sorted(used),
              "steps": steps}
    return replace(hw, efficiency=replace(hw.efficiency, layer_overhead_s=value)), record


def _layer_kernel_time(layer_ops: list[OpRecord], measured: dict[str, float], hw: Hardware,
                       timing: str, used: set[str]) -> tuple[float, list[str]]:
    """(seconds of the layer's operators: each at its measured kernel time when ``measured``
    has its shape (the key is added to ``used``), else at its predicted time on ``hw``;
    the names of the operators counted at predicted time)."""
    total, predicted_ops = 0.0, []
    for op in layer_ops:
        try:
            key = shape_key(op_row(op))
        except ValueError:
            key = None
        if key in measured:
            total += measured[key] * float(np.sum(op.count))
            used.add(key)
        else:
            total += float(np.sum(op_time(op, hw, timing).time_s))
            predicted_ops.append(op.name)
    return total, predicted_ops


def _efficiency_block(eff: Efficiency, source: str) -> dict:
    out = {f.name: getattr(eff, f.name) for f in fields(Efficiency)
           if getattr(eff, f.name) is not None}
    for key in ("attention_tile_q", "attention_latent_cta_rows"):   # tile steps: as read
        steps = getattr(eff, key)
        out[key] = steps[0][1] if len(steps) == 1 else dict(steps)
        if not steps:
            del out[key]
    out["gemm_tiles"] = [list(tile) for tile in eff.gemm_tiles]
    if not eff.gemm_tiles:
        del out["gemm_tiles"]
    # a dense quantized class's host path and cost per row are fields of its gemm_kernels
    # row in the file (``specs.efficiency_block``), not blocks of their own
    extras = {"host_s": out.pop("gemm_host_s", {}), "row_s": out.pop("gemm_row_s", {}),
              "k_half": out.pop("gemm_kernel_k_half", {})}
    out["gemm_kernels"] = {
        key: dict(zip(("gemm_fraction", "memory_fraction", "latency_s"), row, strict=True))
        | {name: table[key] for name, table in extras.items() if key in table}
        for key, row in eff.gemm_kernels.items()}
    return out | {"source": source}


def hardware_document(hw: Hardware, result: FitResult, rows: list[dict], dev: DeviceInfo,
                      provenance: dict, suite: str, command: str,
                      layer_overhead: dict | None = None) -> dict:
    """The YAML mapping (perfmodel/hardware/README.md schema) of a calibrated device."""
    what = "CPU: achieved MKL/oneDNN GEMM rate" if dev.kind == "cpu" else "achieved GEMM rate"
    return {
        "version": 1, "name": hw.name, "vendor": hw.vendor, "description": hw.description,
        "compute": {
            "peak_flops_per_s": {d: float(f"{v:.4g}") for d, v in
                                 result.hardware.peak_flops_per_s.items()},
            "compute_units": hw.compute_units,
            "source": f"measured by perfmodel calibrate: best GEMM FLOP/s per dtype over the "
                      f"calibration sweep ({what}, not a datasheet peak); compute_units = "
                      f"{'torch threads' if dev.kind == 'cpu' else 'SMs'}"},
        "memory": {
            "capacity_bytes": hw.memory_bytes,
            "bandwidth_bytes_per_s": float(f"{hw.memory_bytes_per_s:.4g}"),
            "source": "measured: best streaming add (2 reads + 1 write per element) over "
                      "sizes, inputs rotated beyond the last-level cache; capacity from "
                      + ("/proc/meminfo" if dev.kind == "cpu" else "the CUDA device")},
        "on_chip": {"l2_bytes": hw.l2_bytes,
                    "source": "last-level cache: " + ("sysfs (L3)" if dev.kind == "cpu"
                                                      else "CUDA device properties (L2)")},
        "interconnect": {
            "link_bytes_per_s": float(f"{hw.interconnect.link_bytes_per_s:.4g}"),
            "latency_s": 0.0, "topology": "none", "max_devices": 1,
            "source": "not measured: a single device; the link is a placeholder equal to "
                      "the memory bandwidth"},
        "efficiency": _efficiency_block(
            result.hardware.efficiency,
            f"fitted by perfmodel calibrate (scipy least_squares on log error, soft-L1) to "
            f"{len(rows)} calibration rows; launch_overhead_s = one-element add per call"),
        "calibration": provenance | {
            "command": command, "suite": suite, "timing": dev.timing,
            "method": "peaks and bandwidth = best measured rates; efficiency fitted with "
                      "validate.fit.fit_efficiency (rows weighted equally per operator class)",
            "fitted": {k: float(f"{v:.6g}") for k, v in result.fitted.items()},
            "not_fitted": list(result.fixed),
            "fit_median_abs_error": round(result.median_abs_error, 4),
            "fit_shapes": sorted({shape_key(r) for r in rows}),
        } | ({"layer_overhead": layer_overhead} if layer_overhead else {}),
    }


def write_hardware(doc: dict, path: Path) -> Hardware:
    """Write ``doc`` as YAML and prove it loads with the project's own loader."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(doc, sort_keys=False, width=100))
    hw = load_hardware(path)
    if not math.isclose(hw.memory_bytes_per_s, doc["memory"]["bandwidth_bytes_per_s"]):
        raise ValueError(f"{path}: bandwidth did not survive the round trip")
    return hw
