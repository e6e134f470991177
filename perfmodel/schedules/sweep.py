"""Sweeps over model, device, batch, context and dtypes: pure functions returning columns.

A sweep point is exactly what ``perfmodel estimate`` predicts for the same flags (``batch``
sequences, a prompt of ``prompt_len`` tokens, ``gen_len`` generated tokens, decode summed
exactly). Each (model, device) pair is one vectorised ``estimate_many`` call over the grid
of the other axes, so 10^5 points take seconds (benchmarks/bench_core.py).

``sweep`` returns columns (name -> array, one entry per point; ``pandas.DataFrame(cols)``
makes the table): ``Estimates.columns`` (the scalars of ``estimate --format json``,
``workload_*``, ``tp``/``pp``/``ep``/``dp``, ``<phase>_*``) plus ``attention_kind``,
``context_len`` (= prompt + generated, the length the KV cache is sized for),
``workload_weights_format`` (when the sweep is over weights formats), and the time
per operator class: ``ttft_<class>_s`` (prefill) and ``tpot_<class>_s`` (mean decode step),
which sum to ``ttft_s`` and ``tpot_s`` (``tpot_<class>_s`` is NaN when gen_len is 1: there is
no decode step to split). ``rows`` turns columns into records for the figures.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import fields

import numpy as np

from perfmodel.cost.memory import (
    kv_bytes_of,
    kv_bytes_per_sequence,
    kv_bytes_per_token,
    memory_estimate,
)
from perfmodel.schedules.estimates import Estimates, estimate_many
from perfmodel.specs.errors import SpecError
from perfmodel.specs.formats import weight_format
from perfmodel.specs.hardware import Hardware
from perfmodel.specs.kinds import OP_CLASSES
from perfmodel.specs.model import Model
from perfmodel.specs.workload import Parallelism, Workload, Workloads

BLOCK_POINTS = 131_072    # points per block when a sweep is streamed to its CSV


def sweep(models: Sequence[Model], hardware: Sequence[Hardware], batches: Iterable[int],
          prompts: Iterable[int], base: Workload | None = None,
          weights_dtypes: Iterable[str] | None = None, kv_dtypes: Iterable[str] | None = None,
          plan: Parallelism | None = None, plans: Sequence[Parallelism] | None = None,
          levers: dict[str, Sequence] | None = None,
          speculations: Sequence[object] | None = None,
          weights_formats: Sequence[str] | None = None) -> dict[str, np.ndarray | list]:
    """Columns for the product model x hardware x plan x levers x weights dtype x kv dtype x
    prompt x batch (batch varies fastest). ``plans`` (default: ``[plan]``) are parallelism
    plans; ``speculations`` (``schedules.speculative.Speculation``, None for plain decode)
    one more dimension, after the plans; ``levers`` maps further workload fields
    (shared_prefix, prefix_hit_rate, expert_skew, weight_group_size, outlier_fraction,
    quantize_lm_head, kv_group_size, kv_scale_bytes, ...) to their values.
    ``weights_formats`` (names of ``specs.formats``) take the weights dtype's place:
    each sets the dtype, group size and scale bytes of its points, and adds the column
    ``workload_weights_format``.
    ``base`` supplies every other workload field (gen_len, act dtype, ...); the dtype lists
    default to its dtypes. Invalid workloads raise SpecError before any point is evaluated."""
    parts = list(sweep_blocks(models, hardware, batches, prompts, base, weights_dtypes,
                              kv_dtypes, plan, plans, levers, speculations, weights_formats,
                              block=0))
    return {k: concat([p[k] for p in parts]) for k in parts[0]}


def sweep_blocks(models: Sequence[Model], hardware: Sequence[Hardware],
                 batches: Iterable[int], prompts: Iterable[int], base: Workload | None = None,
                 weights_dtypes: Iterable[str] | None = None,
                 kv_dtypes: Iterable[str] | None = None, plan: Parallelism | None = None,
                 plans: Sequence[Parallelism] | None = None,
                 levers: dict[str, Sequence] | None = None,
                 speculations: Sequence[object] | None = None,
                 weights_formats: Sequence[str] | None = None,
                 block: int = BLOCK_POINTS) -> Iterator[dict[str, np.ndarray | list]]:
    """``sweep``'s columns, in its order, at most ``block`` points at a time (0: a
    whole (model, device, plan, speculation) grid each), so that a 10^6-point sweep can be
    written as it is computed: every point is priced alone, so blocks change no value."""
    base = base or Workload()
    formats = _check_formats(weights_formats, weights_dtypes, levers)
    axes = {**{k: list(v) for k, v in (levers or {}).items()},
            "weights_dtype": [weight_format(f).weights for f in formats]
            or list(weights_dtypes or [base.weights_dtype]),
            "kv_dtype": list(kv_dtypes or [base.kv_dtype]),
            "prompt_len": list(prompts), "batch": list(batches)}
    fixed = {k: v for k, v in _fields(base).items() if k not in axes}
    w = Workloads.grid(**fixed, **axes)     # the axes last, in this order: batch fastest
    names = None
    if formats:
        w, names = _formatted(w, formats, [len(v) for v in axes.values()],
                              list(axes).index("weights_dtype"))
    size = block or len(w)
    cuts = [(a, min(a + size, len(w))) for a in range(0, len(w), size)]
    for m in models:
        for hw in hardware:
            for p in plans or [plan]:
                for sp in speculations or [None]:
                    for a, b in cuts:
                        part = w if b - a == len(w) else w.take(np.arange(a, b))
                        yield _named(point_columns(estimate_many(hw, m, part, p, sp)),
                                     None if names is None else names[a:b])


_FORMAT_FIELDS = ("weight_group_size", "weight_scale_bytes")


def _check_formats(formats: Sequence[str] | None, weights_dtypes: Iterable[str] | None,
                   levers: dict[str, Sequence] | None) -> list[str]:
    """The weights formats as a list; SpecError for an unknown one, or for one beside the
    weights dtypes or a lever of the fields a format sets."""
    out = list(formats or [])
    for f in out:
        weight_format(f, "weights format")
    clash = [k for k in _FORMAT_FIELDS if k in (levers or {})]
    if out and (weights_dtypes is not None or clash):
        raise SpecError("weights format: it sets the weights' dtype, group size and scale "
                        f"bytes; drop {' and '.join(clash or ['the weights dtypes'])}")
    return out


def _formatted(w: Workloads, formats: list[str], sizes: list[int],
               axis: int) -> tuple[Workloads, list[str]]:
    """``w`` (its weights_dtype axis, number ``axis`` of ``sizes``, holding the formats'
    dtypes in order) with each point's group size and scale bytes those of its format, and
    the format of every point."""
    inner = int(np.prod(sizes[axis + 1:], dtype=np.int64))
    at = np.arange(len(w)) // inner % len(formats)
    specs = [weight_format(f).scheme for f in formats]
    arrays = {f.name: getattr(w, f.name) for f in fields(w)}
    arrays["weight_group_size"] = np.array([g or 0 for _, g, _ in specs], dtype=np.int64)[at]
    arrays["weight_scale_bytes"] = np.array([s for _, _, s in specs], dtype=float)[at]
    return Workloads.of(**arrays), np.asarray(formats, dtype=object)[at].tolist()


def _named(cols: dict[str, np.ndarray | list],
           names: list[str] | None) -> dict[str, np.ndarray | list]:
    """``cols`` with ``workload_weights_format`` (``names``) before the weights dtype."""
    if names is None:
        return cols
    out: dict[str, np.ndarray | list] = {}
    for k, v in cols.items():
        if k == "workload_weights_dtype":
            out["workload_weights_format"] = names
        out[k] = v
    return out


def concat(values: list) -> np.ndarray | list:
    """One column from its blocks (arrays, or lists of text)."""
    if isinstance(values[0], list):
        return [x for v in values for x in v]
    return np.concatenate(values)


def point_columns(e: Estimates) -> dict[str, np.ndarray | list]:
    """``Estimates.columns`` plus the columns listed in the module docstring."""
    cols = e.columns()
    n = len(e)
    cols["attention_kind"] = [e.model.attention_kind] * n
    cols["context_len"] = e.workloads.final_len
    prefill, decode = e.phase("prefill"), e.phase("decode")
    steps = decode.steps
    for cls in OP_CLASSES:
        cols[f"ttft_{cls}_s"] = prefill.class_time(cls)
        cols[f"tpot_{cls}_s"] = np.where(steps > 0, decode.class_time(cls)
                                         / np.maximum(steps, 1), np.nan)
    return cols


def rows(columns: dict[str, np.ndarray | list]) -> list[dict]:
    """Columns as one record (dict of Python values) per point."""
    keys = list(columns)
    values = [np.asarray(columns[k], dtype=object).tolist() if isinstance(columns[k], list)
              else columns[k].tolist() for k in keys]
    return [dict(zip(keys, v, strict=True)) for v in zip(*values, strict=True)]


def kv_cache_table(models: Sequence[Model], contexts: Iterable[int],
                   base: Workload | None = None, tp: int = 1) -> list[dict]:
    """KV cache of one sequence against its length, per model (windows and paging applied).

    Rows: model, attention_kind, context (tokens held: prompt + generated),
    beyond_max_position (longer than the model's max_position_embeddings, when known),
    kv_bytes_per_token (all layers, below any window, one device under ``tp``) and
    kv_bytes_per_sequence (memory.kv_bytes_per_sequence at that length).
    """
    base = base or Workload()
    contexts = np.array(list(contexts))
    out = []
    for m in models:
        kvb = float(kv_bytes_of(m, Workloads.from_list([base]))[0])
        per_token = float(kv_bytes_per_token(m, tp, kvb))
        per_seq = kv_bytes_per_sequence(m, tp, kvb, contexts, base.kv_block_tokens)
        out += [{"model": m.name, "attention_kind": _kind_label(m), "context": int(c),
                 "beyond_max_position": _beyond(m, c), "kv_bytes_per_token": per_token,
                 "kv_bytes_per_sequence": float(s)} for c, s in zip(contexts, per_seq,
                                                                    strict=True)]
    return out


def max_batch_table(models: Sequence[Model], hw: Hardware, contexts: Iterable[int],
                    base: Workload | None = None, plan: Parallelism | None = None
                    ) -> list[dict]:
    """Batch ceiling against context (prompt + gen = context, gen from ``base``), per model.

    Contexts not longer than gen_len are skipped. Rows: model, attention_kind, context,
    prompt_len, max_batch, beyond_max_position, weights_bytes, kv_pool_bytes
    (usable - weights, 0 where the weights do not fit), kv_bytes_per_sequence, fits_weights.
    """
    base = base or Workload()
    plan = plan or Parallelism()
    kept = [c for c in contexts if c > base.gen_len]
    if not kept:
        return []
    w = Workloads.of(**{**_fields(base), "prompt_len": [c - base.gen_len for c in kept]})
    out = []
    for m in models:
        mem = memory_estimate(m, hw, plan, w)
        for i, c in enumerate(kept):
            item = mem.item(i)
            out.append({"model": m.name, "attention_kind": _kind_label(m), "context": c,
                        "prompt_len": c - base.gen_len, "max_batch": item.max_batch,
                        "beyond_max_position": _beyond(m, c),
                        "weights_bytes": item.weights_bytes,
                        "kv_pool_bytes": max(item.usable_bytes - item.weights_bytes, 0.0),
                        "kv_bytes_per_sequence": item.kv_cache_bytes_per_sequence,
                        "fits_weights": item.usable_bytes > item.weights_bytes})
    return out


def _fields(base: Workload) -> dict:
    from dataclasses import asdict

    out = asdict(base)
    out["weight_group_size"] = out["weight_group_size"] or 0
    return out


def _beyond(m: Model, context: int) -> bool:
    return bool(0 < m.max_position_embeddings < context)


def _kind_label(m: Model) -> str:
    """Attention kind for legends: mha/gqa/mqa/mla, with the window when there is one."""
    kind = m.attention_kind
    if m.sliding_window is None:
        return kind
    kinds = m.layer_kinds()
    if all(k == "local" for k in kinds):
        return f"{kind}, window {m.sliding_window}"
    return f"{kind}, window {m.sliding_window} on {kinds.count('local')}/{len(kinds)} layers"


def powers_of_two(lo: int, hi: int) -> list[int]:
    """1, 2, 4, ... style grid from lo to hi inclusive (lo rounded up to a power of two)."""
    out, v = [], 1
    while v < lo:
        v *= 2
    while v <= hi:
        out.append(v)
        v *= 2
    return out


SERIES_COLUMNS = ("model", "hardware", "workload_weights_format", "workload_weights_dtype",
                  "workload_weight_group_size", "workload_outlier_fraction",
                  "workload_quantize_lm_head",
                  "workload_act_dtype", "workload_kv_dtype", "workload_kv_group_size",
                  "workload_kv_scale_bytes", "workload_prompt_len", "workload_gen_len", "tp",
                  "pp", "ep", "dp", "expert_replicas", "workload_shared_prefix",
                  "workload_expert_skew", "speculation_acceptance_mean")
_SERIES_LABELS = {"workload_weights_dtype": "W {}", "workload_act_dtype": "A {}",
                  "workload_weight_group_size": "group {}", "workload_outlier_fraction":
                  "outliers {:g}", "workload_quantize_lm_head": "quantized head {}",
                  "workload_kv_dtype": "KV {}", "workload_kv_group_size":
                  "KV group {}", "workload_kv_scale_bytes": "KV scale {:g} B",
                  "workload_prompt_len": "prompt {}", "workload_gen_len": "gen {}",
                  "tp": "TP {}", "pp": "PP {}", "ep": "EP {}", "dp": "DP {}",
                  "expert_replicas": "{} hot copies", "workload_shared_prefix": "prefix {}",
                  "workload_expert_skew": "skew {:g}", "speculation_acceptance_mean":
                  "acceptance {:g}"}
# a weights format names its dtype and group size: the label shows the format alone
_SET_BY_FORMAT = ("workload_weights_dtype", "workload_weight_group_size")


def varying(rows: Sequence[dict], columns: Sequence[str] = SERIES_COLUMNS) -> list[str]:
    """The columns among ``columns`` that take more than one value in ``rows`` (a column
    the rows lack takes none)."""
    return [c for c in columns if len({r.get(c) for r in rows}) > 1]


def series(rows: Sequence[dict], exclude: Sequence[str] = ()) -> dict[str, list[dict]]:
    """Group sweep rows into labelled series: one per combination of the SERIES_COLUMNS that
    vary (minus ``exclude``); the label names only what varies ("h100-sxm, W fp8")."""
    cols = [c for c in varying(rows) if c not in exclude]
    if "workload_weights_format" in cols:
        cols = [c for c in cols if c not in _SET_BY_FORMAT]
    out: dict[str, list[dict]] = {}
    for r in rows:
        parts = [_SERIES_LABELS.get(c, "{}").format(r[c]) for c in cols]
        label = ", ".join(parts) or f"{r['model']} on {r['hardware']}"
        out.setdefault(label, []).append(r)
    return out


def time_split_table(rows: Sequence[dict], phase: str) -> list[dict]:
    """Seconds per operator class against context, from sweep rows of one series and batch.

    ``phase`` is "prefill" (columns ttft_<class>_s) or "decode" (tpot_<class>_s). Rows:
    context (prompt length), then one key per class with any time; sorted by context.
    """
    prefix = {"prefill": "ttft", "decode": "tpot"}[phase]
    used = [c for c in OP_CLASSES if any(r[f"{prefix}_{c}_s"] > 0 for r in rows)]
    table = [{"context": r["workload_prompt_len"]} | {c: r[f"{prefix}_{c}_s"] for c in used}
             for r in rows]
    return sorted(table, key=lambda r: r["context"])
