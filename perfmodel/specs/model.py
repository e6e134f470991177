"""The model record: a decoder-only transformer's shape (sizes are element counts).

Built by ``specs.schema`` from a model YAML (perfmodel/models/README.md) or a translated
Hugging Face config, or directly in Python.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from perfmodel.specs.dtypes import CODE, weight_bytes

# the classes of linear-layer weights (``cost.params`` counts each; a checkpoint may keep
# some at 16 bits while quantizing the rest)
LINEAR_CLASSES = ("attention", "mlp", "experts", "shared_experts", "router")
# parts of a class a checkpoint may store otherwise than the rest of it: the attention's
# output projection (nvidia/DeepSeek-R1-FP4-v2 quantizes o_proj and keeps q/kv 16-bit); a
# part not named in a ``Quantization`` follows its class
SUBCLASSES = {"o_proj": "attention"}
QUANT_CLASSES = (*LINEAR_CLASSES, *SUBCLASSES)


@dataclass(frozen=True)
class MLA:
    """DeepSeek multi-head latent attention dimensions."""

    q_lora_rank: int | None
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    # DeepSeek Sparse Attention (V3.2, GLM-5): a lightning indexer of index_n_heads heads of
    # index_head_dim scores every cached token for each query, and the attention then reads
    # only the index_topk best (arXiv 2512.02556 sec. 2.1); 0: dense MLA
    index_n_heads: int = 0
    index_head_dim: int = 0
    index_topk: int = 0

    @property
    def sparse(self) -> bool:
        """Whether attention reads only the indexer's top-k tokens (DSA)."""
        return self.index_topk > 0


@dataclass(frozen=True)
class MoE:
    n_experts: int
    top_k: int
    expert_intermediate_size: int
    n_shared_experts: int = 0
    first_dense_layers: int = 0
    layer_step: int = 1         # every layer_step-th layer is MoE (Llama 4 Maverick: 2)
    # group-limited routing (HF n_group / topk_group): the experts form n_groups groups of
    # consecutive ids and a token's top_k come from at most topk_groups of them (DeepSeek-V2's
    # device-limited, V3's node-limited routing); topk_groups >= n_groups: no limit
    n_groups: int = 1
    topk_groups: int = 1
    # sigmoid(x w), w of d_model, scales the shared experts' output (Qwen3-Next: vLLM
    # qwen3_next.py shared_expert_gate, a ReplicatedLinear(hidden_size, 1) kept at 16 bits)
    shared_expert_gate: bool = False

    @property
    def group_limited(self) -> bool:
        """A token's experts come from fewer groups than there are."""
        return self.topk_groups < self.n_groups


@dataclass(frozen=True)
class Quantization:
    """How a checkpoint stores its linear-layer weights (from a HF ``quantization_config``
    or a model YAML's ``quantization:`` block).

    ``weights_dtype`` (int4, int8, fp8, fp4) with ``scale_bytes`` of scale (and zero point)
    per ``group_size`` weights (None: one per tensor or output channel, negligible); the
    ``unquantized`` linear classes (``LINEAR_CLASSES``) stay at 16 bits. ``lm_head``: the
    checkpoint quantizes its LM head too (GPTQ's ``"lm_head": true``), the default of its
    workloads' ``quantize_lm_head``. Embedding and norms are always 16-bit in this model.

    Per class: ``formats`` gives the classes stored in another format than the main one
    ((class, ``specs.formats`` name) pairs: an fp8 attention beside NVFP4 experts); they,
    like the ``unquantized`` ones, keep their format whatever weights a workload asks for
    (``--weights-format`` sets the main one). ``format``: the main format's name (""
    where none of the table fits), ``scale_dtype`` its scales' dtype, ``act_dtype`` the
    dtype the checkpoint quantizes activations to (None: not said, or weight-only)."""

    method: str
    weights_dtype: str
    group_size: int | None = None
    scale_bytes: float = 2.0
    unquantized: tuple[str, ...] = ()
    lm_head: bool = False
    format: str = ""
    scale_dtype: str = ""
    act_dtype: str | None = None
    formats: tuple[tuple[str, str], ...] = ()

    @property
    def bytes_per_weight(self) -> float:
        """Bytes per quantized weight, scales included (``dtypes.weight_bytes``)."""
        return float(weight_bytes(CODE[self.weights_dtype], self.group_size or 0,
                                  self.scale_bytes))

    def class_formats(self, classes: tuple[str, ...] = QUANT_CLASSES) -> dict[str, str]:
        """Each of ``classes``: its format's name (the main one, ``format`` or its dtype,
        for the classes not listed otherwise), or "16-bit"; a part of a class
        (``SUBCLASSES``) not listed follows its class."""
        other = dict(self.formats)
        main = self.format or self.weights_dtype

        def one(c: str) -> str:
            if c in SUBCLASSES and c not in self.unquantized and c not in other:
                return one(SUBCLASSES[c])
            return "16-bit" if c in self.unquantized else other.get(c, main)
        return {c: one(c) for c in classes}


@dataclass(frozen=True)
class Mamba:
    """A Mamba layer's mixer (Mamba-2, arXiv 2405.21060; Mamba-1 with ``dt_rank``).

    Mamba-2: in_proj d -> 2 d_inner + 2 n_groups d_state + n_heads (z, x, B, C, dt), a
    causal conv1d of width ``d_conv`` over the x, B, C channels, the SSD scan in chunks of
    ``chunk_size`` with a state of n_heads x head_dim x d_state per sequence, a gated
    RMSNorm, out_proj d_inner -> d. Mamba-1 (Jamba; ``dt_rank`` > 0): in_proj d ->
    2 d_inner, x_proj d_inner -> dt_rank + 2 d_state, dt_proj dt_rank -> d_inner, the
    selective scan per channel (head_dim 1, one group, chunk 1: recurrent). The state is
    kept at ``state_dtype``; the conv state at the KV-cache dtype. ``rms_norm`` false: a
    Mamba-2 mixer without the gated norm's weights, y x silu(z) only (Falcon-H1-0.5B's
    ``mamba_rms_norm``). ``parallel`` (Falcon-H1,
    arXiv 2507.22448): every attention layer also runs this mixer beside its attention, on
    the same normed input, the two outputs summed into the residual."""

    d_inner: int
    d_state: int
    head_dim: int = 64
    n_groups: int = 1
    d_conv: int = 4
    chunk_size: int = 256
    dt_rank: int = 0
    conv_bias: bool = True
    state_dtype: str = "fp32"
    rms_norm: bool = True
    parallel: bool = False

    @property
    def n_heads(self) -> int:
        return self.d_inner // self.head_dim

    @property
    def conv_channels(self) -> int:
        """Channels of the conv: x, B and C (Mamba-1: x)."""
        return self.d_inner + (0 if self.dt_rank else 2 * self.n_groups * self.d_state)


@dataclass(frozen=True)
class LinearAttention:
    """A linear-attention layer's mixer: ``gated_deltanet`` (Qwen3-Next; arXiv 2412.06464:
    q, k, v, z and per-head beta and decay gates, a short conv over q, k, v, the chunked
    delta rule, a gated RMSNorm), ``kda`` (Kimi Delta Attention, Kimi-Linear; arXiv
    2510.26692: the gated delta rule with a decay per key channel, head_k_dim values per
    head and token, from a low-rank projection; q, k, v and beta projections, short convs
    on q, k, v, a low-rank output gate, a sigmoid-gated RMSNorm: vLLM
    ``vllm/model_executor/layers/kda.py`` ``KimiDeltaAttention``) or ``lightning``
    (MiniMax-01; arXiv 2401.04658: q, k, v and an output gate, fixed per-head decay, no
    conv, an RMSNorm). State n_heads x head_k_dim x head_v_dim per sequence at
    ``state_dtype``."""

    kind: str
    n_heads: int            # value heads (the state's)
    n_k_heads: int          # q/k heads (Gated DeltaNet repeats them to n_heads)
    head_k_dim: int
    head_v_dim: int
    d_conv: int = 0
    chunk_size: int = 64
    state_dtype: str = "fp32"

    @property
    def delta(self) -> bool:
        """The delta rule (Gated DeltaNet, KDA): beta, the WY transform, L2-normed q, k."""
        return self.kind in ("gated_deltanet", "kda")

    @property
    def channel_gates(self) -> int:
        """Decay values per head and token: KDA's one per key channel (head_k_dim), none
        for a per-head scalar decay."""
        return self.head_k_dim if self.kind == "kda" else 0

    @property
    def conv_channels(self) -> int:
        """Channels of the short conv: q, k and v (0 without one)."""
        return (2 * self.n_k_heads * self.head_k_dim + self.n_heads * self.head_v_dim) \
            if self.d_conv else 0


@dataclass(frozen=True)
class SharedBlock:
    """Shared transformer blocks (Zamba2, arXiv 2411.15242): ``n_blocks`` attention + MLP
    blocks, each stored once, run in turn (round-robin) at the ``layers`` listed (0-based:
    Hugging Face ``hybrid_layer_ids``), each before that layer's Mamba-2 mixer. A block's
    input is concat(hidden, the token embeddings), 2 d wide: an RMSNorm over 2 d,
    multi-head attention from 2 d (heads x head_dim = 2 d) back to d, an RMSNorm over d and
    the model's MLP, with no residual inside. Every invocation has its own LoRA adapters of
    ``adapter_rank`` (``attention_adapters``: q, k, v each 2 d -> rank -> 2 d;
    ``mlp_adapters``: d -> rank -> the gate_up width), its own d x d linear, whose output is
    added to the layer's Mamba input, and its own KV cache (transformers
    ``modeling_zamba2.py``; vLLM ``vllm/model_executor/models/zamba2.py``)."""

    n_blocks: int
    layers: tuple[int, ...]
    adapter_rank: int = 128
    attention_adapters: bool = False
    mlp_adapters: bool = True

    @property
    def invocations(self) -> int:
        """Times a step runs a shared block: once per listed layer."""
        return len(self.layers)


# layer kinds of a pattern: attention (global, local, chunk), recurrent mixers (mamba,
# linear) and MLP-only layers (mlp: Nemotron-H, where a layer holds a mixer or an MLP)
LayerKind = Literal["global", "local", "chunk", "mamba", "linear", "mlp"]
ATTENTION_KINDS = ("global", "local", "chunk")
LAYER_KINDS = (*ATTENTION_KINDS, "mamba", "linear", "mlp")
QK_NORMS = ("rms", "l2")        # RMSNorm with head_dim weights (Qwen3, Gemma 3); L2 (Llama 4)


@dataclass(frozen=True)
class Model:
    """A decoder-only transformer shape. Sizes are element counts."""

    name: str
    n_layers: int
    d_model: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    vocab_size: int
    intermediate_size: int
    gated_mlp: bool = True
    activation: str = "silu"
    norm: str = "rms"
    norms_per_layer: int = 2
    tie_embeddings: bool = False
    position: str = "rope"
    rotary_dim: int = 0     # features of a head rotary turns (partial RoPE); 0: head_dim
    max_position_embeddings: int = 0       # context limit (0: unknown); learned-table rows
    qkv_bias: bool = False
    linear_bias: bool = False
    parallel_block: bool = False
    sliding_window: int | None = None
    layer_pattern: tuple[str, ...] = ()
    logit_softcap: float | None = None
    attention_chunk: int | None = None     # chunked layers attend within chunks of this
    qk_norm: str | None = None             # a norm over head_dim on every q and k head
    attention_sinks: bool = False          # one learned logit per head (gpt-oss)
    # cross-layer attention (CLA, Brandon et al. 2024, arXiv 2405.12981): each group of
    # kv_share consecutive layers computes and caches one K/V, the others reuse it
    kv_share: int = 1
    attention_output_gate: bool = False    # sigmoid(x W_g) * attention (Qwen3-Next)
    # every nope_interval-th layer (0: none) has no rotary and no q/k norm (Llama 4's NoPE
    # layers: vLLM llama4.py, rotary_emb and qk_norm only ``if not self.nope``)
    nope_interval: int = 0
    mla: MLA | None = None
    moe: MoE | None = None
    mamba: Mamba | None = None
    linear_attention: LinearAttention | None = None
    shared_block: SharedBlock | None = None     # Zamba2's shared attention + MLP blocks
    mtp_modules: int = 0
    quantization: Quantization | None = None   # None: weights at the workload's dtype
    family: str = ""
    source: str = ""
    # derived structure the cost model keeps per model (a fresh one for every copy)
    memo: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    @property
    def rotated_dim(self) -> int:
        """Features of each q and k head that rotary turns (``rotary_dim``, else all)."""
        return self.rotary_dim or self.head_dim

    @property
    def kv_layers(self) -> int:
        """Attention layers that compute and cache their own K/V:
        ceil(attention layers / kv_share)."""
        return -(-self.attention_layers // self.kv_share)

    @property
    def shared_invocations(self) -> int:
        """Invocations of a shared block in a step (``SharedBlock``; 0 without one)."""
        return self.shared_block.invocations if self.shared_block is not None else 0

    @property
    def cache_layers(self) -> int:
        """KV caches per sequence: the attention layers' own (``kv_layers``) and one per
        shared-block invocation (Zamba2)."""
        return self.kv_layers + self.shared_invocations

    @property
    def full_cache_layers(self) -> int:
        """KV caches that keep every position: the global layers' own (cross-layer sharing,
        allowed only when every attention layer is global, leaves kv_layers of them) and
        one per shared-block invocation."""
        return self.layer_count("global") - self.attention_layers + self.kv_layers \
            + self.shared_invocations

    @property
    def nope_layers(self) -> int:
        """Attention layers without rotary or q/k norm: layer i (0-based) with
        (i + 1) % nope_interval == 0 (HF Llama 4 ``no_rope_layers`` 0 there)."""
        n = self.nope_interval
        return sum(k in ATTENTION_KINDS and (i + 1) % n == 0
                   for i, k in enumerate(self.layer_kinds())) if n else 0

    def layer_count(self, *kinds: str) -> int:
        """Layers of the pattern whose kind is one of ``kinds``."""
        key = ("layer_count", kinds)
        if key not in self.memo:
            self.memo[key] = sum(k in kinds for k in self.layer_kinds())
        return self.memo[key]

    @property
    def attention_layers(self) -> int:
        """Layers with softmax attention (global, local or chunk)."""
        return self.layer_count(*ATTENTION_KINDS)

    @property
    def mamba_layers(self) -> int:
        """Layers that run a Mamba mixer: the pattern's mamba layers, and every attention
        layer when the mixer runs beside attention (``Mamba.parallel``, Falcon-H1)."""
        return self.layer_count("mamba") + self.parallel_mixer_layers

    @property
    def parallel_mixer_layers(self) -> int:
        """Layers holding two mixers (attention and Mamba) whose outputs are summed."""
        return self.attention_layers if self.mamba is not None and self.mamba.parallel else 0

    @property
    def mixer_layers(self) -> int:
        """Layers with a token mixer (attention or recurrent): all but the MLP-only ones."""
        return self.n_layers - self.layer_count("mlp")

    @property
    def mlp_layers(self) -> int:
        """Layers with an MLP: the MLP-only ones when the pattern has any (a Nemotron-H
        layer holds a mixer or an MLP), none when a shared block holds the MLP (Zamba2),
        else every layer."""
        mlp_only = self.layer_count("mlp")
        return mlp_only if mlp_only or self.shared_block is not None else self.n_layers

    def layer_kinds(self) -> list[str]:
        """'local' (sliding window), 'chunk' (chunked attention) or 'global' for every layer,
        from the repeating pattern; without one, every layer is local when a window is set,
        chunk when a chunk is, else global."""
        default = "local" if self.sliding_window else "chunk" if self.attention_chunk \
            else "global"
        pattern = self.layer_pattern or (default,)
        return [pattern[i % len(pattern)] for i in range(self.n_layers)]

    def is_moe_layer(self, index: int) -> bool:
        """Layer ``index`` (0-based) has routed experts: past the first dense layers and,
        with ``layer_step`` s, when (index + 1) % s == 0 (HF Llama 4 ``moe_layers``, Qwen3-MoE
        ``decoder_sparse_step``)."""
        moe = self.moe
        return moe is not None and index >= moe.first_dense_layers \
            and (index + 1) % moe.layer_step == 0

    @property
    def n_moe_layers(self) -> int:
        """Layers with routed experts (``is_moe_layer``)."""
        return sum(self.is_moe_layer(i) for i in range(self.n_layers))

    @property
    def attention_kind(self) -> str:
        """mha / gqa / mqa / mla, for reports."""
        if self.mla is not None:
            return "mla"
        if self.n_kv_heads == self.n_heads:
            return "mha"
        return "mqa" if self.n_kv_heads == 1 else "gqa"
