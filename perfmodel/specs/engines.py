"""Serving engines on one device: the ``calibration:`` provenance block and the ``engines:``
block of a hardware YAML (perfmodel/hardware/README.md).

A device's top-level ``efficiency:`` describes one engine's kernels (its ``calibration.engine``,
vLLM when it names none). ``engines.<name>`` lays another engine's measured differences over
it: a partial ``efficiency:`` (a key given replaces the top-level one; a per-kind mapping
such as ``kernel_latency_by_kind`` merges kind by kind), and that engine's own
``calibration:`` and ``uncertainty:``. ``view`` turns a file's mapping into the mapping of
one engine, which the loader then reads like any file; asking for an engine the file has no
block for prices the top-level kernels and says so in one warning line.
"""

from __future__ import annotations

from dataclasses import fields as dataclass_fields
from typing import Any

from perfmodel.specs.errors import SpecError, did_you_mean
from perfmodel.specs.fields import Fields
from perfmodel.specs.hardware import Efficiency
from perfmodel.specs.kinds import ERROR_CLASSES

ENGINES = ("vllm", "sglang", "trtllm")
LABELS = {"vllm": "vLLM", "sglang": "SGLang", "trtllm": "TensorRT-LLM"}
DEFAULT_ENGINE = "vllm"
# the blocks an engine may give; each replaces the top-level block of the same name
ENGINE_BLOCKS = ("efficiency", "calibration", "uncertainty")
# efficiency keys holding a mapping, merged key by key under an engine's partial override
_MAPPINGS = ("kernel_memory_fraction", "kernel_unit_bytes_per_s", "kernel_latency_by_kind",
             "dequant")
# efficiency keys naming one engine's own attention kernels (cost.attention_kernels): an
# engine block never inherits them from the top level, whose kernels are another engine's
_OWN_KERNELS = ("attention_backend", "attention_kernels", "attention_q_cast",
                "attention_q_cast_fused", "attention_latent_kernel")
# the tile rules of the quantized GEMM rows (cost.kernel_tiles): they go with the rows, so
# an engine block that brings its own gemm_kernels does not inherit the top level's
_ROW_TILES = ("gemm_kernels", "gemm_kernel_tiles")
_TEXT = ("source", "engine_version", "method", "note", "hostname", "device", "device_name",
         "cpu_model", "torch_version", "python_version", "measured_at", "command", "suite",
         "timing")
# a fit's own summary per error class (``cost.error_class``), or over every class ("all")
_PER_CLASS = ("rows", "held_out_median_abs_error")
CALIBRATION_KEYS = (*_TEXT, "engine", "fitted", "not_fitted", *_PER_CLASS, "threads",
                    "load_average_1min", "fit_median_abs_error", "fit_shapes", "layer_overhead")
_EFFICIENCY_KEYS = tuple(f.name for f in dataclass_fields(Efficiency))


def check_engine(engine: object, option: str = "--engine") -> str:
    """``engine`` when it is one of ``ENGINES``, else a one-line SpecError naming ``option``."""
    if engine not in ENGINES:
        raise SpecError(f"{option}: expected one of {', '.join(ENGINES)}, got {engine!r}"
                        f"{did_you_mean(str(engine), ENGINES)}")
    return str(engine)


def calibration(f: Fields | None, engine: str | None = None) -> dict | None:
    """The ``calibration:`` block checked and kept as a mapping (None when absent): how the
    efficiency figures were measured or fitted. ``engine``: the engine whose block this is
    (its ``engine`` key, when given, must name it)."""
    if f is None:
        return None
    for key in _TEXT:
        f.text(key, None)
    named = f.text("engine", None, ENGINES)
    if engine is not None and named not in (None, engine):
        raise f.error("engine", f"expected {engine} (the block is engines.{engine}'s), "
                      f"got {named!r}")
    _fitted(f)
    _text_list(f, "not_fitted")
    _text_list(f, "fit_shapes")
    rows = f.sub("rows", required=False)
    if rows is not None:
        for key in _classes(rows):
            rows.integer(key, minimum=0)
    errors = f.sub("held_out_median_abs_error", required=False)
    if errors is not None:
        for key in _classes(errors):
            errors.quantity(key, "number", positive=False)
    f.integer("threads", None, minimum=0)
    for key in ("load_average_1min", "fit_median_abs_error"):
        if f.has(key):
            f.quantity(key, "number", positive=False)
        f.used.add(key)
    overhead = f.raw("layer_overhead", None)
    if overhead is not None and not isinstance(overhead, dict):
        raise f.error("layer_overhead", f"expected a mapping, got {overhead!r}")
    f.finish()
    return dict(f.data)


def _classes(f: Fields) -> list[str]:
    """The keys of a per-class mapping, each an error class or ``all``."""
    allowed = (*ERROR_CLASSES, "all")
    for key in f.data:
        if key not in allowed:
            raise f.error(str(key), f"expected an error class: {', '.join(allowed)}"
                          f"{did_you_mean(str(key), allowed)}")
    return list(f.data)


def _text_list(f: Fields, key: str) -> list[str] | None:
    value = f.raw(key, None)
    if value is not None and (not isinstance(value, list)
                              or not all(isinstance(v, str) for v in value)):
        raise f.error(key, f"expected a list of text, got {value!r}")
    return value


def _fitted(f: Fields) -> None:
    """``fitted``: the efficiency keys a fit set (a list; ``key.kind`` for a per-kind one),
    or ``perfmodel calibrate``'s mapping of each fitted parameter to its value."""
    value = f.raw("fitted", None)
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str) or isinstance(v, bool) or not isinstance(v, (int, float)):
                raise f.error(f"fitted.{k}", f"expected a number, got {v!r}")
        return
    if value is None:
        return
    for key in _text_list(f, "fitted"):
        if key.split(".", 1)[0] not in _EFFICIENCY_KEYS:
            raise f.error("fitted", f"expected efficiency keys, got {key!r}"
                          f"{did_you_mean(key.split('.', 1)[0], _EFFICIENCY_KEYS)}")


def base_engine(data: dict) -> str:
    """The engine the top-level efficiency describes: its calibration's, else vLLM."""
    cal = data.get("calibration")
    named = cal.get("engine") if isinstance(cal, dict) else None
    return named if named in ENGINES else DEFAULT_ENGINE


def listed(data: dict, file: str) -> dict[str, dict]:
    """The ``engines:`` block checked for shape: {engine: its mapping of blocks}."""
    block = data.get("engines")
    if block is None:
        return {}
    f = Fields(block, file, "engines")
    out = {}
    for name in list(f.data):
        if name not in ENGINES:
            raise f.error(str(name), f"expected an engine: {', '.join(ENGINES)}"
                          f"{did_you_mean(str(name), ENGINES)}")
        sub = f.sub(name)
        for key in ENGINE_BLOCKS:
            sub.raw(key, None)
        sub.text("note", None)
        sub.finish()
        out[name] = sub.data
    if not out:
        raise f.error("", "expected at least one engine block (or leave engines out)")
    return out


def view(data: dict, file: str, engine: str) -> tuple[dict, dict[str, str], str]:
    """(the file's mapping as ``engine`` runs it, the path each replaced block is reported
    under in errors, a one-line warning or "").

    With an ``engines.<engine>`` block, its efficiency is laid over the top-level one and its
    calibration and uncertainty replace the top-level ones (absent: none; the top-level
    ones describe another engine's kernels). Without one, the top-level blocks stand, with
    a warning unless they are that engine's own."""
    blocks = listed(data, file)
    out = {k: v for k, v in data.items() if k != "engines"}
    if engine not in blocks:
        base = base_engine(data)
        note = "" if engine == base else \
            f"{data.get('name', file)} has no {engine} calibration: {LABELS[base]}'s " \
            "kernels priced"
        return out, {}, note
    chosen, renamed = blocks[engine], {}
    out.pop("calibration", None)
    out.pop("uncertainty", None)
    for key in ENGINE_BLOCKS:
        if chosen.get(key) is None:
            continue
        renamed[key] = f"engines.{engine}.{key}"
        out[key] = merge_efficiency(data.get("efficiency"), chosen[key]) \
            if key == "efficiency" else chosen[key]
    return out, renamed, ""


def merge_efficiency(base: Any, over: Any) -> Any:
    """``over`` laid on ``base`` (two efficiency mappings): a key of ``over`` replaces the
    base's, a per-kind mapping merges kind by kind; the base's note goes when ``over``
    brings its own source, its attention backend keys (``_OWN_KERNELS``) always go, and
    its GEMM tile rules where ``over`` brings its own quantized GEMM rows (``_ROW_TILES``).
    Anything but two mappings is returned as ``over`` (the reader reports it)."""
    if not isinstance(base, dict) or not isinstance(over, dict):
        return over
    rows, tiles = _ROW_TILES
    out = {k: v for k, v in base.items() if not (k == "note" and "source" in over)
           and k not in _OWN_KERNELS and not (k == tiles and rows in over)}
    for key, value in over.items():
        if key in _MAPPINGS and isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = out[key] | value
        else:
            out[key] = value
    return out
