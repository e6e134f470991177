"""Why the fused-MoE fit is worse on H200 than on H100: the residual breakdown of the README.

Prices every fitted MoE row of H100 and H200 (the rows ``validate.corpus.rows.load_sets``
fits: newest engine version per format, the served kernels) with the shipped hardware
files, matches the two devices' rows by shape, and prints per kernel the median |error|,
the measured H200 / H100 time ratio by tokens per expert, and the split of the log error
into a per-shape bias and the spread within a shape. ``--bandwidth`` refits H200 held out
with H100's HBM peak (a diagnostic only: does the fit improve when H200 streams no faster
than H100?).

    python reports/kernels/moetriton/breakdown.py --from /tmp/corpus_vs --engine vllm
    python reports/kernels/moetriton/breakdown.py --from /tmp/corpus_vs --engine sglang \
        --bandwidth 3.35e12
"""

from __future__ import annotations

import argparse
from dataclasses import replace

import numpy as np
import pandas as pd

import perfmodel as pm
from perfmodel.compare.moe_routing import is_known
from perfmodel.specs.dtypes import CODE
from validate.corpus.fit import held_out, summary
from validate.corpus.rows import Rows, _newest_per_format, _records, load_sets, served
from validate.corpus.sets import moe_set

DEVICES = ("h100-sxm", "h200-sxm")
SHAPE = ["kernel", "format", "n", "k", "experts", "topk", "ep"]
ROW = [*SHAPE, "m", "distribution"]
TOKENS_PER_EXPERT = [0, 1, 16, 256, np.inf]


def residuals(rows: Rows, engine: str) -> pd.DataFrame:
    """Every fitted MoE row of both devices with its error under the shipped file."""
    out = []
    for dev in DEVICES:
        df = rows.frame(dev, engine)
        moe = df[(df["table"] == "moe_perf") & df["distribution"].map(is_known)
                 & df["dtype"].isin(list(CODE))]
        moe, _ = served(_newest_per_format(moe), engine, dev)
        s = moe_set(_records(moe), moe["measured_s"].to_numpy())
        part = moe[["kernel", "m", "n", "k", "experts", "topk", "ep", "distribution",
                    "measured_s"]].copy()
        part["format"] = moe["dtype"] + "/" + moe["weight_format"]
        part["device"] = dev
        part["error"] = s.errors(pm.hardware(dev, engine))
        part["per_expert"] = s.columns["pairs"] / s.columns["groups"]
        out.append(part)
    return pd.concat(out, ignore_index=True)


def by_kernel(d: pd.DataFrame) -> pd.DataFrame:
    """Median |error| and signed median per kernel and device."""
    g = d.assign(abs_error=d["error"].abs()).groupby(["kernel", "format", "device"])
    return g.agg(rows=("error", "size"), median_abs=("abs_error", "median"),
                 bias=("error", "median")).unstack("device")


def ratios(d: pd.DataFrame) -> pd.DataFrame:
    """Measured H200 / H100 time of the same row, q10 / median / q90 by tokens per expert."""
    a, b = (d[d["device"] == dev].drop_duplicates(ROW).set_index(ROW) for dev in DEVICES)
    j = a.merge(b, left_index=True, right_index=True, suffixes=("_a", "_b"))
    ratio = j["measured_s_b"] / j["measured_s_a"]
    band = pd.cut(j["per_expert_a"], TOKENS_PER_EXPERT)
    return ratio.groupby(band, observed=True).quantile([0.1, 0.5, 0.9]).unstack()


def split(d: pd.DataFrame) -> pd.DataFrame:
    """Median |log error| of all rows, of each shape's median (its bias) and of the rows
    about their shape's median (the spread within a shape)."""
    log = np.log1p(d["error"])
    shape_bias = log.groupby([d["device"], *(d[c] for c in SHAPE)]).transform("median")
    out = pd.DataFrame({"all": log.abs(), "within_shape": (log - shape_bias).abs()})
    out["device"] = d["device"]
    per_shape = log.groupby([d["device"], *(d[c] for c in SHAPE)]).median().abs()
    return out.groupby("device").median().assign(
        shape_bias=per_shape.groupby(level=0).median())


def bandwidth_trial(rows: Rows, engine: str, bandwidth: float) -> float:
    """H200's held-out median |error| with its HBM peak replaced by ``bandwidth``."""
    sets = [s for s in load_sets("h200-sxm", engine, rows)[0] if s.error_class == "moe"]
    hw = replace(pm.hardware("h200-sxm", engine), memory_bytes_per_s=bandwidth)
    return summary(held_out(hw, sets)["moe"])["median_abs"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--from", dest="source", required=True)
    p.add_argument("--engine", default="vllm")
    p.add_argument("--bandwidth", type=float)
    a = p.parse_args()
    rows = Rows(a.source)
    d = residuals(rows, a.engine)
    with pd.option_context("display.width", 250, "display.max_columns", 20):
        print(by_kernel(d).round(3), ratios(d).round(2), split(d).round(3), sep="\n\n")
    if a.bandwidth:
        print(f"\nH200 held out at {a.bandwidth:.3g} B/s: "
              f"{bandwidth_trial(rows, a.engine, a.bandwidth):.1%}")


if __name__ == "__main__":
    main()
