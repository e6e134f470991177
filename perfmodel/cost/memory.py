"""Memory on one device: weights, KV cache, workspace, and the batch ceiling.

    usable = max(capacity * usable_fraction - runtime_reserved, 0)
    KV pool = usable - weights - workspace
    max batch = floor((usable - weights) / (KV per sequence + workspace per sequence))

capacity is the total the driver reports (hardware YAML ``memory.capacity_bytes``);
usable_fraction is the engine's budget share (vLLM's ``gpu_memory_utilization``: the
engine may use total x utilization); runtime_reserved is what the engine never gets inside
that budget: the CUDA / ROCm context and library workspaces (``memory.runtime_reserved_bytes``,
vLLM's "non_torch_memory"). vLLM gives the KV cache what is left after weights, peak
activations and that reserve (vllm-project/vllm PR 10511); ``usable_bytes`` is the one place
the reserve is subtracted.

KV per sequence is at its final length (prompt + generated), rounded up to whole paged
blocks, with windowed layers holding at most their window. Every function takes numpy
arrays (one entry per configuration) as readily as numbers.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from perfmodel.cost.params import (
    class_params,
    kv_heads_per_device,
    mamba_conv_channels,
    other_formats,
    param_counts,
    stage_layers,
    unquantized,
)
from perfmodel.specs.dtypes import BYTES, CODE, DTYPE_BYTES, kv_group, scaled_bytes
from perfmodel.specs.errors import SpecError
from perfmodel.specs.formats import weight_format
from perfmodel.specs.hardware import Hardware
from perfmodel.specs.model import Model
from perfmodel.specs.workload import Parallelism, Workloads


@dataclass(frozen=True)
class MemoryEstimate:
    """Memory of one configuration (numbers) or of many (arrays, one entry each)."""

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

    def item(self, i: int) -> MemoryEstimate:
        """The ``i``-th configuration of an array estimate, as numbers."""
        values = {f.name: np.asarray(getattr(self, f.name)).reshape(-1) for f in fields(self)}
        out = {k: float(v[i] if v.size > 1 else v[0]) for k, v in values.items()}
        out["max_batch"], out["fits"] = int(out["max_batch"]), bool(out["fits"])
        return MemoryEstimate(**out)


def weights_bytes(model: Model, tp: int, weight_bytes: np.ndarray,
                  act_bytes: np.ndarray, pp: int = 1, ep: int = 1,
                  replicas: int = 0, head_bytes: np.ndarray | None = None) -> np.ndarray:
    """Bytes of weights on one device: matmul weights at ``weight_bytes`` per element (with
    group scales); embedding, norms and the linear classes the checkpoint keeps
    unquantized (``params.unquantized``) at ``act_bytes``; those it stores in another
    format at that format's bytes (``params.other_formats``); the LM head at ``head_bytes``
    (None: ``act_bytes``; ``head_bytes_of``). Under pipeline parallelism, the fullest
    stage's (``stage_weights``)."""
    return stage_weights(model, tp, weight_bytes, act_bytes, pp, ep, replicas,
                         head_bytes).max(axis=0)


def stage_weights(model: Model, tp: int, weight_bytes: np.ndarray, act_bytes: np.ndarray,
                  pp: int = 1, ep: int = 1, replicas: int = 0,
                  head_bytes: np.ndarray | None = None) -> np.ndarray:
    """(pp, ...) weight bytes on a device of each stage: its share of the decoder layers, the
    embedding on the first stage and the LM head on the last at ``head_bytes`` per element
    (None: ``act_bytes``; a tied head is a second copy of the embedding there when pp > 1);
    under expert parallelism its experts, ``replicas`` redundant copies included
    (``params.param_counts``)."""
    counts = param_counts(model, tp, ep, replicas)
    kept, other = unquantized(model), other_formats(model)
    per = class_params(model, counts, tp)
    linear = sum(n for c, n in per.items() if c not in kept and c not in other)
    layers = linear * np.asarray(weight_bytes) + (counts.norms + sum(
        per[c] for c in kept)) * np.asarray(act_bytes) \
        + sum(per[c] * format_bytes(f) for c, f in other.items())
    head = counts.lm_head if counts.lm_head or pp == 1 else counts.embedding
    share = stage_layers(model.n_layers, pp) / model.n_layers
    out = share.reshape((pp,) + (1,) * np.ndim(layers)) * layers
    out[0] = out[0] + counts.embedding * np.asarray(act_bytes)
    out[-1] = out[-1] + head * np.asarray(act_bytes if head_bytes is None else head_bytes)
    return out


def format_bytes(name: str) -> float:
    """Bytes per weight of format ``name`` (``specs.formats``), its scales included."""
    f = weight_format(name)
    return float(scaled_bytes(CODE[f.weights], f.group_size or 0, f.scale_bytes))


def quantized_head(model: Model, quantize: np.ndarray | bool,
                   weights: np.ndarray | int) -> np.ndarray:
    """Where the LM head is stored and run at the weights' dtype, group size and scales
    (``Workload.quantize_lm_head``): where asked and the weight dtype codes ``weights`` are
    narrower than 16 bits (on 16-bit weights the flag changes nothing).

    A model whose head is its embedding table (``tie_embeddings``) is refused with a
    SpecError where any row asks: the stacks disagree on what a quantized tied head is, so
    no one price is honest. TorchAO's ``quantize_`` gives the output ``nn.Linear`` a new
    quantized parameter and leaves the embedding its 16-bit table (a second, quantized copy
    of the vocabulary matrix); vLLM ties the head by sharing the embedding's tensor
    (``ParallelLMHead.tie_weights``) and skips the checkpoint's ``lm_head.*`` tensors of a
    tied model, so a GPTQ head would not be loaded; auto-round declines to quantize a tied
    head (intel/auto-round PR 101)."""
    on = np.asarray(quantize, dtype=bool) & (BYTES[np.asarray(weights, dtype=int)] < 2)
    if model.tie_embeddings and on.any():
        raise SpecError(f"workload: quantize_lm_head needs an LM head of its own, but "
                        f"{model.name}'s head is its embedding table (tie_embeddings: true); "
                        f"set it to false")
    return on


def head_bytes_of(model: Model, w: Workloads) -> np.ndarray:
    """Bytes per LM-head weight of every configuration of ``w`` (N,): the weights' bytes
    per parameter where the head is quantized (``quantized_head``), else the activations'."""
    on = quantized_head(model, w.quantize_lm_head, w.weights_dtype)
    return np.where(on, w.weight_bytes_per_param, BYTES[w.act_dtype])


def kv_elems_per_token_layer(model: Model, tp: int = 1) -> int:
    """Cached elements per token per layer on one device: 2 * kv_heads * head_dim (K and V),
    or the MLA latent kv_lora_rank + qk_rope_head_dim (shared by all heads, replicated)."""
    if model.mla is not None:
        return model.mla.kv_lora_rank + model.mla.qk_rope_head_dim
    return 2 * kv_heads_per_device(model, tp) * model.head_dim


# DSA's indexer keys: fp8 with one fp32 scale per 128 elements, whatever the KV dtype
# (vLLM ``DeepseekV32IndexerCache``: index_head_dim + index_head_dim // 128 * 4 bytes)
INDEX_KEY_BYTES_PER_ELEM = 1.0 + 4.0 / 128


def index_cache_bytes_per_token_layer(model: Model) -> float:
    """Bytes of the lightning indexer's key one token adds to one layer (0 without DSA)."""
    a = model.mla
    return a.index_head_dim * INDEX_KEY_BYTES_PER_ELEM if a is not None and a.sparse else 0.0


def kv_bytes_per_token_layer(model: Model, tp: int, kv_bytes: np.ndarray) -> np.ndarray:
    """Cached bytes one token adds to one attention layer on one device: its K/V (or MLA
    latent) elements at ``kv_bytes`` each, plus DSA's indexer key."""
    return kv_elems_per_token_layer(model, tp) * kv_bytes \
        + index_cache_bytes_per_token_layer(model)


def kv_vector_elems(model: Model) -> int:
    """Elements of one cached vector, what a per-(token, head) KV scale covers: head_dim,
    or MLA's whole latent kv_lora_rank + qk_rope_head_dim."""
    if model.mla is not None:
        return model.mla.kv_lora_rank + model.mla.qk_rope_head_dim
    return model.head_dim


def kv_bytes_per_element(model: Model, codes: np.ndarray, group: np.ndarray,
                         scale_bytes: np.ndarray) -> np.ndarray:
    """Bytes per cached element at KV dtype ``codes``: bytes(dtype) + scale_bytes / group
    (``dtypes.scaled_bytes``), the group resolved by ``dtypes.kv_group``. An int8 / int4
    cache stores by default one scale and zero point per (token, KV head) at the model's
    16-bit dtype, 4 bytes per head_dim elements: LMDeploy's quant_policy 4 / 8
    (InternLM/lmdeploy lmdeploy/pytorch/engine/cache_engine.py ``get_cache_block_size``,
    commit 011536f: a (..., heads, 2) scale-zero block beside the uint8 cache); KIVI
    (arXiv 2402.02750) keeps a 16-bit scale and zero per group of G elements, given as
    ``kv_group_size``. vLLM's fp8 cache has one scale per tensor: no bytes per element."""
    return scaled_bytes(codes, kv_group(codes, group, kv_vector_elems(model)), scale_bytes)


def kv_bytes_of(model: Model, w: Workloads) -> np.ndarray:
    """``kv_bytes_per_element`` of every configuration of ``w`` (N,)."""
    return kv_bytes_per_element(model, w.kv_dtype, w.kv_group_size, w.kv_scale_bytes)


def kv_bytes_per_token(model: Model, tp: int, kv_bytes: np.ndarray) -> np.ndarray:
    """KV bytes one token adds across all layers (below any window), a shared block's
    invocations included (``Model.cache_layers``)."""
    return model.cache_layers * kv_bytes_per_token_layer(model, tp, kv_bytes)


def kv_bytes_per_sequence(model: Model, tp: int, kv_bytes: np.ndarray, length: np.ndarray,
                          block: np.ndarray | int = 16) -> np.ndarray:
    """KV bytes of one sequence of ``length`` tokens: windowed layers keep min(length, W)
    positions, chunked layers min(length, C) (a full chunk at its last position: the most
    the layer holds); each layer's positions round up to whole blocks of ``block`` tokens;
    a shared block (Zamba2) caches every position at each invocation. Recurrent layers add
    their constant state (``recurrent_state_per_sequence``)."""
    per_layer = kv_bytes_per_token_layer(model, tp, kv_bytes)
    kinds = model.layer_kinds()
    total = np.ceil(length / block) * block * model.full_cache_layers   # CLA: fewer caches
    for kind, limit in (("local", model.sliding_window), ("chunk", model.attention_chunk)):
        if kind in kinds:
            kept = np.minimum(length, limit)
            total = total + np.ceil(kept / block) * block * kinds.count(kind)
    state, conv = recurrent_state_per_sequence(model, tp)
    return total * per_layer + state + conv * kv_bytes * np.ones_like(length, dtype=float)


def recurrent_state_per_sequence(model: Model, tp: int = 1) -> tuple[float, float]:
    """(recurrent-state bytes, conv-state elements) of one sequence over the recurrent
    layers on one device, whatever its length: a Mamba layer holds H x head_dim x d_state
    (Mamba-1: d_inner x d_state) at its ``state_dtype`` and (d_conv - 1) x conv channels;
    a linear-attention layer H x head_k_dim x head_v_dim and its short conv's. The conv
    state is kept at the KV-cache dtype (``kv_bytes_per_sequence``)."""
    state = conv = 0.0
    m, a = model.mamba, model.linear_attention
    if m is not None and model.mamba_layers:
        layers = model.mamba_layers
        state += layers * m.d_inner / tp * m.d_state * DTYPE_BYTES[m.state_dtype]
        conv += layers * (m.d_conv - 1) * mamba_conv_channels(model, tp)
    if a is not None and model.layer_count("linear"):
        layers = model.layer_count("linear")
        state += layers * a.n_heads / tp * a.head_k_dim * a.head_v_dim \
            * DTYPE_BYTES[a.state_dtype]
        conv += layers * max(a.d_conv - 1, 0) * a.conv_channels / tp
    return state, conv


def workspace_bytes_per_token(model: Model, tp: int, act_bytes: np.ndarray) -> np.ndarray:
    """Peak live activations per token of a step: residual stream, normed input and the
    widest intermediate (QKV, or gate+up plus the activated half), at the activation dtype."""
    d = model.d_model
    qkv = (model.n_heads // tp + 2 * kv_heads_per_device(model, tp)) * model.head_dim
    widths = [model.intermediate_size]
    if model.mamba is not None:        # in_proj's outputs, as wide as an MLP's gate+up
        qkv = max(qkv, 2 * model.mamba.d_inner // tp + mamba_conv_channels(model, tp))
    if model.linear_attention is not None:
        a = model.linear_attention
        qkv = max(qkv, (a.conv_channels + 2 * a.n_heads * a.head_v_dim) // tp)
    if model.moe:
        widths.append(model.moe.expert_intermediate_size * model.moe.top_k)
    mlp = max(widths) // tp * (3 if model.gated_mlp else 2)
    return (2 * d + max(qkv, mlp)) * act_bytes


def logits_bytes_per_sequence(model: Model, tp: int) -> float:
    """fp32 logits of the last position of one sequence (vocabulary split under TP)."""
    return model.vocab_size / tp * 4.0


MAX_BATCH = 2.0**40   # a ceiling past any real batch, so that it stays an integer


def batch_ceiling(room: np.ndarray, per_sequence: np.ndarray) -> np.ndarray:
    """Sequences that fit in ``room`` bytes at ``per_sequence`` bytes each (0 when there is
    no room), capped at ``MAX_BATCH``."""
    fit = np.floor(np.maximum(room, 0) / per_sequence)
    return np.where(room > 0, np.minimum(fit, MAX_BATCH), 0).astype(np.int64)


def usable_bytes(hw: Hardware, fraction: np.ndarray | float) -> np.ndarray | float:
    """Device memory the engine may fill with weights, activations and KV cache: its budget
    ``capacity x fraction`` less the runtime's own reserve, never below zero."""
    return np.maximum(hw.memory_bytes * fraction - hw.runtime_reserved_bytes, 0.0)


def memory_estimate(model: Model, hw: Hardware, plan: Parallelism,
                    w: Workloads) -> MemoryEstimate:
    """Memory of every configuration of ``w`` (array fields), on the fullest device. Under
    data-parallel attention each of the ep devices holds the KV cache of its batch/ep
    sequences, so the batch ceiling is ep times one device's."""
    tp, pp = plan.tp, plan.pp
    ways = plan.attention_ways
    ab = BYTES[w.act_dtype]
    kvb = kv_bytes_of(model, w)
    usable = usable_bytes(hw, w.usable_memory_fraction)
    weights = stage_weights(model, tp, w.weight_bytes_per_param, ab, pp, plan.ep,
                            plan.expert_replicas, head_bytes_of(model, w))  # (pp, N)
    share = (stage_layers(model.n_layers, pp) / model.n_layers)[:, None]
    per_seq = kv_bytes_per_sequence(model, tp, kvb, w.final_len, w.kv_block_tokens)
    shared, hit = shared_prefix_bytes(model, tp, kvb, w), w.prefix_hit_rate
    shared = np.where(hit > 0, shared, 0.0)
    new_tokens = w.prompt_len - hit * np.where(shared > 0, w.shared_prefix, 0)
    ws_seq = workspace_bytes_per_token(model, tp, ab) * new_tokens \
        + logits_bytes_per_sequence(model, tp)
    batch, hits = np.ceil(w.batch / ways), np.ceil(w.prefix_hits / ways)    # one device's
    # a stage holds one micro-batch's activations at a time (``schedules.pipeline``)
    in_flight = np.ceil(batch / np.minimum(pp, batch))
    room = usable - weights - share * shared
    private = share * (per_seq - hit * shared)  # a hit's own blocks; a miss holds them all
    max_batch = batch_ceiling(room, private + ws_seq / pp).min(axis=0) * ways
    kv = per_seq * batch + np.where(hits > 0, shared * (1 - hits), 0.0)
    fullest = np.argmax(weights + share * kv, axis=0)
    pick = np.arange(len(w))
    return MemoryEstimate(
        capacity_bytes=np.full(len(w), hw.memory_bytes), usable_bytes=usable,
        weights_bytes=weights[fullest, pick],
        kv_cache_bytes_per_token=kv_bytes_per_token(model, tp, kvb) * share[fullest, 0],
        kv_cache_bytes_per_sequence=per_seq * share[fullest, 0],
        kv_cache_bytes=kv * share[fullest, 0], workspace_bytes=ws_seq * in_flight,
        max_batch=max_batch, fits=w.batch <= max_batch)


def shared_prefix_bytes(model: Model, tp: int, kv_bytes: np.ndarray,
                        w: Workloads) -> np.ndarray:
    """KV bytes of the shared prefix's whole blocks in the full-attention layers: what all
    requests that hit it share, stored once (a partial last block is each request's own;
    a sliding-window layer's blocks leave its window, so it shares nothing here)."""
    blocks = np.floor(w.shared_prefix / w.kv_block_tokens) * w.kv_block_tokens
    return blocks * model.full_cache_layers * kv_bytes_per_token_layer(model, tp, kv_bytes)
