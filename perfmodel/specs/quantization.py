"""A Hugging Face ``quantization_config`` read into a ``Quantization`` record.

The key names follow the writers and readers of these configs:
- ``fp8`` (DeepSeek-V3; transformers ``FineGrainedFP8Config``, vLLM ``Fp8Config``): ``fmt``,
  ``weight_block_size`` [rows, cols] with one fp32 ``weight_scale_inv`` per block,
  ``activation_scheme``, ``modules_to_not_convert`` (vLLM: ``ignored_layers``);
- ``awq`` (transformers ``AwqConfig``, vLLM ``AWQConfig``): ``bits`` (``w_bit``),
  ``group_size`` (``q_group_size``), ``zero_point``, ``modules_to_not_convert``;
- ``gptq`` (transformers ``GPTQConfig``, vLLM ``GPTQConfig``): ``bits``, ``group_size`` (-1:
  per channel), ``sym``; the checkpoint stores a packed zero point per group either way;
  ``lm_head`` true: the LM head is quantized too (vLLM ``GPTQConfig.lm_head_quantized`` gives
  ``ParallelLMHead`` the GPTQ linear method), recorded unless the head is the embedding
  table (``tie_word_embeddings``: vLLM skips a tied model's ``lm_head.*`` tensors and
  shares the 16-bit embedding, ``Qwen2ForCausalLM.load_weights``);
- ``compressed-tensors`` (llm-compressor; vLLM ``CompressedTensorsConfig``): ``config_groups``
  of ``targets`` and ``weights`` {``num_bits``, ``type``, ``strategy``, ``group_size``,
  ``block_structure``, ``symmetric``}, ``ignore`` (``re:`` prefix: a regex);
- ``bitsandbytes`` (transformers ``BitsAndBytesConfig``): ``load_in_4bit`` / ``load_in_8bit``,
  ``bnb_4bit_quant_type`` (nf4 | fp4), ``bnb_4bit_use_double_quant``,
  ``llm_int8_skip_modules``; 4-bit blocks of 64 weights with an fp32 absmax each (double
  quantization: an 8-bit absmax plus an fp32 scale per 256 of them);
- ``mxfp4`` (gpt-oss; transformers ``Mxfp4Config``): ``modules_to_not_convert``; 4-bit
  floats with one 8-bit (E8M0) shared scale per 32 elements.

Which linear classes stay at 16 bits is decided by matching the skip patterns against the
model's module names (``model.layers.N.self_attn.q_proj`` ...) the way the engines do: a
substring (vLLM ``is_layer_skipped_awq``), a regex matched at the start (transformers
``should_convert_module``) or ``re:``-prefixed (compressed-tensors). A pattern that keeps only
some modules of a class (one layer, one projection) is an error: one dtype per class here.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from perfmodel.specs.fields import Fields
from perfmodel.specs.model import LINEAR_CLASSES, Quantization

Scheme = tuple[str, int | None, float]       # weights dtype, group size, scale bytes per group
_FP32, _HALF = 4.0, 2.0


def quantization_from_hf(q: Fields, out: dict[str, Any]) -> Quantization | None:
    """Read ``quantization_config`` (``q``) of a config translated into ``out`` (the
    perfmodel/models/README.md schema); None when it quantizes no weights."""
    method = q.text("quant_method", "bitsandbytes" if q.has("load_in_4bit")
                    or q.has("load_in_8bit") else ...)
    if method not in METHODS:
        raise q.error("quant_method", f"unsupported {method!r}, expected one of "
                      f"{', '.join(METHODS)} (or drop quantization_config and pass "
                      "--weights-dtype)")
    names = module_names(out)
    if method == "compressed-tensors":
        return _compressed_tensors(q, names)
    dtype, group, scale = _SCHEMES[method](q)
    key = next((k for k in _SKIP_KEYS if q.has(k)), _SKIP_KEYS[0])
    kept = _classes(q, key, _patterns(q, key), names)
    head = method == "gptq" and q.flag("lm_head", False) and not out.get("tie_embeddings")
    return _record(method, (dtype, group, scale), [c for c in kept if kept[c]], names, head)


def _record(method: str, scheme: Scheme, kept: list[str],
            names: dict[str, list[str]], lm_head: bool = False) -> Quantization:
    """The record, with an MoE router always at 16 bits: the engines build it unquantized
    whatever the config says (vLLM's Mixtral and DeepSeek gates: ``quant_config=None``)."""
    kept = [*kept, "router"] if names["router"] else kept
    return Quantization(method, *scheme, tuple(c for c in LINEAR_CLASSES if c in kept),
                        lm_head)


def _fp8(q: Fields) -> Scheme:
    q.text("fmt", "e4m3", ("e4m3", "e5m2"))
    block = q.raw("weight_block_size", None)
    if block is None:
        return "fp8", None, _FP32            # one scale per tensor
    if not isinstance(block, list) or len(block) != 2 or \
            not all(isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in block):
        raise q.error("weight_block_size", f"expected [rows, cols] of positive integers, "
                      f"got {block!r}")
    return "fp8", block[0] * block[1], _FP32


def _bits(q: Fields, keys: tuple[str, ...]) -> str:
    key = next((k for k in keys if q.has(k)), keys[0])
    bits = q.integer(key, 4)
    if bits not in (4, 8):
        raise q.error(key, f"expected 4 or 8 (the integer widths modelled), got {bits}")
    return f"int{bits}"


def _group(q: Fields, keys: tuple[str, ...], default: int | None = 128) -> int | None:
    key = next((k for k in keys if q.has(k)), keys[0])
    group = q.integer(key, default, minimum=-1)
    return None if group in (None, -1, 0) else group


def _awq(q: Fields) -> Scheme:
    dtype = _bits(q, ("bits", "w_bit"))
    zero = q.flag("zero_point", True)
    return dtype, _group(q, ("group_size", "q_group_size")), \
        _HALF + (_bits_of(dtype) / 8 if zero else 0.0)


def _gptq(q: Fields) -> Scheme:
    dtype = _bits(q, ("bits",))
    q.flag("sym", True)
    return dtype, _group(q, ("group_size",)), _HALF + _bits_of(dtype) / 8


def _bits_of(dtype: str) -> int:
    return int(dtype[-1])


def _bitsandbytes(q: Fields) -> Scheme:
    if q.flag("load_in_4bit", False):
        kind = q.text("bnb_4bit_quant_type", "nf4", ("nf4", "fp4"))
        double = q.flag("bnb_4bit_use_double_quant", False)
        # nf4 is a 4-bit code into a table of 16 values: stored and moved as int4
        return "fp4" if kind == "fp4" else "int4", 64, 1.0 + _FP32 / 256 if double else _FP32
    if q.flag("load_in_8bit", False):
        return "int8", None, _FP32           # LLM.int8: one fp32 scale per output row
    raise q.error("load_in_4bit", "expected load_in_4bit or load_in_8bit to be true")


def _mxfp4(q: Fields) -> Scheme:
    return "fp4", 32, 1.0


_SCHEMES: dict[str, Callable[[Fields], Scheme]] = {
    "fp8": _fp8, "awq": _awq, "gptq": _gptq, "bitsandbytes": _bitsandbytes, "mxfp4": _mxfp4}
METHODS = (*_SCHEMES, "compressed-tensors")
_SKIP_KEYS = ("modules_to_not_convert", "ignored_layers", "llm_int8_skip_modules")
_CT_TYPES = {("int", 4): "int4", ("int", 8): "int8", ("float", 8): "fp8", ("float", 4): "fp4"}


def _compressed_tensors(q: Fields, names: dict[str, list[str]]) -> Quantization | None:
    """One weights scheme over the ``targets`` of its config groups, less ``ignore``."""
    groups = q.sub("config_groups")
    schemes, targets = set(), []
    for name in list(groups.data):
        g = groups.sub(name)
        w = g.sub("weights", required=False)
        if w is not None:
            schemes.add(_ct_scheme(w))
            targets += _patterns(g, "targets")
    if not schemes:
        return None
    if len(schemes) > 1:
        raise groups.error("", f"{len(schemes)} different weights schemes; perfmodel models "
                           "one weights dtype per model")
    quantized = _classes(groups, "targets", targets, names)
    ignored = _classes(q, "ignore", _patterns(q, "ignore"), names)
    kept = [c for c in quantized if not quantized[c] or ignored[c]]
    return _record("compressed-tensors", schemes.pop(), kept, names)


def _ct_scheme(w: Fields) -> Scheme:
    kind, bits = w.text("type", "int", ("int", "float")), w.integer("num_bits")
    if (kind, bits) not in _CT_TYPES:
        raise w.error("num_bits", f"expected 4 or 8 (with type {kind}), got {bits}")
    dtype = _CT_TYPES[kind, bits]
    strategy = w.text("strategy", "tensor", ("tensor", "channel", "group", "block",
                                             "tensor_group", "token"))
    zero = 0.0 if w.flag("symmetric", True) else bits / 8
    if strategy in ("group", "tensor_group"):
        scale = 1.0 if kind == "float" and bits == 4 else _HALF    # NVFP4: fp8 scales
        return dtype, w.integer("group_size"), scale + zero
    if strategy == "block":
        block = w.raw("block_structure")
        if not isinstance(block, list) or len(block) != 2 or \
                not all(isinstance(b, int) and b > 0 for b in block):
            raise w.error("block_structure", f"expected [rows, cols], got {block!r}")
        return dtype, block[0] * block[1], _HALF + zero
    return dtype, None, _HALF + zero            # per tensor or per channel: negligible


def _patterns(q: Fields, key: str) -> list[str]:
    value = q.raw(key, []) or []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise q.error(key, f"expected a list of module names or patterns, got {value!r}")
    return value


def module_names(out: dict[str, Any]) -> dict[str, list[str]]:
    """The Hugging Face module names of each linear class of a translated config (the
    first and last expert of each MoE layer stand for all of them)."""
    layers, moe, mla = out["n_layers"], out.get("moe"), out.get("mla")
    if mla is not None:
        q = ["q_a_proj", "q_b_proj"] if mla.get("q_lora_rank") else ["q_proj"]
        attn = [*q, "kv_a_proj_with_mqa", "kv_b_proj", "o_proj"]
    else:
        attn = ["q_proj", "k_proj", "v_proj", "o_proj"]
    dense = ["gate_proj", "up_proj", "down_proj"]
    first = moe.get("first_dense_layers", 0) if moe else layers
    step = moe.get("layer_step", 1) if moe else 1
    names: dict[str, list[str]] = {c: [] for c in LINEAR_CLASSES}
    for i in range(layers):
        p = f"model.layers.{i}."
        names["attention"] += [f"{p}self_attn.{n}" for n in attn]
        if i < first or (i + 1) % step:
            names["mlp"] += [f"{p}mlp.{n}" for n in dense]
            continue
        block, mats = ("block_sparse_moe", ["w1", "w2", "w3"]) \
            if out["family"] == "mixtral" else ("mlp", dense)
        names["router"].append(f"{p}{block}.gate")
        names["experts"] += [f"{p}{block}.experts.{j}.{n}"
                             for j in sorted({0, moe["n_experts"] - 1}) for n in mats]
        if moe.get("n_shared_experts"):
            names["shared_experts"] += [f"{p}mlp.shared_experts.{n}" for n in dense]
    return names


def _matches(pattern: str, name: str) -> bool:
    if pattern == "Linear":                  # compressed-tensors: a module class
        return True
    if pattern.startswith("re:"):
        return re.match(pattern[3:], name) is not None
    if pattern in name:
        return True
    try:
        return re.match(pattern, name) is not None
    except re.error:
        return False


def _classes(q: Fields, key: str, patterns: list[str],
             names: dict[str, list[str]]) -> dict[str, bool]:
    """For each linear class the model has: whether ``patterns`` name all its modules.
    Naming only some of them is an error."""
    for p in patterns:
        if p.startswith("re:"):
            try:
                re.compile(p[3:])
            except re.error as exc:
                raise q.error(key, f"{p!r} is not a valid regex: {exc}") from None
    result = {}
    for cls, modules in names.items():
        hit = [n for n in modules if any(_matches(p, n) for p in patterns)]
        if hit and len(hit) < len(modules):
            raise q.error(key, f"names only some {cls} modules ({len(hit)} of "
                          f"{len(modules)}, e.g. {hit[0]!r}); perfmodel models one dtype "
                          "per linear class")
        if modules:
            result[cls] = bool(hit)
    return result
