"""Signed median error of TensorRT-LLM's MoE rows by expert parallelism, with the shipped
hardware files of the checkout it runs from (issue 32; the three-step sort's scans).

    PYTHONPATH=. python reports/kernels/moetrt/scan/ep_sweep.py --from CORPUS [--format F]

Rows: balanced routing, at least 1,024 tokens, the gated CUTLASS kernel, the newest engine
version; ``--format`` picks the weight format column ("" for 16-bit weights).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[4]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import perfmodel as pm  # noqa: E402
from validate.corpus.sets import moe_set, price_moe  # noqa: E402

DEVICES = ("h100-sxm", "h200-sxm", "b200")


def errors(corpus: Path, device: str, fmt: str) -> pd.DataFrame:
    d = pd.read_csv(corpus / f"{device}__trtllm.csv.gz", low_memory=False)
    d = d[(d.op == "moe") & (d.kernel == "moe_torch_flow_cutlass") & (d.m >= 1024)
          & (d.distribution == "balanced")
          & (d.weight_format.fillna("").astype(str) == fmt)]
    d = d[d.engine_version == d.engine_version.max()]
    if d.empty:
        return d.assign(error=[])
    rows = d.astype(object).where(d.notna(), "").astype(str).to_dict("records")
    cols = moe_set(rows, d.measured_s.to_numpy()).columns
    predicted = np.ravel(price_moe(cols, pm.hardware(device, "trtllm")))
    return d.assign(error=predicted / d.measured_s.to_numpy() - 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--from", dest="corpus", type=Path, required=True)
    ap.add_argument("--format", default="")
    args = ap.parse_args()
    table = {dev: e.groupby("ep").error.median() for dev in DEVICES
             if len(e := errors(args.corpus, dev, args.format))}
    eps = sorted({ep for t in table.values() for ep in t.index})
    print("| device | " + " | ".join(f"EP {ep:g}" for ep in eps) + " |")
    print("|---|" + "---:|" * len(eps))
    for dev, t in table.items():
        print(f"| {dev} | " + " | ".join(f"{t[ep]:+.0%}" if ep in t.index else "-"
                                        for ep in eps) + " |")


if __name__ == "__main__":
    main()
