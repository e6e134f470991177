"""CSV traces: ``read_trace`` reads a stream of requests from one, ``write_trace`` writes one
that reads back unchanged (``serving.traffic`` makes streams and re-exports both).

A trace is a CSV file with the header ``arrival_s,input_tokens,output_tokens`` and, optionally,
``prefix_id,prefix_tokens``: requests with one ``prefix_id`` (any text; empty for none) share
their first ``prefix_tokens`` prompt tokens, which count in ``input_tokens``; and, optionally,
``session_id,turn``: the turns of a conversation (``serving.sessions``); and, optionally,
``lora_id``: the LoRA adapter the request names (any text; empty for the base model), ids
0, 1, ... in order of first arrival (``serving.engines.lora``).
"""

from __future__ import annotations

import csv
import math
from dataclasses import replace
from pathlib import Path

import numpy as np

from perfmodel.serving.requests import Requests
from perfmodel.specs.errors import SpecError, did_you_mean, read_user_file
from perfmodel.specs.workload import MAX_TOKENS

COLUMNS = ("arrival_s", "input_tokens", "output_tokens")
PREFIX_COLUMNS = ("prefix_id", "prefix_tokens")
SESSION_COLUMNS = ("session_id", "turn")
LORA_COLUMN = "lora_id"
_COLUMN_LIST = ("arrival_s, input_tokens, output_tokens[, prefix_id, prefix_tokens]"
                "[, session_id, turn][, lora_id]")
_EXPECTED = f"expected {_COLUMN_LIST}"
MAX_ARRIVAL_S = 1e9            # about 32 years: a later arrival is a unit or typing mistake


def read_trace(path: str | Path) -> Requests:
    """The requests of a CSV trace (see the module docstring), sorted by arrival (stable);
    distinct ``prefix_id`` values become 0, 1, ... in order of first arrival. A mistake is a
    one-line SpecError naming the file, column and row ("row N" is line N of the file, the
    header being row 1, as a spreadsheet numbers them)."""
    path = Path(path)
    return read_user_file(path, "a CSV trace", _parse_trace,
                          (csv.Error, UnicodeDecodeError), expected="a CSV trace file")


def _parse_trace(path: Path) -> Requests:
    with path.open(newline="", encoding="utf-8-sig") as file:
        reader = csv.reader(file)
        rows = [(reader.line_num, [f.strip() for f in row]) for row in reader
                if any(f.strip() for f in row)]
    if not rows:
        raise SpecError(f"{path}: empty file, expected a CSV header line ({_COLUMN_LIST})")
    index = _columns(path, rows[0][1])
    if len(rows) == 1:
        raise SpecError(f"{path}: no requests, only a header")
    table = _Table(path, index)
    for line, row in rows[1:]:
        table.add(line, row)
    return table.requests()


def _columns(path: Path, header: list[str]) -> dict[str, int]:
    """Column name -> position; a missing, unknown or repeated column is an error. An
    unknown column is named by its position, never quoted (a file that is not a trace would
    have its first line echoed)."""
    known = COLUMNS + PREFIX_COLUMNS + SESSION_COLUMNS + (LORA_COLUMN,)
    for i, name in enumerate(header):
        if name not in known:
            raise SpecError(f"{path}: header column {i + 1} of {len(header)} is not a trace "
                            f"column{did_you_mean(name, known)} ({_EXPECTED})")
        if name in header[:i]:
            raise SpecError(f"{path}: column {name!r} given twice ({_EXPECTED})")
    for name in COLUMNS:
        if name not in header:
            raise SpecError(f"{path}: missing column {name!r} ({_EXPECTED})")
    if (PREFIX_COLUMNS[0] in header) != (PREFIX_COLUMNS[1] in header):
        given, other = PREFIX_COLUMNS if PREFIX_COLUMNS[0] in header else PREFIX_COLUMNS[::-1]
        raise SpecError(f"{path}: missing column {other!r}: {given!r} needs it ({_EXPECTED})")
    if (SESSION_COLUMNS[0] in header) != (SESSION_COLUMNS[1] in header):
        raise SpecError(f"{path}: columns 'session_id' and 'turn' go together ({_EXPECTED})")
    return {name: i for i, name in enumerate(header)}


class _Table:
    """The trace's rows as they are checked and gathered, one column list each."""

    def __init__(self, path: Path, index: dict[str, int]) -> None:
        self.path, self.index = path, index
        self.arrival: list[float] = []
        self.tokens: tuple[list[int], list[int], list[int]] = ([], [], [])
        self.prefix: list[str] = []
        self.prefix_seen: dict[str, tuple[int, int]] = {}   # id -> (tokens, row)
        self.session: list[str] = []
        self.turn: list[int] = []
        self.adapter: list[str] = []

    def where(self, column: str, line: int) -> str:
        return f"{self.path}: column {column!r}, row {line}"

    def add(self, line: int, row: list[str]) -> None:
        if len(row) != len(self.index):
            raise SpecError(f"{self.path}: row {line}: expected {len(self.index)} fields "
                            f"({', '.join(self.index)}), got {len(row)}")
        cell = {name: row[i] for name, i in self.index.items()}
        self.arrival.append(_time(cell["arrival_s"], self.where("arrival_s", line)))
        inputs = _tokens(cell["input_tokens"], self.where("input_tokens", line), 1)
        self.tokens[0].append(inputs)
        self.tokens[1].append(_tokens(cell["output_tokens"], self.where("output_tokens", line),
                                      1))
        if "session_id" in cell:
            self.session.append(cell["session_id"])
            self.turn.append(_tokens(cell["turn"], self.where("turn", line), 0)
                             if cell["session_id"] else 0)
        if LORA_COLUMN in cell:
            self.adapter.append(cell[LORA_COLUMN])
        prefix_id = cell.get("prefix_id", "")
        self.prefix.append(prefix_id)
        self.tokens[2].append(self.prefix_tokens(line, prefix_id, cell.get("prefix_tokens", ""),
                                                 inputs))

    def prefix_tokens(self, line: int, prefix_id: str, text: str, inputs: int) -> int:
        where = self.where("prefix_tokens", line)
        if not prefix_id:
            if text and _tokens(text, where, 0) != 0:
                raise SpecError(f"{where}: expected an empty field where prefix_id is empty, "
                                f"got {text}")
            return 0
        tokens = _tokens(text, where, 1)
        if tokens > inputs:
            raise SpecError(f"{where}: expected at most input_tokens ({inputs}), got {tokens}")
        first, first_line = self.prefix_seen.setdefault(prefix_id, (tokens, line))
        if tokens != first:
            raise SpecError(f"{where}: this prefix_id has {first} tokens at row {first_line}, "
                            f"expected the same, got {tokens}")
        return tokens

    def requests(self) -> Requests:
        order = np.argsort(np.asarray(self.arrival), kind="stable")
        labels = [self.prefix[i] for i in order]
        ids: dict[str, int] = {}
        prefix_id = [ids.setdefault(x, len(ids)) if x else -1 for x in labels]
        inputs, outputs, prefix_tokens = (np.asarray(t, np.int64)[order] for t in self.tokens)
        reqs = Requests.of(np.asarray(self.arrival)[order], inputs, outputs, prefix_id,
                           prefix_tokens)
        if self.session:
            from perfmodel.serving import sessions

            reqs = sessions.attach(reqs, [self.session[i] for i in order],
                                   [self.turn[i] for i in order], str(self.path))
        if not self.adapter:
            return reqs
        names: dict[str, int] = {}
        adapter = [names.setdefault(self.adapter[i], len(names)) if self.adapter[i] else -1
                   for i in order]
        return replace(reqs, adapter=np.asarray(adapter, np.int64))


def _number(text: str, where: str, expected: str) -> float:
    try:
        value = float(text)
    except ValueError:
        got = "text that is not a number" if text else "an empty field"
        raise SpecError(f"{where}: expected {expected}, got {got}") from None
    if not math.isfinite(value):
        raise SpecError(f"{where}: expected {expected}, got {text}")
    return value


def _time(text: str, where: str) -> float:
    value = _number(text, where, "a time >= 0 s")
    if value < 0:
        raise SpecError(f"{where}: expected a time >= 0 s, got {text}")
    if value > MAX_ARRIVAL_S:    # 1e300 printed a 300-digit duration
        raise SpecError(f"{where}: expected a time <= {MAX_ARRIVAL_S:g} s (about 32 years), "
                        f"got {text}")
    return value


def _tokens(text: str, where: str, minimum: int) -> int:
    expected = f"a whole number of tokens >= {minimum}"
    value = _number(text, where, expected)
    if value > MAX_TOKENS:       # 10^23 overflowed int64 further on
        raise SpecError(f"{where}: expected at most {MAX_TOKENS:,} tokens, got {text}")
    if value != math.floor(value) or value < minimum:
        raise SpecError(f"{where}: expected {expected}, got {text}")
    return int(value)


def write_trace(requests: Requests, path: str | Path) -> None:
    """Write ``requests`` as a CSV trace that ``read_trace`` reads back unchanged (times to
    full float precision; prefix columns only when some request has a shared prefix)."""
    if requests.closed_loop:
        raise SpecError(f"{path}: a trace holds arrival times; closed-loop requests "
                        f"(--concurrency {requests.closed_loop}) have none to write")
    shared = bool(np.any(requests.prefix_id >= 0))
    adapters = requests.adapter is not None
    try:
        with Path(path).open("w", newline="", encoding="utf-8") as file:
            writer = csv.writer(file)
            writer.writerow(COLUMNS + (PREFIX_COLUMNS if shared else ())
                            + ((LORA_COLUMN,) if adapters else ()))
            rows = _trace_rows(requests, shared)
            if adapters:
                rows = [[*row, str(a) if a >= 0 else ""]
                        for row, a in zip(rows, requests.adapter.tolist(), strict=True)]
            writer.writerows(rows)
    except OSError as exc:
        raise SpecError(f"{path}: cannot write: {exc.strerror or type(exc).__name__}") from None


def _trace_rows(requests: Requests, shared: bool) -> list[list[str]]:
    rows = []
    for i in range(len(requests)):
        row = [repr(float(requests.arrival_s[i])), str(int(requests.input_tokens[i])),
               str(int(requests.output_tokens[i]))]
        if shared:
            pid = int(requests.prefix_id[i])
            row += [str(pid), str(int(requests.prefix_tokens[i]))] if pid >= 0 else ["", ""]
        rows.append(row)
    return rows
