"""reports/kernels/moe/README.md: the corpus scored before and after the fused-MoE and
quantized-GEMM kernel constants (docs/kernels-moe.md), per device x engine x class, with
the fit's held-out and leave-one-device-out figures.

    perfmodel kernels import aiconfigurator --out /tmp/corpus --device h100-sxm \\
        --device h200-sxm --device b200
    perfmodel kernels compare /tmp/corpus --sample 1000 --seed 0 --out /tmp/before --no-figures
        (on the commit before the change; its summary.md etc. copied to before_*)
    python -m validate.corpus.moe --from /tmp/corpus -H h100-sxm -H h200-sxm -H b200 \\
        --report reports/kernels/moe --write-hardware
    perfmodel kernels compare /tmp/corpus --sample 1000 --seed 0 --out /tmp/after --no-figures
        (its summary.md, errors.csv and gemm_dtypes.csv copied to after_*)
    PYTHONPATH=. python reports/kernels/moe/make_readme.py
"""

from __future__ import annotations

import csv
from pathlib import Path

HERE = Path(__file__).resolve().parent


def headline(path: Path) -> tuple[list[str], dict[tuple[str, str], dict[str, str]]]:
    """(classes, {(device, engine): {class: 'median (bias)'}}) of a summary.md's first
    table."""
    lines = path.read_text().splitlines()
    start = lines.index("## Median |error| (bias) per device x engine x class")
    head = [c.strip() for c in lines[start + 2].strip("|").split("|")]
    out = {}
    for line in lines[start + 4:]:
        if not line.startswith("| "):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        out[(cells[0], cells[1])] = dict(zip(head[2:], cells[2:], strict=True))
    return head[2:], out


def _median(cell: str) -> str:
    return cell.split(" ")[0] if cell else ""


def table(before: dict, after: dict, classes: list[str]) -> str:
    lines = ["| device | engine | " + " | ".join(classes) + " |",
             "|---|---|" + "---|" * len(classes)]
    for key in sorted(set(before) | set(after)):
        cells = []
        for c in classes:
            b, a = _median(before.get(key, {}).get(c, "")), _median(after.get(key, {}).get(c, ""))
            cells.append(f"{b or '-'} -> {a or '-'}" if a or b else "")
        lines.append(f"| {key[0]} | {key[1]} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def by_format(path: Path) -> dict[tuple[str, str, str], tuple[int, float]]:
    """{(device, engine, dtype/format/act_quant): (rows, median |error|)} of GEMM rows of a
    gemm_dtypes.csv, its kernels pooled by row-weighted median of medians (a summary)."""
    groups: dict[tuple[str, str, str], list[tuple[int, float]]] = {}
    with path.open() as f:
        for r in csv.DictReader(f):
            name = "/".join(x for x in (r["dtype"], r["weight_format"], r["act_quant"]) if x)
            groups.setdefault((r["device"], r["engine"], name), []).append(
                (int(r["n"]), float(r["median_abs_error"])))
    out = {}
    for key, parts in groups.items():
        parts.sort(key=lambda p: p[1])
        total = sum(n for n, _ in parts)
        seen = 0
        for n, m in parts:
            seen += n
            if seen >= total / 2:
                out[key] = (total, m)
                break
    return out


def format_table() -> str:
    before, after = by_format(HERE / "before_gemm_dtypes.csv"), by_format(
        HERE / "after_gemm_dtypes.csv")
    lines = ["| device | engine | GEMM dtype / format / activation quantization | rows | "
             "before | after |", "|---|---|---|---:|---:|---:|"]
    for key in sorted(set(before) | set(after)):
        if key[2] in ("bf16", "fp16"):
            continue
        b, a = before.get(key), after.get(key)
        lines.append(f"| {key[0]} | {key[1]} | {key[2]} | {(a or b)[0]} | "
                     + (f"{b[1]:.1%}" if b else "-") + " | " + (f"{a[1]:.1%}" if a else "-")
                     + " |")
    return "\n".join(lines)


def main() -> None:
    classes, before = headline(HERE / "before_summary.md")
    after_classes, after = headline(HERE / "after_summary.md")
    classes = [*classes, *[c for c in after_classes if c not in classes]]
    fits = [(HERE / name).read_text().split("\n\n", 3)[-1] for name in
            ("calibration.md", "calibration_gemm_quantized.md") if (HERE / name).is_file()]
    text = "\n".join([
        "# Kernel corpus: fused MoE layers and quantized GEMMs, before and after",
        "",
        "Median |error| per device x engine x error class (error = predicted / measured - 1;",
        "at most 1,000 rows per device x engine x class, seed 0; aiconfigurator-core 0.12.0).",
        "**Before**: the shipped files before the change ([before_summary.md](before_summary.md)).",
        "**After**: the collector's routing reproduced, the fused MoE layer's kernels, and the",
        "per-format kernel constants fitted into each engine's block",
        "([after_summary.md](after_summary.md); docs/kernels-moe.md). Regenerate: the commands in",
        "`make_readme.py`'s docstring.",
        "",
        table(before, after, classes),
        "",
        "## Quantized dense GEMMs by format (median of the kernels' medians, row-weighted)",
        "",
        "Unchanged: `gemm_kernels` was fitted (calibration_gemm_quantized.md below) but is not",
        "shipped. Pooled over decode and prefill sizes it made the fp8 gemv rows worse (vLLM",
        "H100 fp8 per-tensor gemv: +37% against -20% before), and vLLM's CUTLASS fp8 GEMM picks",
        "its configs per M bucket (1-16, 17-64, 65-128, >128). vLLM's fp8-block rows",
        "(95%) are timed eagerly: their ~80 us floor is the host path (docs/kernels-moe.md).",
        "",
        format_table(),
        "",
        "## The fit: held out (5 folds by shape) and leave one device out",
        "",
        "Rows: every measured row of the newest engine version (fused MoE layers: every",
        "format and kernel; quantized linears: those replayed from a CUDA graph). Leave one",
        "device out: H100 predicted by the fit on H200 and the reverse; B200 has no family",
        "peer among the fitted devices ('-').",
        "",
        *fits,
        ""])
    (HERE / "README.md").write_text(text)


if __name__ == "__main__":
    main()
