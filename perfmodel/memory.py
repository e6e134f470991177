"""Memory on one device: weights, KV cache, workspace, and the batch ceiling.

    KV pool = capacity * usable_fraction - weights - workspace
    max batch = floor((capacity * usable_fraction - weights) / (KV per sequence + workspace
                per sequence))

KV per sequence is at its final length (prompt + generated), rounded up to whole paged
blocks, with windowed layers holding at most their window.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from perfmodel.params import LINEAR_CLASSES, kv_heads_per_device, param_counts
from perfmodel.specs import DTYPE_BYTES, Hardware, Model, Workload


@dataclass(frozen=True)
class MemoryEstimate:
    capacity_bytes: float
    usable_bytes: float
    weights_bytes: float
    kv_cache_bytes_per_token: float     # all layers, one token, full attention, one device
    kv_cache_bytes_per_sequence: float  # at the final length, windows and paging applied
    kv_cache_bytes: float               # batch x per sequence
    workspace_bytes: float              # activations of the largest step
    max_batch: int
    fits: bool

    @property
    def free_bytes(self) -> float:
        """What is left after weights, workspace and KV (negative: does not fit)."""
        return self.usable_bytes - self.weights_bytes - self.workspace_bytes - self.kv_cache_bytes


def weights_bytes(model: Model, wl: Workload) -> float:
    """Bytes of weights on one device: matmul weights at the weight dtype (with group scales),
    embedding, LM head and norms at the activation dtype."""
    counts = param_counts(model, wl.tp)
    linear = sum(getattr(counts, c) for c in LINEAR_CLASSES)
    other = counts.embedding + counts.lm_head + counts.norms
    return linear * wl.weight_bytes_per_param + other * DTYPE_BYTES[wl.act_dtype]


def kv_elems_per_token_layer(model: Model, tp: int = 1) -> int:
    """Cached elements per token per layer on one device: 2 * kv_heads * head_dim (K and V),
    or the MLA latent kv_lora_rank + qk_rope_head_dim (shared by all heads, replicated)."""
    if model.mla is not None:
        return model.mla.kv_lora_rank + model.mla.qk_rope_head_dim
    return 2 * kv_heads_per_device(model, tp) * model.head_dim


def kv_bytes_per_token(model: Model, wl: Workload) -> float:
    """KV bytes one token adds across all layers (below any window)."""
    return model.n_layers * kv_elems_per_token_layer(model, wl.tp) * DTYPE_BYTES[wl.kv_dtype]


def kv_bytes_per_sequence(model: Model, wl: Workload, length: int) -> float:
    """KV bytes of one sequence of ``length`` tokens: windowed layers keep min(length, W)
    positions; each layer's positions round up to whole blocks of kv_block_tokens."""
    per_layer = kv_elems_per_token_layer(model, wl.tp) * DTYPE_BYTES[wl.kv_dtype]
    block = wl.kv_block_tokens
    total = 0.0
    for kind in model.layer_kinds():
        kept = min(length, model.sliding_window) if kind == "local" else length
        total += math.ceil(kept / block) * block * per_layer
    return total


def workspace_bytes_per_token(model: Model, wl: Workload) -> float:
    """Peak live activations per token of a step: residual stream, normed input and the
    widest intermediate (QKV, or gate+up plus the activated half), at the activation dtype."""
    tp, d = wl.tp, model.d_model
    qkv = (model.n_heads // tp + 2 * kv_heads_per_device(model, tp)) * model.head_dim
    widths = [model.intermediate_size]
    if model.moe:
        widths.append(model.moe.expert_intermediate_size * model.moe.top_k)
    mlp = max(widths) // tp * (3 if model.gated_mlp else 2)
    return (2 * d + max(qkv, mlp)) * DTYPE_BYTES[wl.act_dtype]


def logits_bytes_per_sequence(model: Model, wl: Workload) -> float:
    """fp32 logits of the last position of one sequence (vocabulary split under TP)."""
    return model.vocab_size / wl.tp * 4.0


def memory_estimate(model: Model, hw: Hardware, wl: Workload) -> MemoryEstimate:
    usable = hw.memory_bytes * wl.usable_memory_fraction
    weights = weights_bytes(model, wl)
    per_seq = kv_bytes_per_sequence(model, wl, wl.final_len)
    ws_seq = workspace_bytes_per_token(model, wl) * wl.prompt_len \
        + logits_bytes_per_sequence(model, wl)
    room = usable - weights
    max_batch = max(0, math.floor(room / (per_seq + ws_seq))) if room > 0 else 0
    return MemoryEstimate(
        capacity_bytes=hw.memory_bytes, usable_bytes=usable, weights_bytes=weights,
        kv_cache_bytes_per_token=kv_bytes_per_token(model, wl),
        kv_cache_bytes_per_sequence=per_seq, kv_cache_bytes=per_seq * wl.batch,
        workspace_bytes=ws_seq * wl.batch, max_batch=max_batch, fits=wl.batch <= max_batch)
