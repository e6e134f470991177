"""Predict every row of a measurement CSV (shared schema) and summarise the error.

Each row is rebuilt into the same ``Op`` the transformer model emits (``ops`` constructors),
timed with ``roofline.op_time``, and compared: error = predicted / measured - 1.
Rows are grouped by operator class and regime:
- regime: ``memory`` when the op's arithmetic intensity is below the device's ridge point at
  its dtype, else ``compute`` (a property of the shape, not of the fitted efficiencies);
- size: ``small`` when the ideal roofline time (peak rates, no overheads) is under 20 us, where
  fixed per-kernel costs dominate, else ``large``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from perfmodel import ops
from perfmodel.ops import Op
from perfmodel.roofline import op_time
from perfmodel.specs import DTYPE_BYTES, Hardware, SpecError

SCHEMA = ("device", "source", "model", "tp", "op", "dtype", "m", "n", "k", "batch", "q_len",
          "kv_len", "n_heads", "n_kv_heads", "head_dim", "measured_s", "measured_std_s")
SMALL_IDEAL_S = 20e-6
ELEMENTWISE_KINDS = ("rms_norm", "layer_norm", "add", "softmax", "silu_and_mul",
                     "gelu_and_mul", "gelu", "rotary")


def _int(row: dict, key: str, where: str) -> int:
    value = row.get(key)
    try:
        out = float(value)
    except (TypeError, ValueError):
        out = math.nan
    if not math.isfinite(out) or out < 1:
        raise SpecError(f"{where}: column {key}: expected a positive number, got {value!r}")
    return int(out)


def row_op(row: dict, where: str = "row") -> Op:
    """The Op a measurement row describes (shared schema; see ARCHITECTURE.md)."""
    kind, dtype = row.get("op"), row.get("dtype") or "bf16"
    if dtype not in DTYPE_BYTES:
        raise SpecError(f"{where}: column dtype: unknown dtype {dtype!r}")
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
    raise SpecError(f"{where}: column op: unsupported op {kind!r}, expected gemm, attention, "
                    f"embedding or one of {', '.join(ELEMENTWISE_KINDS)}")


def ideal_time(op: Op, hw: Hardware) -> float:
    """Pure roofline: peak FLOP/s and peak bandwidth, no efficiencies, no overheads."""
    return max(op.flops / hw.peak(op.dtype), op.bytes.total / hw.memory_bytes_per_s)


def regime(op: Op, hw: Hardware) -> str:
    return "compute" if op.intensity >= hw.ridge_point(op.dtype) else "memory"


def predict_rows(rows: Iterable[dict], hw: Hardware, timing: str = "kernel",
                 where: str = "measurements") -> list[dict]:
    """Rows with ``predicted_s``, ``error``, ``op_class``, ``regime``, ``size`` added."""
    out = []
    for i, row in enumerate(rows):
        op = row_op(row, f"{where}: row {i + 2}")
        predicted = op_time(op, hw, timing).time_s
        measured = float(row["measured_s"])
        out.append(dict(row) | {
            "predicted_s": predicted,
            "error": predicted / measured - 1.0 if measured > 0 else math.nan,
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
