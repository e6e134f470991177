"""Summarize one or more ``perfmodel compare-inferencex --out`` folders' rows.csv (for
example one run per GPU x engine, run side by side) as the command's table, optionally
only the rows ``--every N`` keeps and those another run replayed (``--replayed-in``), so
that a full run and a sampled run compare on the same rows:

    python reports/inferencex/summarize.py reports/inferencex/before --every 3 \
        --measurements ../shared/measurements/inferencex/deepseek-r1-h200-mi300x.csv
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
    parser.add_argument("--replayed-in", type=Path, nargs="*", default=[],
                        help="only the rows these folders' runs replayed (not skipped)")
    args = parser.parse_args()
    keep = {p.id for p in ix.sample(ix.load(args.measurements), args.every)}
    if args.replayed_in:
        other = pd.concat([pd.read_csv(f / "rows.csv") for f in args.replayed_in])
        keep &= set(other.loc[other["skipped"].isna(), "id"])
    rows = pd.concat([pd.read_csv(f / "rows.csv") for f in args.folders])
    records = [{k: v for k, v in r.items() if not (isinstance(v, float) and np.isnan(v))}
               for r in rows.to_dict("records") if r["id"] in keep]
    print(summary_table(ix.summarize(records)))


if __name__ == "__main__":
    main()
