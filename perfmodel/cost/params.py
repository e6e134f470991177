"""Parameter counts by tensor class, whole model or per device under tensor parallelism.

Independent check: tests build a torch module of the same shape and compare sum(numel).
Under TP degree t, heads, MLP/expert widths and the vocabulary split t ways; KV heads split
but never below one per device (replicated), as does a lone Mamba-2 B/C group
(``mamba_groups``); norms, routers and the MLA down-projections
(q_a, kv_a) are replicated. A recurrent mixer's (Mamba, linear attention) projections
count as ``attention`` (the mixer class), its conv, per-head scalars and norm as ``norms``
(kept at the activation dtype). A shared block (Zamba2) is counted once per distinct block,
its adapters and per-layer linear once per invocation (``shared_block_params``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from perfmodel.specs.errors import SpecError
from perfmodel.specs.model import LINEAR_CLASSES as LINEAR_CLASSES  # re-exported here
from perfmodel.specs.model import Model

HEAD_CLASSES = ("embedding", "lm_head", "norms")


@dataclass(frozen=True)
class ParamCounts:
    """Element counts per class; ``experts`` are the routed experts (all of them)."""

    embedding: float
    lm_head: float
    norms: float
    attention: float
    mlp: float
    experts: float
    shared_experts: float
    router: float
    mtp: float          # DeepSeek multi-token-prediction modules, excluded from ``total``

    @property
    def total(self) -> float:
        return (self.embedding + self.lm_head + self.norms + self.attention + self.mlp
                + self.experts + self.shared_experts + self.router)

    def active(self, model: Model) -> float:
        """Active parameters as gpt-oss's model card counts them (5.13 B of 116.83 B for
        gpt-oss-120b): the routed experts scaled by top_k / n_experts, and the input
        embedding left out, since a token gathers one row of it (a table tied to the LM
        head still counts, once, as the head; learned positions never do). Mixtral's
        12.9 B, Qwen3's and Llama 4's figures count the embedding too: this plus
        ``embedding``. Bytes do not come from this count."""
        share = model.moe.top_k / model.moe.n_experts if model.moe else 1.0
        positions = model.max_position_embeddings * model.d_model \
            if model.position == "learned" else 0
        gathered = positions if model.tie_embeddings else self.embedding
        return self.total - self.experts * (1.0 - share) - gathered


def unquantized(model: Model) -> tuple[str, ...]:
    """The linear classes the model's checkpoint keeps at 16 bits (its ``quantization``),
    priced and stored at the activation dtype."""
    return model.quantization.unquantized if model.quantization is not None else ()


def other_formats(model: Model) -> dict[str, str]:
    """The linear classes the checkpoint stores in another format than its main one
    (``Quantization.formats``: an fp8 attention beside NVFP4 experts), class -> format
    name; they keep it whatever weights the workload asks for, as the 16-bit ones do."""
    return dict(model.quantization.formats) if model.quantization is not None else {}


def class_params(model: Model, counts: ParamCounts, tp: int = 1) -> dict[str, float]:
    """``counts`` by linear class, with a part of a class the checkpoint stores otherwise
    (``specs.model.SUBCLASSES``: o_proj) counted on its own and taken off its class."""
    out = {c: float(getattr(counts, c)) for c in LINEAR_CLASSES}
    named = set(unquantized(model)) | set(other_formats(model))
    if "o_proj" in named:
        out["o_proj"] = out_proj_params(model, tp)
        out["attention"] -= out["o_proj"]
    return out


def out_proj_params(model: Model, tp: int = 1) -> float:
    """The attention layers' output projections on one device: heads / tp x value width x
    d_model each (MLA's v_head_dim), with the output bias (``linear_bias``)."""
    v = model.mla.v_head_dim if model.mla is not None else model.head_dim
    bias = model.d_model if model.linear_bias and model.mla is None else 0
    return model.attention_layers * (model.n_heads // tp * v * model.d_model + bias)


def check_tp(model: Model, tp: int) -> None:
    """TP must split heads evenly and KV heads evenly (or replicate them whole); Mamba-2's
    B/C groups evenly, or one group replicated on every device (``mamba_groups``)."""
    if model.n_heads % tp:
        raise SpecError(f"parallelism: tp={tp} must divide n_heads={model.n_heads} of {model.name}")
    kv = model.n_kv_heads
    if kv % tp and tp % kv:
        raise SpecError(f"parallelism: tp={tp} and n_kv_heads={kv} of {model.name}: one must "
                        "divide the other")
    m = model.mamba
    if m is not None and m.dt_rank and tp > 1:
        raise SpecError(f"parallelism: tp={tp} with the Mamba-1 mixer (mamba.dt_rank) of "
                        f"{model.name} is not modelled (x_proj's all-reduce); expected tp=1")
    heads = {"mamba heads": m.n_heads if m else tp,
             "mamba.n_groups": tp if m is None or m.n_groups == 1 else m.n_groups,
             "linear_attention.n_heads": model.linear_attention.n_heads
             if model.linear_attention else tp,
             "linear_attention.n_k_heads": model.linear_attention.n_k_heads
             if model.linear_attention else tp}
    for name, n in heads.items():
        if n % tp:
            raise SpecError(f"parallelism: tp={tp} must divide {name}={n} of {model.name}")
    widths = {"vocab_size": model.vocab_size, "intermediate_size": model.intermediate_size}
    if model.moe is not None:
        widths["moe.expert_intermediate_size"] = model.moe.expert_intermediate_size
    shared = model.shared_block
    if shared is not None and (shared.attention_adapters or shared.mlp_adapters) \
            and shared.adapter_rank % tp:      # vLLM's Zamba2LoRA: A column-parallel
        raise SpecError(f"parallelism: tp={tp} must divide shared_block.adapter_rank="
                        f"{shared.adapter_rank} of {model.name}")
    for name, width in widths.items():
        if width < tp:
            raise SpecError(f"parallelism: tp={tp} exceeds {name}={width} of {model.name}: "
                            f"every device needs a share of it")


def mamba_groups(model: Model, tp: int) -> int:
    """Mamba-2 B/C groups on one device: n_groups / tp, or a lone group copied to every
    device. vLLM's MambaMixer2 (vllm/model_executor/layers/mamba/mamba_mixer2.py,
    ``extra_groups_for_head_shards``) accepts tp not dividing n_groups only when n_groups
    is 1, and then replicates that group so it follows each head shard: in_proj's B and C
    rows, the conv's channels and the conv state hold one whole group per device."""
    return max(1, model.mamba.n_groups // tp)


def mamba_conv_channels(model: Model, tp: int) -> int:
    """Conv channels (x, B, C; Mamba-1: x) of one Mamba layer on one device."""
    m = model.mamba
    return m.d_inner // tp + (0 if m.dt_rank else 2 * mamba_groups(model, tp) * m.d_state)


def kv_heads_per_device(model: Model, tp: int) -> int:
    return max(1, model.n_kv_heads // tp)


def indexer_params(model: Model) -> float:
    """DSA's lightning indexer per layer, replicated on every device (vLLM's
    ``DeepseekV32Indexer``: ReplicatedLinear layers): wq_b from the query latent to
    index_n_heads x index_head_dim, wk from d_model to index_head_dim, the keys' LayerNorm
    (weight and bias), and weights_proj from d_model to one weight per index head."""
    a = model.mla
    if a is None or not a.sparse:
        return 0.0
    q_in = a.q_lora_rank or model.d_model
    return q_in * a.index_n_heads * a.index_head_dim + model.d_model * a.index_head_dim \
        + 2 * a.index_head_dim + model.d_model * a.index_n_heads


def attention_params(model: Model, tp: int = 1) -> float:
    """Q, K, V, O projections (and MLA's low-rank factors and norms) on one device, with
    the q and k norms' head_dim weights each (``qk_norm: rms``; replicated; a NoPE layer
    has none, taken off in ``param_counts``) and one sink logit per head
    (``attention.sinks``)."""
    d, h = model.d_model, model.n_heads // tp
    if model.mla is not None:
        a = model.mla
        qk = a.qk_nope_head_dim + a.qk_rope_head_dim
        q = d * h * qk if a.q_lora_rank is None else \
            d * a.q_lora_rank + a.q_lora_rank + a.q_lora_rank * h * qk
        kv = d * (a.kv_lora_rank + a.qk_rope_head_dim) + a.kv_lora_rank \
            + a.kv_lora_rank * h * (a.qk_nope_head_dim + a.v_head_dim)
        return q + kv + h * a.v_head_dim * d + indexer_params(model)
    kv = kv_heads_per_device(model, tp)
    hd = model.head_dim
    qkv = d * (h + 2 * kv) * hd + ((h + 2 * kv) * hd if model.qkv_bias else 0) \
        + (d * h * hd if model.attention_output_gate else 0)
    extra = (2 * hd if model.qk_norm == "rms" else 0) + (h if model.attention_sinks else 0)
    return qkv + h * hd * d + (d if model.linear_bias else 0) + extra


def kv_projection_params(model: Model, tp: int = 1) -> float:
    """The K and V projections of one layer on one device (and their biases): what a layer
    that reuses another layer's K/V (cross-layer sharing) does not have."""
    kv = kv_heads_per_device(model, tp) * model.head_dim
    return 2 * kv * (model.d_model + (1 if model.qkv_bias else 0))


def mamba_params(model: Model, tp: int = 1) -> tuple[float, float]:
    """(projections, the rest) of one Mamba layer on one device (``specs.model.Mamba``):
    Mamba-2 in_proj d x (2 d_inner + 2 G N + H) and out_proj d_inner x d; the conv
    (channels x d_conv, + channels of bias), A_log, D and dt_bias (H each) and the gated
    norm's d_inner weights (``rms_norm``). Mamba-1: in_proj d x 2 d_inner, x_proj
    d_inner x (R + 2N), dt_proj R x d_inner (+ d_inner bias), out_proj; conv, A_log
    d_inner x N, D d_inner and Jamba's RMSNorms over dt, B and C (R + 2N).
    Heads, groups (``mamba_groups``) and d_inner split tp ways."""
    m, d = model.mamba, model.d_model
    inner, conv = m.d_inner / tp, mamba_conv_channels(model, tp)
    if m.dt_rank:
        proj = d * 2 * inner + inner * (m.dt_rank + 2 * m.d_state) + m.dt_rank * inner \
            + inner * d
        rest = conv * (m.d_conv + m.conv_bias) + inner + inner * m.d_state + inner \
            + m.dt_rank + 2 * m.d_state       # Jamba's dt, B and C RMSNorms
        return proj, rest
    heads = m.n_heads / tp
    proj = d * (inner + conv + heads) + inner * d
    return proj, conv * (m.d_conv + m.conv_bias) + 3 * heads + (inner if m.rms_norm else 0)


def linear_attention_params(model: Model, tp: int = 1) -> tuple[float, float]:
    """(projections, the rest) of one linear-attention layer on one device
    (``specs.model.LinearAttention``). Gated DeltaNet: in_proj d x (2 Hk dk + 2 H dv + 2 H)
    (q, k, v, z, beta, a), out_proj H dv x d; conv (2 Hk dk + H dv) x d_conv, A_log and
    dt_bias (H each), the gated norm's dv. KDA (vLLM ``KimiDeltaAttention``): q, k, v
    d x H dk each, beta d x H, the decay and output gates' low-rank pairs (f_a, g_a
    d x dk, replicated; f_b, g_b dk x H dk), out_proj H dv x d; the three convs
    (3 H dk x d_conv), A_log (H), dt_bias (H dk) and the norm's dv. Lightning: qkv
    d x 3 H dv, output gate d x H dv, out_proj H dv x d; the norm's H dv."""
    a, d = model.linear_attention, model.d_model
    h, hk = a.n_heads / tp, a.n_k_heads / tp
    if a.channel_gates:
        width = h * a.head_k_dim
        proj = d * (3 * width + h) + 2 * d * a.head_k_dim + 2 * a.head_k_dim * width \
            + width * d
        return proj, a.conv_channels / tp * a.d_conv + h + width + a.head_v_dim
    if a.delta:
        proj = d * (2 * hk * a.head_k_dim + 2 * h * a.head_v_dim + 2 * h) \
            + h * a.head_v_dim * d
        return proj, a.conv_channels / tp * a.d_conv + 2 * h + a.head_v_dim
    proj = d * h * (2 * a.head_k_dim + 2 * a.head_v_dim) + h * a.head_v_dim * d
    return proj, h * a.head_v_dim


def mixer_params(model: Model, tp: int = 1) -> tuple[float, float]:
    """(projections, the rest) of every recurrent mixer of the model on one device."""
    proj = rest = 0.0
    for kind, count in (("mamba", model.mamba_layers),
                        ("linear", model.layer_count("linear"))):
        if count:
            p, r = (mamba_params if kind == "mamba" else linear_attention_params)(model, tp)
            proj, rest = proj + count * p, rest + count * r
    return proj, rest


def shared_block_params(model: Model, tp: int = 1) -> tuple[float, float, float]:
    """(attention class, mlp class, norms) of the shared blocks (``specs.model.SharedBlock``,
    Zamba2) on one device. Per distinct block: q, k, v 2d x heads x head_dim each and o_proj
    back to d, the MLP (``mlp_params``), an RMSNorm over 2 d and one over d. Per invocation:
    the adapters (A in x rank, B rank x out: q, k, v 2d -> 2d; gate_up d -> its width) and
    the d x d linear into the Mamba input (replicated: vLLM's ReplicatedLinear). Heads, the
    MLP and the adapters' rank (A) and outputs (B) split tp ways, as vLLM does."""
    shared, d = model.shared_block, model.d_model
    if shared is None:
        return 0.0, 0.0, 0.0
    width = model.n_heads * model.head_dim              # = 2 d
    r, n, calls = shared.adapter_rank, shared.n_blocks, shared.invocations
    up = (2 if model.gated_mlp else 1) * model.intermediate_size
    attention = n * (3 * width * width + width * d) / tp + calls * d * d
    mlp = n * mlp_params(model, model.intermediate_size, tp)
    if shared.attention_adapters:
        attention += calls * 3 * (width * r + r * width) / tp
    if shared.mlp_adapters:
        mlp += calls * (d * r + r * up) / tp
    return attention, mlp, n * 3 * d * (2 if model.norm == "layer" else 1)


def mlp_params(model: Model, width: int, tp: int = 1) -> float:
    """One MLP of intermediate ``width`` split t ways: 3 (gated) or 2 matrices, + biases."""
    d, w = model.d_model, width // tp
    mats = 3 if model.gated_mlp else 2
    bias = ((2 if model.gated_mlp else 1) * w + d) if model.linear_bias else 0
    return mats * d * w + bias


def router_params(model: Model) -> int:
    """The 16-bit, replicated linears of one MoE layer: the router (d x n_experts) and the
    shared experts' gate (d x 1, ``MoE.shared_expert_gate``), class ``router``."""
    moe = model.moe
    return model.d_model * (moe.n_experts + (1 if moe.shared_expert_gate else 0))


def norm_params(model: Model) -> int:
    return model.d_model * (2 if model.norm == "layer" else 1)


def param_counts(model: Model, tp: int = 1, ep: int = 1, replicas: int = 0) -> ParamCounts:
    """Per-device parameter counts (tp=1: the whole model); with expert parallelism ``ep``
    the routed experts are whole, ceil((E + replicas) / ep) of them on the fullest device
    (``replicas``: redundant copies of hot experts). Cached on the model."""
    key = ("params", tp, ep, replicas)
    if key not in model.memo:
        model.memo[key] = _param_counts(model, tp, ep, replicas)
    return model.memo[key]


def _param_counts(model: Model, tp: int, ep: int = 1, replicas: int = 0) -> ParamCounts:
    check_tp(model, tp)
    d, layers = model.d_model, model.n_layers
    moe = model.moe
    n_moe = model.n_moe_layers
    vocab = model.vocab_size / tp
    embedding = vocab * d + (model.max_position_embeddings * d
                             if model.position == "learned" else 0)
    mixers, mixer_rest = mixer_params(model, tp)
    shared_attention, shared_mlp, shared_norms = shared_block_params(model, tp)
    norms = (layers * model.norms_per_layer + 1) * norm_params(model) + mixer_rest \
        + shared_norms
    experts = shared = router = 0.0
    if moe:
        expert = mlp_params(model, moe.expert_intermediate_size, tp)
        experts = n_moe * moe.n_experts * expert
        if ep > 1:
            held = -(-(moe.n_experts + replicas) // ep)
            experts = n_moe * held * mlp_params(model, moe.expert_intermediate_size)
        shared = n_moe * moe.n_shared_experts * expert
        router = n_moe * router_params(model)
    # an MTP module: two input norms, a [2d -> d] projection, one decoder block, an output norm
    block_mlp = ((moe.n_experts + moe.n_shared_experts)
                 * mlp_params(model, moe.expert_intermediate_size, tp) + router_params(model)
                 if moe else mlp_params(model, model.intermediate_size, tp))
    block = attention_params(model, tp) + model.norms_per_layer * norm_params(model) + block_mlp
    mtp = model.mtp_modules * (3 * norm_params(model) + 2 * d * d + block)
    return ParamCounts(
        embedding=embedding, lm_head=0.0 if model.tie_embeddings else vocab * d, norms=norms,
        attention=model.attention_layers * attention_params(model, tp) + mixers
        - (model.attention_layers - model.kv_layers) * kv_projection_params(model, tp)
        - (model.nope_layers * 2 * model.head_dim if model.qk_norm == "rms" else 0)
        + shared_attention,
        mlp=(model.mlp_layers - n_moe) * mlp_params(model, model.intermediate_size, tp)
        + shared_mlp,
        experts=experts, shared_experts=shared, router=router, mtp=mtp)


def stage_layers(n_layers: int, pp: int) -> np.ndarray:
    """Decoder layers on each of ``pp`` pipeline stages, as vLLM splits them
    (``vllm/distributed/utils.py: get_pp_indices``): n_layers // pp each, the remainder one
    more each to the stages before the last (which also holds the LM head)."""
    out = np.full(pp, n_layers // pp)
    for i in range(2, n_layers % pp + 2):
        out[-i] += 1
    return out
