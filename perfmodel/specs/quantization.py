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
  floats with one 8-bit (E8M0) shared scale per 32 elements;
- ``modelopt`` (NVIDIA Model Optimizer; vLLM ``ModelOptFp8Config`` / ``ModelOptNvFp4Config``,
  read from ``hf_quant_config.json`` beside a config.json too): ``quant_algo`` FP8 | NVFP4 |
  MIXED_PRECISION with ``quantized_layers`` {module: {quant_algo, group_size}},
  ``exclude_modules`` (or ``ignore``) globs (``specs.quant_groups``).

Each linear class gets one format (``specs.formats``) or stays 16-bit; a checkpoint whose
classes differ (NVFP4 experts beside an fp8 attention) keeps the second format per class
(``Quantization.formats``). Which classes a skip list names: ``specs.quant_modules``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from perfmodel.specs import quant_groups
from perfmodel.specs.fields import Fields
from perfmodel.specs.model import Quantization
from perfmodel.specs.quant_modules import classes, module_names, patterns
from perfmodel.specs.quant_record import Scheme, record

_FP32, _HALF = 4.0, 2.0


def quantization_from_hf(q: Fields, out: dict[str, Any]) -> Quantization | None:
    """Read ``quantization_config`` (``q``) of a config translated into ``out`` (the
    perfmodel/models/README.md schema); None when it quantizes no weights."""
    method = q.text("quant_method", "bitsandbytes" if q.has("load_in_4bit")
                    or q.has("load_in_8bit") else ...)
    if method not in METHODS:
        raise q.error("quant_method", f"unsupported {method!r}, expected one of "
                      f"{', '.join(METHODS)} (or drop quantization_config and pass "
                      "--weights-format)")
    names = module_names(out)
    if method in quant_groups.READERS:
        return quant_groups.READERS[method](q, names)
    scheme = _SCHEMES[method](q)
    key = next((k for k in _SKIP_KEYS if q.has(k)), _SKIP_KEYS[0])
    kept = classes(q, key, patterns(q, key), names)
    head = method == "gptq" and q.flag("lm_head", False) and not out.get("tie_embeddings")
    per_class = {c: None if kept[c] else scheme for c in kept}
    acts = "fp8" if method == "fp8" and q.text("activation_scheme", "dynamic") else None
    return record(q, method, per_class, names, head, acts, named=method != "bitsandbytes")


def _fp8(q: Fields) -> Scheme:
    # torch's dtype names (float8_e4m3fn: MiniMax-M2's config) say the same formats
    q.text("fmt", "e4m3", ("e4m3", "e5m2", "float8_e4m3fn", "float8_e5m2"))
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
METHODS = (*_SCHEMES, "compressed-tensors", "modelopt")
_SKIP_KEYS = ("modules_to_not_convert", "ignored_layers", "llm_int8_skip_modules")
