"""A small Llama-shaped model with random weights, built locally (no downloads).

It runs exactly the operators ``perfmodel.cost.step.step_records`` lists for a dense GQA model
with RoPE, in the same order: embedding, per layer [rms_norm, fused QKV projection, rotary,
KV-cache write, attention, output projection, residual add, rms_norm, fused gate/up
projection, silu_and_mul, down projection, residual add], final rms_norm over all new tokens,
and the LM head on the last token of each sequence. Timing a whole step of it checks that the
per-operator predictions compose.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from perfmodel.specs import Model
from validate import kernels as K


@dataclass
class Layer:
    attn_norm: torch.Tensor   # [d]
    qkv: torch.Tensor         # [(H + 2 KV) D, d]
    o: torch.Tensor           # [d, H D]
    mlp_norm: torch.Tensor    # [d]
    gate_up: torch.Tensor     # [2 I, d]
    down: torch.Tensor        # [d, I]
    k_cache: torch.Tensor     # [B, KV, C_max, D]
    v_cache: torch.Tensor     # [B, KV, C_max, D]


class TinyLlama:
    """Weights and KV cache of ``model`` for ``batch`` sequences of up to ``max_context``."""

    def __init__(self, model: Model, dtype: str, device: torch.device, batch: int,
                 max_context: int, seed: int = 0) -> None:
        if model.mla or model.moe or model.sliding_window or not model.gated_mlp:
            raise ValueError(f"{model.name}: the harness model is a dense gated GQA Llama")
        self.model, self.batch = model, batch
        self.dtype = K.TORCH_DTYPES[dtype]
        gen = torch.Generator(device=device).manual_seed(seed)
        d, h, kv, hd, inter = (model.d_model, model.n_heads, model.n_kv_heads, model.head_dim,
                               model.intermediate_size)

        def rnd(*shape: int, scale: float = 1.0) -> torch.Tensor:
            return (torch.randn(shape, generator=gen, device=device) * scale).to(self.dtype)

        def layer() -> Layer:
            return Layer(rnd(d), rnd((h + 2 * kv) * hd, d, scale=d ** -0.5),
                         rnd(d, h * hd, scale=(h * hd) ** -0.5), rnd(d),
                         rnd(2 * inter, d, scale=d ** -0.5), rnd(d, inter, scale=inter ** -0.5),
                         rnd(batch, kv, max_context, hd), rnd(batch, kv, max_context, hd))

        self.layers = [layer() for _ in range(model.n_layers)]
        self.embed = rnd(model.vocab_size, d)
        self.final_norm = rnd(d)
        self.lm_head = rnd(model.vocab_size, d, scale=d ** -0.5)
        # the RoPE table for positions 0 .. max_context-1
        self.freqs = K.rotary_freqs(torch.arange(max_context, device=device), hd)
        self.device = device

    def layer(self, w: Layer, x: torch.Tensor, start: int, t: int) -> torch.Tensor:
        """One decoder layer on x [B*T, d] for new positions start .. start+t-1."""
        m = self.model
        b, h, kv, hd = self.batch, m.n_heads, m.n_kv_heads, m.head_dim
        qkv = K.linear(K.rms_norm(x, w.attn_norm), w.qkv)            # [B*T, (H+2KV) D]
        qk = K.rotary(qkv[:, :(h + kv) * hd], self.freqs[start:start + t])  # [B*T, (H+KV) D]
        k_new = qk[:, h * hd:].view(b, t, kv, hd).transpose(1, 2)     # [B, KV, T, D]
        v_new = qkv[:, (h + kv) * hd:].view(b, t, kv, hd).transpose(1, 2)
        end = start + t
        w.k_cache[:, :, start:end] = k_new                           # KV-cache write
        w.v_cache[:, :, start:end] = v_new
        q = qk[:, :h * hd].view(b, t, h, hd).transpose(1, 2)          # [B, H, T, D]
        att = K.attention(q, w.k_cache[:, :, :end], w.v_cache[:, :, :end])
        att = att.transpose(1, 2).reshape(b * t, h * hd)
        x = torch.add(x, K.linear(att, w.o))
        up = K.linear(K.rms_norm(x, w.mlp_norm), w.gate_up)           # [B*T, 2I]
        return torch.add(x, K.linear(K.silu_and_mul(up), w.down))

    def step(self, ids: torch.Tensor, start: int) -> torch.Tensor:
        """One forward step: ids [B, T] at positions start..; logits [B, vocab] (last token)."""
        b, t = ids.shape
        x = K.embedding(ids.reshape(-1), self.embed)                  # [B*T, d]
        for w in self.layers:
            x = self.layer(w, x, start, t)
        x = K.rms_norm(x, self.final_norm)
        last = x.view(b, t, -1)[:, -1]                                # [B, d]
        return K.linear(last, self.lm_head)

    def random_ids(self, t: int, gen: torch.Generator) -> torch.Tensor:
        return torch.randint(0, self.model.vocab_size, (self.batch, t), generator=gen,
                             device=self.device)
