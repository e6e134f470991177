"""The model schema (models/README.md): a mapping, from a YAML file or a translated Hugging
Face config, into a ``Model``. Unknown keys are errors.
"""

from __future__ import annotations

from perfmodel.specs.fields import Fields
from perfmodel.specs.model import MLA, Model, MoE

MODEL_KEYS = ("version", "name", "family", "source", "n_layers", "d_model", "n_heads",
              "n_kv_heads", "head_dim", "vocab_size", "intermediate_size", "gated_mlp",
              "activation", "norm", "norms_per_layer", "tie_embeddings", "position",
              "max_position_embeddings", "qkv_bias", "linear_bias", "parallel_block",
              "attention", "mla", "moe", "mtp")

def check_version(f: Fields) -> None:
    if f.integer("version") != 1:
        raise f.error("version", "expected 1 (the only schema version so far)")



def model_from_fields(f: Fields) -> Model:
    """Build a Model from a mapping in the models/README.md schema (YAML or translated HF)."""
    n_heads = f.integer("n_heads")
    d_model = f.integer("d_model")
    attention = f.sub("attention", required=False)
    window, pattern, softcap = None, (), None
    if attention is not None:
        window = attention.integer("sliding_window", None)
        raw_pattern = attention.raw("layer_pattern", [])
        if not isinstance(raw_pattern, list) or any(p not in ("local", "global")
                                                    for p in raw_pattern):
            raise attention.error("layer_pattern", "expected a list of 'local' and 'global'")
        pattern = tuple(raw_pattern)
        if pattern and window is None:
            raise attention.error("sliding_window", "required when layer_pattern is given")
        softcap = attention.raw("logit_softcap", None)
        attention.finish()
    model = Model(
        name=f.text("name"), family=f.text("family", ""), source=f.text("source", ""),
        n_layers=f.integer("n_layers"), d_model=d_model, n_heads=n_heads,
        n_kv_heads=f.integer("n_kv_heads"),
        head_dim=f.integer("head_dim", d_model // n_heads if d_model % n_heads == 0 else ...),
        vocab_size=f.integer("vocab_size"), intermediate_size=f.integer("intermediate_size"),
        gated_mlp=f.flag("gated_mlp", True),
        activation=f.text("activation", "silu", ("silu", "gelu", "gelu_tanh", "relu")),
        norm=f.text("norm", "rms", ("rms", "layer")),
        norms_per_layer=f.integer("norms_per_layer", 2),
        tie_embeddings=f.flag("tie_embeddings", False),
        position=f.text("position", "rope", ("rope", "learned", "alibi")),
        max_position_embeddings=f.integer("max_position_embeddings", 0, minimum=0),
        qkv_bias=f.flag("qkv_bias", False), linear_bias=f.flag("linear_bias", False),
        parallel_block=f.flag("parallel_block", False),
        sliding_window=window, layer_pattern=pattern, logit_softcap=softcap,
        mla=_mla(f.sub("mla", required=False)), moe=_moe(f.sub("moe", required=False)),
        mtp_modules=_mtp(f.sub("mtp", required=False)),
    )
    if model.n_kv_heads > model.n_heads or model.n_heads % model.n_kv_heads:
        raise f.error("n_kv_heads", f"expected a divisor of n_heads ({model.n_heads}), "
                      f"got {model.n_kv_heads}")
    if model.position == "learned" and model.max_position_embeddings < 1:
        raise f.error("max_position_embeddings", "required (>= 1) when position is learned")
    if model.moe and model.moe.first_dense_layers > model.n_layers:
        raise f.error("moe.first_dense_layers", f"expected at most n_layers ({model.n_layers})")
    return model


def _mla(f: Fields | None) -> MLA | None:
    if f is None:
        return None
    out = MLA(q_lora_rank=f.integer("q_lora_rank", None), kv_lora_rank=f.integer("kv_lora_rank"),
              qk_nope_head_dim=f.integer("qk_nope_head_dim"),
              qk_rope_head_dim=f.integer("qk_rope_head_dim"), v_head_dim=f.integer("v_head_dim"))
    f.finish()
    return out


def _moe(f: Fields | None) -> MoE | None:
    if f is None:
        return None
    out = MoE(n_experts=f.integer("n_experts"), top_k=f.integer("top_k"),
              expert_intermediate_size=f.integer("expert_intermediate_size"),
              n_shared_experts=f.integer("n_shared_experts", 0, minimum=0),
              first_dense_layers=f.integer("first_dense_layers", 0, minimum=0))
    if out.top_k > out.n_experts:
        raise f.error("top_k", f"expected at most n_experts ({out.n_experts}), got {out.top_k}")
    f.finish()
    return out


def _mtp(f: Fields | None) -> int:
    if f is None:
        return 0
    out = f.integer("n_modules", 0, minimum=0)
    f.finish()
    return out
