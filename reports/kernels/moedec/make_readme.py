"""reports/kernels/moedec/README.md's tables: the fused-MoE fit's held-out and
leave-one-device-out figures before (reports/kernels/moe/calibration.md, the fit this
change replaces) and after (calibration_moe.md here), and the moe class of
``perfmodel kernels compare`` with the shipped files before and after.

    PYTHONPATH=. python reports/kernels/moedec/make_readme.py BEFORE_SUMMARY AFTER_SUMMARY

prints the two tables (BEFORE_SUMMARY / AFTER_SUMMARY: the summary.md files of
``perfmodel kernels compare`` run on the commit before and after).
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
BEFORE_FIT = HERE.parent / "moe" / "calibration.md"
AFTER_FIT = HERE / "calibration_moe.md"
DEVICES = ("h100-sxm", "h200-sxm", "b200")
ENGINES = ("vllm", "sglang", "trtllm")


def fit_rows(path: Path) -> dict[tuple[str, str], list[str]]:
    """{(device, engine): [rows, before, held-out, bias, lodo]} of a calibration table
    (with or without a class column)."""
    out = {}
    for line in path.read_text().splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) < 7 or cells[0] not in DEVICES or cells[1] not in ENGINES:
            continue
        if cells[2] in ("moe", "gemm_quantized"):
            if cells[2] != "moe":
                continue
            cells = cells[:2] + cells[3:]
        out[(cells[0], cells[1])] = cells[2:]
    return out


def moe_cells(path: Path) -> dict[tuple[str, str], str]:
    """{(device, engine): 'median (bias)'} of the moe column of a compare summary.md."""
    from reports.kernels.moe.make_readme import headline

    _, table = headline(path)
    return {k: v.get("moe", "") for k, v in table.items()}


def main(before: str, after: str) -> None:
    old, new = fit_rows(BEFORE_FIT), fit_rows(AFTER_FIT)
    print("| device | engine | rows before -> after | held-out before -> after | "
          "held-out bias | leave-one-device-out before -> after |")
    print("|---|---|---:|---:|---:|---:|")
    for engine in ENGINES:
        for device in DEVICES:
            o, n = old.get((device, engine)), new.get((device, engine))
            if not n:
                continue
            o = o or ["-"] * 5
            print(f"| {device} | {engine} | {o[0]} -> {n[0]} | {o[2]} -> {n[2]} | {n[3]} | "
                  f"{o[4]} -> {n[4]} |")
    b, a = moe_cells(Path(before)), moe_cells(Path(after))
    print("\n| device | engine | moe median abs error (bias), before | after |")
    print("|---|---|---:|---:|")
    for key in sorted(set(b) | set(a)):
        if b.get(key) or a.get(key):
            print(f"| {key[0]} | {key[1]} | {b.get(key) or '-'} | {a.get(key) or '-'} |")


if __name__ == "__main__":
    main(*sys.argv[1:3])
