"""The constants the kernel corpus fits (``corpus.fit``): each one's name, its plausible range
and why (``PARAMETERS``), where every fit starts (``START``), and how a value is read from and
set on a device (``value_of``, ``apply``: efficiency fields, per-kind latencies, the
``moe_kernels`` / ``gemm_kernels`` tables and the link).
"""

from __future__ import annotations

import math
from dataclasses import replace

from perfmodel.specs.dtypes import DENSE_FORMATS, MOE_FORMATS
from perfmodel.specs.hardware import Hardware
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
    "attention_cta_s": (1e-8, 2e-5, "fixed time of one latent decode CTA whatever its keys "
                                    "(its queries, page table, tensor memory, output)"),
    "attention_restream_fraction": (0.01, 1.0, "share of a further CTA's stream of the same "
                                               "latent cache that reaches HBM (the rest "
                                               "hits L2)"),
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
                                 "moe_kernels.cu threeStepBuildExpertMapsSortFirstToken)")),
        ("scan_s", (1e-15, 1e-9, "time per (local expert, token) thread of the three-step "
                                 "sort's expert scans (cost.moe.expert_scan), its grid's "
                                 "share of the device")))},
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
MOE_FIELDS = ("gemm_fraction", "memory_fraction", "latency_s", "expert_latency_s",
              "programs_per_unit", "depth_s", "slot_s", "scan_s")
# fitted only on rows of the kernels that copy the device's pairs into expert order
# (``compare.moe_forms.LOCAL_COMBINE``: TensorRT-LLM's), whose routing and sort no other term
# prices; 0 (off) in a row that does not fit it (the Triton kernels' un-permutation reads
# every slot already: vLLM / SGLang prices stay as they were)
# (the per-slot cost, and the three-step sort's scans likewise)
ROUTING = ("slot_s", "scan_s")
CUSTOM_AR_MAX_BYTES = 8192 * 1024   # vLLM CustomAllreduce max_size (custom_all_reduce.py)
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
                                        0.0 if n in ROUTING else
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


# where every fit starts (the same on every run, whatever the file held before: a rerun
# of the calibration reproduces the shipped values)
START = {"gemm_fraction": 0.8, "gemm_k_half": 128.0, "memory_fraction": 0.85,
         "memory_half_bytes": 1e6, "kernel_latency_s": 2e-6, "attention_fraction": 0.6,
         "attention_program_keys": 64.0, "attention_head_dim_half": 32.0,
         "attention_fallback_fraction": 0.1, "attention_fallback_program_steps": 4.0,
         "attention_decode_fraction": 0.6, "attention_decode_program_keys": 64.0,
         "attention_decode_latency_s": 5e-6, "attention_decode_head_dim_half": 32.0,
         "memory_fraction.attention": 0.85, "attention_restream_fraction": 0.5,
         "attention_cta_s": 1e-6,
         "kernel_latency_s.attention": 5e-6, "collective_fraction": 0.7,
         "collective_latency_s": 8e-6, "custom_all_reduce_fraction": 0.3,
         "custom_all_reduce_latency_s": 5e-6,
         **{f"moe.{c}.{n}": v for c in MOE_FORMATS
            for n, v in zip(MOE_FIELDS, (0.5, 0.8, 8e-6, 5e-8, 1.0, 1e-9, 5e-10, 1e-12),
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
