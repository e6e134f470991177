"""The decode kernel an engine runs where its main decode kernel does not serve the shape.

TensorRT-LLM decodes with XQA only for 2 to 32 query heads per KV head
(``cpp/tensorrt_llm/kernels/decoderMaskedMultiheadAttention/decoderXQAImplJIT/kernelUtils.cpp``:
``supportConfigCommon`` refuses plain MHA at beam width 1, "for performance reasons";
``supportConfigHMMA`` / ``supportConfigQGMMA`` refuse ``head_grp_size * beam_width > 32``).
Every other group runs masked multi-head attention (MMHA,
``decoderMaskedMultiheadAttention/decoderMaskedMultiheadAttentionTemplate.h``): one thread
block per (query head, sequence), its Q.K and P.V dot products in fp32 on the CUDA cores,
no tensor cores. Its compute is priced at the fp32 peak x ``attention_fallback_fraction``
(the fitted share of it); its bytes are the cache read once (the query heads of a KV head
run side by side and share its lines in L2). The corpus shows the kernel plainly: at 48 to
128 query heads per KV head the measured rate is 6-7 TFLOP/s on H100, H200 and B200 alike
(head_dim 128 and 256, bf16 and fp8 caches the same), a flat share of each part's fp32
peak, where a bandwidth-bound kernel would scale with the cache's bytes.

A device without ``attention_decode_min_group`` / ``attention_decode_max_group`` (0) has no
fallback: its decode kernel serves every group.

MLA's absorbed decode (K and V read from one shared latent, ``tiling.latent_attention``)
never takes this dispatch: TensorRT-LLM runs DeepSeek-dim MLA generation on FlashMLA on SM90
and on its trtllm-gen MLA kernels on Blackwell, not on XQA or MMHA (ai-dynamo/aiconfigurator
``collector/trtllm/collect_mla.py`` ``_mla_tokens_per_block``, from
``tensorrt_llm/_torch/model_config.py`` enable_flash_mla and ``thop/attentionOp.cpp`` at
v1.3.0rc20). Priced as MMHA, the corpus's 64- and 128-head MLA generation rows (the heads of
one device under DP attention) came out 9-11x too slow on H100/H200 and 32-46x on B200.
"""

from __future__ import annotations

import numpy as np

from perfmodel.cost.tiling import latent_attention
from perfmodel.specs.hardware import Hardware


def fallback_groups(hw: Hardware, heads: np.ndarray, kv_heads: np.ndarray) -> np.ndarray:
    """Where the decode of ``heads`` query heads on ``kv_heads`` KV heads runs the fallback
    kernel: the group (query heads per KV head) is below ``attention_decode_min_group`` or
    above ``attention_decode_max_group``; all false when the device has no fallback."""
    eff = hw.efficiency
    group = np.floor_divide(heads, np.maximum(kv_heads, 1))
    if not eff.attention_fallback_fraction:
        return np.zeros(np.shape(group), dtype=bool)
    low = group < eff.attention_decode_min_group
    high = (group > eff.attention_decode_max_group) if eff.attention_decode_max_group \
        else np.zeros(np.shape(group), dtype=bool)
    return low | high


def fallback_efficiency(hw: Hardware, rate: np.ndarray) -> np.ndarray:
    """The fallback kernel's compute efficiency against ``rate`` (the attention dtype's
    tensor peak the caller divides by): fp32 peak x ``attention_fallback_fraction`` / rate."""
    return hw.peak("fp32") * hw.efficiency.attention_fallback_fraction / np.asarray(rate)


# XQA's multi-block unit: a block of a sequence's history per CTA
# (decoderXQAImplCommon.h kMinHistoryTokensPerBlock = 512)
XQA_HISTORY_BLOCK = 512


def fallback_mask(op, hw: Hardware, decode: np.ndarray) -> np.ndarray:
    """Decode groups of each ``Attention`` instance that run the fallback kernel: a group the
    main kernel refuses (``fallback_groups``), or every 16-bit-cache group of an instance
    whose decode gives the main kernel too few blocks (``attention_decode_min_waves``:
    TensorRT-LLM's ``DecoderXQARunner::mayHavePerfGain``, decoderXQARunner.cpp: XQA only
    when KV heads x sequences x (past keys // 512) x kEnableMinBlockFactor 4 >= the SMs, so
    a history under 512 keys decodes with MMHA)."""
    heads, kv_heads = op.g("n_heads"), op.g("n_kv_heads")
    decode = decode & ~latent_attention(op)[..., None]
    out = np.broadcast_to(fallback_groups(hw, heads, kv_heads), decode.shape)
    waves = hw.efficiency.attention_decode_min_waves
    if not waves:
        return out & decode
    seqs = (op.batch * decode).sum(axis=-1)
    past = (np.maximum(op.kv_len - 1, 0) * decode).max(axis=-1)
    blocks = np.max(np.broadcast_to(kv_heads, decode.shape) * decode, axis=-1) * seqs \
        * np.floor(past / XQA_HISTORY_BLOCK)
    few = blocks < waves * hw.compute_units
    # an 8-bit cache keeps XQA whatever its blocks: "MMHA does not support this combination"
    # (bf16 / fp16 input, e4m3 cache; DecoderXQARunner::shouldUse)
    few = few[..., None] & (np.asarray(op.g("kv_bytes")) >= 2)
    return (out | few) & decode


# threads of an MMHA block (the kernel's default dynamic block size)
MMHA_THREADS = 256


def fallback_splits(hw: Hardware, head_dim: np.ndarray, pool: np.ndarray, keys: np.ndarray
                    ) -> np.ndarray:
    """Blocks per (query head, sequence) of MMHA's multi-block mode
    (decoderMaskedMultiheadAttentionLaunch.h ``multi_block_grid_setup``): enough to fill the
    SMs once, ceil(SMs / programs) (``getMaxNumSeqLenTile``, attentionOp.cpp), but each at
    least one unrolled key loop, 8 x threads / threads per value keys, a thread reading 16
    bytes of a 16-bit head (threads per value head_dim / 8)."""
    per_block = 8 * MMHA_THREADS / np.maximum(np.asarray(head_dim) / 8, 1)
    fill = np.ceil(hw.compute_units / np.maximum(pool, 1))
    return np.maximum(np.minimum(fill, np.ceil(keys / per_block)), 1)
