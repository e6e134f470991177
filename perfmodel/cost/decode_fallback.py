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


# XQA's multi-block unit: a block of a sequence's history per CTA (decoderXQAConstants.h
# kMinHistoryTokensPerBlock = 128; it was 512 in older releases' decoderXQAImplCommon.h)
XQA_HISTORY_BLOCK = 128
# XQA's multi-block count is cut back past this many waves of CTAs (kTargetWaveFactor)
XQA_TARGET_WAVES = 8
# sub-sequences XQA's multi-block workspace holds (getXqaMaxNumSubSeq, non-MLA)
XQA_MAX_SUB_SEQ = 6000


def fallback_mask(op, hw: Hardware, decode: np.ndarray) -> np.ndarray:
    """Decode groups of each ``Attention`` instance that run the fallback kernel: a group the
    main kernel refuses (``fallback_groups``), or every 16-bit-cache group of an instance
    whose decode gives the main kernel too few blocks (``attention_decode_min_waves``:
    TensorRT-LLM's ``DecoderXQAImplJIT::mayHavePerfGain``, decoderXQAImplJIT.cpp: XQA only
    when KV heads x sequences x max(1, past keys // 128) x kEnableMinBlockFactor 4 >= the
    SMs, "always use at least 1 block regardless of history length"; the corpus shows both:
    groups of 2-32 on a near-empty cache cost a constant 36-58 ns per (sequence, KV head)
    from 33 of them on, XQA's, and MMHA's 9-11 ns per query head below)."""
    heads, kv_heads = op.g("n_heads"), op.g("n_kv_heads")
    decode = decode & ~latent_attention(op)[..., None]
    out = np.broadcast_to(fallback_groups(hw, heads, kv_heads), decode.shape)
    waves = hw.efficiency.attention_decode_min_waves
    if not waves:
        return out & decode
    seqs = (op.batch * decode).sum(axis=-1)
    past = (np.maximum(op.kv_len - 1, 0) * decode).max(axis=-1)
    blocks = np.max(np.broadcast_to(kv_heads, decode.shape) * decode, axis=-1) * seqs \
        * np.maximum(np.floor(past / XQA_HISTORY_BLOCK), 1)
    few = blocks < waves * hw.compute_units
    # an 8-bit cache keeps XQA whatever its blocks: "MMHA does not support this combination"
    # (bf16 / fp16 input, e4m3 cache; DecoderXQARunner::shouldUse)
    few = few[..., None] & (np.asarray(op.g("kv_bytes")) >= 2)
    return (out | few) & decode


# threads of an MMHA block (the kernel's default dynamic block size)
MMHA_THREADS = 256
# threads of an MMHA block in multi-block mode (fewer programs than SMs: the launch grows
# the block to its 1,024-thread maximum, fallback_splits)
MMHA_SPLIT_THREADS = 1024
# elements of a key or value one MMHA thread reads per loop step: a 16-byte vector of a
# 16-bit head (decoderMaskedMultiheadAttentionTemplate.h K_VEC_SIZE / V_VEC_SIZE)
MMHA_STEP_ELEMS = 8


def fallback_program_keys(hw: Hardware, head_dim: np.ndarray) -> np.ndarray:
    """A fallback (MMHA) program's own work, in key positions of its head:
    ``attention_fallback_program_steps`` x the keys one loop step of its threads covers,
    8 elements x 256 threads / head_dim. Each thread steps over a key's (and a value's)
    head_dim / 8 vectors with head_dim / 8 threads a key, so the kernel's work is
    proportional to keys x head_dim and a fixed number of steps (the query's load and
    rotary, the new token's cache write, the block's reductions, the output) costs the same
    time at every head_dim: the corpus's MMHA rows on a near-empty cache take the same time
    at head_dim 64, 128 and 256 (H200, 64 query heads on 64 KV heads, 2,048 sequences, one past
    key: 1.38, 1.39, 1.44 ms)."""
    return hw.efficiency.attention_fallback_program_steps * MMHA_STEP_ELEMS * MMHA_THREADS \
        / np.maximum(np.asarray(head_dim, dtype=float), 1.0)


def fallback_splits(hw: Hardware, head_dim: np.ndarray, pool: np.ndarray, keys: np.ndarray
                    ) -> np.ndarray:
    """Blocks per (query head, sequence) of MMHA's multi-block mode
    (decoderMaskedMultiheadAttentionLaunch.h ``multi_block_grid_setup``): enough to fill the
    SMs once, ceil(SMs / programs) (``getMaxNumSeqLenTile``, attentionOp.cpp), but each at
    least one unrolled key loop, 8 x threads / threads per value keys, a thread reading 16
    bytes of a 16-bit head (threads per value head_dim / 8). The split runs only with fewer
    programs than SMs, and then ``mmha_launch_kernel_ex`` has grown the block to
    ``MMHA_SPLIT_THREADS``: block_size_factor = min(ceil(SMs x 4 / programs), 4) blocks of
    256 threads (4 a SM, "limited by registers"), at most 1,024."""
    per_block = 8 * MMHA_SPLIT_THREADS / np.maximum(np.asarray(head_dim) / 8, 1)
    fill = np.ceil(hw.compute_units / np.maximum(pool, 1))
    return np.maximum(np.minimum(fill, np.ceil(keys / per_block)), 1)



def xqa_splits(hw: Hardware, pool: np.ndarray, seqs: np.ndarray, past: np.ndarray
               ) -> np.ndarray:
    """CTAs per (sequence, KV head) of XQA's multi-block mode for a decode pool of ``pool``
    (sequence, KV head) programs over ``seqs`` sequences whose longest history is ``past``
    keys (decoderXQAImplCommon.h ``computeMultiBlockCount``): past // 128 blocks, at most
    round(sqrt(8 x that)) ("otherwise the final reduction may dominate"), at least 1; cut
    back by the waves past 8 (pool x count / SMs over ``XQA_TARGET_WAVES``), and to the
    workspace's 6,000 sub-sequences over the sequences."""
    count = np.floor(np.asarray(past, dtype=float) / XQA_HISTORY_BLOCK)
    count = np.maximum(np.minimum(count, np.round(np.sqrt(count * 8.0))), 1.0)
    over = pool * count / hw.compute_units / XQA_TARGET_WAVES
    count = np.maximum(np.where(over > 1.0, np.floor(count / np.maximum(over, 1.0)), count), 1.0)
    return np.maximum(np.minimum(count, np.floor(XQA_MAX_SUB_SEQ / np.maximum(seqs, 1))), 1.0)
