"""Hybrid (recurrent + attention) families of the Hugging Face ``config.json`` translation
(``specs.hf``): Jamba, Nemotron-H, Qwen3-Next, MiniMax-Text-01, Falcon-H1, Zamba2,
Kimi-Linear.

Each function reads the keys one family adds and writes them into ``out`` (the
perfmodel/models/README.md schema): the per-layer kinds into ``attention.layer_pattern`` (mamba,
linear, mlp, global) and the recurrent block (``mamba:`` or ``linear_attention:``; Falcon-H1:
``mamba.parallel``, a Mamba-2 mixer beside attention in every layer; Zamba2: a
``shared_block``). A layer
letter or type not understood is an error naming the key. Key names follow the families'
``configuration_*.py`` (transformers; the hub's remote code for Nemotron-H and MiniMax).
"""

from __future__ import annotations

from typing import Any

from perfmodel.specs.fields import Fields
from perfmodel.specs.hf_families import deepseek, qwen3_moe, set_pattern

# Nemotron-H ``hybrid_override_pattern`` letters: Mamba-2 mixer, attention, MLP
_NEMOTRON = {"M": "mamba", "*": "global", "-": "mlp"}
# Qwen3-Next / MiniMax (transformers) ``layer_types``
_LINEAR_TYPES = {"linear_attention": "linear", "full_attention": "global"}
# MiniMax-Text-01 ``attn_type_list``: 0 lightning (linear) attention, 1 softmax attention
_MINIMAX = {0: "linear", 1: "global"}
# flash-linear-attention chunk_gated_delta_rule's and chunk_kda's chunk (no config key)
_DELTANET_CHUNK = 64
# Zamba2 ``layers_block_type``: a Mamba layer, or a shared block then a Mamba layer ("m" and
# "g" in Zyphra's earlier spelling); True: the layer invokes a shared block
_ZAMBA2 = {"mamba": False, "hybrid": True, "m": False, "g": True}
# Zyphra's earlier zamba2 key names (Zyphra/transformers_zamba2's Zamba2Config) -> today's
# (transformers' Zamba2Config)
_ZAMBA2_SPELLING = {"state_size": "mamba_d_state", "conv_dimension": "mamba_d_conv",
                    "expansion_factor": "mamba_expand", "ffn_hidden_size": "intermediate_size",
                    "lora_rank": "adapter_rank",
                    "use_shared_attention_lora": "use_shared_attention_adapter"}


def _kinds(hf: Fields, key: str, values: list, table: dict, layers: int) -> list[str]:
    """``values`` (one per layer, read from ``key``) mapped through ``table``; an entry not in
    it or a count other than ``layers`` is an error naming ``key``."""
    bad = [v for v in values if v not in table]
    if bad:
        raise hf.error(key, f"unknown layer type {bad[0]!r}, expected one of "
                       f"{', '.join(map(str, table))}")
    if len(values) != layers:
        raise hf.error(key, f"expected one per layer ({layers}), got {len(values)}")
    return [table[v] for v in values]


def _every(hf: Fields, period_key: str, offset_key: str, layers: int,
           default: tuple[int, int]) -> list[bool]:
    """Layer i selected when i % period == offset (Jamba's attn/expert layer rule)."""
    period = hf.integer(period_key, default[0])
    offset = hf.integer(offset_key, default[1], minimum=0)
    if offset >= period:
        raise hf.error(offset_key, f"expected below {period_key} ({period}), got {offset}")
    return [i % period == offset for i in range(layers)]


def jamba(hf: Fields, out: dict[str, Any]) -> None:
    """Jamba: attention on layer i when i % ``attn_layer_period`` == ``attn_layer_offset``,
    Mamba-1 elsewhere (``mamba_expand`` x d, ``mamba_d_state``, ``mamba_d_conv``,
    ``mamba_dt_rank``); ``num_experts`` MoE on i % ``expert_layer_period`` ==
    ``expert_layer_offset`` (only offset period - 1, the schema's ``layer_step``)."""
    layers = out["n_layers"]
    out["position"] = "none"        # JambaAttention has no rotary (vLLM jamba.py, HF)
    attend = _every(hf, "attn_layer_period", "attn_layer_offset", layers, (8, 4))
    set_pattern(hf, out, ["global" if a else "mamba" for a in attend])
    rank = hf.raw("mamba_dt_rank", "auto")
    out["mamba"] = {"d_inner": hf.integer("mamba_expand", 2) * out["d_model"],
                    "d_state": hf.integer("mamba_d_state", 16),
                    "d_conv": hf.integer("mamba_d_conv", 4),
                    "dt_rank": -(-out["d_model"] // 16) if rank == "auto"
                    else hf.integer("mamba_dt_rank"),
                    "conv_bias": hf.flag("mamba_conv_bias", True)}
    if hf.flag("mamba_proj_bias", False):
        raise hf.error("mamba_proj_bias", "biased Mamba projections are not modelled")
    if hf.integer("num_experts", 1) > 1:
        step = hf.integer("expert_layer_period", 2)
        if hf.integer("expert_layer_offset", 1, minimum=0) != step - 1:
            raise hf.error("expert_layer_offset", f"only expert_layer_period - 1 ({step - 1}) "
                           "is modelled (MoE on every period-th layer, counted from 1)")
        out["moe"] = {"n_experts": hf.integer("num_experts"),
                      "top_k": hf.integer("num_experts_per_tok"),
                      "expert_intermediate_size": out["intermediate_size"],
                      "layer_step": step}


def nemotron_h(hf: Fields, out: dict[str, Any]) -> None:
    """Nemotron-H: one block per ``hybrid_override_pattern`` letter (M Mamba-2, * attention,
    - a relu^2 MLP), each with one pre-norm; Mamba-2 of ``mamba_num_heads`` x
    ``mamba_head_dim``, ``ssm_state_size``, ``n_groups``, ``conv_kernel``, ``chunk_size``."""
    pattern = hf.text("hybrid_override_pattern")
    set_pattern(hf, out, _kinds(hf, "hybrid_override_pattern", list(pattern), _NEMOTRON,
                                out["n_layers"]))
    act = hf.text("mlp_hidden_act", "relu2")
    if act not in ("relu2", "relu"):
        raise hf.error("mlp_hidden_act", f"unsupported {act!r}, expected relu2")
    # NoPE attention (transformers' NemotronHAttention is JambaAttention: no rotary)
    out.update(gated_mlp=False, activation="relu", norms_per_layer=1, position="none")
    if not hf.has("head_dim") and hf.has("attention_head_dim"):
        out["head_dim"] = hf.integer("attention_head_dim")
    heads, head_dim = hf.integer("mamba_num_heads"), hf.integer("mamba_head_dim")
    out["mamba"] = {"d_inner": heads * head_dim, "head_dim": head_dim,
                    "d_state": hf.integer("ssm_state_size"),
                    "n_groups": _either(hf, "n_groups", "mamba_n_groups", 8),
                    "d_conv": _either(hf, "conv_kernel", "mamba_d_conv", 4),
                    "chunk_size": _either(hf, "chunk_size", "mamba_chunk_size", 256),
                    "conv_bias": hf.flag("use_conv_bias", hf.flag("mamba_conv_bias", True))}


def falcon_h1(hf: Fields, out: dict[str, Any]) -> None:
    """Falcon-H1: every layer runs attention and a Mamba-2 mixer in parallel on one normed
    input (``layers_block_type`` all "hybrid"), then a SwiGLU MLP. Mamba-2 of
    ``mamba_d_ssm`` (else ``mamba_expand`` x d) in ``mamba_n_heads`` heads of
    ``mamba_d_head`` ("auto": d_ssm / heads), ``mamba_d_state``, ``mamba_n_groups``,
    ``mamba_d_conv``, ``mamba_chunk_size``, with or without its gated RMSNorm
    (``mamba_rms_norm``, default false as in transformers' ``FalconH1Config``; the norm's
    place, ``mamba_norm_before_gate``, costs the same). The muP multipliers
    (``*_multiplier(s)``) are scalings folded into existing passes and cost nothing here."""
    if hf.raw("attn_layer_indices", None) is not None:
        raise hf.error("attn_layer_indices", "attention on only some layers is not modelled "
                       "for Falcon-H1; expected null")
    for key in ("mamba_proj_bias", "projectors_bias", "mlp_bias"):
        if hf.flag(key, False):
            raise hf.error(key, "biased projections are not modelled for Falcon-H1")
    heads = hf.integer("mamba_n_heads")
    inner = hf.integer("mamba_d_ssm") if hf.raw("mamba_d_ssm", None) is not None \
        else hf.integer("mamba_expand", 2) * out["d_model"]
    head = inner // heads if hf.raw("mamba_d_head", "auto") == "auto" \
        else hf.integer("mamba_d_head")
    if head * heads != inner:
        raise hf.error("mamba_n_heads", f"expected heads x mamba_d_head = {inner}, got "
                       f"{heads} x {head}")
    out["mamba"] = {"d_inner": inner, "head_dim": head,
                    "d_state": hf.integer("mamba_d_state", 256),
                    "n_groups": hf.integer("mamba_n_groups", 1),
                    "d_conv": hf.integer("mamba_d_conv", 4),
                    "chunk_size": hf.integer("mamba_chunk_size", 256),
                    "conv_bias": hf.flag("mamba_conv_bias", True),
                    "rms_norm": hf.flag("mamba_rms_norm", False), "parallel": True,
                    # vLLM's mamba_ssm_cache_dtype "auto": the model's (bfloat16) dtype
                    "state_dtype": "bf16"}


def _either(hf: Fields, key: str, alias: str, default: int) -> int:
    """``key`` (the hub config's name), else ``alias`` (the constructor's), else default."""
    return hf.integer(key) if hf.has(key) else hf.integer(alias, default)


def qwen3_next(hf: Fields, out: dict[str, Any]) -> None:
    """Qwen3-Next: Gated DeltaNet layers (``linear_num_value_heads`` /
    ``linear_num_key_heads`` of ``linear_value_head_dim`` / ``linear_key_head_dim``, conv
    ``linear_conv_kernel_dim``) and gated full attention on every
    ``full_attention_interval``-th layer (or ``layer_types``); Qwen3-MoE experts plus a
    shared expert of ``shared_expert_intermediate_size``. The MTP layer is not counted."""
    layers = out["n_layers"]
    if hf.has("layer_types"):
        kinds = _kinds(hf, "layer_types", hf.raw("layer_types"), _LINEAR_TYPES, layers)
    else:
        every = hf.integer("full_attention_interval", 4)
        kinds = ["global" if (i + 1) % every == 0 else "linear" for i in range(layers)]
    set_pattern(hf, out, kinds)
    out.setdefault("attention", {})["output_gate"] = True
    out["qk_norm"] = "rms"
    qwen3_moe(hf, out)
    shared = hf.integer("shared_expert_intermediate_size", 0, minimum=0)
    width = out["moe"]["expert_intermediate_size"]
    if shared % width:
        raise hf.error("shared_expert_intermediate_size",
                       f"expected a multiple of moe_intermediate_size ({width}), got {shared}")
    out["moe"]["n_shared_experts"] = shared // width
    out["moe"]["shared_expert_gate"] = shared > 0
    out["linear_attention"] = {"kind": "gated_deltanet",
                               "n_heads": hf.integer("linear_num_value_heads"),
                               "n_k_heads": hf.integer("linear_num_key_heads"),
                               "head_k_dim": hf.integer("linear_key_head_dim"),
                               "head_v_dim": hf.integer("linear_value_head_dim"),
                               "d_conv": hf.integer("linear_conv_kernel_dim", 4),
                               "chunk_size": _DELTANET_CHUNK}


def minimax(hf: Fields, out: dict[str, Any]) -> None:
    """MiniMax-Text-01: lightning attention (``attn_type_list`` 0, or ``layer_types``
    linear_attention) with the softmax layers' heads and ``head_dim``, blocks of
    ``block_size``; every layer ``num_local_experts`` MoE of ``intermediate_size``."""
    layers = out["n_layers"]
    if hf.has("attn_type_list"):
        kinds = _kinds(hf, "attn_type_list", hf.raw("attn_type_list"), _MINIMAX, layers)
    else:
        kinds = _kinds(hf, "layer_types", hf.raw("layer_types"), _LINEAR_TYPES, layers)
    set_pattern(hf, out, kinds)
    if hf.integer("shared_intermediate_size", 0, minimum=0):
        raise hf.error("shared_intermediate_size", "shared experts are not modelled for "
                       "MiniMax; expected 0")
    heads = out["n_heads"]
    head_dim = out.get("head_dim") or out["d_model"] // heads
    out["linear_attention"] = {"kind": "lightning", "n_heads": heads, "n_k_heads": heads,
                               "head_k_dim": head_dim, "head_v_dim": head_dim,
                               "chunk_size": hf.integer("block_size", 256)}
    out["moe"] = {"n_experts": hf.integer("num_local_experts"),
                  "top_k": hf.integer("num_experts_per_tok"),
                  "expert_intermediate_size": out["intermediate_size"]}


def zamba2_keys(data: dict[str, Any]) -> dict[str, Any]:
    """A zamba2 config.json in today's key names: Zyphra's earlier ones renamed
    (``_ZAMBA2_SPELLING``) where today's is absent, and the MLP width transformers gives a
    config without one (4 x hidden_size)."""
    out = dict(data)
    for old, new in _ZAMBA2_SPELLING.items():
        if old in out and out.get(new) is None:
            out[new] = out.pop(old)
    if out.get("intermediate_size") is None and isinstance(out.get("hidden_size"), int):
        out["intermediate_size"] = 4 * out["hidden_size"]
    return out


def zamba2(hf: Fields, out: dict[str, Any]) -> None:
    """Zamba2: every layer a Mamba-2 mixer (``mamba_expand`` x d in ``n_mamba_heads``, else
    heads of ``mamba_headdim``; ``mamba_d_state``, ``mamba_ngroups``, ``mamba_d_conv``,
    ``chunk_size``) with one pre-norm; the "hybrid" layers of ``layers_block_type`` first
    run one of ``num_mem_blocks`` shared blocks in turn, multi-head attention of head_dim
    2 d / heads over the 2 d concat (rotary when ``use_mem_rope``) and the gated MLP, with
    ``adapter_rank`` adapters: q/k/v ones when ``use_shared_attention_adapter``, the gate_up
    one always (transformers' and vLLM's Zamba2MLP build it whatever
    ``use_shared_mlp_adapter`` says; Zyphra's earlier ``use_shared_block_lora``)."""
    layers, d = out["n_layers"], out["d_model"]
    calls = _kinds(hf, "layers_block_type", hf.raw("layers_block_type"), _ZAMBA2, layers)
    ids = [i for i, call in enumerate(calls) if call]
    if hf.has("hybrid_layer_ids") and hf.raw("hybrid_layer_ids") != ids:
        raise hf.error("hybrid_layer_ids", f"expected the hybrid layers of layers_block_type "
                       f"{ids}, got {hf.raw('hybrid_layer_ids')}")
    if hf.flag("add_bias_linear", False):
        raise hf.error("add_bias_linear", "biased projections are not modelled for Zamba2")
    if (2 * d) % out["n_heads"]:
        raise hf.error("num_attention_heads", f"expected a divisor of 2 x hidden_size "
                       f"({2 * d}), got {out['n_heads']}")
    inner = hf.integer("mamba_expand", 2) * d
    heads = hf.integer("n_mamba_heads") if hf.has("n_mamba_heads") \
        else inner // hf.integer("mamba_headdim", 64)
    if inner % heads:
        raise hf.error("n_mamba_heads", f"expected a divisor of mamba_expand x hidden_size "
                       f"({inner}), got {heads}")
    set_pattern(hf, out, ["mamba"] * layers)
    out.update(head_dim=2 * d // out["n_heads"], norms_per_layer=1,
               tie_embeddings=hf.flag("tie_word_embeddings", True),
               position="rope" if hf.flag("use_mem_rope", False) else "none")
    if not hf.has("hidden_act"):
        out["activation"] = "gelu"                    # Zamba2Config's default
    if hf.flag("use_long_context", False):            # Zamba2Config: a 16,384 context
        out["max_position_embeddings"] = 16384
    out["mamba"] = {"d_inner": inner, "head_dim": inner // heads,
                    "d_state": hf.integer("mamba_d_state", 64),
                    "n_groups": hf.integer("mamba_ngroups", 1),
                    "d_conv": hf.integer("mamba_d_conv", 4),
                    "chunk_size": hf.integer("chunk_size", 256),
                    "conv_bias": hf.flag("use_conv_bias", True),
                    # vLLM's mamba_ssm_cache_dtype "auto": the model's (bfloat16) dtype
                    "state_dtype": "bf16"}
    out["shared_block"] = {"n_blocks": hf.integer("num_mem_blocks", 1), "layers": ids,
                           "adapter_rank": hf.integer("adapter_rank", 128),
                           "attention_adapters": hf.flag("use_shared_attention_adapter", False),
                           "mlp_adapters": hf.flag("use_shared_block_lora", True)}


def kimi_linear(hf: Fields, out: dict[str, Any]) -> None:
    """Kimi-Linear (the hub's ``configuration_kimi.py`` ``KimiLinearConfig``; vLLM
    ``kimi_linear.py``): KDA on the 1-based ``linear_attn_config.kda_layers``, MLA (the
    DeepSeek keys) on its ``full_attn_layers``, the two together covering every layer once;
    KDA of ``num_heads`` x ``head_dim`` for q, k and v, conv ``short_conv_kernel_size``,
    its state fp32 (vLLM ``kda_state_dtype``); MLA without rotary when ``mla_use_nope``;
    ``num_experts`` routed experts (``num_experts_per_token``, ``num_shared_experts`` of
    ``moe_intermediate_size``) after ``first_k_dense_replace`` dense layers; the context
    ``model_max_length`` where ``max_position_embeddings`` is absent."""
    linear = hf.sub("linear_attn_config")
    set_pattern(hf, out, _kimi_kinds(linear, out["n_layers"]))
    deepseek(hf, out)
    if hf.flag("mla_use_nope", False):
        out["position"] = "none"
    if out.get("max_position_embeddings") is None and hf.has("model_max_length"):
        out["max_position_embeddings"] = hf.integer("model_max_length")
    if linear.flag("use_full_rank_gate", False):
        raise linear.error("use_full_rank_gate", "a full-rank KDA gate is not modelled; "
                           "expected false (the low-rank f_a / f_b pair)")
    heads, dim = linear.integer("num_heads"), linear.integer("head_dim")
    out["linear_attention"] = {"kind": "kda", "n_heads": heads, "n_k_heads": heads,
                               "head_k_dim": dim, "head_v_dim": dim,
                               "d_conv": linear.integer("short_conv_kernel_size", 4),
                               "chunk_size": _DELTANET_CHUNK, "state_dtype": "fp32"}
    if hf.integer("moe_layer_freq", 1) != 1:
        raise hf.error("moe_layer_freq", "only 1 (every layer after the dense ones) is "
                       "supported")
    if hf.has("num_experts"):
        groups = hf.integer("num_expert_group", 1)
        out["moe"] = {"n_experts": hf.integer("num_experts"),
                      "top_k": hf.integer("num_experts_per_token"),
                      "expert_intermediate_size": hf.integer("moe_intermediate_size"),
                      "n_shared_experts": hf.integer("num_shared_experts", 0, minimum=0),
                      "first_dense_layers": hf.integer("first_k_dense_replace", 0,
                                                       minimum=0),
                      "n_groups": groups, "topk_groups": hf.integer("topk_group", groups)}


def _kimi_kinds(linear: Fields, layers: int) -> list[str]:
    """Each layer's kind from the 1-based ``kda_layers`` (linear) and ``full_attn_layers``
    (global); a list that is not of layer numbers, or two that leave a layer out or name
    one twice, is an error naming the key."""
    lists = {}
    for key in ("kda_layers", "full_attn_layers"):
        got = linear.raw(key)
        if not isinstance(got, list) or any(
                isinstance(i, bool) or not isinstance(i, int) or not 1 <= i <= layers
                for i in got):
            raise linear.error(key, f"expected a list of 1-based layer numbers up to "
                               f"num_hidden_layers ({layers})")
        lists[key] = got
    kda, full = lists["kda_layers"], lists["full_attn_layers"]
    both = sorted(set(kda) & set(full)) or sorted({i for i in kda if kda.count(i) > 1}
                                                  | {i for i in full if full.count(i) > 1})
    if both:
        raise linear.error("full_attn_layers", f"layer {both[0]} (1-based) is listed twice "
                           f"between kda_layers and full_attn_layers; expected each once")
    missing = sorted(set(range(1, layers + 1)) - set(kda) - set(full))
    if missing:
        raise linear.error("kda_layers", f"layer {missing[0]} (1-based) is in neither "
                           f"kda_layers nor full_attn_layers; expected every layer once")
    return ["linear" if i + 1 in set(kda) else "global" for i in range(layers)]
