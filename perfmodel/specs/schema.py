"""The model schema (perfmodel/models/README.md): a mapping, from a YAML file or a translated
Hugging Face config, into a ``Model``. Unknown keys are errors.
"""

from __future__ import annotations

from perfmodel.specs.dtypes import DTYPES
from perfmodel.specs.fields import Fields
from perfmodel.specs.formats import WeightFormat
from perfmodel.specs.model import (
    LAYER_KINDS,
    MLA,
    QK_NORMS,
    QUANT_CLASSES,
    LinearAttention,
    Mamba,
    Model,
    MoE,
    Quantization,
    SharedBlock,
)

MODEL_KEYS = ("version", "name", "family", "source", "n_layers", "d_model", "n_heads",
              "n_kv_heads", "head_dim", "vocab_size", "intermediate_size", "gated_mlp",
              "activation", "norm", "norms_per_layer", "tie_embeddings", "position",
              "rotary_dim", "max_position_embeddings", "qkv_bias", "linear_bias", "parallel_block",
              "qk_norm", "attention", "mla", "moe", "mtp", "quantization", "mamba",
              "linear_attention", "shared_block")

# Upper bounds on sizes, generous enough for any real model (the largest published ones
# reach 126 layers, d_model 18,432, 128 heads, a 262k vocabulary, 384 experts, a 10M
# context), so that a typo such as ``d_model: 5e9`` is an error rather than an estimate.
WIDTH = 2**20                   # d_model, MLP widths, MLA ranks: 1,048,576
MAX = {"n_layers": 4096, "d_model": WIDTH, "n_heads": 16384, "n_kv_heads": 16384,
       "head_dim": 65536, "rotary_dim": 65536, "vocab_size": 2**24, "intermediate_size": 2**24,
       "norms_per_layer": 16, "max_position_embeddings": 2**30, "sliding_window": 2**30,
       "chunk_size": 2**30, "layer_step": 4096, "kv_share": 4096, "nope_interval": 4096,
       "n_experts": 65536, "top_k": 65536, "expert_intermediate_size": 2**24,
       "n_shared_experts": 1024, "first_dense_layers": 4096, "n_modules": 64,
       "q_lora_rank": WIDTH, "kv_lora_rank": WIDTH, "qk_nope_head_dim": 65536,
       "qk_rope_head_dim": 65536, "v_head_dim": 65536, "group_size": 2**24,
       "d_inner": WIDTH, "d_state": 65536, "n_groups": 16384, "d_conv": 64, "dt_rank": WIDTH,
       "n_k_heads": 16384, "head_k_dim": 65536, "head_v_dim": 65536, "topk_groups": 16384,
       "n_blocks": 4096, "adapter_rank": WIDTH, "index_n_heads": 16384,
       "index_head_dim": 65536, "index_topk": 2**24}
QUANTIZED_DTYPES = tuple(d for d in DTYPES if d in ("int8", "int4", "fp8", "fp4"))


def size(f: Fields, key: str, default: object = ..., minimum: int = 1) -> int:
    """An integer size field, bounded by ``MAX[key]``."""
    return f.integer(key, default, minimum=minimum, maximum=MAX[key])


def context_limit(f: Fields, key: str) -> int:
    """The context limit: 0 (unknown) when the field is absent, else at least 1 (a limit of
    0 tokens, written out, is a mistake: no request would fit)."""
    return size(f, key, 0, minimum=1 if f.has(key) else 0)


def _head_dim(f: Fields, d_model: int, n_heads: int) -> int:
    """``head_dim``, by default d_model / n_heads; when that is not whole the file must say
    (the message says why it is needed rather than only that it is missing)."""
    if f.has("head_dim") or d_model % n_heads == 0:
        return size(f, "head_dim", d_model // n_heads)
    raise f.error("head_dim", f"needed: d_model {d_model} / n_heads {n_heads} is not whole "
                  f"({d_model / n_heads:.4g}), so the head width cannot be derived; expected "
                  f"head_dim given")


def check_version(f: Fields) -> None:
    if f.integer("version") != 1:
        raise f.error("version", "expected 1 (the only schema version so far)")



def model_from_fields(f: Fields) -> Model:
    """Build a Model from a mapping in the perfmodel/models/README.md schema (YAML or
    translated HF)."""
    n_heads = size(f, "n_heads")
    d_model = size(f, "d_model")
    window, chunk, pattern, softcap, sinks, share, gate, nope = _attention(
        f.sub("attention", required=False))
    model = Model(
        name=f.text("name"), family=f.text("family", ""), source=f.text("source", ""),
        n_layers=size(f, "n_layers"), d_model=d_model, n_heads=n_heads,
        n_kv_heads=size(f, "n_kv_heads"),
        head_dim=_head_dim(f, d_model, n_heads),
        vocab_size=size(f, "vocab_size"), intermediate_size=size(f, "intermediate_size"),
        gated_mlp=f.flag("gated_mlp", True),
        activation=f.text("activation", "silu", ("silu", "gelu", "gelu_tanh", "relu")),
        norm=f.text("norm", "rms", ("rms", "layer")),
        norms_per_layer=size(f, "norms_per_layer", 2),
        tie_embeddings=f.flag("tie_embeddings", False),
        position=f.text("position", "rope", ("rope", "learned", "alibi", "none")),
        rotary_dim=size(f, "rotary_dim", 0, minimum=0),
        max_position_embeddings=context_limit(f, "max_position_embeddings"),
        qkv_bias=f.flag("qkv_bias", False), linear_bias=f.flag("linear_bias", False),
        parallel_block=f.flag("parallel_block", False),
        sliding_window=window, layer_pattern=pattern, logit_softcap=softcap,
        attention_chunk=chunk, attention_sinks=sinks, kv_share=share, nope_interval=nope,
        attention_output_gate=gate, mamba=_mamba(f.sub("mamba", required=False)),
        linear_attention=_linear(f.sub("linear_attention", required=False)),
        shared_block=_shared(f.sub("shared_block", required=False)),
        qk_norm=f.text("qk_norm", None, QK_NORMS),
        mla=_mla(f.sub("mla", required=False)), moe=_moe(f.sub("moe", required=False)),
        mtp_modules=_mtp(f.sub("mtp", required=False)),
        quantization=_quantization(f.sub("quantization", required=False)),
    )
    if model.n_kv_heads > model.n_heads or model.n_heads % model.n_kv_heads:
        raise f.error("n_kv_heads", f"expected a divisor of n_heads ({model.n_heads}), "
                      f"got {model.n_kv_heads}")
    if model.position == "learned" and model.max_position_embeddings < 1:
        raise f.error("max_position_embeddings", "required (>= 1) when position is learned")
    if model.rotary_dim and (model.position != "rope" or model.mla is not None
                             or model.rotary_dim % 2 or model.rotary_dim > model.head_dim):
        raise f.error("rotary_dim", f"expected an even number of features up to head_dim "
                      f"({model.head_dim}), with position: rope and no mla (its "
                      f"qk_rope_head_dim), got {model.rotary_dim}")
    if model.kv_share > 1 and model.mla is not None:
        raise f.error("attention.kv_share", "cross-layer KV sharing with MLA is not "
                      "modelled; expected 1")
    if model.nope_interval and (model.position != "rope" or model.kv_share > 1):
        raise f.error("attention.nope_interval", "NoPE layers need position: rope and no "
                      "cross-layer KV sharing (kv_share 1); expected it left out")
    if model.moe and model.moe.first_dense_layers > model.n_layers:
        raise f.error("moe.first_dense_layers", f"expected at most n_layers ({model.n_layers})")
    if model.quantization is not None and model.quantization.lm_head \
            and model.tie_embeddings:
        raise f.error("quantization.lm_head", "the LM head is the embedding table "
                      "(tie_embeddings: true), kept at 16 bits; expected false")
    _check_recurrent(f, model)
    _check_shared(f, model)
    return model


def _check_recurrent(f: Fields, model: Model) -> None:
    """A pattern's mamba / linear layers need their block and a block needs its layers;
    MLP-only layers (mlp) exclude MoE; KV sharing stays with attention-only models, MLA
    with attention-only models or MLA beside linear-attention layers (Kimi-Linear)."""
    kinds = set(model.layer_kinds())
    parallel = model.mamba is not None and model.mamba.parallel
    if parallel and (model.mamba.dt_rank or kinds & {"mamba", "linear"}
                     or not model.attention_layers):
        raise f.error("mamba.parallel", "expected a Mamba-2 mixer (no dt_rank) beside the "
                      "attention layers, and no mamba or linear layers in the pattern")
    for kind, key, block in (("mamba", "mamba", None if parallel else model.mamba),
                             ("linear", "linear_attention", model.linear_attention)):
        if (kind in kinds) != (block is not None):
            raise f.error(key, f"required when attention.layer_pattern has {kind!r} layers"
                          if block is None else f"no {kind!r} layer in attention.layer_pattern")
    if {"mamba", "linear"} <= kinds:
        raise f.error("linear_attention", "mamba and linear layers in one model are not "
                      "modelled")
    if "mlp" in kinds and model.moe is not None:
        raise f.error("moe", "MoE with MLP-only ('mlp') layers is not modelled")
    if (kinds & {"mamba", "linear", "mlp"} or parallel) and model.kv_share > 1:
        raise f.error("attention.layer_pattern", "recurrent or MLP-only layers with KV "
                      "sharing are not modelled")
    if (kinds & {"mamba", "mlp"} or parallel) and model.mla is not None:
        raise f.error("attention.layer_pattern", "Mamba or MLP-only layers with MLA are not "
                      "modelled (MLA beside linear layers is)")


def _check_shared(f: Fields, model: Model) -> None:
    """A shared block (Zamba2) runs before the Mamba-2 mixer of listed layers of an
    all-Mamba pattern; its attention is multi-head from the 2 d concat (vLLM's
    Zamba2Attention: heads x head_dim = 2 d, as many K/V heads as heads), no MoE."""
    shared = model.shared_block
    if shared is None:
        return
    m = model.mamba
    if set(model.layer_kinds()) != {"mamba"} or m.dt_rank or m.parallel or model.moe:
        raise f.error("shared_block", "expected every layer of attention.layer_pattern to be "
                      "mamba (Mamba-2, not parallel) and no moe block")
    if list(shared.layers) != sorted(set(shared.layers)) or shared.layers[-1] >= model.n_layers:
        raise f.error("shared_block.layers", f"expected distinct increasing layer indices "
                      f"below n_layers ({model.n_layers}), got {list(shared.layers)}")
    if shared.n_blocks > shared.invocations:
        raise f.error("shared_block.n_blocks", f"expected at most one block per listed layer "
                      f"({shared.invocations}), got {shared.n_blocks}")
    if model.n_heads * model.head_dim != 2 * model.d_model:
        raise f.error("head_dim", f"expected n_heads x head_dim = 2 x d_model "
                      f"({2 * model.d_model}) with a shared block, got "
                      f"{model.n_heads * model.head_dim}")
    if model.n_kv_heads != model.n_heads:
        raise f.error("n_kv_heads", f"expected n_heads ({model.n_heads}) with a shared block "
                      f"(vLLM's Zamba2Attention is multi-head)")


def _shared(f: Fields | None) -> SharedBlock | None:
    """The ``shared_block:`` block (perfmodel/models/README.md)."""
    if f is None:
        return None
    layers = f.raw("layers")
    if not isinstance(layers, list) or not layers or any(
            not isinstance(i, int) or isinstance(i, bool) or i < 0 for i in layers):
        raise f.error("layers", f"expected a non-empty list of 0-based layer indices, "
                      f"got {layers!r}")
    out = SharedBlock(n_blocks=size(f, "n_blocks"), layers=tuple(layers),
                      adapter_rank=size(f, "adapter_rank", 128),
                      attention_adapters=f.flag("attention_adapters", False),
                      mlp_adapters=f.flag("mlp_adapters", True))
    f.finish()
    return out


def _attention(f: Fields | None) -> tuple:
    """The ``attention:`` block: (sliding_window, chunk_size, layer_pattern, logit_softcap,
    sinks, kv_share, output_gate, nope_interval). A pattern names local (windowed), chunk
    (chunked) and global layers; each kind it names needs its size, and a window or chunk
    no layer uses is an error."""
    if f is None:
        return None, None, (), None, False, 1, False, 0
    window, chunk = size(f, "sliding_window", None), size(f, "chunk_size", None)
    raw = f.raw("layer_pattern", [])
    if not isinstance(raw, list) or any(p not in LAYER_KINDS for p in raw):
        raise f.error("layer_pattern", f"expected a list of {', '.join(LAYER_KINDS)}")
    pattern = tuple(raw) or (("local",) if window else ("chunk",) if chunk else ())
    for kind, key, value in (("local", "sliding_window", window), ("chunk", "chunk_size", chunk)):
        if (kind in pattern) != (value is not None):
            raise f.error(key, f"required when layer_pattern has {kind!r} layers"
                          if value is None else f"no {kind!r} layer in layer_pattern uses it")
    share = size(f, "kv_share", 1)
    if share > 1 and (window or chunk):
        raise f.error("kv_share", "cross-layer KV sharing with windowed or chunked layers is "
                      "not modelled; expected 1 there")
    out = (window, chunk, tuple(raw), f.raw("logit_softcap", None), f.flag("sinks", False),
           share, f.flag("output_gate", False), size(f, "nope_interval", None, 2) or 0)
    f.finish()
    return out


def _mamba(f: Fields | None) -> Mamba | None:
    """The ``mamba:`` block (perfmodel/models/README.md)."""
    if f is None:
        return None
    dt_rank = size(f, "dt_rank", 0, minimum=0)
    out = Mamba(d_inner=size(f, "d_inner"), d_state=size(f, "d_state"),
                head_dim=1 if dt_rank else size(f, "head_dim"),
                n_groups=1 if dt_rank else size(f, "n_groups", 1),
                d_conv=size(f, "d_conv", 4), chunk_size=1 if dt_rank else size(f, "chunk_size"),
                dt_rank=dt_rank, conv_bias=f.flag("conv_bias", True),
                state_dtype=f.text("state_dtype", "fp32", DTYPES),
                rms_norm=not dt_rank and f.flag("rms_norm", True),
                parallel=f.flag("parallel", False))
    if out.d_inner % out.head_dim or out.n_heads % out.n_groups:
        raise f.error("head_dim", "expected head_dim to divide d_inner and n_groups the heads")
    f.finish()
    return out


def _linear(f: Fields | None) -> LinearAttention | None:
    """The ``linear_attention:`` block (perfmodel/models/README.md)."""
    if f is None:
        return None
    out = LinearAttention(kind=f.text("kind", choices=("gated_deltanet", "kda", "lightning")),
                          n_heads=size(f, "n_heads"), n_k_heads=size(f, "n_k_heads"),
                          head_k_dim=size(f, "head_k_dim"), head_v_dim=size(f, "head_v_dim"),
                          d_conv=size(f, "d_conv", 0, minimum=0),
                          chunk_size=size(f, "chunk_size"),
                          state_dtype=f.text("state_dtype", "fp32", DTYPES))
    if out.n_heads % out.n_k_heads:
        raise f.error("n_k_heads", f"expected a divisor of n_heads ({out.n_heads})")
    if out.kind == "kda" and (out.n_k_heads != out.n_heads or out.head_k_dim != out.head_v_dim
                              or not out.d_conv):
        raise f.error("kind", "kda has one num_heads and head_dim for q, k and v and a short "
                      "conv (vLLM's KimiDeltaAttention): expected n_k_heads = n_heads, "
                      "head_k_dim = head_v_dim and d_conv >= 1")
    f.finish()
    return out


def _mla(f: Fields | None) -> MLA | None:
    if f is None:
        return None
    out = MLA(q_lora_rank=size(f, "q_lora_rank", None), kv_lora_rank=size(f, "kv_lora_rank"),
              qk_nope_head_dim=size(f, "qk_nope_head_dim"),
              qk_rope_head_dim=size(f, "qk_rope_head_dim"), v_head_dim=size(f, "v_head_dim"),
              index_n_heads=size(f, "index_n_heads", 0, minimum=0),
              index_head_dim=size(f, "index_head_dim", 0, minimum=0),
              index_topk=size(f, "index_topk", 0, minimum=0))
    if out.sparse != (out.index_n_heads > 0) or out.sparse != (out.index_head_dim > 0):
        raise f.error("index_topk", "expected index_n_heads, index_head_dim and index_topk "
                      "all given (DeepSeek sparse attention) or none")
    f.finish()
    return out


def _moe(f: Fields | None) -> MoE | None:
    if f is None:
        return None
    groups = size(f, "n_groups", 1)
    out = MoE(n_experts=size(f, "n_experts"), top_k=size(f, "top_k"),
              expert_intermediate_size=size(f, "expert_intermediate_size"),
              n_shared_experts=size(f, "n_shared_experts", 0, minimum=0),
              first_dense_layers=size(f, "first_dense_layers", 0, minimum=0),
              layer_step=size(f, "layer_step", 1), n_groups=groups,
              topk_groups=size(f, "topk_groups", groups),
              shared_expert_gate=f.flag("shared_expert_gate", False))
    if out.shared_expert_gate and not out.n_shared_experts:
        raise f.error("shared_expert_gate", "gates the shared experts: expected "
                      "n_shared_experts >= 1 with it")
    if out.top_k > out.n_experts:
        raise f.error("top_k", f"expected at most n_experts ({out.n_experts}), got {out.top_k}")
    _check_groups(f, out)
    f.finish()
    return out


def _check_groups(f: Fields, moe: MoE) -> None:
    """Group-limited routing: equal groups, at most n_groups of them picked, and enough
    experts in the picked groups for top_k."""
    if moe.n_experts % moe.n_groups:
        raise f.error("n_groups", f"expected a divisor of n_experts ({moe.n_experts}), got "
                                  f"{moe.n_groups}")
    if moe.topk_groups > moe.n_groups:
        raise f.error("topk_groups", f"expected at most n_groups ({moe.n_groups}), got "
                                     f"{moe.topk_groups}")
    reach = moe.topk_groups * (moe.n_experts // moe.n_groups)
    if moe.top_k > reach:
        raise f.error("topk_groups", f"expected topk_groups x n_experts / n_groups >= top_k "
                                     f"({moe.top_k}), got {reach} experts")


def _mtp(f: Fields | None) -> int:
    if f is None:
        return 0
    out = size(f, "n_modules", 0, minimum=0)
    f.finish()
    return out


def _quantization(f: Fields | None) -> Quantization | None:
    """The ``quantization:`` block (perfmodel/models/README.md): a weight ``format`` name
    (``specs.formats``: dtype, group or block, scale dtype and bytes) or weights_dtype,
    group_size and scale_bytes per group; the linear classes left unquantized and those in
    another format (``formats``: class -> format name); the activations the checkpoint
    quantizes (``act_dtype``); whether the LM head is quantized too (``lm_head``); a
    free-text method."""
    if f is None:
        return None
    kept = f.raw("unquantized", [])
    if not isinstance(kept, list) or any(k not in QUANT_CLASSES for k in kept):
        raise f.error("unquantized", f"expected a list of {', '.join(QUANT_CLASSES)}, "
                      f"got {kept!r}")
    f.text("source", "")                # where the block is transcribed from (any text)
    fmt = _format(f, "format") if f.has("format") else None
    if fmt is not None and any(f.has(k) for k in ("weights_dtype", "group_size",
                                                  "scale_bytes")):
        raise f.error("format", "sets weights_dtype, group_size and scale_bytes; drop them")
    out = Quantization(method=f.text("method", "declared"),
                       weights_dtype=fmt.weights if fmt else
                       f.text("weights_dtype", choices=QUANTIZED_DTYPES),
                       group_size=fmt.group_size if fmt else size(f, "group_size", None),
                       scale_bytes=fmt.scale_bytes if fmt else
                       f.quantity("scale_bytes", "number", 2.0, positive=False, maximum=64.0),
                       unquantized=tuple(k for k in QUANT_CLASSES if k in kept),
                       lm_head=f.flag("lm_head", False),
                       format=fmt.name if fmt else "",
                       scale_dtype=fmt.scale_dtype if fmt else "",
                       act_dtype=f.text("act_dtype", None, ("fp8", "fp4", "int8")),
                       formats=_class_formats(f, kept))
    f.finish()
    return out


def _format(f: Fields, key: str) -> WeightFormat:
    from perfmodel.specs.formats import format_names, weight_format

    name = f.text(key)
    if name not in format_names():
        raise f.error(key, f"unknown weights format {name!r}, expected one of "
                      f"{', '.join(format_names())}")
    return weight_format(name)


def _class_formats(f: Fields, kept: list[str]) -> tuple[tuple[str, str], ...]:
    """``formats:`` {linear class: format name} of the classes stored in another format."""
    sub = f.sub("formats", required=False)
    if sub is None:
        return ()
    out = []
    quantized = [c for c in QUANT_CLASSES if c not in kept]
    for cls in list(sub.data):
        if cls not in quantized:
            raise sub.error(cls, f"expected a quantized linear class ({', '.join(quantized)})")
        out.append((cls, _format(sub, cls).name))
    sub.finish()
    return tuple(sorted(out, key=lambda p: QUANT_CLASSES.index(p[0])))
