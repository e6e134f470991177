"""Translate a Hugging Face ``config.json`` into the perfmodel/models/README.md schema.

Supported ``model_type`` values: ``FAMILIES`` (the multimodal gemma3 and llama4 read their
``text_config``; kimi_k2 is a deepseek_v3 shape); the keys a family adds are read in
``specs.hf_families``, those of the hybrid (Mamba / linear-attention) ones in
``specs.hf_hybrids``. HF configs carry many keys that do not affect performance; those are
ignored. A missing required key is a one-line error naming it. A ``quantization_config``
(top level, else the text config's) is read by ``specs.quantization``.

The model is named after ``_name_or_path`` (its last path component), else
``architectures[0]`` and its shape (``LlamaForCausalLM-4096x32``: hidden size x layers),
else the file: its stem, or for a ``config.json`` the folder holding it unless that is a
Hugging Face cache snapshot (40 hex digits).
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path
from typing import Any

from perfmodel.specs import hf_families as families
from perfmodel.specs import hf_hybrids as hybrids
from perfmodel.specs.errors import SpecError, did_you_mean, quoted
from perfmodel.specs.fields import Fields
from perfmodel.specs.model import Model
from perfmodel.specs.quantization import quantization_from_hf
from perfmodel.specs.schema import model_from_fields

FAMILIES = ("llama", "mistral", "mixtral", "qwen2", "qwen3", "qwen3_moe", "gemma2", "gemma3",
            "gemma3_text", "phi3", "llama4", "llama4_text", "gpt_oss", "deepseek_v3",
            "deepseek_v2", "kimi_k2", "jamba", "nemotron_h", "qwen3_next", "minimax",
            "minimax_text_01", "falcon_h1", "zamba2", "deepseek_v32", "glm_moe_dsa",
            "minimax_m2", "glm4_moe", "kimi_linear")
# multimodal configs: the text model's config sits under ``text_config``
_TEXT = {"gemma3": "gemma3_text", "llama4": "llama4_text"}
_FAMILY = {"mixtral": families.mixtral, "qwen3_moe": families.qwen3_moe,
           "gemma3_text": families.gemma3, "llama4_text": families.llama4,
           "gpt_oss": families.gpt_oss, "deepseek_v3": families.deepseek,
           "deepseek_v2": families.deepseek, "kimi_k2": families.deepseek,
           "deepseek_v32": families.deepseek, "glm_moe_dsa": families.deepseek,
           "minimax_m2": families.minimax_m2, "glm4_moe": families.glm4_moe,
           "jamba": hybrids.jamba, "nemotron_h": hybrids.nemotron_h,
           "qwen3_next": hybrids.qwen3_next, "minimax": hybrids.minimax,
           "minimax_text_01": hybrids.minimax, "falcon_h1": hybrids.falcon_h1,
           "zamba2": hybrids.zamba2, "kimi_linear": hybrids.kimi_linear}
# a family's earlier config.json key names, read as today's before any key is
_SPELLING = {"zamba2": hybrids.zamba2_keys}
_ACT = {"silu": "silu", "swish": "silu", "gelu": "gelu", "gelu_new": "gelu_tanh",
        "gelu_pytorch_tanh": "gelu_tanh", "gelu_tanh": "gelu_tanh", "relu": "relu"}


# schema field -> the HF key it was read from, to name the user's key in errors
_HF_KEYS = {"n_layers": "num_hidden_layers", "d_model": "hidden_size",
            "n_heads": "num_attention_heads", "n_kv_heads": "num_key_value_heads",
            "vocab_size": "vocab_size", "intermediate_size": "intermediate_size",
            "head_dim": "head_dim", "max_position_embeddings": "max_position_embeddings",
            "rotary_dim": "rotary_dim or partial_rotary_factor",
            "attention.sliding_window": "sliding_window", "moe.top_k": "num_experts_per_tok",
            "attention.chunk_size": "attention_chunk_size",
            "moe.layer_step": "decoder_sparse_step or interleave_moe_layer_step",
            "shared_block.n_blocks": "num_mem_blocks", "shared_block.adapter_rank": "adapter_rank"}


def model_from_hf_config(data: dict, file: str, name: str | None = None) -> Model:
    """Build a Model from a parsed HF config mapping (``file`` is named in errors; ``name``
    overrides the one ``hf_name`` gives)."""
    top = Fields(data, file)
    kind = top.text("model_type")
    if kind not in FAMILIES:
        raise top.error("model_type", f"unsupported {quoted(kind)}"
                        f"{did_you_mean(kind, FAMILIES)}, expected one of "
                        f"{', '.join(FAMILIES)}")
    if kind in _SPELLING:
        top = Fields(_SPELLING[kind](data), file)
    hf = top.sub("text_config") if kind in _TEXT else top
    kind = _TEXT.get(kind, kind)
    n_heads = hf.integer("num_attention_heads")
    act = hf.text("hidden_activation", None) or hf.text("hidden_act", "silu")
    if act not in _ACT:
        raise hf.error("hidden_act", f"unsupported activation {quoted(act)}, expected one of "
                       f"{', '.join(_ACT)}")
    gemma = kind.startswith("gemma")
    out: dict[str, Any] = {
        "name": name or hf_name(top, file, hf), "family": kind, "source": file,
        "n_layers": hf.integer("num_hidden_layers"), "d_model": hf.integer("hidden_size"),
        "n_heads": n_heads, "n_kv_heads": hf.integer("num_key_value_heads", n_heads),
        "vocab_size": hf.integer("vocab_size"),
        "intermediate_size": hf.integer("intermediate_size"),
        "gated_mlp": True, "activation": _ACT[act], "norm": "rms",
        "tie_embeddings": hf.flag("tie_word_embeddings", gemma),
        "qkv_bias": kind == "qwen2" or hf.flag("attention_bias", False),
        "linear_bias": False,
        # absent: None, read by the schema as 0 (unknown); written out, at least 1
        "max_position_embeddings": hf.integer("max_position_embeddings", None),
    }
    if hf.has("head_dim"):
        out["head_dim"] = hf.integer("head_dim")
    if kind == "gemma2":
        out["norms_per_layer"] = 4
        out["attention"] = {"sliding_window": hf.integer("sliding_window"),
                            "layer_pattern": ["local", "global"],
                            "logit_softcap": hf.raw("attn_logit_softcapping", None)}
    elif kind in ("qwen3", "qwen3_moe"):
        out["qk_norm"] = "rms"
    if kind not in ("gemma2", "gemma3_text", "gpt_oss", "llama4_text") \
            and hf.has("sliding_window") \
            and hf.flag("use_sliding_window", not kind.startswith("qwen")):
        out["attention"] = {"sliding_window": hf.integer("sliding_window")}
    if kind in _FAMILY:
        _FAMILY[kind](hf, out)
    _partial_rotary(hf, out)
    try:
        model = model_from_fields(Fields(out, file))
    except SpecError as exc:
        raise SpecError(_in_hf_terms(str(exc), file)) from None
    q = top.sub("quantization_config", required=False) \
        or hf.sub("quantization_config", required=False)
    if q is None:
        return model
    return replace(model, quantization=quantization_from_hf(q, out))


def _partial_rotary(hf: Fields, out: dict[str, Any]) -> None:
    """Partial RoPE: ``rotary_dim`` (MiniMax-Text-01), else ``partial_rotary_factor`` x
    head_dim (Qwen3-Next, Phi-4-mini), truncated as vLLM's get_rope does
    (``int(rotary_dim * partial_rotary_factor)``); left out when every feature turns."""
    if out.get("position", "rope") != "rope" or "mla" in out:
        return
    head_dim = out.get("head_dim") or out["d_model"] // out["n_heads"]
    if hf.has("rotary_dim"):
        dim = hf.integer("rotary_dim")
    elif hf.has("partial_rotary_factor"):
        dim = int(head_dim * hf.quantity("partial_rotary_factor", "number", maximum=1.0))
    else:
        return
    if dim < 2:
        raise hf.error("partial_rotary_factor", f"turns {dim} of head_dim {head_dim} "
                       "features; expected at least 2")
    if dim != head_dim:
        out["rotary_dim"] = dim


def _in_hf_terms(message: str, file: str) -> str:
    """A schema error about the translated mapping, naming the HF key it came from."""
    rest = message[len(file) + 2:] if message.startswith(f"{file}: ") else message
    field, _, what = rest.partition(": ")
    if field in _HF_KEYS:
        return f"{file}: {_HF_KEYS[field]}: {what}"
    return f"{message} (translated from the Hugging Face config)"


def hf_name(hf: Fields, file: str, text: Fields | None = None) -> str:
    """``_name_or_path``'s last component, else ``architectures[0]-<hidden>x<layers>`` (of
    the ``text`` config when given), else the file stem, or for config.json its folder
    (unless a cache snapshot hash)."""
    given = hf.raw("_name_or_path", "")
    given = given.replace("\\", "/").strip().strip("/") if isinstance(given, str) else ""
    if given:
        return given.split("/")[-1]
    arch = hf.raw("architectures", None)
    if isinstance(arch, list) and arch and isinstance(arch[0], str) and arch[0]:
        shape = text or hf
        return f"{arch[0]}-{shape.raw('hidden_size', '?')}x{shape.raw('num_hidden_layers', '?')}"
    path = Path(file)
    folder = path.parent.name
    if path.stem == "config" and folder and not re.fullmatch(r"[0-9a-f]{40}", folder):
        return folder
    return path.stem
