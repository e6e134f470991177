"""Score aiconfigurator-core's MLA attention tables (context_mla_perf, generation_mla_perf)
against the model, per device x engine x phase x kernel x KV dtype.

    perfmodel kernels import aiconfigurator --out /tmp/mla_corpus --device h200-sxm \
        --device h100-sxm --device b200 --engine sglang --engine trtllm
    python reports/kernels/mla/score.py /tmp/mla_corpus h200-sxm,h100-sxm,b200 [--before]

``--before``: with the latent decode tile unset (``attention_decode_tile_q_latent`` 0: the
head-dim-128 decode tile, as the model priced MLA decode before). Prints the table
README.md quotes.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

from perfmodel.kernels.compare import device_for, score
from perfmodel.kernels.corpus import read_file

TABLES = ("context_mla_perf", "generation_mla_perf")


def main() -> None:
    folder, devices = Path(sys.argv[1]), sys.argv[2].split(",")
    before, cache, out = "--before" in sys.argv, {}, []
    for dev in devices:
        for eng in ("sglang", "trtllm"):
            path = folder / f"{dev}__{eng}.csv.gz"
            if not path.exists():
                continue
            df = read_file(path)
            df = df[df.table.isin(TABLES)]
            hw = device_for(dev, eng, cache)
            if before:
                hw = replace(hw, efficiency=replace(hw.efficiency,
                                                    attention_decode_tile_q_latent=0))
            if len(df):
                out.append(pd.DataFrame(score(df.to_dict("records"), hw)))
    r = pd.concat(out)
    r["err"] = r.predicted_s / pd.to_numeric(r.measured_s) - 1
    r["phase"] = np.where(r.table.str.startswith("context"), "context", "generation")
    keys = ["device", "engine", "engine_version", "phase", "kernel", "kv_dtype"]
    print(r.groupby(keys).err.agg(
        n="count", bias="median", median_abs=lambda x: x.abs().median(),
        p90_abs=lambda x: x.abs().quantile(0.9)).round(3).to_string())


if __name__ == "__main__":
    main()
