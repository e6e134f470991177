"""TensorRT-LLM's decode attention rows (aiconfigurator-core ``generation_attention_perf``,
TRT-LLM 1.3.0rc20, XQA) scored on a 4,000-row sample (seed 1): overall, by KV dtype and by
query heads per KV head.

    perfmodel kernels import aiconfigurator --out /tmp/corpus --device h200-sxm \
        --device h100-sxm --engine trtllm
    python reports/kernels/xqa/score.py /tmp/corpus h200-sxm [TILE]

TILE: the decode row tile to price with (as shipped when omitted; 128 = before).
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pandas as pd

from perfmodel.kernels.compare import device_for, score
from perfmodel.kernels.corpus import read_file


def main() -> None:
    folder, dev = Path(sys.argv[1]), sys.argv[2]
    tile = int(sys.argv[3]) if len(sys.argv) > 3 else -1
    df = read_file(folder / f"{dev}__trtllm.csv.gz")
    df = df[df.table == "generation_attention_perf"].sample(4000, random_state=1)
    hw = device_for(dev, "trtllm", {})
    if tile >= 0:
        hw = replace(hw, efficiency=replace(hw.efficiency, attention_decode_tile_q=tile))
    r = pd.DataFrame(score(df.to_dict("records"), hw))
    r["err"] = r.predicted_s / pd.to_numeric(r.measured_s) - 1
    r["heads_per_kv_head"] = pd.to_numeric(r.n_heads) // pd.to_numeric(r.n_kv_heads)
    stats = {"median_abs": lambda x: x.abs().median(), "bias": "median", "n": "size"}
    print(f"{dev}, tile {tile if tile >= 0 else 'as shipped'}: median |error| "
          f"{r.err.abs().median():.3f}, bias {r.err.median():+.3f}")
    print(r.groupby("kv_dtype").err.agg(**stats).round(3).to_string())
    print(r.groupby("heads_per_kv_head").err.agg(**stats).round(3).T.to_string())


if __name__ == "__main__":
    main()
