"""Append-only measurement CSVs that survive interruption and resume.

Each measurement is written and flushed as soon as it is taken. Reopening a file reads the
configurations already there (a half-written last line from a killed run is cut off first),
so a rerun measures only what is missing (and re-measures rows taken on a busy machine).
Keys are canonical text (``compare.shape_key``
style): ``64`` and ``64.0`` name the same configuration.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable
from pathlib import Path

from perfmodel.compare import SCHEMA, SHAPE_COLUMNS, canonical
from perfmodel.specs import SpecError

# kernel rows: the shared schema, then how they were measured
KERNEL_COLUMNS = (*SCHEMA, "timing", "threads", "device_name", "name", "repeats", "inner",
                  "measured_min_s", "measured_max_s", "others_busy", "passes")
KERNEL_KEY = (*SHAPE_COLUMNS, "threads")
# whole layers and model steps (validate/README.md)
STEP_COLUMNS = ("device", "source", "model", "scope", "phase", "dtype", "batch", "q_len",
                "kv_len", "measured_s", "measured_std_s", "timing", "threads", "device_name",
                "repeats", "inner", "others_busy", "passes")
STEP_KEY = ("scope", "model", "dtype", "batch", "q_len", "kv_len", "threads")
# a row measured while other processes kept more than this share of the CPUs busy is
# contended: it is measured again on resume and left out of error statistics
CONTENDED = 0.1


def contended(row: dict) -> bool:
    try:
        return float(row.get("others_busy") or 0.0) > CONTENDED
    except ValueError:
        return False


def _truncate_partial_line(path: Path) -> None:
    """Cut a last line that lacks its newline (the run died while writing it)."""
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        path.write_bytes(data[: data.rfind(b"\n") + 1])


class MeasurementLog:
    """A CSV at ``path`` with ``columns``; rows identified by ``key_columns``."""

    def __init__(self, path: str | Path, columns: tuple[str, ...],
                 key_columns: tuple[str, ...]) -> None:
        self.path, self.columns, self.key_columns = Path(path), columns, key_columns
        self.rows: list[dict] = []
        if self.path.is_file() and self.path.stat().st_size:
            _truncate_partial_line(self.path)
            with self.path.open(newline="") as f:
                reader = csv.DictReader(f)
                missing = [c for c in key_columns if c not in (reader.fieldnames or ())]
                if missing:
                    raise SpecError(f"{self.path}: column {missing[0]}: missing; not a file "
                                    f"this harness wrote (choose another --out)")
                self.columns = tuple(reader.fieldnames or columns)
                self.rows = [r for r in reader if r.get("measured_s")]
        self.done = {self.key(r) for r in self.rows if not contended(r)}

    def key(self, row: dict) -> tuple[str, ...]:
        return tuple(canonical(row.get(c)) for c in self.key_columns)

    def has(self, row: dict) -> bool:
        return self.key(row) in self.done

    def todo(self, rows: Iterable[dict]) -> list[dict]:
        return [r for r in rows if not self.has(r)]

    def latest(self) -> list[dict]:
        """One row per configuration: the last one written."""
        return list({self.key(r): r for r in self.rows}.values())

    def latest_quiet(self, wanted: Iterable[dict]) -> list[dict]:
        """The latest row of each configuration of ``wanted`` (rows naming every key
        column), unless that row was contended."""
        keys = {self.key(r) for r in wanted}
        return [r for r in self.latest() if self.key(r) in keys and not contended(r)]

    def append(self, row: dict) -> None:
        """Write one row now (header first if the file is new) and flush it to disk."""
        new = not self.path.is_file() or self.path.stat().st_size == 0
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=self.columns, extrasaction="ignore")
            if new:
                writer.writeheader()
            writer.writerow({c: row.get(c, "") for c in self.columns})
        self.rows.append({c: str(row.get(c, "")) for c in self.columns})
        if not contended(row):
            self.done.add(self.key(row))
