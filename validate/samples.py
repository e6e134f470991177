"""Measured samples in columns, for fitting: one record per record type, priced at once.

A ``Sample`` pairs one operator instance (a length-1 or scalar record from
``compare.row_op`` or ``cost.ops``) with its measured seconds and timing. ``Samples`` holds
many of them by record type (every GEMM in one ``Gemm`` record, every elementwise pass in one
``Pointwise`` and so on), so that predicting them all is one ``roofline.op_time`` call per
record type instead of one per sample. No torch here.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from perfmodel.compare import records, row_timing
from perfmodel.cost.op_arrays import concat, grouped_fields
from perfmodel.cost.ops import OpRecord, kind_names
from perfmodel.cost.roofline import TIMINGS, busy_units, op_time
from perfmodel.specs.hardware import Hardware
from perfmodel.specs.kinds import op_class


@dataclass(frozen=True)
class Sample:
    """One operator instance ``op``, measured at ``measured_s`` seconds under ``timing``."""

    op: OpRecord
    measured_s: float
    timing: str = "kernel"


def _group_key(rec: OpRecord) -> tuple:
    return (type(rec), *(np.shape(getattr(rec, g))[-1] for g in grouped_fields(rec)))


@dataclass(frozen=True, eq=False)
class Samples:
    """Samples in columns: ``groups`` is (sample positions, record of those samples) per
    record type; ``measured`` seconds, ``timing`` codes (``roofline.TIMINGS``), registry
    ``kinds`` and report ``classes`` per sample."""

    groups: tuple[tuple[np.ndarray, OpRecord], ...]
    measured: np.ndarray
    timing: np.ndarray
    kinds: np.ndarray
    classes: np.ndarray

    @classmethod
    def build(cls, groups: list[tuple[np.ndarray, OpRecord]], measured: np.ndarray,
              timing: np.ndarray) -> Samples:
        """Samples of ``groups`` (positions, record), with their kinds and classes."""
        kinds = np.empty(len(measured), dtype=object)
        for index, rec in groups:
            kinds[index] = kind_names(rec)
        classes = np.array([op_class(k) for k in kinds], dtype=object)
        return cls(tuple(groups), np.asarray(measured, dtype=float),
                   np.asarray(timing, dtype=np.int64), kinds, classes)

    @classmethod
    def of(cls, samples: Samples | Sequence[Sample | tuple]) -> Samples:
        """``samples`` in columns (``Sample`` or (op, measured_s[, timing]) tuples, each
        op one instance)."""
        if isinstance(samples, Samples):
            return samples
        rows = [s if isinstance(s, Sample) else Sample(*s) for s in samples]
        by_type: dict[tuple, list[int]] = {}
        for i, s in enumerate(rows):
            if int(np.prod(s.op.shape)) != 1:
                raise ValueError(f"sample {i}: expected one operator instance, got "
                                 f"{int(np.prod(s.op.shape))}")
            by_type.setdefault(_group_key(s.op), []).append(i)
        groups = [(np.array(index), concat([rows[i].op for i in index]))
                  for index in by_type.values()]
        return cls.build(groups, np.array([s.measured_s for s in rows], dtype=float),
                         np.array([TIMINGS.index(s.timing) for s in rows]))

    @classmethod
    def from_rows(cls, rows: Sequence[dict], timing: str = "auto",
                  where: str = "row") -> Samples:
        """Measurement rows, each predicted with its own timing under ``auto``
        (``compare.row_timing``)."""
        codes = [TIMINGS.index(row_timing(r, timing)) for r in rows]
        return cls.build(records(rows, where), np.array([float(r["measured_s"]) for r in rows]),
                         np.array(codes))

    def __len__(self) -> int:
        return len(self.measured)

    def take(self, index: np.ndarray) -> Samples:
        """The samples at positions ``index`` (in that order; repeats allowed)."""
        index = np.asarray(index, dtype=np.int64)
        group, local = np.zeros(len(self), dtype=np.int64), np.zeros(len(self), dtype=np.int64)
        for g, (pos, _) in enumerate(self.groups):
            group[pos], local[pos] = g, np.arange(len(pos))
        groups = []
        for g, (_, rec) in enumerate(self.groups):
            chosen = np.flatnonzero(group[index] == g)
            if len(chosen):
                groups.append((chosen, rec.take(local[index[chosen]])))
        return Samples(tuple(groups), self.measured[index], self.timing[index],
                       self.kinds[index], self.classes[index])

    def field(self, name: str) -> np.ndarray:
        """Field ``name`` of every sample (NaN where its record type has none)."""
        out = np.full(len(self), np.nan)
        for index, rec in self.groups:
            if hasattr(rec, name):
                out[index] = np.broadcast_to(getattr(rec, name), rec.shape)
        return out

    def busy_units(self, hw: Hardware) -> np.ndarray:
        """Compute units each sample runs on (``roofline.busy_units``)."""
        out = np.zeros(len(self))
        for index, rec in self.groups:
            out[index] = np.broadcast_to(busy_units(rec, hw), rec.shape)
        return out

    @cached_property
    def group_kinds(self) -> tuple[frozenset[str], ...]:
        """The registry kinds of each record type's samples."""
        return tuple(frozenset(self.kinds[index].tolist()) for index, _ in self.groups)

    def predicted(self, hw: Hardware) -> np.ndarray:
        """``roofline.op_time`` of every sample on ``hw`` (one call per record type)."""
        out = np.empty(len(self))
        for index, rec in self.groups:
            out[index] = op_time(rec, hw, self.timing[index]).time_s
        return out

    def log_errors(self, hw: Hardware, kinds: Iterable[str] | None = None,
                   previous: np.ndarray | None = None) -> np.ndarray:
        """log(predicted / measured) of every sample on ``hw``. With ``kinds`` and
        ``previous`` (the errors on a device that differs from ``hw`` only in entries of
        its per-kind tables for ``kinds``), only the record types holding one of those kinds
        are priced again; the others keep their ``previous`` errors."""
        if previous is None or kinds is None:
            return np.log(self.predicted(hw) / self.measured)
        out, kinds = previous.copy(), frozenset(kinds)
        for (index, rec), held in zip(self.groups, self.group_kinds, strict=True):
            if held & kinds:
                out[index] = np.log(op_time(rec, hw, self.timing[index]).time_s
                                    / self.measured[index])
        return out
