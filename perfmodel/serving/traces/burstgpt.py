"""BurstGPT (HPMLL/BurstGPT, CC-BY-4.0; the KDD '25 paper): ChatGPT and GPT-4 calls served
on Azure, ``Timestamp`` (seconds from 0:00:00 of the first day), ``Model``, ``Request
tokens``, ``Response tokens``, ``Total tokens``, ``Log Type`` (``Conversation log`` or ``API
log``); ``BurstGPT_3`` adds ``Session ID`` and ``Elapsed time`` (the repository's README).

A row with 0 ``Response tokens`` is a failed call (the README: ``BurstGPT_1.csv`` holds
"some failure that Response tokens are 0s"; ``BurstGPT_without_fails_*`` lacks them): left
out, and counted. Arrivals are the seconds after the earliest row. ``Model``, ``Log Type``,
``Total tokens``, ``Session ID`` and ``Elapsed time`` are not read (a session's
``Request tokens`` does not say how much of it is the conversation so far).
"""

from __future__ import annotations

from pathlib import Path

from perfmodel.serving.requests import Requests
from perfmodel.serving.traces.columns import (
    counts,
    csv_columns,
    number_column,
    requests_of,
    seconds,
)

WHAT = "a BurstGPT trace"
TIME, INPUT, OUTPUT = "Timestamp", "Request tokens", "Response tokens"
COLUMNS = (TIME, INPUT, OUTPUT)


def read(path: Path) -> tuple[Requests, list[str]]:
    """The requests of the BurstGPT trace ``path`` and the warnings of what was changed."""
    table = csv_columns(path, WHAT, COLUMNS)
    arrival = seconds(number_column(table, TIME), TIME, path, 1.0)
    notes: list[str] = []
    reqs = requests_of(path, arrival, counts(table, INPUT, path), counts(table, OUTPUT, path),
                       notes)
    return reqs, notes
