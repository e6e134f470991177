"""Public production traces, each read in the format it was published in (docs/traces.md):
``mooncake`` (kvcache-ai/Mooncake JSONL), ``azure`` (Azure LLM inference traces 2023 and
2024), ``burstgpt`` (HPMLL/BurstGPT) and ``sharegpt`` (ShareGPT conversations, no times),
beside perfmodel's own CSV (``native``, ``serving.trace``). ``read`` tells the format from
the file's first line unless one is named, and says as warnings what a reader changed;
``reshape`` cuts a window out of a long trace and speeds it up; ``timed`` says whether a
format has arrival times (``at_rate`` gives them where it has not).
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from perfmodel.serving.requests import Requests
from perfmodel.specs.errors import SpecError, did_you_mean

FORMATS = ("native", "mooncake", "azure", "burstgpt", "sharegpt")
NAMES = {"native": "a perfmodel CSV trace", "mooncake": "a Mooncake JSONL trace",
         "azure": "an Azure LLM inference trace", "burstgpt": "a BurstGPT trace",
         "sharegpt": "a ShareGPT conversation file"}
_HEAD_BYTES = 4096


@dataclass(frozen=True)
class Loaded:
    """A trace's requests, its format and the warnings of what reading it changed."""

    requests: Requests
    fmt: str
    notes: tuple[str, ...]


def check_format(fmt: str, flag: str = "--trace-format") -> None:
    choices = ("auto", *FORMATS)
    if fmt not in choices:
        raise SpecError(f"{flag}: expected one of {', '.join(choices)}, got {fmt!r}"
                        f"{did_you_mean(fmt, choices)}")


def detect(path: Path) -> str:
    """The format of ``path`` from its first line (``native`` where none fits: its reader
    then says what is wrong)."""
    return _detect(path) or "native"


def _detect(path: Path) -> str | None:
    """The format of ``path``, or None where its first line fits none (not a regular
    file, a pipe say: ``native``, whose reader says so without reading it)."""
    if not path.is_file():
        return "native"
    try:
        with path.open("rb") as file:
            head = file.read(_HEAD_BYTES).decode("utf-8-sig", errors="replace")
    except OSError:
        return "native"         # its reader names the problem
    first = next((line.strip() for line in head.splitlines() if line.strip()), "")
    if first.startswith("["):
        return "sharegpt"
    if first.startswith("{"):
        return "mooncake" if '"input_length"' in head else None
    from perfmodel.serving.traces.azure import COLUMNS as AZURE
    from perfmodel.serving.traces.burstgpt import COLUMNS as BURSTGPT

    cells = {c.strip() for c in next(csv.reader([first]), [])}
    for name, columns in (("azure", AZURE), ("burstgpt", BURSTGPT)):
        if set(columns) <= cells:
            return name
    from perfmodel.serving.trace import COLUMNS

    return "native" if cells & set(COLUMNS) else None


def resolve(path: Path, fmt: str = "auto") -> str:
    """The format ``fmt`` names, or ``path``'s (``detect``)."""
    check_format(fmt)
    return detect(Path(path)) if fmt == "auto" else fmt


def timed(fmt: str) -> bool:
    """Whether a format gives each request's arrival time."""
    return fmt != "sharegpt"


def read(path: str | Path, fmt: str = "auto") -> Loaded:
    """The requests of the trace ``path`` in format ``fmt`` (``auto``: ``detect``)."""
    path = Path(path)
    check_format(fmt)
    found = _detect(path) if fmt == "auto" else fmt
    name = found or "native"
    if name == "native":
        from perfmodel.serving.trace import read_trace

        try:
            return Loaded(read_trace(path), name, ())
        except SpecError as exc:
            if found is not None:         # a native header: its reader's word is enough
                raise
            raise SpecError(f"{exc}; or a trace in a published format, told by its first "
                            "line or named with --trace-format (docs/traces.md)") from None
    from importlib import import_module

    reqs, notes = import_module(f"perfmodel.serving.traces.{name}").read(path)
    return Loaded(reqs, name, tuple(notes))


def parse_window(text: str | None, flag: str = "--trace-window"
                 ) -> tuple[float, float] | None:
    """``START:END`` seconds (either may be empty: the trace's start, its end) as a pair."""
    if text is None:
        return None
    parts = text.split(":")
    try:
        if len(parts) != 2:
            raise ValueError
        lo = float(parts[0]) if parts[0].strip() else 0.0
        hi = float(parts[1]) if parts[1].strip() else math.inf
    except ValueError:
        raise SpecError(f"{flag}: expected START:END in seconds (e.g. 600:1200, or :600), "
                        f"got {text!r}") from None
    if not (math.isfinite(lo) and lo >= 0 and hi > lo):
        raise SpecError(f"{flag}: expected 0 <= START < END, got {text!r}")
    return lo, hi


def reshape(requests: Requests, window: tuple[float, float] | None = None,
            speedup: float = 1.0, where: str = "--trace-window") -> Requests:
    """The requests arriving in ``[start, end)`` seconds, moved to start at 0 (the first at
    its offset from ``start``), their times divided by ``speedup``."""
    if not (math.isfinite(speedup) and speedup > 0):
        raise SpecError(f"--trace-speedup: expected a number > 0, got {speedup:g}")
    if requests.closed_loop:
        return requests
    reqs = requests
    if window is not None:
        lo, hi = window
        keep = (reqs.arrival_s >= lo) & (reqs.arrival_s < hi)
        if not keep.any():
            raise SpecError(f"{where}: no request arrives in [{lo:g}, {hi:g}) s; the trace "
                            f"spans [{reqs.arrival_s[0]:g}, {reqs.arrival_s[-1]:g}] s")
        reqs = reqs.take(np.flatnonzero(keep))
        reqs = _with_times(reqs, reqs.arrival_s - lo)
    return reqs if speedup == 1.0 else _with_times(reqs, reqs.arrival_s / speedup)


def at_rate(requests: Requests, rate: float, arrival: str = "poisson",
            burstiness: float = 1.0, seed: int = 0) -> Requests:
    """A trace without times sent in its order at the arrival times ``simulate --rate``
    would draw (``traffic.generate``'s arrival stream for this seed)."""
    from perfmodel.serving import traffic

    times = traffic.generate(len(requests), rate=rate, arrival=arrival, burstiness=burstiness,
                             input_len=1, output_len=1, seed=seed).arrival_s
    return _with_times(requests, times)


def _with_times(requests: Requests, times: np.ndarray) -> Requests:
    from dataclasses import replace

    return replace(requests, arrival_s=np.asarray(times, dtype=float))


