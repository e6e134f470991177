"""Summarize one or more ``perfmodel compare-inferencex --out`` folders' rows.csv (for
example one run per GPU x engine, run side by side) as the command's table, optionally
only the rows ``--every N`` keeps and those another run replayed (``--replayed-in``), so
that a full run and a sampled run compare on the same rows:

    python reports/inferencex/summarize.py reports/inferencex/before --every 3 \
        --measurements ../shared/measurements/inferencex/deepseek-r1-h200-mi300x.csv

``--half 0`` / ``--half 1``: of the rows ``--every N`` keeps, those at even / odd places in
each GPU x engine (with ``--every 6``: every 12th row, and every 12th from the 6th on), so a
change is checked on two disjoint halves apart.
"""

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

from perfmodel.cli.inferencex import summary_table
from perfmodel.compare import inferencex as ix

DATA = Path("../shared/measurements/inferencex/deepseek-r1-h200-mi300x.csv")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("folders", nargs="+", type=Path)
    parser.add_argument("--every", type=int, default=1)
    parser.add_argument("--measurements", type=Path, default=DATA)
    parser.add_argument("--half", type=int, choices=(0, 1), default=None,
                        help="only the even (0) or odd (1) places of each group's sample")
    parser.add_argument("--replayed-in", type=Path, nargs="*", default=[],
                        help="only the rows these folders' runs replayed (not skipped)")
    args = parser.parse_args()
    kept = ix.sample(ix.load(args.measurements), args.every)
    if args.half is not None:
        kept = [p for i, p in _places(kept) if i % 2 == args.half]
    keep = {p.id for p in kept}
    if args.replayed_in:
        other = pd.concat([pd.read_csv(f / "rows.csv") for f in args.replayed_in])
        keep &= set(other.loc[other["skipped"].isna(), "id"])
    rows = pd.concat([pd.read_csv(f / "rows.csv") for f in args.folders])
    records = [{k: v for k, v in r.items() if not (isinstance(v, float) and np.isnan(v))}
               for r in rows.to_dict("records") if r["id"] in keep]
    print(summary_table(ix.summarize(records)))


def _places(points: list) -> list[tuple[int, object]]:
    """(place within its group, point) for each point, in order."""
    seen: dict = {}
    out = []
    for p in points:
        seen[p.group] = seen.get(p.group, -1) + 1
        out.append((seen[p.group], p))
    return out


if __name__ == "__main__":
    main()
