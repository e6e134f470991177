"""Predict measurement rows and summarise the error (error = predicted / measured - 1).

Rows are grouped by operator class and regime:
- regime: ``memory`` when the op's arithmetic intensity is below the device's ridge point at
  its dtype, else ``compute`` (a property of the shape, not of the fitted efficiencies);
- size: ``small`` when the ideal roofline time (peak rates, no overheads) is under 20 us, where
  fixed per-kernel costs dominate, else ``large``.

Rows also carry how they were timed (column ``timing``: kernel | stream | host, see
``roofline``); ``timing="auto"`` predicts each row the way it was measured. All rows of one
record type are predicted in one vectorised call. A quantized linear timed eagerly
(``stream``) takes at least its engine's host path (``cost.eager``).
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Iterable

import numpy as np

from perfmodel.compare.rows import TIMINGS, canonical, row_parts, row_timing, shape_key
from perfmodel.cost.eager import eager_time, host_floor
from perfmodel.cost.ops import Gemm, OpRecord, kind_names
from perfmodel.cost.roofline import op_time, peak
from perfmodel.specs.errors import SpecError
from perfmodel.specs.hardware import Hardware
from perfmodel.specs.kinds import op_class

SMALL_IDEAL_S = 20e-6


def ideal_time(op: OpRecord, hw: Hardware) -> np.ndarray:
    """Pure roofline: peak FLOP/s and peak bandwidth, no efficiencies, no overheads."""
    return np.maximum(op.flops / peak(hw, op.dtype), op.bytes.total / hw.memory_bytes_per_s)


def regime(op: OpRecord, hw: Hardware) -> np.ndarray:
    """"compute" where the intensity reaches the ridge point at the op's dtype, else "memory"."""
    ridge = peak(hw, op.dtype) / hw.memory_bytes_per_s
    return np.where(op.intensity >= ridge, "compute", "memory")


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
    """Rows with ``predicted_s``, ``error``, ``op_class``, ``regime``, ``size`` (and
    ``intensity``, ``flops``, ``bytes``) added. A row that timed several kernels
    (``compare.forms``) is predicted as their sum; the other columns are its primary
    record's.

    ``timing`` is kernel | stream | host, or ``auto`` (each row's ``timing`` column).
    """
    if timing not in (*TIMINGS, "auto"):
        raise SpecError(f"--timing: expected one of {', '.join(TIMINGS)} or auto, "
                        f"got {timing!r}")
    rows = list(rows)
    measured = np.array([_measured(r, f"{where}: row {i + 2}") for i, r in enumerate(rows)])
    codes = np.array([TIMINGS.index(row_timing(r, timing)) for r in rows], dtype=np.int64)
    out = [dict(r) for r in rows]
    total = np.zeros(len(rows))
    floor = np.zeros(len(rows))         # an eager linear's host path (``cost.eager``)
    stream = TIMINGS.index("stream")
    for index, op, primary in row_parts(rows, where, hw):
        total[index] += op_time(op, hw, codes[index]).time_s
        if isinstance(op, Gemm):
            floor[index] = np.maximum(floor[index],
                                      np.where(codes[index] == stream, host_floor(op, hw), 0))
        if not primary:
            continue
        columns = {"predicted_s": np.nan, "error": np.nan,     # filled below; first, as before
                   "op_class": [op_class(k) for k in kind_names(op)],
                   "regime": regime(op, hw),
                   "size": np.where(ideal_time(op, hw) < SMALL_IDEAL_S, "small", "large"),
                   "intensity": op.intensity, "flops": op.flops, "bytes": op.bytes.total}
        lists = {k: np.broadcast_to(v, index.shape).tolist() for k, v in columns.items()}
        for j, i in enumerate(index):
            out[i].update({k: v[j] for k, v in lists.items()})
    total = eager_time(total, floor)
    for i, row in enumerate(out):
        row.update(predicted_s=float(total[i]), error=float(total[i] / measured[i] - 1.0))
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
