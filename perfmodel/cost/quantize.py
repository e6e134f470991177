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
kernel). Scales are a few bytes per row or per 128 elements: left out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from perfmodel.cost.ops import ByteCounts, KvWrite, Num


@dataclass(frozen=True, kw_only=True, eq=False)
class ActQuant(KvWrite):
    """Quantize ``rows`` x ``n`` activations read at ``act_bytes`` to ``kv_bytes`` per
    element; ``reduce_pass`` 1 reads them once more for a per-tensor absolute maximum."""

    kind: ClassVar[str] = "quantize"
    reduce_pass: Num = 0.0

    @property
    def bytes(self) -> ByteCounts:
        read = self.rows * self.n * self.act_bytes
        return ByteCounts(act_read=read * (1.0 + self.reduce_pass),
                          act_write=self.rows * self.n * self.kv_bytes)
