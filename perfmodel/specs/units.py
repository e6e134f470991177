"""Units: decimal SI constants, parsing of quantities with units, and formatting.

This is the only module that knows GB from GiB. Everything inside the model is in base SI
units: bytes, seconds, FLOPs, bytes/s, FLOP/s. Binary prefixes are accepted on input (a
datasheet that says GiB) and converted here.
"""

from __future__ import annotations

import functools
import math
import re
from decimal import Decimal

from perfmodel.specs.errors import quoted

K, M, G, T, P = 1e3, 1e6, 1e9, 1e12, 1e15
KiB, MiB, GiB, TiB = 2.0**10, 2.0**20, 2.0**30, 2.0**40

_PREFIX = {"": 1.0, "k": K, "K": K, "M": M, "G": G, "T": T, "P": P,
           "Ki": KiB, "Mi": MiB, "Gi": GiB, "Ti": TiB}
_TIME = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}

# unit kind -> regex for the unit part after the prefix (compiled on first use)
_KINDS = {
    "bytes": r"^(?P<p>Ki|Mi|Gi|Ti|[kKMGTP]?)B$",
    "bytes_per_s": r"^(?P<p>Ki|Mi|Gi|Ti|[kKMGTP]?)B/s$",
    "flops_per_s": r"^(?P<p>[kKMGTP]?)(FLOP|FLOPS|OP|OPS)(/s)?$",
}
_NUM = r"^\s*(?P<num>[-+]?(\d+(\.\d*)?|\.\d+)([eE][-+]?\d+)?)\s*(?P<unit>\S*)\s*$"


@functools.cache
def _regex(pattern: str) -> re.Pattern:
    return re.compile(pattern)


class UnitError(ValueError):
    """A quantity string that does not parse; the loader adds file and field."""


def parse_quantity(value: object, kind: str) -> float:
    """Parse ``value`` (a number, or a string like ``"3.35 TB/s"``) into base SI units.

    ``kind`` is one of ``bytes``, ``bytes_per_s``, ``flops_per_s``, ``s`` or ``number``.
    A bare number is taken to be in the base unit already.
    """
    if isinstance(value, bool):
        raise UnitError(f"expected a {kind} quantity, got {quoted(value)}")
    if isinstance(value, (int, float)):
        out = float(value)
    elif isinstance(value, str):
        match = _regex(_NUM).match(value)
        if not match:
            raise UnitError(f"expected a {kind} quantity like '80 GB', got {quoted(value)}")
        unit = match["unit"]
        # Decimal keeps '66.9 TFLOP/s' exactly 66.9e12 rather than 66.90000000000001e12
        out = float(Decimal(match["num"]) * Decimal(repr(_unit_scale(unit, kind, value))))
    else:
        raise UnitError(f"expected a {kind} quantity, got {quoted(value)}")
    if not math.isfinite(out):
        raise UnitError(f"expected a finite {kind} quantity, got {quoted(value)}")
    return out


def _unit_scale(unit: str, kind: str, raw: str) -> float:
    if unit == "":
        return 1.0
    if kind == "s":
        if unit in _TIME:
            return _TIME[unit]
        raise UnitError(f"expected a time unit (s, ms, us, ns), got {quoted(raw)}")
    pattern = _KINDS.get(kind)
    match = _regex(pattern).match(unit) if pattern else None
    if not match:
        raise UnitError(f"expected a {kind} unit, got {quoted(raw)}")
    return _PREFIX[match["p"]]


def _fmt(value: float, unit: str, prefixes: tuple[tuple[float, str], ...], digits: int) -> str:
    for scale, prefix in prefixes:
        if abs(value) >= scale:
            return f"{value / scale:.{digits}g} {prefix}{unit}"
    return f"{value:.{digits}g} {unit}"


_SI = ((P, "P"), (T, "T"), (G, "G"), (M, "M"), (K, "k"))


def fmt_bytes(value: float, digits: int = 4) -> str:
    """Format bytes with decimal prefixes: 8.19e5 -> '819.2 kB'."""
    return _fmt(value, "B", _SI, digits)


def fmt_rate(value: float, unit: str = "B/s", digits: int = 4) -> str:
    """Format a rate (B/s or FLOP/s) with decimal prefixes."""
    return _fmt(value, unit, _SI, digits)


def fmt_count(value: float, digits: int = 4) -> str:
    """Format a count (parameters, FLOPs) with decimal prefixes: 1.3e10 -> '13 G'."""
    return _fmt(value, "", _SI, digits).strip()


def fmt_time(seconds: float, digits: int = 4) -> str:
    """Format seconds as s / ms / us."""
    if seconds >= 1:
        return f"{seconds:.{digits}g} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.{digits}g} ms"
    return f"{seconds * 1e6:.{digits}g} us"
