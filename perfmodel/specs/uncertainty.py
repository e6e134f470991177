"""The hardware file's ``uncertainty:`` block: an 80% band on a kernel's time per error class.

``error = predicted / measured - 1``; ``error_q10`` and ``error_q90`` are its 10th and 90th
percentiles over held-out kernel measurements of one class (``cost.error_class``), so a
kernel predicted at ``t`` is measured in ``[t / (1 + q90), t / (1 + q10)]`` four times in
five. ``source`` says whose residuals; a device with no measurements of its own borrows its
family's leave-one-device-out band: ``source: "leave-one-device-out, <family>"`` (the
residuals of the family's other devices, fitted without it). How the classes combine into a
step's band is ``cost.band``'s.

``read_uncertainty`` reads the block from any ``Fields`` (the top-level block, or an
engine's override under ``engines:``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from perfmodel.specs.errors import SpecError, did_you_mean
from perfmodel.specs.kinds import ERROR_CLASSES

# the error classes (``cost.error_class`` classifies operators into them; the order is the
# code of each)
UNCERTAINTY_KEYS = ("source", "note", "error_q10", "error_q90")
LEAVE_ONE_OUT = "leave-one-device-out"
# a device with no measurements of its own nor of its family: the band of datasheet-era
# constants (reports/kernels/uncalibrated_band.py); ``source: "uncalibrated, <basis>"``
UNCALIBRATED = "uncalibrated"
# a relative error past these is a typo (0.08 written as 8), not a kernel
MAX_ERROR = 10.0


@dataclass(frozen=True)
class Uncertainty:
    """The 80% band per error class: ``q10[c] <= q90[c]``, both > -1; a class absent from
    both has no band (its kernels count as exact)."""

    source: str
    q10: dict[str, float]
    q90: dict[str, float]

    def __post_init__(self) -> None:
        for c in (*self.q10, *self.q90):
            if c not in ERROR_CLASSES or c not in self.q10 or c not in self.q90:
                raise SpecError(f"uncertainty: {c!r}: expected an error class given in both "
                                f"q10 and q90 ({', '.join(ERROR_CLASSES)})")
            if not -1.0 < self.q10[c] <= self.q90[c]:
                raise SpecError(f"uncertainty: {c}: expected -1 < q10 <= q90, got "
                                f"{self.q10[c]:g}, {self.q90[c]:g}")

    @property
    def family(self) -> str | None:
        """The family whose leave-one-device-out band this is (None: the device's own)."""
        head, _, rest = self.source.partition(",")
        return rest.strip() or None if head.strip() == LEAVE_ONE_OUT else None

    @property
    def uncalibrated(self) -> bool:
        """Whether the device's constants are datasheet figures nobody fitted (its band is
        the datasheet-constant rule's, not a fit's residuals)."""
        return self.source.partition(",")[0].strip() == UNCALIBRATED

    def describe(self) -> str:
        """One line for a report: whose band it is."""
        if self.uncalibrated:
            return ("uncalibrated device: 80% band from the residuals datasheet constants had "
                    "on the calibrated devices' kernels before calibration (no band fitted "
                    "to kernel measurements of this device or its family)")
        if self.family is not None:
            return (f"80% band from the {self.family} family's leave-one-device-out residuals "
                    f"(no kernel measurements of this device)")
        return f"80% band from {self.source}"


def read_uncertainty(f: Any) -> Uncertainty | None:
    """The ``uncertainty:`` block ``f``, a ``specs.fields.Fields`` (not imported: it imports
    the specs package, which holds ``Hardware``), or None where the block is absent; every
    error is one SpecError line naming the field."""
    if f is None:
        return None
    unknown = [str(key) for key in f.data if key not in UNCERTAINTY_KEYS]
    if unknown:    # named by count, never quoted (a key is the file's text)
        hint = next(filter(None, (did_you_mean(k, UNCERTAINTY_KEYS) for k in unknown)), "")
        raise f.error("", f"{len(unknown)} unknown field{'s' if len(unknown) > 1 else ''}"
                      f"{hint} (expected {', '.join(UNCERTAINTY_KEYS)})")
    source = f.text("source")
    if not source.strip():
        raise f.error("source", "expected text saying whose residuals the band comes from")
    head, _, family = source.partition(",")
    if head.strip() == LEAVE_ONE_OUT and not family.strip():
        raise f.error("source", f"expected '{LEAVE_ONE_OUT}, <family>' (the family whose "
                      f"band this device borrows), got {source!r}")
    if head.strip() == UNCALIBRATED and not family.strip():
        raise f.error("source", f"expected '{UNCALIBRATED}, <basis>' (where the band of an "
                      f"uncalibrated device comes from), got {source!r}")
    q10, q90 = (_per_class(f, key) for key in ("error_q10", "error_q90"))
    if set(q10) != set(q90):
        missing = sorted(set(q10) ^ set(q90), key=ERROR_CLASSES.index)[0]
        where = "error_q90" if missing in q10 else "error_q10"
        raise f.error(f"{where}.{missing}", "missing: each class needs both its q10 and q90")
    for c in q10:
        if q10[c] > q90[c]:
            raise f.error(f"error_q10.{c}", f"expected at most error_q90.{c} ({q90[c]:g}), "
                          f"got {q10[c]:g}")
    f.raw("note", None)
    f.finish()
    return Uncertainty(source, q10, q90)


def _per_class(f: Any, key: str) -> dict[str, float]:
    value = f.raw(key)
    if not isinstance(value, dict) or not value:
        raise f.error(key, f"expected a mapping error class -> relative error, e.g. "
                      f"{{gemm: -0.08}}; got {value!r}")
    out = {}
    for c, x in value.items():
        if c not in ERROR_CLASSES:
            raise f.error(f"{key}.{c}", f"unknown error class, expected one of "
                          f"{', '.join(ERROR_CLASSES)}")
        if isinstance(x, bool) or not isinstance(x, (int, float)) or not -1.0 < x <= MAX_ERROR:
            raise f.error(f"{key}.{c}", f"expected a number > -1 and <= {MAX_ERROR:g} "
                          f"(predicted / measured - 1), got {x!r}")
        out[c] = float(x)
    return out

