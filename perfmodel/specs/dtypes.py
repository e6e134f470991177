"""Data types: bytes per element, the code each dtype has in arrays, and the matmul rule.

Arrays of configurations carry dtypes as small integer codes (the index in ``DTYPES``) so
that numpy can look up bytes and peak rates per row.
"""

from __future__ import annotations

import numpy as np

from perfmodel.specs.errors import SpecError

# Bytes per element. Floats: int4/fp4 are half a byte (integer division would make them 0).
DTYPE_BYTES: dict[str, float] = {
    "fp32": 4.0, "tf32": 4.0, "bf16": 2.0, "fp16": 2.0,
    "fp8": 1.0, "int8": 1.0, "int4": 0.5, "fp4": 0.5,
}
DTYPES = tuple(DTYPE_BYTES)
CODE = {name: i for i, name in enumerate(DTYPES)}
BYTES = np.array([DTYPE_BYTES[d] for d in DTYPES])     # code -> bytes per element


def dtype_bytes(name: str, where: str = "dtype") -> float:
    """Bytes per element of dtype ``name``; SpecError naming ``where`` if unknown."""
    return DTYPE_BYTES[DTYPES[dtype_code(name, where)]]


def dtype_code(name: str, where: str = "dtype") -> int:
    """The array code of dtype ``name``; SpecError naming ``where`` if unknown."""
    if name not in CODE:
        raise SpecError(f"{where}: unknown dtype {name!r}, expected one of {', '.join(DTYPES)}")
    return CODE[name]


def compute_dtype(weights: str, acts: str) -> str:
    """Dtype a matmul of ``weights`` x ``acts`` runs at: the wider of the two operands.

    Weight-only quantization (int4/int8/fp8 weights, bf16 activations) dequantizes to the
    activation dtype and runs at its rate; both operands fp8 runs at the fp8 rate.
    """
    return DTYPES[int(compute_codes(CODE[weights], CODE[acts]))]


def scaled_bytes(codes: np.ndarray | int, group_size: np.ndarray | int,
                 scale_bytes: np.ndarray | float = 2.0) -> np.ndarray:
    """Bytes per element of dtype ``codes`` stored in groups of ``group_size`` elements with
    ``scale_bytes`` of scale (and zero point) per group (0: not grouped):
    bytes(dtype) + scale_bytes / group_size. The one scale formula: weights
    (``weight_bytes``) and the KV cache (``cost.memory.kv_bytes_per_element``) use it."""
    group = np.asarray(group_size)
    return BYTES[codes] + np.where(group > 0, scale_bytes / np.maximum(group, 1), 0.0)


def mixed_bytes(quantized: np.ndarray | float, outlier_fraction: np.ndarray | float
                ) -> np.ndarray:
    """Bytes per weight when a share ``outlier_fraction`` of each matrix's input channels
    stays in 16 bits and the rest is quantized at ``quantized`` bytes per weight:
    (1 - f) x quantized + f x 2 (LLM.int8(), arXiv 2208.07339: 0.1% - 1% of the feature
    dimensions carry the outliers; SpQR keeps them likewise)."""
    f = np.asarray(outlier_fraction)
    return (1.0 - f) * quantized + f * DTYPE_BYTES["bf16"]


def weight_bytes(codes: np.ndarray | int, group_size: np.ndarray | int,
                 scale_bytes: np.ndarray | float = 2.0,
                 outlier_fraction: np.ndarray | float = 0.0) -> np.ndarray:
    """Bytes per matmul weight of dtype ``codes``: ``scaled_bytes`` (``scale_bytes`` per
    group of ``group_size`` weights), with ``outlier_fraction`` of the input channels in 16
    bits (``mixed_bytes``). The default is one 16-bit scale; a 128x128-block fp8 checkpoint
    has one fp32 scale per 16,384 weights, AWQ/GPTQ int4 a 16-bit scale and a 4-bit zero
    point per group."""
    return mixed_bytes(scaled_bytes(codes, group_size, scale_bytes), outlier_fraction)


KV_PER_VECTOR = -1   # kv_group_size: one scale per cached vector (token, head)
KV_SCALED = ("int8", "int4")   # KV dtypes stored with a scale per vector unless told


def kv_group(codes: np.ndarray | int, group_size: np.ndarray | int,
             vector: int) -> np.ndarray:
    """The KV cache's scale group: ``group_size``, or where it is ``KV_PER_VECTOR`` one scale
    per cached vector of ``vector`` elements (a head's head_dim) for an int8 / int4 cache
    (LMDeploy's per-head per-token quantization) and none for the others (fp8: vLLM's one
    scale per tensor)."""
    group = np.asarray(group_size)
    scaled = np.isin(codes, [CODE[d] for d in KV_SCALED])
    return np.where(group == KV_PER_VECTOR, np.where(scaled, vector, 0), group)


def narrower_code(stored: np.ndarray | int, compute: np.ndarray | int) -> np.ndarray:
    """The stored weights' dtype code where narrower than the ``compute`` dtype (converted
    in the kernel), else -1: ``cost.ops.Gemm.weight_dtype``'s contract. Weights stored at
    the compute width (a bf16 checkpoint's, an fp8 W8A8's) are not weight-only quantized."""
    stored, compute = np.asarray(stored, dtype=int), np.asarray(compute, dtype=int)
    safe = np.where(stored >= 0, stored, compute)
    return np.where((stored >= 0) & (BYTES[safe] < BYTES[compute]), stored, -1)


def compute_codes(weights: np.ndarray | int, acts: np.ndarray | int) -> np.ndarray:
    """``compute_dtype`` on arrays of codes (ties go to the weights' dtype)."""
    return np.where(BYTES[weights] >= BYTES[acts], weights, acts)


# weight-format classes of a fused MoE layer's expert GEMMs (``cost.moe``): an engine picks
# its MoE kernel per class, so a hardware file calibrates each (``efficiency.moe_kernels``)
MOE_FORMATS = ("bf16", "fp8", "fp8_block", "fp4", "w4a16", "w4a8", "w8a16")
# the quantized classes a dense GEMM's kernel is calibrated by (``efficiency.gemm_kernels``)
DENSE_FORMATS = ("fp8", "fp8_block", "fp4")
# the kernels a GPU engine runs a linear-attention scan with, per kind of call: the chunked
# prefill and the recurrent step (decode, speculative verify) of the gated delta rule
# (Gated DeltaNet) and of KDA (a decay per key channel); ``efficiency.scan_kernels``
SCAN_CLASSES = ("delta_chunk", "delta_step", "kda_chunk", "kda_step")
