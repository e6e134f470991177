"""Predict every row of a measurement CSV (shared schema) and summarise the error.

Each row is rebuilt into the same ``Op`` the transformer model emits (``ops`` constructors),
timed with ``roofline.op_time``, and compared: error = predicted / measured - 1.
Rows are grouped by operator class and regime:
- regime: ``memory`` when the op's arithmetic intensity is below the device's ridge point at
  its dtype, else ``compute`` (a property of the shape, not of the fitted efficiencies);
- size: ``small`` when the ideal roofline time (peak rates, no overheads) is under 20 us, where
  fixed per-kernel costs dominate, else ``large``.

Rows also carry how they were timed (column ``timing``: kernel | stream | host, see
``roofline``); ``timing="auto"`` predicts each row the way it was measured. ``op_row`` is the
inverse of ``row_op``: the harness turns model operators into rows, measures them, and reads
them back through the same path as anyone else's measurements.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Iterable
from pathlib import Path

from perfmodel import ops
from perfmodel.ops import ELEMENTWISE_KINDS, Op
from perfmodel.roofline import TIMINGS, op_time
from perfmodel.specs import DTYPE_BYTES, Hardware, SpecError, read_user_file

SCHEMA = ("device", "source", "model", "tp", "op", "dtype", "m", "n", "k", "batch", "q_len",
          "kv_len", "n_heads", "n_kv_heads", "head_dim", "measured_s", "measured_std_s")
SMALL_IDEAL_S = 20e-6
# the columns that identify a kernel configuration (resume keys, fit/held-out bookkeeping)
SHAPE_COLUMNS = ("op", "dtype", "m", "n", "k", "batch", "q_len", "kv_len", "n_heads",
                 "n_kv_heads", "head_dim")


def _int(row: dict, key: str, where: str) -> int:
    value = row.get(key)
    try:
        out = float(value)
    except (TypeError, ValueError):
        out = math.nan
    if not math.isfinite(out) or out < 1:
        raise SpecError(f"{where}: column {key}: expected a positive number, got {value!r}")
    return int(out)


SUPPORTED_OPS = ("gemm", "attention", "embedding", "kv_cache_write", *ELEMENTWISE_KINDS)
_EXPECTED_OPS = (f"gemm, attention, embedding, kv_cache_write or one of "
                 f"{', '.join(ELEMENTWISE_KINDS)}")


def row_op(row: dict, where: str = "row") -> Op:
    """The Op a measurement row describes (shared schema; see ARCHITECTURE.md)."""
    kind, dtype = row.get("op"), row.get("dtype") or "bf16"
    if dtype not in DTYPE_BYTES:
        raise SpecError(f"{where}: column dtype: unknown dtype {dtype!r}")
    if kind not in SUPPORTED_OPS:       # the one list compare's skipping also reads
        raise SpecError(f"{where}: column op: unsupported op {kind!r}, expected {_EXPECTED_OPS}")
    b = DTYPE_BYTES[dtype]
    if kind == "gemm":
        return ops.gemm("gemm", _int(row, "m", where), _int(row, "n", where),
                        _int(row, "k", where), weight_bytes=b, act_bytes=b, dtype=dtype)
    if kind == "attention":
        hd = _int(row, "head_dim", where)
        return ops.attention("attention", batch=_int(row, "batch", where),
                             q_len=_int(row, "q_len", where), kv_len=_int(row, "kv_len", where),
                             n_heads=_int(row, "n_heads", where),
                             n_kv_heads=_int(row, "n_kv_heads", where), qk_dim=hd, v_dim=hd,
                             act_bytes=b, kv_bytes=b, dtype=dtype, cache_elems=2 * hd)
    if kind in ELEMENTWISE_KINDS:
        return ops.elementwise(kind, kind, _int(row, "m", where), _int(row, "n", where),
                               act_bytes=b, dtype=dtype)
    if kind == "embedding":
        return ops.embedding(kind, _int(row, "m", where), _int(row, "n", where), act_bytes=b,
                             dtype=dtype)
    # kv_cache_write: the one supported op left
    return ops.kv_cache_write(kind, _int(row, "m", where), _int(row, "n", where),
                              act_bytes=b, kv_bytes=b, dtype=dtype)


def drop_unsupported(rows: list[dict], where: str = "measurements") -> tuple[list[dict], list[str]]:
    """(the rows whose op the model predicts, one line per other op: its count and first row).

    A file may hold ops this model has no formula for (another project's kernels); those rows
    are set aside and named rather than failing the whole file. No predictable row at all is a
    SpecError (most likely not a measurement file of this schema)."""
    kept, other = [], {}
    for i, row in enumerate(rows):
        op = row.get("op")
        if op in SUPPORTED_OPS:
            kept.append(row)
        else:
            first, count = other.get(op, (i + 2, 0))
            other[op] = (first, count + 1)
    notes = [f"skipped {count} row{'s' * (count > 1)} of op {op!r} (first at row {first}): "
             f"no formula for it" for op, (first, count) in other.items()]
    if not kept:
        raise SpecError(f"{where}: column op: no row has an op the model predicts "
                        f"({'; '.join(notes)}); expected {_EXPECTED_OPS}")
    return kept, notes


def op_row(op: Op) -> dict:
    """The measurement-schema row of ``op`` (the inverse of ``row_op``; one instance).

    GEMMs over several weight groups and windowed attention have no row form: ValueError.
    """
    s = op.shape
    row: dict = {"op": op.kind, "dtype": op.dtype}
    if op.kind == "gemm":
        if s.get("groups", 1.0) != 1.0:
            raise ValueError(f"{op.name}: grouped GEMMs have no measurement-row form")
        return row | {"m": round(s["m"]), "n": int(s["n"]), "k": int(s["k"])}
    if op.kind == "attention":
        if s.get("window"):
            raise ValueError(f"{op.name}: windowed attention has no measurement-row form")
        return row | {c: int(s[c]) for c in ("batch", "q_len", "kv_len", "n_heads",
                                            "n_kv_heads", "head_dim")}
    if op.kind in (*ELEMENTWISE_KINDS, "embedding", "kv_cache_write"):
        return row | {"m": round(s["m"]), "n": int(s["n"])}
    raise ValueError(f"{op.name}: op kind {op.kind!r} has no measurement-row form")


def canonical(value: object) -> str:
    """'' for blanks and NaN, integers without a decimal point, other values as text."""
    if value is None:
        return ""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return str(value).strip()
    if math.isnan(number):
        return ""
    return str(int(number)) if number.is_integer() else repr(number)


def shape_key(row: dict, columns: tuple[str, ...] = SHAPE_COLUMNS) -> str:
    """Canonical text naming a configuration, e.g. ``gemm fp32 m=64 n=64 k=64``."""
    parts = [canonical(row.get("op")), canonical(row.get("dtype"))]
    parts += [f"{c}={canonical(row.get(c))}" for c in columns[2:] if canonical(row.get(c))]
    return " ".join(parts)


def ideal_time(op: Op, hw: Hardware) -> float:
    """Pure roofline: peak FLOP/s and peak bandwidth, no efficiencies, no overheads."""
    return max(op.flops / hw.peak(op.dtype), op.bytes.total / hw.memory_bytes_per_s)


def regime(op: Op, hw: Hardware) -> str:
    return "compute" if op.intensity >= hw.ridge_point(op.dtype) else "memory"


def row_timing(row: dict, timing: str) -> str:
    """The timing a row is predicted with: ``timing``, or for ``auto`` the row's own
    ``timing`` column when it names one of kernel | stream | host, else kernel."""
    if timing != "auto":
        return timing
    own = row.get("timing")
    return own if own in TIMINGS else "kernel"


def _measured(row: dict, where: str) -> float:
    try:
        value = float(row["measured_s"])
    except (KeyError, TypeError, ValueError):
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise SpecError(f"{where}: column measured_s: expected a positive number of seconds, "
                        f"got {row.get('measured_s')!r}")
    return value


def predict_rows(rows: Iterable[dict], hw: Hardware, timing: str = "kernel",
                 where: str = "measurements") -> list[dict]:
    """Rows with ``predicted_s``, ``error``, ``op_class``, ``regime``, ``size`` added.

    ``timing`` is kernel | stream | host, or ``auto`` (each row's ``timing`` column).
    """
    if timing not in (*TIMINGS, "auto"):
        raise SpecError(f"--timing: expected one of {', '.join(TIMINGS)} or auto, "
                        f"got {timing!r}")
    out = []
    for i, row in enumerate(rows):
        here = f"{where}: row {i + 2}"
        op = row_op(row, here)
        measured = _measured(row, here)
        predicted = op_time(op, hw, row_timing(row, timing)).time_s
        out.append(dict(row) | {
            "predicted_s": predicted,
            "error": predicted / measured - 1.0,
            "op_class": op.op_class, "regime": regime(op, hw),
            "size": "small" if ideal_time(op, hw) < SMALL_IDEAL_S else "large",
            "intensity": op.intensity, "flops": op.flops, "bytes": op.bytes.total})
    return out


def summarize(df, by: tuple[str, ...] = ("op_class", "regime", "size")):
    """Median and p90 absolute error, signed median (bias) and count per group (pandas)."""
    import pandas as pd

    df = df.assign(abs_error=df["error"].abs())
    grouped = df.groupby(list(by), observed=True)
    out = pd.DataFrame({
        "n": grouped.size(),
        "median_abs_error": grouped["abs_error"].median(),
        "p90_abs_error": grouped["abs_error"].quantile(0.9),
        "median_error": grouped["error"].median(),
    }).reset_index()
    return out


def read_measurements(path: str | Path, devices: Iterable[str] | None = None) -> list[dict]:
    """Rows of a measurement CSV as dicts of text (blank cells are ''), checked for the
    columns every row needs; ``devices`` keeps only rows whose ``device`` is listed.

    Raises SpecError naming the file and column. A file holding several devices must be
    filtered: one hardware record cannot predict two devices.
    """
    import pandas as pd

    path = Path(path)
    df = read_user_file(path, "a readable CSV",
                        lambda p: pd.read_csv(p, dtype=str, keep_default_na=False),
                        (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError))
    for column in ("op", "measured_s"):
        if column not in df.columns:
            raise SpecError(f"{path}: column {column}: missing (expected the shared schema: "
                            f"{', '.join(SCHEMA)})")
    present = sorted(set(df["device"])) if "device" in df.columns else []
    if devices is not None:
        wanted = set(devices)
        df = df[df["device"].isin(wanted)] if "device" in df.columns else df.iloc[0:0]
        if df.empty:
            raise SpecError(f"{path}: column device: no rows for {', '.join(sorted(wanted))}; "
                            f"the file holds {', '.join(present) or 'no device column'}")
    elif len(present) > 1:
        raise SpecError(f"{path}: column device: rows of several devices "
                        f"({', '.join(present)}); choose one with --device-filter")
    if df.empty:
        raise SpecError(f"{path}: no measurement rows")
    return df.to_dict("records")


def split_by_model(rows: list[dict]) -> tuple[list[dict], list[dict], list[str], list[str]]:
    """Deterministic half split by model: sorted model names alternate fit, evaluate.

    Returns (fit rows, evaluation rows, fit models, evaluation models). Needs two models.
    """
    models = sorted({r.get("model") or "" for r in rows} - {""})
    if len(models) < 2:
        raise SpecError(f"column model: --split-by model needs rows of at least two models, "
                        f"found {len(models)}")
    fit_models, eval_models = models[0::2], models[1::2]
    chosen = set(fit_models)
    fit = [r for r in rows if (r.get("model") or "") in chosen]
    rest = [r for r in rows if (r.get("model") or "") not in chosen]
    return fit, rest, fit_models, eval_models


def split_fraction(rows: list[dict], fraction: float) -> tuple[list[dict], list[dict]]:
    """Deterministic split by configuration: a shape goes to the fitting set when the CRC32
    of its ``shape_key`` falls in the first ``fraction`` of the range (all repeats of one
    shape land on the same side, so no shape is both fitted and evaluated)."""
    if not 0 < fraction < 1:
        raise SpecError(f"--calibrate-on: expected a fraction in (0, 1), got {fraction}")
    fit, rest = [], []
    for row in rows:
        h = zlib.crc32(f"{shape_key(row)} tp={canonical(row.get('tp'))}".encode())
        (fit if h < fraction * 2**32 else rest).append(row)
    return fit, rest
