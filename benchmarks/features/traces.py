"""Public traces: the 10,000 requests written as a Mooncake JSONL trace (each prompt's
512-token blocks as hash_ids, the first block shared by all, as a system prompt) and as an
Azure LLM inference trace (TIMESTAMP as a date and time), each read back through
``serving.traces`` (the read's time printed apart), the Mooncake one then simulated."""

from __future__ import annotations

import json
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

from perfmodel.serving import traces
from perfmodel.serving.simulate import simulate

LABEL = "public traces (Mooncake JSONL)"
BLOCK = 512


def _mooncake(reqs, path: Path) -> None:
    next_id = 1
    with path.open("w") as file:
        for t, n, out in zip(reqs.arrival_s, reqs.input_tokens, reqs.output_tokens,
                             strict=True):
            blocks = -(-int(n) // BLOCK)
            hashes = [0, *range(next_id, next_id + blocks - 1)]
            next_id += blocks - 1
            file.write(json.dumps({"timestamp": round(t * 1000), "input_length": int(n),
                                   "output_length": int(out), "hash_ids": hashes}) + "\n")


def _azure(reqs, path: Path) -> None:
    start = datetime(2024, 5, 10, tzinfo=timezone.utc)
    with path.open("w") as file:
        file.write("TIMESTAMP,ContextTokens,GeneratedTokens\n")
        for t, n, out in zip(reqs.arrival_s, reqs.input_tokens, reqs.output_tokens,
                             strict=True):
            stamp = (start + timedelta(seconds=float(t))).isoformat(sep=" ")
            file.write(f"{stamp},{int(n)},{int(out)}\n")


def run(reqs, model, hw):
    with tempfile.TemporaryDirectory() as folder:
        moon, azure = Path(folder) / "trace.jsonl", Path(folder) / "trace.csv"
        _mooncake(reqs, moon)
        _azure(reqs, azure)
        traces.read(moon)                      # the readers' imports (pandas) paid once
        for path in (moon, azure):
            start = time.perf_counter()
            loaded = traces.read(path)
            print(f"  read {len(loaded.requests):,} requests of {loaded.fmt} in "
                  f"{time.perf_counter() - start:.3f} s", flush=True)
        return simulate(model, hw, traces.read(moon).requests)
