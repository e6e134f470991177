"""How many CTAs of a latent (MLA) decode stream one sequence's cache.

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
"""

from __future__ import annotations

import numpy as np


def _step(steps: tuple[tuple[int, int], ...], group: np.ndarray) -> np.ndarray:
    """The value of the step of ``steps`` ({min group: value}) whose minimum is reached."""
    mins = np.array([m for m, _ in steps])
    values = np.array([v for _, v in steps], dtype=float)
    return values[np.maximum(np.searchsorted(mins, group, side="right") - 1, 0)]


def latent_cta_rows(eff, group: np.ndarray) -> np.ndarray:
    """Query heads of one KV head per CTA (``attention_latent_cta_rows``)."""
    return _step(eff.attention_latent_cta_rows, group)


def latent_mma_rows(eff, group: np.ndarray) -> np.ndarray:
    """Rows a latent decode's MMA pads a CTA's query heads to
    (``attention_latent_mma_rows``)."""
    return _step(eff.attention_latent_mma_rows, group)


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
