"""The operators of one forward step of a decoder-only transformer.

``step_ops(model, workload, new_tokens, context)`` is the single description of a step:
prefill is ``new_tokens = prompt, context = prompt``; a decode step is ``new_tokens = 1``
at its current context. B = workload.batch sequences, T new tokens each, C positions in the
cache after the step (C includes the T new ones). Every op carries the number of layers it
runs in as ``count``.
"""

from __future__ import annotations

from perfmodel import ops
from perfmodel.ops import Op
from perfmodel.params import check_tp, kv_heads_per_device
from perfmodel.specs import DTYPE_BYTES, Model, Workload, compute_dtype


class _Ctx:
    """Per-step constants shared by the op builders (sizes per device under TP)."""

    def __init__(self, model: Model, wl: Workload, new_tokens: int, context: int) -> None:
        check_tp(model, wl.tp)
        self.model, self.wl = model, wl
        self.B, self.T, self.C = wl.batch, new_tokens, context
        self.N = wl.batch * new_tokens                      # tokens in this step
        self.tp = wl.tp
        self.heads = model.n_heads // wl.tp
        self.kv_heads = kv_heads_per_device(model, wl.tp)
        self.ab = DTYPE_BYTES[wl.act_dtype]
        self.kvb = DTYPE_BYTES[wl.kv_dtype]
        self.wb = wl.weight_bytes_per_param
        self.mm = compute_dtype(wl.weights_dtype, wl.act_dtype)   # linear layers
        self.att = compute_dtype(wl.kv_dtype, wl.act_dtype)       # attention math

    def linear(self, name: str, n: int, k: int, m: float | None = None,
               groups: float = 1.0, bias: bool = False, count: float = 1.0) -> Op:
        return ops.gemm(name, self.N if m is None else m, n, k, weight_bytes=self.wb,
                        act_bytes=self.ab, dtype=self.mm, groups=groups, bias=bias, count=count)

    def pointwise(self, name: str, kind: str, n: int, count: float, rows: float | None = None
                  ) -> Op:
        return ops.elementwise(name, kind, self.N if rows is None else rows, n,
                               act_bytes=self.ab, dtype=self.wl.act_dtype, count=count)


def step_ops(model: Model, wl: Workload, new_tokens: int, context: int,
             logits_all: bool = False) -> list[Op]:
    """All operators of one step, grouped by their place in a layer (embedding, attention
    block, MLP block, head), each with ``count`` = how many times it runs in the step.

    Logits are computed for the last new token of each sequence (B rows), or for all
    B*T new tokens with ``logits_all`` (speculative verification).
    """
    if not 1 <= new_tokens <= context:
        raise ValueError(f"need 1 <= new_tokens ({new_tokens}) <= context ({context})")
    x = _Ctx(model, wl, new_tokens, context)
    d, L = model.d_model, model.n_layers
    norm = "rms_norm" if model.norm == "rms" else "layer_norm"
    out = [ops.embedding("embed", x.N, d, act_bytes=x.ab, dtype=wl.act_dtype)]
    if model.position == "learned":
        out.append(x.pointwise("pos_embed_add", "add", d, 1))
    out.append(x.pointwise("attn_norm", norm, d, L))
    out += _mla_ops(x) if model.mla is not None else _attention_ops(x)
    reduce = 1 if model.parallel_block else 2
    if x.tp > 1:
        out.append(ops.all_reduce("all_reduce", x.N * d * x.ab, x.tp, dtype=wl.act_dtype,
                                  count=L * reduce))
    out.append(x.pointwise("residual_add", "add", d, L * 2))
    extra_norms = model.norms_per_layer - 1 - (0 if model.parallel_block else 1)
    if not model.parallel_block:
        out.append(x.pointwise("mlp_norm", norm, d, L))
    if extra_norms > 0:
        out.append(x.pointwise("post_norms", norm, d, L * extra_norms))
    out += _mlp_ops(x)
    out.append(x.pointwise("final_norm", norm, d, 1))
    rows = x.N if logits_all else x.B
    out.append(ops.gemm("lm_head", rows, model.vocab_size // x.tp, d, weight_bytes=x.ab,
                        act_bytes=x.ab, dtype=wl.act_dtype))
    return out


def _attention_kernels(x: _Ctx, **dims: int) -> list[Op]:
    """The attention kernel, split into local (windowed) and global layers."""
    kinds = x.model.layer_kinds()
    out = []
    for kind in ("global", "local"):
        layers = kinds.count(kind)
        if layers:
            window = x.model.sliding_window if kind == "local" else None
            name = "attention" if layers == len(kinds) else f"attention_{kind}"
            out.append(ops.attention(name, batch=x.B, q_len=x.T, kv_len=x.C, act_bytes=x.ab,
                                     kv_bytes=x.kvb, dtype=x.att, window=window, count=layers,
                                     **dims))
    return out


def _attention_ops(x: _Ctx) -> list[Op]:
    """MHA / GQA / MQA: fused QKV projection, rotary, cache write, attention, output."""
    m, L, hd = x.model, x.model.n_layers, x.model.head_dim
    out = [x.linear("qkv_proj", (x.heads + 2 * x.kv_heads) * hd, m.d_model, bias=m.qkv_bias,
                    count=L)]
    if m.position == "rope":
        out.append(x.pointwise("rotary", "rotary", (x.heads + x.kv_heads) * hd, L))
    out.append(ops.kv_cache_write("kv_cache_write", x.N, 2 * x.kv_heads * hd, act_bytes=x.ab,
                                  kv_bytes=x.kvb, dtype=x.wl.act_dtype, count=L))
    out += _attention_kernels(x, n_heads=x.heads, n_kv_heads=x.kv_heads, qk_dim=hd, v_dim=hd,
                              cache_elems=2 * hd)
    out.append(x.linear("o_proj", m.d_model, x.heads * hd, bias=m.linear_bias, count=L))
    return out


def mla_absorbed(model: Model, new_tokens: int, context: int) -> bool:
    """Whether the absorbed (latent-space) MLA form needs fewer FLOPs for this step.

    Absorbed: attention runs over the cached latent (kv_lora + rope dims for scores,
    kv_lora for values) after folding W_UK into Q and W_UV into the output.
    Expanded: K and V are up-projected for every cached position, then attention runs with
    qk = nope + rope and v = v_head_dim. Prefill (T = C) picks expanded, decode absorbed.
    """
    a, h = model.mla, model.n_heads
    att = ops.attended_positions(new_tokens, context)
    absorbed = 2 * h * att * (2 * a.kv_lora_rank + a.qk_rope_head_dim) \
        + 2 * new_tokens * h * a.kv_lora_rank * (a.qk_nope_head_dim + a.v_head_dim)
    expanded = 2 * h * att * (a.qk_nope_head_dim + a.qk_rope_head_dim + a.v_head_dim) \
        + 2 * context * a.kv_lora_rank * h * (a.qk_nope_head_dim + a.v_head_dim)
    return absorbed < expanded


def _mla_ops(x: _Ctx) -> list[Op]:
    """DeepSeek MLA: low-rank Q, a compressed latent KV cache, and one of two attention forms."""
    m, L, a, d = x.model, x.model.n_layers, x.model.mla, x.model.d_model
    qk = a.qk_nope_head_dim + a.qk_rope_head_dim
    latent = a.kv_lora_rank + a.qk_rope_head_dim
    out = []
    if a.q_lora_rank is None:
        out.append(x.linear("q_proj", x.heads * qk, d, count=L))
    else:
        out += [x.linear("q_a_proj", a.q_lora_rank, d, count=L),
                x.pointwise("q_a_norm", "rms_norm", a.q_lora_rank, L),
                x.linear("q_b_proj", x.heads * qk, a.q_lora_rank, count=L)]
    out += [x.linear("kv_a_proj", latent, d, count=L),
            x.pointwise("kv_a_norm", "rms_norm", a.kv_lora_rank, L),
            x.pointwise("rotary", "rotary", (x.heads + 1) * a.qk_rope_head_dim, L),
            ops.kv_cache_write("kv_cache_write", x.N, latent, act_bytes=x.ab, kv_bytes=x.kvb,
                               dtype=x.wl.act_dtype, count=L)]
    if mla_absorbed(m, x.T, x.C):
        out.append(x.linear("q_absorb", a.kv_lora_rank, a.qk_nope_head_dim, groups=x.heads,
                            count=L))
        out += _attention_kernels(x, n_heads=x.heads, n_kv_heads=1, qk_dim=latent,
                                  v_dim=a.kv_lora_rank, cache_elems=latent)
        out.append(x.linear("o_absorb", a.v_head_dim, a.kv_lora_rank, groups=x.heads, count=L))
    else:
        # expand the cached latent of every position in context to per-head K_nope and V
        out.append(x.linear("kv_b_proj", x.heads * (a.qk_nope_head_dim + a.v_head_dim),
                            a.kv_lora_rank, m=x.B * x.C, count=L))
        out += [ops.attention("attention", batch=x.B, q_len=x.T, kv_len=x.C, n_heads=x.heads,
                              n_kv_heads=x.heads, qk_dim=qk, v_dim=a.v_head_dim,
                              act_bytes=x.ab, kv_bytes=x.kvb, dtype=x.att,
                              kv_from_cache=False, count=L)]
    out.append(x.linear("o_proj", d, x.heads * a.v_head_dim, count=L))
    return out


def experts_touched(n_experts: int, top_k: int, tokens: float) -> float:
    """Expected distinct experts hit when ``tokens`` each pick top_k of n_experts uniformly:
    E * (1 - (1 - k/E)^N). One token touches k; many tokens touch all E."""
    return n_experts * (1.0 - (1.0 - top_k / n_experts) ** tokens)


def _mlp_block(x: _Ctx, prefix: str, width: int, rows: float, groups: float,
               count: float) -> list[Op]:
    """Gated (gate+up fused, act-and-mul, down) or plain (up, act, down) MLP of ``width``."""
    m, w = x.model, width // x.tp
    bias = m.linear_bias
    act = "silu_and_mul" if m.activation == "silu" else "gelu_and_mul"
    if m.gated_mlp:
        return [x.linear(f"{prefix}gate_up_proj", 2 * w, m.d_model, m=rows, groups=groups,
                         bias=bias, count=count),
                x.pointwise(f"{prefix}{act}", act, w, count, rows=rows * groups),
                x.linear(f"{prefix}down_proj", m.d_model, w, m=rows, groups=groups, bias=bias,
                         count=count)]
    return [x.linear(f"{prefix}up_proj", w, m.d_model, m=rows, groups=groups, bias=bias,
                     count=count),
            x.pointwise(f"{prefix}gelu", "gelu", w, count, rows=rows * groups),
            x.linear(f"{prefix}down_proj", m.d_model, w, m=rows, groups=groups, bias=bias,
                     count=count)]


def _mlp_ops(x: _Ctx) -> list[Op]:
    """Dense MLP layers, then MoE layers: router, routed experts, shared experts, combine."""
    m, L = x.model, x.model.n_layers
    moe = m.moe
    n_moe = L - moe.first_dense_layers if moe else 0
    out = []
    if L - n_moe:
        out += _mlp_block(x, "", m.intermediate_size, x.N, 1.0, L - n_moe)
    if n_moe:
        touched = experts_touched(moe.n_experts, moe.top_k, x.N)
        per_expert = x.N * moe.top_k / touched
        out.append(ops.gemm("router", x.N, moe.n_experts, m.d_model, weight_bytes=x.ab,
                            act_bytes=x.ab, dtype=x.wl.act_dtype, count=n_moe))
        out += _mlp_block(x, "experts.", moe.expert_intermediate_size, per_expert, touched,
                          n_moe)
        if moe.n_shared_experts:
            out += _mlp_block(x, "shared.", moe.n_shared_experts * moe.expert_intermediate_size,
                              x.N, 1.0, n_moe)
    return out
