"""How many CTAs of a latent (MLA) decode stream one sequence's cache, and how the engine's
MLA kernel splits and schedules its keys (``attention_latent_sched``).

FlashMLA (SM90; deepseek-ai/FlashMLA, TensorRT-LLM's copy under
cpp/tensorrt_llm/kernels/flashMLA): a CTA holds 64 query rows (``BLOCK_SIZE_M``), so 128
heads run two CTAs per (KV head, part), each streaming the cache; ``get_mla_metadata``
charges each sequence ceil(keys / 64) + 5 blocks (``block_size_n`` 64,
``fixed_overhead_num_blocks`` 5) and shares the total evenly over ``num_sm_parts = SMs /
KV heads / ceil(heads / 64)`` parts, each at most ceil(total / parts) + 5 blocks; a piece of
a split sequence writes fp32 partials (``o_accum``, ``lse_accum``) its combine kernel reads.

TensorRT-LLM's trtllm-gen MLA generation kernels (Blackwell) hold a few query heads of the
one latent KV head per CTA (NVIDIA/TensorRT-LLM
cpp/tensorrt_llm/kernels/trtllmGenKernels/fmha/fmhaKernels.h, ``hashFromRunnerParams``:
up to 32 heads the low-latency SwapsMmaAbForGeneration kernel with
``maxNumHeadsQPerKvInCta`` 8 (up to 8 heads) or 16; above, KeepsMmaAbForGeneration with 64,
and 128 heads on a 2-CTA MMA pair). ``computeNumCtas`` then launches ``numHeadsQ /
numHeadsPerCta`` CTAs per sequence (grid y), every one reading the sequence's whole latent
(its QK^T needs all 576 columns of every key), so 32 heads stream the cache twice where 16
stream it once. A pair of a 2-CTA MMA shares its operand loads: one stream.
The second stream partly hits L2 (its twin CTA reads the same pages at about the same
time): ``attention_restream_fraction`` is the share that reaches HBM.

The key split (``computeNumCtas``, NVIDIA/TensorRT-LLM commit 52cd475): at most
ceil(keys / (2 x stepKv)) CTAs per (sequence, head tile), as many as fill the SMs the other
CTAs leave; the low-latency kernel reduces a split itself (CgaSmemReduction /
GmemReduction), the high-throughput one always launches its reduction kernel
(GmemReductionWithSeparateKernel, ``selectMlaGenerationKernel``). Not modelled: the
low-latency kernel chosen for more than 32 heads at small batches and short caches
(``useSwapsMmaAbMlaGenKernel``), the 2-CTA pair's doubled CTA count in the split, and
``headDimPerCtaV`` splits of V.
"""

from __future__ import annotations

import numpy as np

from perfmodel.cost.tiling import latent_attention


def _step(steps: tuple[tuple[int, int], ...], group: np.ndarray) -> np.ndarray:
    """The value of the step of ``steps`` ({min group: value}) whose minimum is reached."""
    mins = np.array([m for m, _ in steps])
    values = np.array([v for _, v in steps], dtype=float)
    return values[np.maximum(np.searchsorted(mins, group, side="right") - 1, 0)]


def latent_cta_rows(eff, group: np.ndarray) -> np.ndarray:
    """Query heads of one KV head per CTA (``attention_latent_cta_rows``)."""
    return _step(eff.attention_latent_cta_rows, group)


def latent_streams(eff, group: np.ndarray) -> np.ndarray:
    """CTAs per (sequence, KV head) that each stream its cache: ceil(group / rows)."""
    group = np.maximum(np.asarray(group, dtype=float), 1.0)
    return np.ceil(group / latent_cta_rows(eff, group))


def latent_groups(op) -> np.ndarray:
    """Per group of ``op``: MLA's absorbed form, K and V read from one shared latent (a
    position holds fewer elements than Q/K plus V; ``tiling.latent_attention`` per group)."""
    return np.asarray(op.g("cache_elems")) < np.asarray(op.g("qk_dim")) + op.g("v_dim")


def latent_restreamed(op, eff, decode: np.ndarray) -> np.ndarray:
    """Cache bytes read again from HBM per instance: each latent decode group's further
    streams (``latent_streams`` - 1) x its cache reads x ``attention_restream_fraction``."""
    if not eff.attention_latent_cta_rows or not eff.attention_restream_fraction:
        return np.zeros(np.shape(op.batch)[:-1])
    group = np.floor_divide(op.g("n_heads"), op.g("n_kv_heads"))
    further = (latent_streams(eff, group) - 1.0) * latent_groups(op) * decode
    return eff.attention_restream_fraction * (op.group_bytes().kv_read * further).sum(axis=-1)


# trtllm-gen's key split (fmhaKernels.h computeNumCtas): a CTA takes at least two key steps
# of 128 (tileSizeKv), and the split fills the SMs left by the other CTAs
TRTLLM_GEN_STEP_KV = 128
# groups up to this run the low-latency SwapsMmaAb kernel, which reduces a split in the
# kernel (CgaSmemReduction up to 16 CTAs, else GmemReduction); above, KeepsMmaAb always
# runs the separate reduction kernel (GmemReductionWithSeparateKernel)
SWAPS_MAX_GROUP = 32


def trtllm_gen_splits(hw, op, decode: np.ndarray) -> np.ndarray:
    """CTAs per (sequence, head tile) of a latent decode instance:
    min(ceil(longest keys / (2 x 128)), max(1, SMs // CTAs before the split))."""
    group = np.floor_divide(op.g("n_heads"), op.g("n_kv_heads"))
    ctas = (op.batch * op.g("n_kv_heads") * latent_streams(hw.efficiency, group)
            * decode).sum(axis=-1)
    most = np.ceil((op.kv_len * decode).max(axis=-1) / (2 * TRTLLM_GEN_STEP_KV))
    fill = np.maximum(1.0, np.floor(hw.compute_units / np.maximum(ctas, 1.0)))
    return np.maximum(np.minimum(most, fill), 1.0)


def reduces_in_kernel(op, decode: np.ndarray) -> np.ndarray:
    """Per instance: every latent decode group runs the kernel that reduces its own split
    (no combine kernel of its own)."""
    group = np.floor_divide(op.g("n_heads"), op.g("n_kv_heads"))
    low = (group <= SWAPS_MAX_GROUP) & latent_groups(op)
    return np.where(decode, low, True).all(axis=-1)


def latent_costs(op, hw, decode: np.ndarray, splits: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per instance: (cache bytes its further head-tile CTAs read again, the CTAs' own fixed
    time over the SMs, whether it reduces its split in the kernel). Each CTA's prologue and
    epilogue (its queries, page table, tensor memory, output) take ``attention_cta_s``
    whatever its keys, the CTAs spread over the SMs by the persistent / split schedule:
    CTAs x that / SMs."""
    eff = hw.efficiency
    group = np.floor_divide(op.g("n_heads"), op.g("n_kv_heads"))
    ctas = (op.batch * op.g("n_kv_heads") * latent_streams(eff, group) * latent_groups(op)
            * decode).sum(axis=-1) * splits
    own = reduces_in_kernel(op, decode) if eff.attention_latent_sched == "trtllm_gen" \
        else np.zeros(np.shape(ctas), dtype=bool)
    extra = latent_restreamed(op, eff, decode)
    if eff.attention_latent_sched == "flashmla":
        extra = extra + flashmla_partials(hw, op, decode) * latent_attention(op)
    return extra, eff.attention_cta_s * ctas / hw.compute_units, own


# FlashMLA's decode scheduler (deepseek-ai/FlashMLA get_mla_metadata, as TensorRT-LLM's
# copy runs it, cpp/tensorrt_llm/kernels/flashMLA): keys in blocks of 64, each sequence
# charged 5 blocks of fixed work, the total shared evenly over num_sm_parts = SMs / KV heads
# / ceil(heads / 64) CTAs per (KV head, 64-row query block)
FLASHMLA_BLOCK_N = 64
FLASHMLA_FIXED_BLOCKS = 5


def _parts(hw, op, decode: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(CTAs per part: KV heads x 64-row query blocks, num_sm_parts) per instance."""
    group = np.floor_divide(op.g("n_heads"), op.g("n_kv_heads"))
    row_ctas = (op.g("n_kv_heads") * latent_streams(hw.efficiency, group) * decode).max(axis=-1)
    return row_ctas, np.maximum(1.0, np.floor(hw.compute_units / np.maximum(row_ctas, 1.0)))


def flashmla_partials(hw, op, decode: np.ndarray) -> np.ndarray:
    """Bytes of the split pieces' fp32 partial outputs and log-sum-exps (o_accum, lse_accum),
    written by the main kernel and read by the combine: a part's boundary inside a sequence
    splits it, so about parts + min(sequences, parts) pieces, each heads x (512 x 4 + 4)."""
    _, parts = _parts(hw, op, decode)
    seqs = (op.batch * decode).sum(axis=-1)
    heads = (op.g("n_heads") * decode).max(axis=-1)
    v = (op.g("v_dim") * decode).max(axis=-1)
    return 2.0 * (parts + np.minimum(seqs, parts)) * heads * (v * 4.0 + 4.0)


def flashmla_fill(hw, op, decode: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(useful share of the SMs' time, key splits of the longest sequence) of a FlashMLA
    decode: each CTA runs ceil(total / parts) + 5 blocks (``payload``), all CTAs at once."""
    row_ctas, parts = _parts(hw, op, decode)
    blocks = np.ceil(op.kv_len / FLASHMLA_BLOCK_N)
    total = (op.batch * (blocks + FLASHMLA_FIXED_BLOCKS) * decode).sum(axis=-1)
    payload = np.ceil(total / parts) + FLASHMLA_FIXED_BLOCKS
    useful = (op.batch * op.kv_len * decode).sum(axis=-1) / FLASHMLA_BLOCK_N
    longest = (blocks * decode).max(axis=-1) + FLASHMLA_FIXED_BLOCKS
    return np.minimum(1.0, useful * row_ctas / (hw.compute_units * payload)), \
        np.maximum(1.0, np.ceil(longest / payload))
