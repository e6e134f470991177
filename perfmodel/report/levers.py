"""One line per serving lever an estimate has switched on (for the report's assumptions)."""

from __future__ import annotations

from perfmodel.schedules.estimate import Estimate
from perfmodel.specs.dtypes import DTYPE_BYTES
from perfmodel.specs.units import fmt_time


def lever_lines(e: Estimate) -> list[str]:
    """One line per serving lever that is switched on."""
    wl, out = e.workload, []
    if wl.shared_prefix:
        out.append(f"Prefix caching: {wl.shared_prefix} shared prompt tokens, hit rate "
                   f"{wl.prefix_hit_rate:.0%}; TTFT without the cache "
                   f"{fmt_time(e.ttft_without_prefix_cache_s)}.")
    if wl.expert_skew:
        out.append(f"MoE routing skew: expert popularity ~ 1/rank^{wl.expert_skew:g}.")
    out += _quantization_lines(e)
    spec = getattr(e, "speculation", None)
    if spec is not None:
        out.append(f"Speculative decoding: {spec.draft}, K = {spec.k}, "
                   f"{spec.tokens_per_round:.2f} tokens per round, {spec.speedup:.2f}x plain "
                   f"decode.")
    return out


def _quantization_lines(e: Estimate) -> list[str]:
    """The weights' in-kernel conversion (the breakdown's ``dequant`` row) when the GEMMs
    convert them, a quantized LM head, and the 16-bit outlier channels."""
    wl, out = e.workload, []
    rows = [o for o in e.ops if o.kind == "dequant"]
    if rows:
        added = sum(o.time_s for o in rows)
        per_phase = ", ".join(f"{fmt_time(o.time_s)} in {o.phase}" for o in rows)
        out.append(f"Weight-only {wl.weights_dtype} weights are converted to "
                   f"{wl.act_dtype} inside the GEMM kernels: the conversion adds {per_phase} "
                   f"({added / e.e2e_s:.1%} of the request) beyond the GEMMs' max(compute, "
                   f"memory), the breakdown's dequant row (perfmodel/cost/dequant.py).")
    if wl.quantize_lm_head and DTYPE_BYTES[wl.weights_dtype] < 2:
        out.append(f"LM head quantized: stored and run as the other linear layers, "
                   f"{wl.weights_dtype} weights with their group scales (TorchAO's quantize_ "
                   f"takes every nn.Linear; a GPTQ checkpoint with \"lm_head\": true), not "
                   f"at {wl.act_dtype} as vLLM keeps it by default.")
    if wl.outlier_fraction:
        out.append(f"Outlier channels: {wl.outlier_fraction:.2%} of each quantized matrix's "
                   f"input channels kept in 16 bits; every such GEMM runs three kernels, the "
                   f"quantized GEMM over the other channels, a copy of the outlier "
                   f"activation columns and a 16-bit GEMM added into its output "
                   f"(bitsandbytes' LLM.int8() decomposition, perfmodel/cost/outliers.py).")
    return out
