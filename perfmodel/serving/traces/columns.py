"""What the trace readers share: a published CSV read into columns by name, a column of
token counts or of times checked as a whole, and the rows a reader drops, counted.

Every message names the file, the column and the row ("row N": the header is row 1, blank
lines not counted) and what was expected; never a cell's text, nor a column name the file
gives (only the names the format expects).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from perfmodel.serving.requests import Requests
from perfmodel.specs.errors import SpecError, read_user_file
from perfmodel.specs.workload import MAX_TOKENS

MS = 1e-3       # a millisecond in seconds


def csv_columns(path: Path, what: str, needed: tuple[str, ...], texts: tuple[str, ...] = ()
                ) -> pd.DataFrame:
    """The columns ``needed`` of the CSV ``path`` (a ``what``, e.g. "an Azure LLM inference
    trace"), ``texts`` of them kept as text; a missing column or no row is one SpecError."""
    def parse(p: Path) -> pd.DataFrame:
        header = pd.read_csv(p, nrows=0, encoding="utf-8-sig").columns
        names = [str(c).strip() for c in header]
        for name in needed:
            if name not in names:
                raise SpecError(f"{p}: missing column {name!r} ({what}: expected "
                                f"{', '.join(needed)})")
        table = pd.read_csv(p, encoding="utf-8-sig", usecols=lambda c: str(c).strip() in needed,
                            dtype={c: str for c in header if str(c).strip() in texts},
                            keep_default_na=False, skipinitialspace=True)
        table.columns = [str(c).strip() for c in table.columns]
        if table.empty:
            raise SpecError(f"{p}: no requests, only a header ({what})")
        return table

    return read_user_file(path, what, parse, (pd.errors.ParserError, pd.errors.EmptyDataError,
                                              UnicodeDecodeError, ValueError),
                          expected=what)


def _first_bad(bad: np.ndarray) -> int:
    return int(np.flatnonzero(bad)[0])


def counts(table: pd.DataFrame, column: str, path: Path, minimum: int = 0) -> np.ndarray:
    """Column ``column`` as whole token counts >= ``minimum`` (int64)."""
    values = pd.to_numeric(table[column], errors="coerce").to_numpy(dtype=float)
    bad = ~np.isfinite(values) | (values != np.floor(values)) | (values < minimum) | \
        (values > MAX_TOKENS)
    if bad.any():
        i = _first_bad(bad)
        got = "text that is not a number" if not np.isfinite(values[i]) else f"{values[i]:g}"
        raise SpecError(f"{path}: column {column!r}, row {i + 2}: expected a whole number of "
                        f"tokens in [{minimum}, {MAX_TOKENS:,}], got {got}")
    return values.astype(np.int64)


def seconds(values: np.ndarray, column: str, path: Path, unit: str) -> np.ndarray:
    """Times (in ``unit`` seconds each, e.g. ``MS``) as seconds: numbers that are finite
    and >= 0."""
    values = np.asarray(values, dtype=float)
    bad = ~np.isfinite(values) | (values < 0)
    if bad.any():
        i = _first_bad(bad)
        got = "text that is not a number" if np.isnan(values[i]) else f"{values[i]:g}"
        raise SpecError(f"{path}: column {column!r}, row {i + 2}: expected a time >= 0, "
                        f"got {got}")
    return values * unit


def number_column(table: pd.DataFrame, column: str) -> np.ndarray:
    return pd.to_numeric(table[column], errors="coerce").to_numpy(dtype=float)


def dropped(count: int, total: int, path: Path, why: str) -> str:
    """The warning for ``count`` of ``total`` rows left out, and why."""
    return f"{path.name}: {count:,} of {total:,} requests left out: {why}"


def requests_of(path: Path, arrival: np.ndarray, inputs: np.ndarray, outputs: np.ndarray,
                notes: list[str], prefix: tuple[np.ndarray, np.ndarray] | None = None
                ) -> Requests:
    """The requests of these columns, sorted by arrival (stable); rows with no prompt or no
    output token are left out (a failed request: nothing to simulate), said in ``notes``;
    none left is an error."""
    empty = (inputs < 1) | (outputs < 1)
    if empty.any():
        notes.append(dropped(int(empty.sum()), len(inputs), path, "no prompt token or no "
                             "output token (a failed or empty request)"))
    keep = ~empty
    if not keep.any():
        raise SpecError(f"{path}: no request with at least one prompt and one output token")
    order = np.flatnonzero(keep)[np.argsort(arrival[keep], kind="stable")]
    ids, tokens = (None, None) if prefix is None else (prefix[0][order], prefix[1][order])
    return Requests.of(arrival[order] - arrival[order].min(), inputs[order], outputs[order],
                       ids, tokens)
