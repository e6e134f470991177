"""The activation-quantization pass of a W8A8 / W4A4 linear: a record of its own.

A linear whose activations run at a narrow dtype (fp8 or int8 with dynamic scales, NVFP4)
quantizes its 16-bit input before the GEMM: vLLM's ``Fp8LinearOp`` calls
``scaled_fp8_quant`` and SGLang's fp8 path ``sgl_per_token_quant_fp8`` (DeepGEMM's
``per_token_group_quant_fp8``, FlashInfer's ``fp4_quantize``) inside the layer's forward,
so a measured linear includes it. Its bytes are a KV write's: the 16-bit activations read
once and written at the narrow dtype (``ActQuant`` keeps ``KvWrite``'s formula, with
``kv_bytes`` the narrow dtype's bytes); per-tensor dynamic scaling first reduces the
tensor's absolute maximum, a second read (``reduce_pass``: vLLM's
``dynamic_scaled_fp8_quant`` runs ``segmented_max_reduction`` before the quantizing
kernel). The scales it writes are counted too (``scale_bytes`` per element,
``act_scale_bytes``): an fp32 scale per 128-element group for the per-token-group fp8
quantization a 128 x 128 block-scaled GEMM needs (vLLM ``per_token_group_quant_fp8``,
SGLang ``sglang_per_token_group_quant_fp8``: group_size 128, float32 scales), one e4m3
scale per 16 elements for NVFP4 (FlashInfer ``fp4_quantize``, sf_vec_size 16), and one
number per tensor (nothing per element) for per-tensor fp8.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from perfmodel.cost.ops import ByteCounts, KvWrite, Num
from perfmodel.specs.dtypes import CODE


@dataclass(frozen=True, kw_only=True, eq=False)
class ActQuant(KvWrite):
    """Quantize ``rows`` x ``n`` activations read at ``act_bytes`` to ``kv_bytes`` per
    element; ``reduce_pass`` 1 reads them once more for a per-tensor absolute maximum."""

    kind: ClassVar[str] = "quantize"
    reduce_pass: Num = 0.0
    scale_bytes: Num = 0.0

    @property
    def bytes(self) -> ByteCounts:
        read = self.rows * self.n * self.act_bytes
        return ByteCounts(act_read=read * (1.0 + self.reduce_pass),
                          act_write=self.rows * self.n * (self.kv_bytes + self.scale_bytes))


# scale bytes per quantized element: fp32 per 128-element group (fp8 per token group),
# e4m3 per 16 (NVFP4)
GROUP_SCALE_BYTES = 4.0 / 128
NVFP4_SCALE_BYTES = 1.0 / 16


def act_scale_bytes(dtype: np.ndarray, mode: np.ndarray) -> np.ndarray:
    """Scale bytes per element an activation quantization of mode ``mode`` (0 per token
    group, 1 per tensor) to ``dtype`` (codes) writes."""
    return np.where(np.asarray(dtype) == CODE["fp4"], NVFP4_SCALE_BYTES,
                    np.where(np.asarray(mode) == 0, GROUP_SCALE_BYTES, 0.0))
