"""Which operators one forward step of a decoder-only transformer runs, and at what shapes.

``step_template(model, tp)`` declares every operator of a step: its kind, how many layers
run it (``count``), its dimensions per device under tensor parallelism, and which quantity
of the step sets its rows (``rows``). A step is any mix of sequence groups (see
``cost.step``): prefill is one group with T = C = prompt, a decode step T = 1 at its
context, a continuous-batching step both at once; the template is the same for all of
them, so every formula is written once. ``cost.step`` instantiates it for arrays of steps.

Step quantities a template names (all per step, summed over its groups of ``count``
sequences with T new tokens and C positions after the step):
- ``tokens`` = sum(count x T), the rows of every linear layer and elementwise pass;
- ``seqs`` = sum(count); ``logits``: seqs (the last token of each sequence) or tokens
  (every new token: speculative verification);
- MoE: ``expert_rows`` = tokens x top_k / touched, the mean rows of each of the
  ``touched`` distinct experts (``experts_touched``, exact under routing skew);
  ``expert_act_rows`` = expert_rows x touched;
- MLA: ``absorbed`` = tokens of the groups that run the absorbed (latent) form,
  ``expanded_context`` = sum(count x C) of those that run the expanded form.
"""

from __future__ import annotations

import numpy as np

from perfmodel.cost.memory import INDEX_KEY_BYTES_PER_ELEM
from perfmodel.cost.operators import (
    AllReduceSpec,
    AllToAllSpec,
    AttentionSpec,
    EmbeddingSpec,
    GemmSpec,
    KvWriteSpec,
    OverheadSpec,
    PointwiseSpec,
    Spec,
    weights_of,
)
from perfmodel.cost.ops import attended_positions
from perfmodel.cost.params import check_tp, kv_heads_per_device
from perfmodel.cost.recurrent import recurrent_mixers
from perfmodel.cost.routing import zipf_distinct
from perfmodel.specs.model import Model

# bytes per element of DeepEP's dispatch: fp8 activations with one fp32 scale per 128
# (deepseek-ai/DeepEP README: "dispatch ... FP8, combine ... BF16")
DISPATCH_BYTES = 1.0 + 4.0 / 128


def step_template(model: Model, tp: int = 1, ep: int = 1,
                  dispatch: bool = False) -> tuple[Spec, ...]:
    """Every operator of a step of ``model`` under tensor parallelism ``tp`` (and expert
    parallelism ``ep``: each device runs whole experts, 1/ep of them; ``dispatch``: tokens
    reach them by all-to-all, under data-parallel attention), in the order they run
    (embedding, attention block, MLP block, head), each with its layer count. Cached on the
    model."""
    key = ("template", tp, ep, dispatch)
    if key not in model.memo:
        model.memo[key] = tuple(_build(model, tp, ep, dispatch))
    return model.memo[key]


def _build(model: Model, tp: int, ep: int = 1, dispatch: bool = False) -> list[Spec]:
    check_tp(model, tp)
    d, L = model.d_model, model.n_layers
    mixers, mlps = model.mixer_layers, model.mlp_layers
    norm = "rms_norm" if model.norm == "rms" else "layer_norm"
    out: list[Spec] = [EmbeddingSpec("embed", d)]
    if model.position == "learned":
        out.append(PointwiseSpec("pos_embed_add", "add", d, 1))
    if model.shared_block is not None:
        out += _shared_blocks(model, tp, norm)
    out.append(PointwiseSpec("attn_norm", norm, d, mixers))
    if model.attention_layers:
        out += _mla(model, tp) if model.mla is not None else _attention(model, tp)
    out += recurrent_mixers(model, tp)
    sublayers = mixers + mlps       # each ends in a residual add (and under TP a reduce)
    both = model.parallel_mixer_layers
    if both:        # Falcon-H1: the attention and Mamba outputs summed (vLLM reduces each)
        out.append(PointwiseSpec("mixer_sum", "add", d, both))
    if tp > 1:
        out.append(AllReduceSpec("all_reduce", d, tp,
                                 L if model.parallel_block else sublayers + both))
    out.append(PointwiseSpec("residual_add", "add", d, sublayers))
    extra_norms = model.norms_per_layer - 1 - (0 if model.parallel_block else 1)
    if mlps and not model.parallel_block:
        out.append(PointwiseSpec("mlp_norm", norm, d, mlps))
    if extra_norms > 0:
        out.append(PointwiseSpec("post_norms", norm, d, L * extra_norms))
    out += _mlp(model, tp, ep, dispatch)
    out.append(PointwiseSpec("final_norm", norm, d, 1))
    out.append(GemmSpec("lm_head", model.vocab_size // tp, d, 1, rows="logits",
                        weights="head"))
    out.append(OverheadSpec("layer_overhead", L))
    return out


def _attention_kernels(model: Model, **dims: int | bool | str) -> list[AttentionSpec]:
    """The attention kernel, split into global, local (windowed) and chunked layers. A
    chunked layer's FLOPs and bytes are its chunk's (``positions``); its kernel is shaped
    (tiles, key splits) as a sliding window of the chunk, the keys bound it has (vLLM runs
    it as FlashAttention over one virtual sequence per chunk)."""
    kinds = model.layer_kinds()
    out = []
    for kind in ("global", "local", "chunk"):
        layers = kinds.count(kind)
        if layers:
            chunk = model.attention_chunk if kind == "chunk" else 0
            window = model.sliding_window if kind == "local" else chunk
            name = "attention" if layers == model.attention_layers else f"attention_{kind}"
            out.append(AttentionSpec(name, count=layers, window=window or 0, chunk=chunk or 0,
                                     **dims))
    return out


def _attention(model: Model, tp: int) -> list[Spec]:
    """MHA / GQA / MQA: fused QKV projection (with the output gate's, Qwen3-Next), rotary
    (over each head's rotated part, ``Model.rotary_dim``) and the q/k norm (not on NoPE
    layers, ``Model.nope_layers``), cache write, attention, the gate, output; over the
    attention layers."""
    L, hd, own = model.attention_layers, model.head_dim, model.kv_layers
    heads, kv = model.n_heads // tp, kv_heads_per_device(model, tp)
    w = weights_of(model, "attention")
    gate = heads * hd if model.attention_output_gate else 0
    out: list[Spec] = [GemmSpec("qkv_proj", (heads + 2 * kv) * hd + gate, model.d_model, own,
                                weights=w, bias=model.qkv_bias)]
    if L > own:          # cross-layer KV sharing: these layers project only their queries
        out.append(GemmSpec("q_proj", heads * hd, model.d_model, L - own, weights=w,
                            bias=model.qkv_bias))
    # rotary turns the rotated_dim features of each head in place (partial RoPE: vLLM's
    # rotary_embedding kernel, csrc/pos_encoding_kernels.cu, loops over heads x rot_dim / 2
    # pairs a token and touches no other feature). rms q/k norms: head_dim weights for q
    # and head_dim for k, shared by the heads (vLLM qwen3.py q_norm, k_norm =
    # RMSNorm(head_dim)); l2 (Llama 4): none (RMSNorm(head_dim, has_weight=False), llama4.py)
    norm_w = hd if model.qk_norm == "rms" else 0
    for name, kind, on, dim, norm_weights in (
            ("rotary", "rotary", model.position == "rope", model.rotated_dim, 0),
            ("qk_norm", "rms_norm", bool(model.qk_norm), hd, norm_w)):
        if on:           # one pass over the q and k heads' rows, not on NoPE layers
            out.append(PointwiseSpec(name, kind, (heads + kv) * dim,        # (kv_share 1)
                                     own - model.nope_layers,
                                     weight_elems=2 * norm_weights))
            if L > own:
                out.append(PointwiseSpec(f"q_{name}", kind, heads * dim, L - own,
                                         weight_elems=norm_weights))
    out.append(KvWriteSpec("kv_cache_write", 2 * kv * hd, own))
    out += _attention_kernels(model, heads=heads, kv_heads=kv, qk_dim=hd, v_dim=hd,
                              cache_elems=2 * hd)
    if gate:
        out.append(PointwiseSpec("attn_gate", "sigmoid_mul", gate, L))
    out.append(GemmSpec("o_proj", model.d_model, heads * hd, L,
                        weights=weights_of(model, "o_proj"), bias=model.linear_bias))
    return out


def _shared_blocks(model: Model, tp: int, norm: str) -> list[Spec]:
    """Every invocation of a shared block (Zamba2, ``specs.model.SharedBlock``): the concat
    of the hidden state and the embeddings (a copy of 2 d per token), its norm, q/k/v from
    2 d (with their adapters: A to rank, B back, added), rotary, the cache write and
    attention, o_proj to d, the norm, the MLP with its gate_up adapter, the per-layer d x d
    linear and its add into the Mamba input; under TP vLLM's all-reduces after o_proj and
    down_proj. vLLM's Zamba2LoRA gathers the rank-wide output of A on every device; those
    small all-gathers are not priced. Each invocation reads the block's weights again: a
    block (170M parameters in Zamba2-2.7B) does not stay in the L2 cache between the
    layers that share it, so the weight bytes are those of every invocation."""
    shared, d = model.shared_block, model.d_model
    calls, rank = shared.invocations, shared.adapter_rank
    heads, hd = model.n_heads // tp, model.head_dim
    width = heads * hd                       # 2 d / tp: each of q, k, v on one device
    att, mlp = weights_of(model, "attention"), weights_of(model, "mlp")
    out: list[Spec] = [PointwiseSpec("shared.concat", "gather", 2 * d, calls),
                       PointwiseSpec("shared.input_norm", norm, 2 * d, calls),
                       GemmSpec("shared.qkv_proj", 3 * width, 2 * d, calls, weights=att)]
    if shared.attention_adapters:            # q, k and v adapters, 2d -> rank -> 2d
        out += [GemmSpec("shared.qkv_adapter_a", rank // tp, 2 * d, 3 * calls, weights=att),
                GemmSpec("shared.qkv_adapter_b", width, rank, 3 * calls, weights=att),
                PointwiseSpec("shared.qkv_adapter_add", "add", width, 3 * calls)]
    if model.position == "rope":
        out.append(PointwiseSpec("shared.rotary", "rotary", 2 * heads * model.rotated_dim,
                                 calls))
    out += [KvWriteSpec("shared.kv_cache_write", 2 * width, calls),
            AttentionSpec("shared.attention", heads, heads, hd, hd, 2 * hd, calls),
            GemmSpec("shared.o_proj", d, width, calls, weights=att),
            PointwiseSpec("shared.pre_ff_norm", norm, d, calls)]
    block = _mlp_block(model, tp, "shared.", model.intermediate_size, calls)
    if shared.mlp_adapters:                  # d -> rank -> gate_up, added before the act
        up = block[0].n
        block[1:1] = [GemmSpec("shared.mlp_adapter_a", rank // tp, d, calls, weights=mlp),
                      GemmSpec("shared.mlp_adapter_b", up, rank, calls, weights=mlp),
                      PointwiseSpec("shared.mlp_adapter_add", "add", up, calls)]
    out += block
    if tp > 1:
        out.append(AllReduceSpec("shared.all_reduce", d, tp, 2 * calls))
    return [*out, GemmSpec("shared.linear", d, d, calls, weights=att),
            PointwiseSpec("shared.add", "add", d, calls)]


def mla_absorbed(model: Model, new_tokens: np.ndarray, context: np.ndarray) -> np.ndarray:
    """Whether the absorbed (latent-space) MLA form needs fewer FLOPs for a group.

    Absorbed: attention runs over the cached latent (kv_lora + rope dims for scores,
    kv_lora for values) after folding W_UK into Q and W_UV into the output.
    Expanded: K and V are up-projected for every cached position, then attention runs with
    qk = nope + rope and v = v_head_dim. Prefill (T = C) picks expanded, decode absorbed.
    """
    a, h = model.mla, model.n_heads
    if a.sparse:   # DSA runs MLA in its MQA (latent) form in prefill and decode alike
        return np.ones(np.broadcast(new_tokens, context).shape, dtype=bool)
    att = attended_positions(new_tokens, context)
    absorbed = 2 * h * att * (2 * a.kv_lora_rank + a.qk_rope_head_dim) \
        + 2 * new_tokens * h * a.kv_lora_rank * (a.qk_nope_head_dim + a.v_head_dim)
    expanded = 2 * h * att * (a.qk_nope_head_dim + a.qk_rope_head_dim + a.v_head_dim) \
        + 2 * context * a.kv_lora_rank * h * (a.qk_nope_head_dim + a.v_head_dim)
    return absorbed < expanded


def _indexer(model: Model) -> list[Spec]:
    """DSA's lightning indexer, replicated on every device (vLLM ``DeepseekV32Indexer``):
    its queries from the query latent (wq_b), one key per token (wk, a LayerNorm, rotary on
    the rope part), one weight per index head (weights_proj, kept 16-bit), the fp8 key cache
    write, and the scoring of every cached token by every index head (DeepGEMM's
    fp8_mqa_logits / fp8_paged_mqa_logits: 2 * heads * index_head_dim FLOPs a token at the
    fp8 rate, or the nearest wider one a device has; the cache read at
    INDEX_KEY_BYTES_PER_ELEM); the top-k over the scores is not priced."""
    L, a, d = model.attention_layers, model.mla, model.d_model
    w, n, dim = weights_of(model, "attention"), a.index_n_heads, a.index_head_dim
    return [GemmSpec("indexer.wq_b", n * dim, a.q_lora_rank or d, L, weights=w),
            GemmSpec("indexer.wk", dim, d, L, weights=w),
            PointwiseSpec("indexer.k_norm", "layer_norm", dim, L),
            GemmSpec("indexer.weights_proj", n, d, L, weights="act"),
            PointwiseSpec("indexer.rotary", "rotary", (n + 1) * a.qk_rope_head_dim, L),
            KvWriteSpec("indexer.cache_write", dim, L, INDEX_KEY_BYTES_PER_ELEM),
            AttentionSpec("indexer.scores", n, 1, dim, 0, dim, L,
                          elem_bytes=INDEX_KEY_BYTES_PER_ELEM, math_dtype="fp8")]


def _mla(model: Model, tp: int) -> list[Spec]:
    """DeepSeek MLA over the attention layers (all of them, or the global layers beside
    linear ones: Kimi-Linear): low-rank Q, a compressed latent KV cache, and one of two
    attention forms per group (``mla_absorbed``); the form-dependent operators move with the
    context. Rotary turns the rope part of q and of the cached key only with position rope
    (Kimi-Linear's ``mla_use_nope``: vLLM kimi_linear.py builds its MLA with rotary_emb
    None; the latent keeps its qk_rope_head_dim part, unrotated)."""
    L, a, d = model.attention_layers, model.mla, model.d_model
    heads = model.n_heads // tp
    qk = a.qk_nope_head_dim + a.qk_rope_head_dim
    latent = a.kv_lora_rank + a.qk_rope_head_dim
    w = weights_of(model, "attention")
    out: list[Spec] = []
    if a.q_lora_rank is None:
        out.append(GemmSpec("q_proj", heads * qk, d, L, weights=w))
    else:
        out += [GemmSpec("q_a_proj", a.q_lora_rank, d, L, weights=w),
                PointwiseSpec("q_a_norm", "rms_norm", a.q_lora_rank, L),
                GemmSpec("q_b_proj", heads * qk, a.q_lora_rank, L, weights=w)]
    out += [GemmSpec("kv_a_proj", latent, d, L, weights=w),
            PointwiseSpec("kv_a_norm", "rms_norm", a.kv_lora_rank, L)]
    if model.position == "rope":
        out.append(PointwiseSpec("rotary", "rotary", (heads + 1) * a.qk_rope_head_dim, L))
    out.append(KvWriteSpec("kv_cache_write", latent, L))
    # absorbed form
    out.append(GemmSpec("q_absorb", a.kv_lora_rank, a.qk_nope_head_dim, L, rows="absorbed",
                        groups=heads, weights=w, context=True))
    kernels = _attention_kernels(model, heads=heads, kv_heads=1, qk_dim=latent,
                                 v_dim=a.kv_lora_rank, cache_elems=latent, form="absorbed")
    # DSA: each query reads only the indexer's top-k cached tokens, as a window of k would
    out += [s._replace(window=a.index_topk) for s in kernels] if a.sparse else kernels
    out.append(GemmSpec("o_absorb", a.v_head_dim, a.kv_lora_rank, L, rows="absorbed",
                        groups=heads, weights=w, context=True))
    if a.sparse:
        out += _indexer(model)
    # expanded form: up-project the cached latent of every position to K_nope and V
    out.append(GemmSpec("kv_b_proj", heads * (a.qk_nope_head_dim + a.v_head_dim),
                        a.kv_lora_rank, L, rows="expanded_context", weights=w, context=True))
    out.append(AttentionSpec("attention_expanded", heads, heads, qk, a.v_head_dim,
                             qk + a.v_head_dim, L, from_cache=False, form="expanded"))
    out.append(GemmSpec("o_proj", d, heads * a.v_head_dim, L,
                        weights=weights_of(model, "o_proj")))
    return out


def experts_touched(n_experts: int, top_k: int, tokens: np.ndarray,
                    skew: np.ndarray | float = 0.0) -> np.ndarray:
    """Expected distinct experts hit when ``tokens`` each pick top_k of n_experts, routed with
    Zipf exponent ``skew`` (``routing``): sum_i (1 - (1 - p_i)^N), which for uniform
    routing (skew 0) is E * (1 - (1 - k/E)^N). One token touches k; many tokens touch all
    E; skew touches fewer."""
    return zipf_distinct(n_experts, top_k, tokens, skew)


def _mlp_block(model: Model, tp: int, prefix: str, width: int, count: float,
               rows: str = "tokens", groups: float | str = 1.0,
               linear_class: str = "mlp") -> list[Spec]:
    """Gated (gate+up fused, act-and-mul, down) or plain (up, act, down) MLP of ``width``;
    routed experts' first GEMM carries the layer's routing slots (``GemmSpec.slots``)."""
    w, d, bias = width // tp, model.d_model, model.linear_bias
    act_rows = "expert_act_rows" if rows == "expert_rows" else rows
    kw = {"weights": weights_of(model, linear_class), "bias": bias}
    slots = groups == "touched"
    if model.gated_mlp:
        act = "silu_and_mul" if model.activation == "silu" else "gelu_and_mul"
        return [GemmSpec(f"{prefix}gate_up_proj", 2 * w, d, count, rows, groups, **kw,
                         slots=slots),
                PointwiseSpec(f"{prefix}{act}", act, w, count, act_rows),
                GemmSpec(f"{prefix}down_proj", d, w, count, rows, groups, **kw)]
    return [GemmSpec(f"{prefix}up_proj", w, d, count, rows, groups, **kw, slots=slots),
            PointwiseSpec(f"{prefix}gelu", "gelu", w, count, act_rows),
            GemmSpec(f"{prefix}down_proj", d, w, count, rows, groups, **kw)]


def _mlp(model: Model, tp: int, ep: int = 1, dispatch: bool = False) -> list[Spec]:
    """Dense MLP layers, then MoE layers: router, routed experts (split by ``tp``, or whole
    under expert parallelism), shared experts and their gate (``MoE.shared_expert_gate``)."""
    L, moe = model.mlp_layers, model.moe
    n_moe = model.n_moe_layers
    out: list[Spec] = []
    if L - n_moe:
        out += _mlp_block(model, tp, "", model.intermediate_size, L - n_moe)
    if n_moe:
        out.append(GemmSpec("router", moe.n_experts, model.d_model, n_moe, weights="act"))
        if dispatch:      # DeepEP: dispatch in fp8 with a 4-byte scale per 128, combine
            out.append(AllToAllSpec("moe_dispatch", model.d_model, ep, n_moe,
                                    DISPATCH_BYTES, moe))
        out += _mlp_block(model, tp if ep == 1 else 1, "experts.",
                          moe.expert_intermediate_size, n_moe, "expert_rows", "touched",
                          "experts")
        if dispatch:
            out.append(AllToAllSpec("moe_combine", model.d_model, ep, n_moe, 0.0, moe))
        if moe.n_shared_experts:
            out += _mlp_block(model, tp, "shared.",
                              moe.n_shared_experts * moe.expert_intermediate_size, n_moe,
                              linear_class="shared_experts")
        if moe.shared_expert_gate:    # d -> 1; its sigmoid and scaling fuse (Inductor) into
            out.append(GemmSpec("shared.gate", 1, model.d_model, n_moe,    # the unpriced
                                weights="act"))            # sum of routed and shared output
    return out
