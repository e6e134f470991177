"""Split Vidur's A100 prefill attention into the chunk's own causal triangle and the prior context.

For each chunk length q, the time of a chunk after kv_len - q cached tokens grows linearly
in kv_len; the slope (seconds per cached key) gives the rate at which the kernel attends to
prior context, and the kv_len = q row gives the rate of the chunk's own causal triangle.
The same split is printed for perfmodel's prediction with the shipped A100 file, so the two
parts can be compared separately: once for the standard path (varlen kernel) and once for
the path Sarathi-Serve ran (``attention_append_kv``: flash_attn_with_kvcache appending the
chunk's K/V in every program). Nothing is fitted.

    python reports/a100/attention_increment.py [../shared/measurements/vidur-a100-attention.csv]
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

import perfmodel as pm
from perfmodel.compare import predict_rows

DEFAULT = Path(__file__).resolve().parents[3] / "shared/measurements/vidur-a100-attention.csv"


def main(path: Path) -> None:
    hw = pm.hardware("a100-80gb-sxm")
    append = replace(hw, efficiency=replace(hw.efficiency, attention_append_kv=True))
    data = pd.read_csv(path)
    prefill = data[(data.q_len > 1) & (data.batch == 1)].copy()
    records = prefill.to_dict("records")
    prefill["predicted_s"] = [r["predicted_s"] for r in predict_rows(records, hw, "kernel")]
    prefill["append_s"] = [r["predicted_s"] for r in predict_rows(records, append, "kernel")]
    print(f"{path.name}: batch-1 prefill rows, TFLOP/s (4 x q x heads x head_dim per key)")
    print("predicted: standard path / append-KV path")
    print(f"{'q_len':>6} {'prior ctx: measured':>20} {'predicted':>14} "
          f"{'own triangle: measured':>23} {'predicted':>14}")
    for q, g in prefill.groupby("q_len"):
        later = g[g.kv_len >= q + 256]
        first = g[g.kv_len == q]
        if len(later) < 4 or first.empty or q % 384:
            continue
        per_key = 4 * q * g.n_heads.iloc[0] * g.head_dim.iloc[0]
        tri = per_key * (q + 1) / 2
        slope_m = np.polyfit(later.kv_len, later.measured_s, 1)[0]
        slope_p = np.polyfit(later.kv_len, later.predicted_s, 1)[0]
        slope_a = np.polyfit(later.kv_len, later.append_s, 1)[0]
        rates = f"{per_key / slope_p / 1e12:.0f} / {per_key / slope_a / 1e12:.0f}"
        tri_p = (f"{tri / first.predicted_s.median() / 1e12:.0f} / "
                 f"{tri / first.append_s.median() / 1e12:.0f}")
        print(f"{q:>6} {per_key / slope_m / 1e12:>20.0f} {rates:>14} "
              f"{tri / first.measured_s.median() / 1e12:>23.0f} {tri_p:>14}")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT)
