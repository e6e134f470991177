"""Sweeps over model, device, batch, context and dtypes: pure functions returning records.

What one sweep point means
--------------------------
A point is exactly what ``perfmodel estimate`` predicts for the same flags (``batch``
sequences, a prompt of ``prompt_len`` tokens, ``gen_len`` generated tokens), with one
difference, for speed: the decode phase is integrated over ``decode_samples`` evenly spaced
contexts between the first (S+1) and last (S+G-1) decode step, trapezoid rule, instead of
the core's 65 (``estimate(..., decode_samples=)``). Each extra context re-evaluates
only the attention ops (the others are cached); measured on a 2-core machine,
``estimate()`` costs ~8.5 ms a point and the sampled form ~1.8 ms
(benchmarks/bench_figures.py: 1,000 points ~2 s). With at most
``decode_samples`` decode steps the sum is exact; beyond, the per-step time is piecewise
linear in the context and 9 samples stay within 0.1% of ``estimate()``'s TPOT (measured
over dense, sliding-window, hybrid and MLA/MoE models, batch 1-256, contexts 128-11k;
tested in tests/test_sweep.py).
``decode_samples=None`` calls ``estimate()`` itself.

Each record is ``perfmodel.report.flat_record`` (the columns of ``estimate --format csv``)
plus ``decode_samples``, ``attention_kind``, ``kv_cache_bytes_per_sequence``,
``context_len`` (= prompt + generated, the length the KV cache is sized for), and the time
per operator class: ``ttft_<class>_s`` (prefill) and ``tpot_<class>_s`` (mean decode step),
which sum to ``ttft_s`` and ``tpot_s`` (``tpot_<class>_s`` is NaN when gen_len is 1: there
is no decode step to split).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import replace

from perfmodel.estimate import DECODE_SAMPLES, Estimate, Phase, estimate
from perfmodel.memory import kv_bytes_per_sequence, kv_bytes_per_token, memory_estimate
from perfmodel.ops import OP_CLASS
from perfmodel.report import flat_record
from perfmodel.specs import Hardware, Model, Workload

DEFAULT_DECODE_SAMPLES = 9
OP_CLASSES: tuple[str, ...] = tuple(dict.fromkeys(OP_CLASS.values()))


def point_estimate(model: Model, hw: Hardware, wl: Workload,
                   decode_samples: int | None = DEFAULT_DECODE_SAMPLES) -> Estimate:
    """One sweep point as an Estimate (decode sampled; ``None``: the core default)."""
    return estimate(hw, model, wl,
                    DECODE_SAMPLES if decode_samples is None else decode_samples)


def class_times(phase: Phase) -> dict[str, float]:
    """Seconds per operator class over a phase (every class in OP_CLASSES, zeros kept)."""
    out = dict.fromkeys(OP_CLASSES, 0.0)
    for op in phase.ops:
        out[op.op_class] = out.get(op.op_class, 0.0) + op.time_s
    return out


def point_record(e: Estimate, decode_samples: int | None) -> dict:
    """flat_record plus the columns listed in the module docstring."""
    row = flat_record(e)
    wl = e.workload
    row["decode_samples"] = 0 if decode_samples is None else decode_samples
    row["attention_kind"] = e.model.attention_kind
    row["context_len"] = wl.final_len
    for cls, t in class_times(e.prefill).items():
        row[f"ttft_{cls}_s"] = t
    steps = e.decode.steps
    for cls, t in class_times(e.decode).items():
        # one generated token: tpot is the first step, not sampled here
        row[f"tpot_{cls}_s"] = t / steps if steps else float("nan")
    return row


def sweep(models: Sequence[Model], hardware: Sequence[Hardware], batches: Iterable[int],
          prompts: Iterable[int], base: Workload | None = None,
          weights_dtypes: Iterable[str] | None = None, kv_dtypes: Iterable[str] | None = None,
          decode_samples: int | None = DEFAULT_DECODE_SAMPLES) -> list[dict]:
    """Records for the product model x hardware x weights dtype x kv dtype x prompt x batch.

    ``base`` supplies every other workload field (gen_len, act dtype, tp, ...); the dtype
    lists default to its dtypes. Order: batch varies fastest. Invalid workloads raise
    SpecError before any point is evaluated.
    """
    base = base or Workload()
    batches, prompts = list(batches), list(prompts)
    wdts = list(weights_dtypes or [base.weights_dtype])
    kdts = list(kv_dtypes or [base.kv_dtype])
    grid = list(itertools.product(models, hardware, wdts, kdts, prompts, batches))
    workloads = [replace(base, batch=b, prompt_len=s, weights_dtype=w, kv_dtype=k)
                 for _, _, w, k, s, b in grid]
    return [point_record(point_estimate(m, hw, wl, decode_samples), decode_samples)
            for (m, hw, *_), wl in zip(grid, workloads, strict=True)]


def kv_cache_table(models: Sequence[Model], contexts: Iterable[int],
                   base: Workload | None = None) -> list[dict]:
    """KV cache of one sequence against its length, per model (windows and paging applied).

    Rows: model, attention_kind, context (tokens held: prompt + generated),
    beyond_max_position (longer than the model's max_position_embeddings, when known),
    kv_bytes_per_token (all layers, below any window, one device under base.tp) and
    kv_bytes_per_sequence (memory.kv_bytes_per_sequence at that length).
    """
    base = base or Workload()
    contexts = list(contexts)
    rows = []
    for m in models:
        per_token = kv_bytes_per_token(m, base)
        for c in contexts:
            rows.append({"model": m.name, "attention_kind": _kind_label(m), "context": c,
                         "beyond_max_position": _beyond(m, c),
                         "kv_bytes_per_token": per_token,
                         "kv_bytes_per_sequence": kv_bytes_per_sequence(m, base, c)})
    return rows


def max_batch_table(models: Sequence[Model], hw: Hardware, contexts: Iterable[int],
                    base: Workload | None = None) -> list[dict]:
    """Batch ceiling against context (prompt + gen = context, gen from ``base``), per model.

    Contexts not longer than gen_len are skipped. Rows: model, attention_kind, context,
    prompt_len, max_batch, beyond_max_position, weights_bytes, kv_pool_bytes
    (usable - weights), kv_bytes_per_sequence, fits_weights.
    """
    base = base or Workload()
    rows = []
    for m in models:
        for c in contexts:
            if c <= base.gen_len:
                continue
            wl = replace(base, prompt_len=c - base.gen_len)
            mem = memory_estimate(m, hw, wl)
            rows.append({"model": m.name, "attention_kind": _kind_label(m), "context": c,
                         "prompt_len": wl.prompt_len, "max_batch": mem.max_batch,
                         "beyond_max_position": _beyond(m, c),
                         "weights_bytes": mem.weights_bytes,
                         "kv_pool_bytes": mem.usable_bytes - mem.weights_bytes,
                         "kv_bytes_per_sequence": mem.kv_cache_bytes_per_sequence,
                         "fits_weights": mem.usable_bytes > mem.weights_bytes})
    return rows


def _beyond(m: Model, context: int) -> bool:
    return 0 < m.max_position_embeddings < context


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


SERIES_COLUMNS = ("model", "hardware", "workload_weights_dtype", "workload_act_dtype",
                  "workload_kv_dtype", "workload_prompt_len", "workload_gen_len", "workload_tp")
_SERIES_LABELS = {"workload_weights_dtype": "W {}", "workload_act_dtype": "A {}",
                  "workload_kv_dtype": "KV {}", "workload_prompt_len": "prompt {}",
                  "workload_gen_len": "gen {}", "workload_tp": "TP {}"}


def varying(rows: Sequence[dict], columns: Sequence[str] = SERIES_COLUMNS) -> list[str]:
    """The columns among ``columns`` that take more than one value in ``rows``."""
    return [c for c in columns if len({r[c] for r in rows}) > 1]


def series(rows: Sequence[dict], exclude: Sequence[str] = ()) -> dict[str, list[dict]]:
    """Group sweep rows into labelled series: one per combination of the SERIES_COLUMNS that
    vary (minus ``exclude``); the label names only what varies ("h100-sxm, W fp8")."""
    cols = [c for c in varying(rows) if c not in exclude]
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
