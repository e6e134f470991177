"""Checkpoints whose ``quantization_config`` gives a scheme per group of modules:
compressed-tensors (llm-compressor; vLLM ``CompressedTensorsConfig``) and NVIDIA Model
Optimizer (``modelopt``; vLLM ``ModelOptFp8Config`` / ``ModelOptNvFp4Config``,
TensorRT-LLM's ``QuantConfig``).

- compressed-tensors: ``config_groups`` of ``targets`` and ``weights`` {``num_bits``,
  ``type``, ``strategy``, ``group_size``, ``block_structure``, ``symmetric``} (a
  ``group_size`` without a ``strategy`` is a group strategy, as ModelOpt's NVFP4 exports
  write it), ``input_activations`` (W8A8 / W4A4), ``ignore`` (``re:`` regexes or globs);
- modelopt: ``quant_algo`` FP8 (per-tensor weight and input scales), NVFP4 (E2M1 in
  groups of ``group_size`` 16 with fp8 E4M3 scales) or MIXED_PRECISION with
  ``quantized_layers`` {module prefix: {``quant_algo``, ``group_size``}};
  ``exclude_modules`` (``ignore`` in config.json exports) are globs. In
  ``hf_quant_config.json`` the same keys sit under ``quantization`` (``specs.load`` reads
  that file beside a config.json that has no ``quantization_config``).

Each linear class gets one scheme or none (16-bit); ``quant_record.record`` makes the
record, with the classes in another format than the main one kept per class.
"""

from __future__ import annotations

from collections.abc import Callable

from perfmodel.specs.fields import Fields
from perfmodel.specs.formats import weight_format
from perfmodel.specs.model import QUANT_CLASSES, Quantization
from perfmodel.specs.quant_modules import classes, matches, patterns
from perfmodel.specs.quant_record import Scheme, record

_HALF = 2.0
_CT_TYPES = {("int", 4): "int4", ("int", 8): "int8", ("float", 8): "fp8", ("float", 4): "fp4"}
_MODELOPT = {"FP8": "fp8-tensor", "NVFP4": "nvfp4"}
Names = dict[str, list[str]]


def compressed_tensors(q: Fields, names: Names) -> Quantization | None:
    """Each config group's weights scheme over the classes its ``targets`` name, less
    ``ignore``; a class two groups name with different schemes is an error."""
    groups = q.sub("config_groups")
    per_class: dict[str, Scheme | None] = {}
    acts = None
    ignored = classes(q, "ignore", patterns(q, "ignore"), names)
    for name in list(groups.data):
        g = groups.sub(name)
        w = g.sub("weights", required=False)
        if w is None:
            continue
        scheme = _ct_scheme(w)
        acts = acts or _ct_acts(g)
        for c, hit in classes(g, "targets", patterns(g, "targets"), names).items():
            if hit and not ignored.get(c):
                if per_class.get(c, scheme) != scheme:
                    raise g.error("targets", f"the {c} modules are named by two config "
                                  "groups with different weights schemes")
                per_class[c] = scheme
    return record(groups, "compressed-tensors", per_class, names, acts=acts)


def _ct_scheme(w: Fields) -> Scheme:
    kind, bits = w.text("type", "int", ("int", "float")), w.integer("num_bits")
    if (kind, bits) not in _CT_TYPES:
        raise w.error("num_bits", f"expected 4 or 8 (with type {kind}), got {bits}")
    dtype = _CT_TYPES[kind, bits]
    grouped = w.raw("group_size", None) is not None
    strategy = w.text("strategy", "group" if grouped else "tensor",
                      ("tensor", "channel", "group", "block", "tensor_group", "token"))
    zero = 0.0 if w.flag("symmetric", True) else bits / 8
    if strategy in ("group", "tensor_group"):
        scale = 1.0 if kind == "float" and bits == 4 else _HALF    # NVFP4 / MXFP4: 8 bits
        return dtype, w.integer("group_size"), scale + zero
    if strategy == "block":
        block = w.raw("block_structure")
        if not isinstance(block, list) or len(block) != 2 or \
                not all(isinstance(b, int) and b > 0 for b in block):
            raise w.error("block_structure", f"expected [rows, cols], got {block!r}")
        return dtype, block[0] * block[1], _HALF + zero
    return dtype, None, _HALF + zero            # per tensor or per channel: negligible


def _ct_acts(g: Fields) -> str | None:
    """The dtype a group quantizes its activations to (None: weight-only)."""
    a = g.sub("input_activations", required=False)
    if a is None or not a.data:
        return None
    return _CT_TYPES.get((a.text("type", "int", ("int", "float")), a.integer("num_bits")))


def modelopt(q: Fields, names: Names) -> Quantization | None:
    """A ModelOpt export: one ``quant_algo`` for every module not excluded, or
    MIXED_PRECISION's per-module ``quantized_layers``."""
    algo = q.text("quant_algo", choices=(*_MODELOPT, "MIXED_PRECISION"))
    key = "exclude_modules" if q.has("exclude_modules") else "ignore"
    excluded = classes(q, key, patterns(q, key), names)
    if algo != "MIXED_PRECISION":
        scheme = weight_format(_MODELOPT[algo]).scheme
        per_class = {c: None if excluded[c] else scheme for c in excluded}
        return record(q, "modelopt", per_class, names, acts=_acts(algo))
    layers = q.sub("quantized_layers")
    per_class = {}
    for cls in QUANT_CLASSES:
        found = {_layer_scheme(layers.sub(k)) for k in layers.data
                 if any(_under(k, n) for n in names[cls])}
        if len(found) > 1:
            raise layers.error("", f"gives the {cls} modules {len(found)} different "
                               "quant_algo; perfmodel models one format per linear class")
        if names[cls]:
            per_class[cls] = None if excluded[cls] or not found else found.pop()
    acts = next((_acts(layers.sub(k).text("quant_algo")) for k in layers.data), None)
    return record(layers, "modelopt", per_class, names, acts=acts)


def _under(key: str, name: str) -> bool:
    """Whether module ``name`` is ``key`` or inside it (a key may be a glob)."""
    return name == key or name.startswith(key + ".") or ("*" in key and matches(key, name))


def _layer_scheme(layer: Fields) -> Scheme:
    algo = layer.text("quant_algo", choices=tuple(_MODELOPT))
    return weight_format(_MODELOPT[algo]).scheme


def _acts(algo: str) -> str:
    """ModelOpt's FP8 and NVFP4 quantize the activations too (static input scales)."""
    return "fp8" if algo == "FP8" else "fp4"


READERS: dict[str, Callable[[Fields, Names], Quantization | None]] = {
    "compressed-tensors": compressed_tensors, "modelopt": modelopt}
