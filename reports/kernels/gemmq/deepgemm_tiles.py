"""reports/kernels/gemmq/deepgemm_tiles.md: SGLang's quantized linears held out (5 folds by
weight n x k) per format class and dispatch bucket, before and after pricing its
block-fp8 GEMMs on DeepGEMM's own tile (``cost.kernel_tiles``) with the top bucket's
own k-depth ramp (``k_half``). Before: the same files with ``gemm_kernel_tiles`` and
``k_half`` taken out (the fit restarts from the same start, so this is the fit of the
commit before).

    PYTHONPATH=. python reports/kernels/gemmq/deepgemm_tiles.py --from /tmp/gemm_corpus
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

import numpy as np

import perfmodel as pm
from perfmodel.cost.moe import FORMATS
from validate.corpus.fit import held_out
from validate.corpus.rows import Rows, load_sets

HERE = Path(__file__).resolve().parent
DEVICES = ("h100-sxm", "h200-sxm", "b200")


def errors(hw, s) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(format, bucket, held-out error) of every row of ``s``, in held-out order."""
    order = [np.flatnonzero(s.fold == f) for f in range(5)]
    fmt = np.concatenate([s.columns["format"][i] for i in order])
    bucket = np.concatenate([s.columns["bucket"][i] for i in order])
    return fmt, bucket, held_out(hw, [s])["gemm_quantized"]


def rows_of(device: str, s) -> list[str]:
    hw = pm.hardware(device, "sglang")
    off = replace(hw, efficiency=replace(hw.efficiency, gemm_kernel_tiles={},
                                         gemm_kernel_k_half={}))
    fmt, bucket, before = errors(off, s)
    _, _, after = errors(hw, s)
    out = []
    groups = [(f"{FORMATS[int(f)]} M <= {b:g}" if np.isfinite(b) else
               f"{FORMATS[int(f)]} top", (fmt == f) & (bucket == b))
              for f in np.unique(fmt) for b in np.unique(bucket[fmt == f])]
    groups.append(("all", np.ones(len(fmt), dtype=bool)))
    for name, sel in groups:
        out.append(f"| {device} | {name} | {int(sel.sum())} | "
                   f"{np.median(np.abs(before[sel])):.1%} | "
                   f"{np.median(np.abs(after[sel])):.1%} |")
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--from", dest="source", required=True)
    a = p.parse_args(argv)
    rows = Rows(a.source)
    lines = ["| device | class and dispatch bucket | rows | before | after |",
             "|---|---|---:|---:|---:|"]
    for device in DEVICES:
        sets, _ = load_sets(device, "sglang", rows)
        lines += rows_of(device, next(s for s in sets if s.error_class == "gemm_quantized"))
    (HERE / "deepgemm_tiles.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
