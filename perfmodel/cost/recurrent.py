"""The step template of the recurrent mixers: Mamba (``specs.model.Mamba``) and linear
attention (``specs.model.LinearAttention``), each counted over the layers of its kind in
the model's layer pattern (Mamba also in every attention layer when it runs beside
attention: ``Mamba.parallel``, Falcon-H1). Their operators do not move with the context: a
decode step reads and writes a constant state per sequence whatever the context
(``ScanSpec.context`` is False), so the decode sum prices them once.
"""

from __future__ import annotations

from perfmodel.cost.operators import (
    AllReduceSpec,
    ConvSpec,
    GemmSpec,
    PointwiseSpec,
    ScanSpec,
    Spec,
    weights_of,
)
from perfmodel.cost.params import mamba_conv_channels, mamba_groups
from perfmodel.specs.dtypes import DTYPE_BYTES
from perfmodel.specs.model import Model


def recurrent_mixers(model: Model, tp: int) -> list[Spec]:
    """Every operator of the model's Mamba and linear-attention layers on one device."""
    out: list[Spec] = []
    if model.mamba_layers:          # mamba layers, or beside attention (Falcon-H1)
        out += _mamba(model, tp, model.mamba_layers)
    if model.layer_count("linear"):
        kda = model.linear_attention.channel_gates
        out += (_kda if kda else _linear)(model, tp, model.layer_count("linear"))
    return out


def _mamba(model: Model, tp: int, layers: int) -> list[Spec]:
    """Mamba-2: in_proj (z, x, B, C, dt), conv1d over x, B, C, the SSD scan, y * silu(z)
    and the gated RMSNorm (``rms_norm``; under TP with one group its sum of squares is
    all-reduced, one number per token: vLLM's ``Mixer2RMSNormGated``), out_proj. Mamba-1
    (``dt_rank``): in_proj (x, z), conv1d over x, x_proj (dt, B, C) and dt_proj, the
    selective scan per channel (heads = d_inner, head_dim 1, one group, chunk 1),
    y * silu(z), out_proj."""
    m, d, w = model.mamba, model.d_model, weights_of(model, "attention")
    inner, groups = m.d_inner // tp, mamba_groups(model, tp)
    state = DTYPE_BYTES[m.state_dtype]
    if m.dt_rank:
        out: list[Spec] = [GemmSpec("mamba.in_proj", 2 * inner, d, layers, weights=w),
                           ConvSpec("mamba.conv1d", inner, m.d_conv, layers),
                           GemmSpec("mamba.x_proj", m.dt_rank + 2 * m.d_state, inner, layers,
                                    weights=w),
                           GemmSpec("mamba.dt_proj", inner, m.dt_rank, layers, weights=w),
                           ScanSpec("mamba.scan", "ssm_scan", inner, 1, m.d_state, 1, 1,
                                    False, 1, layers, state)]
    else:
        heads = m.n_heads // tp
        conv = mamba_conv_channels(model, tp)
        out = [GemmSpec("mamba.in_proj", inner + conv + heads, d, layers, weights=w),
               ConvSpec("mamba.conv1d", conv, m.d_conv, layers),
               ScanSpec("mamba.scan", "ssm_scan", heads, groups, m.d_state, m.head_dim,
                        m.chunk_size, False, 1, layers, state)]
    out.append(PointwiseSpec("mamba.gate", "silu_and_mul", inner, layers))
    if m.rms_norm:
        out.append(PointwiseSpec("mamba.norm", "rms_norm", inner, layers))
        if tp > 1 and m.n_groups == 1:     # the sum of squares spans the devices
            out.append(AllReduceSpec("mamba.norm_all_reduce", 1, tp, layers))
    out.append(GemmSpec("mamba.out_proj", d, inner, layers, weights=w))
    return out


def _linear(model: Model, tp: int, layers: int) -> list[Spec]:
    """Gated DeltaNet: in_proj (q, k, v, z, beta, a), short conv over q, k, v, the chunked
    gated delta rule (q and k repeated to the value heads; the L2 norm of the q and k heads
    in its record, ``scan.Scan.l2norm_heads``), RMSNorm and the silu(z) gate,
    out_proj. Lightning: qkv and the output gate, the chunked scan with fixed per-head
    decay, RMSNorm and the sigmoid gate (``sigmoid_mul``; vLLM minimax_text_01.py:
    ``F.sigmoid(gate) * hidden``), out_proj."""
    a, d, w = model.linear_attention, model.d_model, weights_of(model, "attention")
    h, hk = a.n_heads // tp, a.n_k_heads // tp
    width = h * a.head_v_dim
    qkv = 2 * hk * a.head_k_dim + width
    gates = 2 if a.delta else 0
    out: list[Spec] = [GemmSpec("linear.in_proj", qkv + width + gates * h, d, layers,
                                weights=w)]
    if a.d_conv:
        out.append(ConvSpec("linear.conv1d", qkv, a.d_conv, layers))
    out += [ScanSpec("linear.scan", "linear_attention", h, h, a.head_k_dim, a.head_v_dim,
                     a.chunk_size, a.delta, gates, layers, DTYPE_BYTES[a.state_dtype],
                     hk if a.delta else 0),
            PointwiseSpec("linear.norm", "rms_norm", width, layers),
            PointwiseSpec("linear.gate", "silu_and_mul" if a.delta else "sigmoid_mul",
                          width, layers),
            GemmSpec("linear.out_proj", d, width, layers, weights=w)]
    return out


def _kda(model: Model, tp: int, layers: int) -> list[Spec]:
    """Kimi Delta Attention as vLLM runs it (``vllm/model_executor/layers/kda.py``
    ``KimiDeltaAttention.forward``): q, k and v projections (three ColumnParallelLinear
    GEMMs) and beta's (d -> H); the decay gate f_b(f_a(x)) and the output gate g_b(g_a(x)),
    each a replicated d -> d_k GEMM then a column-parallel d_k -> H d_k one; a short conv
    on each of q, k, v (three causal_conv1d calls); the chunked delta rule with its
    per-channel decay (``scan.kda_flops``; the gate's activation and cumsum, fused in front
    of it, in the record), the sigmoid-gated RMSNorm (``FusedRMSNormGated``, priced as a
    norm and a ``sigmoid_mul``, as Gated DeltaNet's gated norm is) and out_proj."""
    a, d, w = model.linear_attention, model.d_model, weights_of(model, "attention")
    h, n = a.n_heads // tp, a.head_k_dim
    width = h * n
    return [GemmSpec("linear.qkv_proj", width, d, 3 * layers, weights=w),
            GemmSpec("linear.beta_proj", h, d, layers, weights=w),
            GemmSpec("linear.gate_a_proj", n, d, 2 * layers, weights=w),
            GemmSpec("linear.gate_b_proj", width, n, 2 * layers, weights=w),
            ConvSpec("linear.conv1d", width, a.d_conv, 3 * layers),
            ScanSpec("linear.scan", "linear_attention", h, h, n, a.head_v_dim, a.chunk_size,
                     True, 1, layers, DTYPE_BYTES[a.state_dtype], h, n),
            PointwiseSpec("linear.norm", "rms_norm", width, layers),
            PointwiseSpec("linear.gate", "sigmoid_mul", width, layers),
            GemmSpec("linear.out_proj", d, width, layers, weights=w)]
