"""An independent parameter count: torch modules laid out like the Hugging Face reference
implementations (q/k/v/o projections, gate/up/down, MLA's q_a/q_b/kv_a/kv_b, experts as
separate MLPs), built on the ``meta`` device so even DeepSeek-V3 costs no memory.

Written from the module layouts, not from perfmodel.params: the two must agree exactly.
"""

from __future__ import annotations

import torch
from torch import nn

from perfmodel.specs import Model


def _norm(model: Model, width: int) -> nn.Module:
    return nn.RMSNorm(width) if model.norm == "rms" else nn.LayerNorm(width)


class MLP(nn.Module):
    def __init__(self, model: Model, width: int) -> None:
        super().__init__()
        d, bias = model.d_model, model.linear_bias
        if model.gated_mlp:
            self.gate_proj = nn.Linear(d, width, bias=bias)
        self.up_proj = nn.Linear(d, width, bias=bias)
        self.down_proj = nn.Linear(width, d, bias=bias)


class Attention(nn.Module):
    def __init__(self, model: Model) -> None:
        super().__init__()
        d, h, kv, hd = model.d_model, model.n_heads, model.n_kv_heads, model.head_dim
        gate = 2 if model.attention_output_gate else 1     # Qwen3-Next: query and gate
        self.q_proj = nn.Linear(d, gate * h * hd, bias=model.qkv_bias)
        self.k_proj = nn.Linear(d, kv * hd, bias=model.qkv_bias)
        self.v_proj = nn.Linear(d, kv * hd, bias=model.qkv_bias)
        self.o_proj = nn.Linear(h * hd, d, bias=model.linear_bias)
        if model.qk_norm == "rms":           # Qwen3 / Gemma 3 q_norm, k_norm (Llama 4's L2
            self.q_norm, self.k_norm = nn.RMSNorm(hd), nn.RMSNorm(hd)   # norm has none)
        if model.attention_sinks:            # gpt-oss: one sink logit per head
            self.sinks = nn.Parameter(torch.empty(h))


class LatentAttention(nn.Module):
    """DeepSeek-V2/V3 MLA as in modeling_deepseek.py."""

    def __init__(self, model: Model) -> None:
        super().__init__()
        a, d, h = model.mla, model.d_model, model.n_heads
        qk = a.qk_nope_head_dim + a.qk_rope_head_dim
        if a.q_lora_rank is None:
            self.q_proj = nn.Linear(d, h * qk, bias=False)
        else:
            self.q_a_proj = nn.Linear(d, a.q_lora_rank, bias=False)
            self.q_a_layernorm = nn.RMSNorm(a.q_lora_rank)
            self.q_b_proj = nn.Linear(a.q_lora_rank, h * qk, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(d, a.kv_lora_rank + a.qk_rope_head_dim, bias=False)
        self.kv_a_layernorm = nn.RMSNorm(a.kv_lora_rank)
        self.kv_b_proj = nn.Linear(a.kv_lora_rank,
                                   h * (a.qk_nope_head_dim + a.v_head_dim), bias=False)
        self.o_proj = nn.Linear(h * a.v_head_dim, d, bias=False)
        if a.sparse:
            self.indexer = Indexer(model)


class Indexer(nn.Module):
    """DeepSeek-V3.2's lightning indexer as in its inference/model.py ``Indexer``."""

    def __init__(self, model: Model) -> None:
        super().__init__()
        a, d = model.mla, model.d_model
        self.wq_b = nn.Linear(a.q_lora_rank, a.index_n_heads * a.index_head_dim, bias=False)
        self.wk = nn.Linear(d, a.index_head_dim, bias=False)
        self.k_norm = nn.LayerNorm(a.index_head_dim)
        self.weights_proj = nn.Linear(d, a.index_n_heads, bias=False)


class Mamba(nn.Module):
    """transformers' Mamba2Mixer / NemotronHMamba2Mixer; with ``dt_rank`` JambaMambaMixer
    (Mamba-1, with its dt / B / C RMSNorms)."""

    def __init__(self, model: Model) -> None:
        super().__init__()
        m, d = model.mamba, model.d_model
        inner = m.d_inner
        if m.dt_rank:
            self.in_proj = nn.Linear(d, 2 * inner, bias=False)
            self.conv1d = nn.Conv1d(inner, inner, m.d_conv, groups=inner, bias=m.conv_bias)
            self.x_proj = nn.Linear(inner, m.dt_rank + 2 * m.d_state, bias=False)
            self.dt_proj = nn.Linear(m.dt_rank, inner, bias=True)
            self.A_log = nn.Parameter(torch.empty(inner, m.d_state))
            self.D = nn.Parameter(torch.empty(inner))
            self.dt_layernorm = nn.RMSNorm(m.dt_rank)
            self.b_layernorm, self.c_layernorm = nn.RMSNorm(m.d_state), nn.RMSNorm(m.d_state)
        else:
            conv = inner + 2 * m.n_groups * m.d_state
            heads = inner // m.head_dim
            self.in_proj = nn.Linear(d, inner + conv + heads, bias=False)
            self.conv1d = nn.Conv1d(conv, conv, m.d_conv, groups=conv, bias=m.conv_bias)
            self.dt_bias = nn.Parameter(torch.empty(heads))
            self.A_log = nn.Parameter(torch.empty(heads))
            self.D = nn.Parameter(torch.empty(heads))
            if m.rms_norm:                   # Falcon-H1's mamba_rms_norm
                self.norm = nn.RMSNorm(inner)
        self.out_proj = nn.Linear(inner, d, bias=False)


class LinearAttention(nn.Module):
    """Qwen3NextGatedDeltaNet, Kimi-Linear's KimiDeltaAttention (vLLM layers/kda.py: q, k,
    v, the f_a/f_b decay and g_a/g_b output gate pairs, b_proj, three depthwise convs,
    A_log, dt_bias, o_norm, o_proj), or MiniMax-Text-01's lightning attention (qkv_proj,
    output_gate, norm, out_proj)."""

    def __init__(self, model: Model) -> None:
        super().__init__()
        a, d = model.linear_attention, model.d_model
        h, hk, dk, dv = a.n_heads, a.n_k_heads, a.head_k_dim, a.head_v_dim
        if a.kind == "kda":
            self.q_proj, self.k_proj, self.v_proj = (nn.Linear(d, h * dk, bias=False)
                                                     for _ in range(3))
            self.f_a_proj, self.g_a_proj = (nn.Linear(d, dk, bias=False) for _ in range(2))
            self.f_b_proj, self.g_b_proj = (nn.Linear(dk, h * dk, bias=False)
                                            for _ in range(2))
            self.b_proj = nn.Linear(d, h, bias=False)
            self.q_conv1d, self.k_conv1d, self.v_conv1d = (
                nn.Conv1d(h * dk, h * dk, a.d_conv, groups=h * dk, bias=False)
                for _ in range(3))
            self.A_log = nn.Parameter(torch.empty(1, 1, h, 1))
            self.dt_bias = nn.Parameter(torch.empty(h * dk))
            self.o_norm = nn.RMSNorm(dv)
            self.o_proj = nn.Linear(h * dv, d, bias=False)
            return
        if a.kind == "gated_deltanet":
            self.in_proj_qkvz = nn.Linear(d, 2 * hk * dk + 2 * h * dv, bias=False)
            self.in_proj_ba = nn.Linear(d, 2 * h, bias=False)
            conv = 2 * hk * dk + h * dv
            self.conv1d = nn.Conv1d(conv, conv, a.d_conv, groups=conv, bias=False)
            self.dt_bias = nn.Parameter(torch.empty(h))
            self.A_log = nn.Parameter(torch.empty(h))
            self.norm = nn.RMSNorm(dv)
        else:
            self.qkv_proj = nn.Linear(d, h * (2 * dk + dv), bias=False)
            self.output_gate = nn.Linear(d, h * dv, bias=False)
            self.norm = nn.RMSNorm(h * dv)
        self.out_proj = nn.Linear(h * dv, d, bias=False)


class MoE(nn.Module):
    def __init__(self, model: Model) -> None:
        super().__init__()
        moe = model.moe
        self.gate = nn.Linear(model.d_model, moe.n_experts, bias=False)
        self.experts = nn.ModuleList(MLP(model, moe.expert_intermediate_size)
                                     for _ in range(moe.n_experts))
        if moe.n_shared_experts:
            self.shared_experts = MLP(model, moe.n_shared_experts * moe.expert_intermediate_size)
        if moe.shared_expert_gate:           # Qwen3-Next's shared_expert_gate
            self.shared_expert_gate = nn.Linear(model.d_model, 1, bias=False)


class Block(nn.Module):
    """A decoder layer of ``kind``: its mixer and its MLP (a Nemotron-H layer, in a pattern
    with MLP-only layers, holds one of the two; a Falcon-H1 layer holds attention and a
    Mamba mixer side by side, FalconH1DecoderLayer's ``self_attn`` and ``mamba``; a Zamba2
    layer only its Mamba mixer, the MLP being the shared block's)."""

    def __init__(self, model: Model, moe: bool, kind: str = "global") -> None:
        super().__init__()
        if kind == "mamba":
            self.mixer = Mamba(model)
        elif kind == "linear":
            self.linear_attn = LinearAttention(model)
        elif kind != "mlp":
            self.self_attn = LatentAttention(model) if model.mla else Attention(model)
            if model.mamba is not None and model.mamba.parallel:
                self.mamba = Mamba(model)
        if kind == "mlp" or ("mlp" not in model.layer_kinds() and model.shared_block is None):
            self.mlp = MoE(model) if moe else MLP(model, model.intermediate_size)
        self.norms = nn.ModuleList(_norm(model, model.d_model)
                                   for _ in range(model.norms_per_layer))


class SharedTransformer(nn.Module):
    """Zamba2AttentionDecoderLayer (transformers modeling_zamba2.py): an RMSNorm over the
    2 d concat, q/k/v/o from and to it (o back to d), an RMSNorm over d, the gated MLP;
    the per-invocation adapters live in the model (``Zamba2Invocation``)."""

    def __init__(self, model: Model) -> None:
        super().__init__()
        d, width = model.d_model, model.n_heads * model.head_dim
        self.input_layernorm, self.pre_ff_layernorm = nn.RMSNorm(2 * d), nn.RMSNorm(d)
        self.q_proj, self.k_proj, self.v_proj = (nn.Linear(2 * d, width, bias=False)
                                                 for _ in range(3))
        self.o_proj = nn.Linear(width, d, bias=False)
        self.feed_forward = MLP(model, model.intermediate_size)


class Zamba2Invocation(nn.Module):
    """What one hybrid layer owns: the d x d ``linear`` and the adapters (nn.Sequential of
    A, B) of its turn at a shared block (``linear_q/k/v_adapter_list``,
    ``gate_up_proj_adapter_list``)."""

    def __init__(self, model: Model) -> None:
        super().__init__()
        shared, d, r = model.shared_block, model.d_model, model.shared_block.adapter_rank
        self.linear = nn.Linear(d, d, bias=False)
        if shared.attention_adapters:
            self.qkv_adapters = nn.ModuleList(
                nn.Sequential(nn.Linear(2 * d, r, bias=False), nn.Linear(r, 2 * d, bias=False))
                for _ in range(3))
        if shared.mlp_adapters:
            up = (2 if model.gated_mlp else 1) * model.intermediate_size
            self.gate_up_adapter = nn.Sequential(nn.Linear(d, r, bias=False),
                                                 nn.Linear(r, up, bias=False))


class DecoderLM(nn.Module):
    def __init__(self, model: Model) -> None:
        super().__init__()
        d = model.d_model
        self.embed_tokens = nn.Embedding(model.vocab_size, d)
        if model.position == "learned":
            self.embed_positions = nn.Embedding(model.max_position_embeddings, d)
        kinds = model.layer_kinds()
        self.layers = nn.ModuleList(Block(model, model.is_moe_layer(i), kinds[i])
                                    for i in range(model.n_layers))
        if model.shared_block is not None:
            self.shared = nn.ModuleList(SharedTransformer(model)
                                        for _ in range(model.shared_block.n_blocks))
            self.invocations = nn.ModuleList(Zamba2Invocation(model)
                                             for _ in model.shared_block.layers)
        self.norm = _norm(model, d)
        if not model.tie_embeddings:
            self.lm_head = nn.Linear(d, model.vocab_size, bias=False)


class MTPModule(nn.Module):
    """DeepSeek-V3 multi-token prediction: enorm, hnorm, eh_proj, one block, shared_head norm."""

    def __init__(self, model: Model) -> None:
        super().__init__()
        d = model.d_model
        self.enorm, self.hnorm = nn.RMSNorm(d), nn.RMSNorm(d)
        self.eh_proj = nn.Linear(2 * d, d, bias=False)
        self.block = Block(model, model.moe is not None)
        self.shared_head_norm = nn.RMSNorm(d)


def numel(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def build(model: Model) -> tuple[int, int]:
    """(parameters of the model, parameters of its MTP modules), counted by torch."""
    with torch.device("meta"):
        main = numel(DecoderLM(model))
        mtp = sum(numel(MTPModule(model)) for _ in range(model.mtp_modules))
    return main, mtp
