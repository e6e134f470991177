"""Per-family parts of the Hugging Face ``config.json`` translation (``specs.hf``).

Each function reads the keys one family adds and writes them into ``out``, the mapping in
the perfmodel/models/README.md schema that ``specs.hf`` built from the keys all families
share. A key
that changes the cost and is not understood (a layer type, an MoE layout no step rule
expresses) is an error naming it, never ignored. Key names follow each family's
``configuration_*.py`` in huggingface/transformers.
"""

from __future__ import annotations

from typing import Any

from perfmodel.specs.fields import Fields

# HF ``layer_types`` (transformers ``ALLOWED_LAYER_TYPES``) -> the schema's layer kinds
_LAYER_TYPES = {"full_attention": "global", "sliding_attention": "local",
                "chunked_attention": "chunk"}


def attention_from_layer_types(hf: Fields, out: dict[str, Any]) -> None:
    """``layer_types`` (one per layer: full_attention, sliding_attention, chunked_attention)
    into ``attention.layer_pattern`` with the window (``sliding_window``) or chunk
    (``attention_chunk_size``) its kinds need; no block when every layer is full."""
    types = hf.raw("layer_types")
    if not isinstance(types, list) or any(t not in _LAYER_TYPES for t in types):
        raise hf.error("layer_types", f"expected a list of {', '.join(_LAYER_TYPES)}, "
                       f"got {types!r}")
    if len(types) != out["n_layers"]:
        raise hf.error("layer_types", f"expected one per layer ({out['n_layers']}), "
                       f"got {len(types)}")
    set_pattern(hf, out, [_LAYER_TYPES[t] for t in types])


def set_pattern(hf: Fields, out: dict[str, Any], kinds: list[str]) -> None:
    """The ``attention`` block of per-layer ``kinds``, shortened to its repeating unit."""
    if set(kinds) == {"global"}:
        return
    period = next(p for p in range(1, len(kinds) + 1)
                  if all(k == kinds[i % p] for i, k in enumerate(kinds)))
    block = out.setdefault("attention", {})
    block["layer_pattern"] = kinds[:period]
    if "local" in kinds:
        block["sliding_window"] = hf.integer("sliding_window")
    if "chunk" in kinds:
        block["chunk_size"] = hf.integer("attention_chunk_size")


def gemma3(hf: Fields, out: dict[str, Any]) -> None:
    """Gemma 3 text: pre- and post-norms, q/k RMSNorms, tied embeddings, local layers of
    ``sliding_window`` and every ``sliding_window_pattern``-th layer global (or
    ``layer_types``)."""
    out.update(norms_per_layer=4, qk_norm="rms")
    if hf.has("layer_types"):
        attention_from_layer_types(hf, out)
    else:
        every = hf.integer("sliding_window_pattern", 6)
        set_pattern(hf, out, ["local"] * (every - 1) + ["global"])
    if hf.has("attn_logit_softcapping") and "attention" in out:
        out["attention"]["logit_softcap"] = hf.raw("attn_logit_softcapping")


def qwen3_moe(hf: Fields, out: dict[str, Any]) -> None:
    """Qwen3-MoE: ``num_experts`` routed experts of ``moe_intermediate_size`` on every
    ``decoder_sparse_step``-th layer; ``mlp_only_layers`` other than none is refused."""
    if hf.raw("mlp_only_layers", []):
        raise hf.error("mlp_only_layers", "dense layers by list are not modelled; "
                       "only [] (every decoder_sparse_step-th layer MoE)")
    out["moe"] = {"n_experts": hf.integer("num_experts"),
                  "top_k": hf.integer("num_experts_per_tok"),
                  "expert_intermediate_size": hf.integer("moe_intermediate_size"),
                  "layer_step": hf.integer("decoder_sparse_step", 1)}


def llama4(hf: Fields, out: dict[str, Any]) -> None:
    """Llama 4 text: ``num_local_experts`` of ``intermediate_size`` plus one shared expert
    of that width on every ``interleave_moe_layer_step``-th layer, dense layers of
    ``intermediate_size_mlp``; chunked attention (``attention_chunk_size``) on the RoPE
    layers, full attention on the NoPE ones (``no_rope_layers``: 1 = RoPE, default every
    ``no_rope_layer_interval``-th NoPE: ``nope_interval``, no rotary or q/k norm there);
    ``use_qk_norm``: an L2 norm without weights."""
    step = hf.integer("interleave_moe_layer_step", 1)
    layers = out["n_layers"]
    listed = hf.raw("moe_layers", None)
    if listed is not None and listed != list(range(step - 1, layers, step)):
        raise hf.error("moe_layers", f"only every interleave_moe_layer_step-th layer "
                       f"({step}) is modelled, got {listed!r}")
    width = out["intermediate_size"]
    out["intermediate_size"] = hf.integer("intermediate_size_mlp", width)
    out["moe"] = {"n_experts": hf.integer("num_local_experts"),
                  "top_k": hf.integer("num_experts_per_tok"),
                  "expert_intermediate_size": width, "n_shared_experts": 1,
                  "layer_step": step}
    if hf.flag("use_qk_norm", False):
        out["qk_norm"] = "l2"
    rope = hf.raw("no_rope_layers", None) or [
        int((i + 1) % hf.integer("no_rope_layer_interval", 4) != 0) for i in range(layers)]
    if not isinstance(rope, list) or len(rope) != layers or any(r not in (0, 1) for r in rope):
        raise hf.error("no_rope_layers", f"expected {layers} flags of 0 or 1, got {rope!r}")
    if 0 in rope:
        every = rope.index(0) + 1
        if rope != [int((i + 1) % every != 0) for i in range(layers)]:
            raise hf.error("no_rope_layers", f"only every n-th layer NoPE is modelled, got "
                           f"{rope!r}")
        if every == 1:
            out["position"] = "none"
        else:
            out.setdefault("attention", {})["nope_interval"] = every
    if hf.has("attention_chunk_size"):
        set_pattern(hf, out, ["chunk" if r else "global" for r in rope])


def gpt_oss(hf: Fields, out: dict[str, Any]) -> None:
    """gpt-oss: every layer MoE (``num_local_experts`` of ``intermediate_size``, biased),
    biased attention with one sink logit per head, alternating sliding and full layers
    (``layer_types``)."""
    out.update(qkv_bias=hf.flag("attention_bias", True), linear_bias=True)
    out["moe"] = {"n_experts": hf.integer("num_local_experts"),
                  "top_k": hf.integer("num_experts_per_tok"),
                  "expert_intermediate_size": out["intermediate_size"]}
    attention_from_layer_types(hf, out)
    out.setdefault("attention", {})["sinks"] = True


def mixtral(hf: Fields, out: dict[str, Any]) -> None:
    out["moe"] = {"n_experts": hf.integer("num_local_experts"),
                  "top_k": hf.integer("num_experts_per_tok"),
                  "expert_intermediate_size": out["intermediate_size"]}


def routed_experts(hf: Fields) -> dict[str, Any]:
    """The DeepSeek-style MoE block (DeepSeek-V2/V3, Kimi K2, GLM-4.5): routed and shared
    experts after ``first_k_dense_replace`` dense layers, group-limited routing."""
    if hf.integer("moe_layer_freq", 1) != 1:
        raise hf.error("moe_layer_freq", "only 1 (every layer after the dense ones) is supported")
    return {"n_experts": hf.integer("n_routed_experts"),
            "top_k": hf.integer("num_experts_per_tok"),
            "expert_intermediate_size": hf.integer("moe_intermediate_size"),
            "n_shared_experts": hf.integer("n_shared_experts", 0, minimum=0),
            "first_dense_layers": hf.integer("first_k_dense_replace", 0, minimum=0),
            "n_groups": hf.integer("n_group", 1),
            "topk_groups": hf.integer("topk_group", hf.integer("n_group", 1))}


def glm4_moe(hf: Fields, out: dict[str, Any]) -> None:
    """GLM-4.5 / 4.6: GQA attention with q/k norms (``use_qk_norm``) and biased QKV, partial
    rotary (``partial_rotary_factor``, read by the caller), DeepSeek-style experts; its MTP
    layers (``num_nextn_predict_layers``)."""
    if hf.flag("use_qk_norm", False):
        out["qk_norm"] = "rms"
    out["moe"] = routed_experts(hf)
    if hf.integer("num_nextn_predict_layers", 0, minimum=0):
        out["mtp"] = {"n_modules": hf.integer("num_nextn_predict_layers", minimum=0)}


def minimax_m2(hf: Fields, out: dict[str, Any]) -> None:
    """MiniMax-M2: full GQA attention with q/k norms, Mixtral-style experts (no shared)."""
    if hf.flag("use_qk_norm", False):
        out["qk_norm"] = "rms"
    mixtral(hf, out)


def deepseek(hf: Fields, out: dict[str, Any]) -> None:
    """DeepSeek-V2/V3 (and Kimi K2, a V3 shape): MLA, routed + shared experts after the
    first dense layers, MTP modules. ``n_group`` / ``topk_group``: a token's experts come
    from at most topk_group of n_group expert groups (V2's device-limited, V3's node-limited
    routing; vLLM's grouped top-k applies them whatever ``topk_method`` says); absent: no
    limit."""
    nope, rope = hf.integer("qk_nope_head_dim"), hf.integer("qk_rope_head_dim")
    out["head_dim"] = nope + rope
    out["n_kv_heads"] = out["n_heads"]
    out["mla"] = {"q_lora_rank": hf.integer("q_lora_rank", None),
                  "kv_lora_rank": hf.integer("kv_lora_rank"),
                  "qk_nope_head_dim": nope, "qk_rope_head_dim": rope,
                  "v_head_dim": hf.integer("v_head_dim")}
    if hf.has("index_topk"):      # DeepSeek-V3.2 / GLM-5: DSA's lightning indexer
        out["mla"] |= {"index_n_heads": hf.integer("index_n_heads"),
                       "index_head_dim": hf.integer("index_head_dim"),
                       "index_topk": hf.integer("index_topk")}
    if hf.has("n_routed_experts"):
        out["moe"] = routed_experts(hf)
    if hf.integer("num_nextn_predict_layers", 0, minimum=0):
        out["mtp"] = {"n_modules": hf.integer("num_nextn_predict_layers", minimum=0)}
