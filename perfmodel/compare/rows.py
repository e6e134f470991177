"""Measurement rows (the shared schema) and operator records, both ways.

``row_op`` rebuilds the operator record a row describes, with the same constructors the
model's step template uses; ``records`` does it for many rows at once, one record per
record type; ``op_row`` is the inverse: the harness turns model operators into rows,
measures them, and reads them back through the same path as anyone else's measurements.
Which kinds have a row form, and with which columns, is the registry's (``specs.kinds``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

import perfmodel.compare.forms as forms
import perfmodel.compare.moe_forms as moe_forms
from perfmodel.cost.ops import (
    Attention,
    Embedding,
    Gemm,
    KvWrite,
    OpRecord,
    Pointwise,
    kind_names,
)
from perfmodel.specs.dtypes import BYTES, CODE
from perfmodel.specs.errors import SpecError, read_user_file
from perfmodel.specs.hardware import Hardware
from perfmodel.specs.kinds import KINDS, POINTWISE, POINTWISE_CODE, ROW_KINDS
from perfmodel.specs.workload import MAX_TOKENS

SCHEMA = ("device", "source", "model", "tp", "op", "dtype", "m", "n", "k", "batch", "q_len",
          "kv_len", "n_heads", "n_kv_heads", "head_dim", "measured_s", "measured_std_s")
# the columns that identify a kernel configuration (resume keys, fit/held-out bookkeeping)
SHAPE_COLUMNS = ("op", "dtype", "m", "n", "k", "batch", "q_len", "kv_len", "n_heads",
                 "n_kv_heads", "head_dim")
SUPPORTED_OPS = ROW_KINDS
_EXPECTED_OPS = ", ".join(ROW_KINDS)
TIMINGS = ("kernel", "stream", "host")


def _number(value: object) -> float:
    try:
        out = float(value)
    except (TypeError, ValueError):
        return math.nan
    return out


def _column(rows: Sequence[dict], key: str, where: str, first_row: int) -> np.ndarray:
    """Column ``key`` of ``rows`` as positive numbers, or a SpecError naming the row."""
    values = np.array([_number(r.get(key)) for r in rows], dtype=float)
    bad = ~(np.isfinite(values) & (values >= 1))
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise SpecError(f"{where}: row {first_row[i]}: column {key}: expected a positive "
                        f"number, got {rows[i].get(key)!r}")
    return np.floor(values)


def _dtypes(rows: Sequence[dict], where: str, first_row: Sequence[int]) -> np.ndarray:
    names = [r.get("dtype") or "bf16" for r in rows]
    for i, name in enumerate(names):
        if name not in CODE:
            raise SpecError(f"{where}: row {first_row[i]}: column dtype: unknown dtype "
                            f"{name!r}")
    return np.array([CODE[n] for n in names])


def _parts(kind: str, rows: Sequence[dict], where: str, line: Sequence[int],
           hw: Hardware | None = None) -> list[forms.Part]:
    """The records of ``rows``, all of op ``kind`` (elements at the row dtype): the primary
    one first, then the kernels the measured call also ran (``compare.forms``)."""
    dtype = _dtypes(rows, where, line)
    b = BYTES[dtype]

    def col(key: str) -> np.ndarray:
        return _column(rows, key, where, line)

    if kind == "gemm":
        return forms.gemm_parts(rows, col, dtype, where, line)
    if kind == "attention":
        return forms.attention_parts(rows, col, dtype, where, line)
    if kind == "moe":
        return moe_forms.moe_parts(rows, col, dtype, where, line)
    if kind == "linear_attention":
        return forms.scan_parts(rows, col, dtype, where, line)
    if kind == "conv1d":
        return forms.conv_parts(rows, col, dtype, where, line)
    if kind in ("all_reduce", "all_to_all"):
        return forms.collective_parts(kind, rows, col, hw)
    if kind in forms.EP_OPS:
        return forms.ep_row_parts(kind, rows, col, hw, where, line)
    if kind in POINTWISE:
        code = np.array([POINTWISE_CODE[r["op"]] for r in rows])
        return [(Pointwise(code=code, rows=col("m"), n=col("n"), act_bytes=b, dtype=dtype),
                 True)]
    if kind == "embedding":
        return [(Embedding(rows=col("m"), n=col("n"), act_bytes=b, dtype=dtype), True)]
    return [(KvWrite(rows=col("m"), n=col("n"), act_bytes=b, kv_bytes=b, dtype=dtype), True)]


def _record(kind: str, rows: Sequence[dict], where: str, line: Sequence[int]) -> OpRecord:
    """The primary record of ``rows`` (``_parts``)."""
    return _parts(kind, rows, where, line)[0][0]


def _check_op(row: dict, where: str) -> str:
    kind = row.get("op")
    if kind not in SUPPORTED_OPS:       # the one list compare's skipping also reads
        raise SpecError(f"{where}: column op: unsupported op {kind!r}, expected one of "
                        f"{_EXPECTED_OPS}")
    return kind


def row_parts(rows: Sequence[dict], where: str = "measurements", hw: Hardware | None = None
              ) -> list[tuple[np.ndarray, OpRecord, bool]]:
    """(row indices, record, primary) per record type: every row rebuilt as the kernels its
    measured call ran; a row's time is the sum of its records', its class and regime are its
    primary record's (``compare.forms``). ``hw`` sets the nodes a collective spans."""
    groups: dict[str, list[int]] = {}
    for i, row in enumerate(rows):
        kind = _check_op(row, f"{where}: row {i + 2}")
        groups.setdefault("pointwise" if kind in POINTWISE else kind, []).append(i)
    out = []
    for index in groups.values():
        part = [rows[i] for i in index]
        first = part[0]["op"]
        for op, primary in _parts(first, part, where, [i + 2 for i in index], hw):
            out.append((np.array(index), op, primary))
    return out


def records(rows: Sequence[dict], where: str = "measurements"
            ) -> list[tuple[np.ndarray, OpRecord]]:
    """(row indices, record) per record type: every row rebuilt as the operator it describes
    (its primary record, ``row_parts``; SpecError naming the row and column for a bad
    value)."""
    return [(index, op) for index, op, primary in row_parts(rows, where) if primary]


def row_op(row: dict, where: str = "row") -> OpRecord:
    """The record (one instance) a measurement row describes."""
    kind = _check_op(row, where)
    dtype = row.get("dtype") or "bf16"
    if dtype not in CODE:
        raise SpecError(f"{where}: column dtype: unknown dtype {dtype!r}")
    for key in KINDS[kind].row:
        if not (math.isfinite(_number(row.get(key))) and _number(row.get(key)) >= 1):
            raise SpecError(f"{where}: column {key}: expected a positive number, got "
                            f"{row.get(key)!r}")
    return _record(kind, [row], where, [0])


def drop_unsupported(rows: list[dict], where: str = "measurements"
                     ) -> tuple[list[dict], list[str]]:
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
                        f"({'; '.join(notes)}); expected one of {_EXPECTED_OPS}")
    return kept, notes


def op_row(op: OpRecord, i: int = 0) -> dict:
    """The measurement-schema row of instance ``i`` of ``op`` (the inverse of ``row_op``).

    GEMMs over several weight groups, windowed or multi-group attention and kinds without a
    row form (``specs.kinds``) have none: ValueError."""
    kind = str(np.ravel(kind_names(op))[i])
    row: dict = {"op": kind, "dtype": op.dtype_name(i)}

    def at(value: object) -> float:
        return float(np.ravel(np.broadcast_to(value, op.shape))[i])

    if isinstance(op, Gemm):
        if at(op.groups) != 1.0:
            raise ValueError(f"{op.name or kind}: grouped GEMMs have no measurement-row form")
        return row | {"m": round(at(op.m)), "n": int(at(op.n)), "k": int(at(op.k))}
    if isinstance(op, Attention):
        one = op.take(i) if op.shape else op
        if at(op.window) or np.shape(one.batch)[-1] != 1:
            raise ValueError(f"{op.name or kind}: windowed or multi-group attention has no "
                             "measurement-row form")
        return row | {"batch": int(np.ravel(one.batch)[0]), "q_len": int(np.ravel(one.q_len)[0]),
                      "kv_len": int(np.ravel(one.kv_len)[0]), "n_heads": int(at(op.n_heads)),
                      "n_kv_heads": int(at(op.n_kv_heads)), "head_dim": int(at(op.qk_dim))}
    if isinstance(op, (Pointwise, Embedding, KvWrite)):
        return row | {"m": round(at(op.rows)), "n": int(at(op.n))}
    raise ValueError(f"{op.name or kind}: op kind {kind!r} has no measurement-row form")


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


def row_timing(row: dict, timing: str) -> str:
    """The timing a row is predicted with: ``timing``, or for ``auto`` the row's own
    ``timing`` column when it names one of kernel | stream | host, else kernel."""
    if timing != "auto":
        return timing
    own = row.get("timing")
    return own if own in TIMINGS else "kernel"


# whole-number columns: a shape past MAX_TOKENS (or a tp of 0) is a typo, and compared it
# gave errors of 4.8e18%; a time past an hour, or not a positive finite number, is no kernel's
COUNT_COLUMNS = ("tp", "m", "n", "k", "batch", "q_len", "kv_len", "n_heads", "n_kv_heads",
                 "head_dim")
MAX_MEASURED_S = 3600.0


def check_values(df: object, where: str) -> None:
    """SpecError for the first bad value of a measurement table (a pandas frame of text):
    a count column (blank where it does not apply) that is not a whole number in [1,
    MAX_TOKENS], or a ``measured_s`` that is not a number of seconds in (0, 3600]. Called
    where a table enters (compare, ``kernels import csv``), so a NaN row is never stored."""
    import pandas as pd

    checks = [(c, f"a whole number in [1, {MAX_TOKENS:,}] or blank",
               lambda v: (v >= 1) & (v <= MAX_TOKENS) & (v == v.round()))
              for c in COUNT_COLUMNS if c in df.columns]
    checks.append(("measured_s", f"a time in seconds in (0, {MAX_MEASURED_S:g}]",
                   lambda v: (v > 0) & (v <= MAX_MEASURED_S)))
    for column, what, ok in checks:
        text = df[column].astype(str).str.strip()
        given = text != "" if column != "measured_s" else pd.Series(True, index=df.index)
        values = pd.to_numeric(text.where(given, None), errors="coerce")
        bad = given & ~ok(values).fillna(False).astype(bool)
        if bad.any():
            i = int(bad.to_numpy().nonzero()[0][0])
            raise SpecError(f"{where}: row {i + 2}: column {column}: expected {what}, got "
                            f"{text.iloc[i]!r}")


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
    check_values(df, str(path))
    return df.to_dict("records")


def _words(text: str) -> set[str]:
    """'A100-80GB sxm' -> {'a100', '80gb', 'sxm'}."""
    return {w for w in re.split(r"[^a-z0-9]+", text.lower()) if w}


def check_device(rows: Sequence[dict], hw: Hardware, where: str) -> None:
    """SpecError unless every row's ``device`` label names the device ``hw`` describes: each
    word of the label must occur in the hardware's name or description ('a100' and
    'a100-80gb' name a100-80gb-sxm, 'a40' does not). Blank labels are not checked."""
    known = _words(hw.name) | _words(hw.description)
    labels = sorted({str(r.get("device") or "").strip() for r in rows} - {""})
    other = [label for label in labels if not _words(label) <= known]
    if other:
        shown = ", ".join(repr(x) for x in other)
        raise SpecError(f"{where}: column device: rows measured on {shown}, predicted with "
                        f"--hardware {hw.name}; expected --hardware naming the device they were "
                        f"measured on, or --any-device if {shown} is {hw.name} under another "
                        "name")
