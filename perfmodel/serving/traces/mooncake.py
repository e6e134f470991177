"""Mooncake traces (kvcache-ai/Mooncake ``FAST25-release/traces/*.jsonl`` and the older
``arxiv-trace/mooncake_trace.jsonl``): JSON lines of ``timestamp`` (ms from the trace's
start), ``input_length``, ``output_length`` and ``hash_ids``, the prompt's 512-token blocks
as remapped hashes ("Identical hash IDs indicate reusable prefix KV cache blocks",
``FAST25-release/README.md``).

The blocks' sharing is a tree (prompts that share a system prompt, then a conversation);
the simulator's prefix model (``Requests.prefix_id``/``prefix_tokens``) knows one chain of
blocks per id, which a request shares up to its own prefix length. The mapping, in arrival
order: a request's shared path is its leading blocks that some other request also begins
with; it takes the chain that path lies on, or extends the chain that ends where the path
leaves it, or starts a new chain (a branch: the blocks it shares with the chain it leaves
are then counted as its own). What that loses is said: the tokens a cache without bound
would reuse, by the hashes, against those the chains give (a chain is cached as long as
its first request's shared path, ``EngineState._publish``).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from perfmodel.serving.requests import Requests
from perfmodel.serving.traces.columns import MS, requests_of
from perfmodel.specs.errors import SpecError, read_user_file
from perfmodel.specs.workload import MAX_TOKENS

BLOCK_TOKENS = 512      # FAST25-release/README.md: "The block size is 512 tokens"
WHAT = "a Mooncake trace"
EXPECTED = "one JSON object a line: timestamp (ms), input_length, output_length, hash_ids"


def read(path: Path) -> tuple[Requests, list[str]]:
    """The requests of the Mooncake trace ``path`` and the warnings of what was changed."""
    return read_user_file(path, WHAT, _parse, (UnicodeDecodeError,),
                          expected=f"{WHAT} ({EXPECTED})")


def _parse(path: Path) -> tuple[Requests, list[str]]:
    rows: list[tuple[float, int, int, list]] = []
    with path.open(encoding="utf-8-sig") as file:
        for line, text in enumerate(file, 1):
            if text.strip():
                rows.append(_row(path, line, text))
    if not rows:
        raise SpecError(f"{path}: empty file, expected {WHAT} ({EXPECTED})")
    order = sorted(range(len(rows)), key=lambda i: rows[i][0])
    rows = [rows[i] for i in order]
    inputs = np.array([r[1] for r in rows], np.int64)
    ids, tokens, kept, ideal = prefixes([r[3] for r in rows], inputs)
    notes = []
    if ideal:
        notes.append(f"{path.name}: prefix sharing from hash_ids ({BLOCK_TOKENS}-token "
                     f"blocks) as one chain per prefix id: {kept:,} of {ideal:,} reusable "
                     f"prompt tokens kept ({100 * kept / ideal:.0f}%, with a cache without "
                     "bound); a branch's shared blocks and a chain's growth past its first "
                     "request are counted as recomputed (docs/traces.md)")
    reqs = requests_of(path, np.array([r[0] for r in rows]) * MS, inputs,
                       np.array([r[2] for r in rows], np.int64), notes, (ids, tokens))
    return reqs, notes


def _row(path: Path, line: int, text: str) -> tuple[float, int, int, list]:
    where = f"{path}: line {line}"
    try:
        row = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SpecError(f"{where}: not JSON (column {exc.colno}), expected {EXPECTED}"
                        ) from None
    if not isinstance(row, dict):
        raise SpecError(f"{where}: expected a JSON object ({EXPECTED})")
    for name in ("timestamp", "input_length", "output_length"):
        if name not in row:
            raise SpecError(f"{where}: missing field {name!r} ({EXPECTED})")
    stamp = row["timestamp"]
    if isinstance(stamp, bool) or not isinstance(stamp, (int, float)) or \
            not math.isfinite(stamp) or stamp < 0:
        raise SpecError(f"{where}: field 'timestamp': expected milliseconds >= 0")
    hashes = row.get("hash_ids", [])
    if not isinstance(hashes, list) or not all(
            isinstance(h, (int, str)) and not isinstance(h, bool) for h in hashes):
        raise SpecError(f"{where}: field 'hash_ids': expected a list of block ids")
    return float(stamp), _length(row, "input_length", where), \
        _length(row, "output_length", where), hashes


def _length(row: dict, name: str, where: str) -> int:
    value = row[name]
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_TOKENS:
        raise SpecError(f"{where}: field {name!r}: expected a whole number of tokens in "
                        f"[0, {MAX_TOKENS:,}]")
    return value


def prefixes(paths: list[list], inputs: np.ndarray) -> tuple[np.ndarray, np.ndarray, int, int]:
    """(prefix_id, prefix_tokens, tokens the chains reuse, tokens the hashes reuse) of
    requests in arrival order with block-hash ``paths`` (the module docstring)."""
    trie: dict[tuple[int, object], int] = {}
    nodes = [_walk(trie, p) for p in paths]          # each request's nodes, root first
    count = np.bincount(np.concatenate([*nodes, np.zeros(0, np.int64)]),
                        minlength=len(trie))
    seen = np.zeros(len(trie), bool)
    owner = np.full(len(trie), -1, np.int64)
    chains: list[list[int]] = []                       # chain -> [end node, cached blocks]
    n = len(paths)
    ids, blocks = np.full(n, -1, np.int64), np.zeros(n, np.int64)
    kept = ideal = 0
    for i, path in enumerate(nodes):
        shared = int(np.flatnonzero(count[path] >= 2)[-1] + 1) if len(path) and \
            count[path[0]] >= 2 else 0
        hit = int(np.flatnonzero(seen[path])[-1] + 1) if len(path) and seen[path[0]] else 0
        seen[path] = True
        ideal += min(hit * BLOCK_TOKENS, int(inputs[i]) - 1)
        if not shared:
            continue
        c = _chain(path[:shared], owner, chains)
        ids[i], blocks[i] = c, shared
        if chains[c][1]:
            kept += min(min(chains[c][1], shared) * BLOCK_TOKENS, int(inputs[i]) - 1)
        else:
            chains[c][1] = shared
    return ids, np.minimum(blocks * BLOCK_TOKENS, inputs), kept, ideal


def _walk(trie: dict, path: list) -> np.ndarray:
    """The trie nodes of ``path``, made where new."""
    out, parent = [], -1
    for h in path:
        parent = trie.setdefault((parent, h), len(trie))
        out.append(parent)
    return np.array(out, np.int64)


def _chain(path: np.ndarray, owner: np.ndarray, chains: list[list[int]]) -> int:
    """The chain a shared path lies on, extends, or starts."""
    if owner[path[-1]] >= 0:
        return int(owner[path[-1]])
    owned = np.flatnonzero(owner[path] >= 0)
    if len(owned):
        c = int(owner[path[owned[-1]]])
        if chains[c][0] == path[owned[-1]]:           # the chain ends where the path leaves
            owner[path[owned[-1] + 1:]] = c
            chains[c][0] = int(path[-1])
            return c
    chains.append([int(path[-1]), 0])
    c = len(chains) - 1
    owner[path[owner[path] < 0]] = c
    return c
