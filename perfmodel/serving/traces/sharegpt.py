"""ShareGPT-style conversation files (``ShareGPT_V3_unfiltered_cleaned_split.json``, the file
``vllm bench serve --dataset-name sharegpt`` reads): a JSON list of entries, each with
``conversations``, a list of turns ``{"from": "human" | "gpt" | ..., "value": text}``.

As vLLM's ``ShareGPTDataset.sample`` (``vllm/benchmarks/datasets.py``) takes them: an entry
with at least two turns is one request, its first turn the prompt and its second the
answer; entries with fewer are left out. The file holds text, not tokens, and no tokenizer
is at hand: lengths are the characters over ``CHARS_PER_TOKEN`` (rounded up, at least 1),
said as a warning (a model's tokenizer counts otherwise: code and non-English text take
more tokens a character). Exact counts: write them as a native CSV trace
(``arrival_s,input_tokens,output_tokens``) and give it to ``--lengths-from``. No arrival
times: ``simulate --trace F --rate R`` sends the requests in the file's order at the times
``--rate R`` draws (``traffic.generate``); ``plan`` takes the lengths with its ``--rate``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from perfmodel.serving.requests import Requests
from perfmodel.serving.traces.columns import dropped, requests_of
from perfmodel.specs.errors import SpecError, read_user_file

# "one token generally corresponds to ~4 characters of text for common English text"
# (OpenAI Help Center, "What are tokens and how to count them?")
CHARS_PER_TOKEN = 4.0
WHAT = "a ShareGPT conversation file"
EXPECTED = 'a JSON list of {"conversations": [{"from": ..., "value": text}, ...]}'


def read(path: Path) -> tuple[Requests, list[str]]:
    """The requests of ``path`` (all at t=0: the file has no times) and the warnings."""
    return read_user_file(path, WHAT, _parse, (json.JSONDecodeError, UnicodeDecodeError),
                          expected=f"{WHAT} ({EXPECTED})")


def _parse(path: Path) -> tuple[Requests, list[str]]:
    with path.open(encoding="utf-8-sig") as file:
        entries = json.load(file)
    if not isinstance(entries, list):
        raise SpecError(f"{path}: expected {EXPECTED}, got another JSON value")
    pairs = []
    for i, entry in enumerate(entries):
        turns = entry.get("conversations") if isinstance(entry, dict) else None
        if not isinstance(turns, list):
            raise SpecError(f"{path}: entry {i + 1}: expected an object with a list "
                            f"'conversations' ({EXPECTED})")
        if len(turns) >= 2:
            pairs.append((_tokens(path, i, turns[0]), _tokens(path, i, turns[1])))
    notes = []
    if len(pairs) < len(entries):
        notes.append(dropped(len(entries) - len(pairs), len(entries), path,
                             "fewer than two turns (vLLM's ShareGPT sampling skips them)"))
    if not pairs:
        raise SpecError(f"{path}: no conversation of two turns or more ({EXPECTED})")
    notes.append(f"{path.name}: token counts estimated as characters / {CHARS_PER_TOKEN:g} "
                 "(no tokenizer; a model's own counts differ, most for code and "
                 "non-English text)")
    lengths = np.array(pairs, np.int64)
    reqs = requests_of(path, np.zeros(len(pairs)), lengths[:, 0], lengths[:, 1], notes)
    return reqs, notes


def _tokens(path: Path, entry: int, turn: object) -> int:
    text = turn.get("value") if isinstance(turn, dict) else None
    if not isinstance(text, str):
        raise SpecError(f"{path}: entry {entry + 1}: expected each turn an object with a "
                        "text 'value'")
    return max(1, math.ceil(len(text) / CHARS_PER_TOKEN))
