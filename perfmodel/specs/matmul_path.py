"""Which kernel path a quantized linear takes on a device: the one place the choice is made.

Two paths exist for narrow weights with 16-bit activations:
- **W8A8 / W4A4**: the layer quantizes its input to the format's activation dtype (fp8 per
  tensor, per token or per 1 x 128 group; NVFP4 per 16) and the MMA runs at that dtype's
  tensor-core rate, the weights used as stored;
- **weight-only**: a 16-bit MMA on weights converted in the kernel (``cost.dequant``).

The engines' rule, from their source: vLLM's ``Fp8LinearMethod`` runs an fp8 scaled_mm
(CUTLASS, DeepGEMM or Triton ``w8a8_block_fp8_matmul`` for 128 x 128 blocks) on devices of
compute capability 8.9 and up and Marlin fp8 W8A16 below (``use_marlin = not
has_device_capability(89)``); ``ModelOptNvFp4LinearMethod`` runs ``cutlass_scaled_fp4_mm``
on SM100 and Marlin FP4 below; SGLang and TensorRT-LLM need the same capabilities for fp8
and NVFP4, and TensorRT-LLM has no weight-only fallback for either. MXFP4 (gpt-oss) keeps
16-bit activations in vLLM's default MoE backends on every NVIDIA generation. Here a device
"has" an activation dtype when its hardware file lists a tensor-core rate for it
(``compute.peak_flops_per_s``): no device name is special-cased. A format's activations
come from ``weight_formats.yaml`` (``acts``).

``matmul_codes`` is the vectorised form the cost model prices from (one compute dtype code
per configuration); ``matmul_path`` the readable one the reports and assumptions quote.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from perfmodel.specs.dtypes import BYTES, CODE, DTYPES, compute_codes, compute_dtype
from perfmodel.specs.formats import WeightFormat, format_of
from perfmodel.specs.hardware import Hardware


@dataclass(frozen=True)
class MatmulPath:
    """How a linear of ``fmt`` runs: ``kind`` "w8a8" / "w4a4" (activations quantized to
    ``act_dtype`` per ``act_group`` elements, 0: per token or tensor) or "weight-only";
    ``compute``: the MMA's dtype."""

    kind: str
    fmt: WeightFormat
    compute: str
    act_dtype: str | None = None
    act_group: int = 0

    def describe(self) -> str:
        """'W8A8 (fp8 activations per 128, fp8 MMA)' or 'weight-only (bf16 MMA)'."""
        if self.act_dtype is None:
            return f"weight-only ({self.compute} MMA)"
        grain = f"per {self.act_group}" if self.act_group else "per token/tensor"
        return f"{self.kind.upper()} ({self.act_dtype} activations {grain}, " \
               f"{self.compute} MMA)"


def native_acts(hw: Hardware, fmt: WeightFormat) -> bool:
    """Whether ``hw`` runs ``fmt``'s quantized activations: it lists a rate for them."""
    return fmt.act_dtype is not None and fmt.act_dtype in hw.peak_flops_per_s


def matmul_path(hw: Hardware, weights: str, group_size: int | None,
                scale_bytes: float | None = None, acts: str = "bf16") -> MatmulPath | None:
    """The path a linear of stored ``weights`` (in groups of ``group_size``) takes on ``hw``
    with ``acts`` activations (module docstring); None for 16-bit weights. Activations
    already narrower than 16 bits keep the wider operand's rule (``dtypes.compute_dtype``)."""
    fmt = format_of(weights, group_size, scale_bytes)
    if fmt is None:
        return None
    if BYTES[CODE[acts]] == 2.0 and native_acts(hw, fmt):
        kind = "w8a8" if fmt.act_dtype == "fp8" else "w4a4"
        return MatmulPath(kind, fmt, fmt.act_dtype, fmt.act_dtype, fmt.act_group)
    return MatmulPath("weight-only", fmt, compute_dtype(weights, acts))


def act_quant_codes(hw: Hardware, weights: np.ndarray, group: np.ndarray,
                    acts: np.ndarray) -> np.ndarray:
    """Per configuration, the dtype code quantized linears quantize their 16-bit input to
    (W8A8 / W4A4 on ``hw``), -1 where they run weight-only or at 16 bits: ``matmul_path``
    over arrays of weight codes, group sizes (0: none) and activation codes."""
    weights, group, acts = np.broadcast_arrays(*(np.asarray(x, dtype=np.int64)
                                                 for x in (weights, group, acts)))
    out = np.full(weights.shape, -1, dtype=np.int64)
    narrow = (BYTES[weights] < 2.0) & (BYTES[acts] == 2.0)
    # the (dtype, group) pairs present: a few, whatever the number of configurations
    for code, g in set(zip(weights[narrow].tolist(), group[narrow].tolist(), strict=True)):
        fmt = format_of(DTYPES[code], g or None)
        if fmt is not None and native_acts(hw, fmt):
            out[narrow & (weights == code) & (group == g)] = CODE[fmt.act_dtype]
    return out


def matmul_codes(hw: Hardware, weights: np.ndarray, group: np.ndarray,
                 acts: np.ndarray) -> np.ndarray:
    """Per configuration, the compute dtype code of a quantized linear on ``hw``: the
    quantized activations' where it runs W8A8 / W4A4 (``act_quant_codes``), else the wider
    operand's (``dtypes.compute_codes``)."""
    quant = act_quant_codes(hw, weights, group, acts)
    return np.where(quant >= 0, quant, compute_codes(weights, acts))
