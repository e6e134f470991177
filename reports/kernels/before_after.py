"""reports/kernels/README.md: median |error| per device x engine x error class before (the
datasheet-era hardware files, reports/kernels/before/summary.md) and after (the files
calibrated to aiconfigurator-core's kernels, reports/kernels/summary.md).

    PYTHONPATH=. python reports/kernels/before_after.py
"""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve().parent
CLASSES = ("gemv", "gemm", "moe", "attention_prefill", "attention_decode", "collective",
           "memory")


def headline(path: Path) -> dict[tuple[str, str], dict[str, str]]:
    """{(device, engine): {class: median}} of a summary.md's first table."""
    out: dict[tuple[str, str], dict[str, str]] = {}
    lines = path.read_text().splitlines()
    start = lines.index("## Median |error| (bias) per device x engine x class")
    for line in lines[start + 4:]:
        if not line.startswith("| "):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        out[(cells[0], cells[1])] = {k: v.split(" ")[0] for k, v in zip(CLASSES, cells[2:],
                                                                         strict=True)}
    return out


def table(before: dict, after: dict) -> str:
    """The before -> after markdown table (a device scored only after: '- -> x')."""
    lines = ["| device | engine | " + " | ".join(CLASSES) + " |",
             "|---|---|" + "---|" * len(CLASSES)]
    for key in sorted(set(before) | set(after)):
        cells = []
        for c in CLASSES:
            b, a = before.get(key, {}).get(c, ""), after.get(key, {}).get(c, "")
            cells.append(f"{b or '-'} -> {a or '-'}" if a or b else "")
        lines.append(f"| {key[0]} | {key[1]} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    before = headline(HERE / "before" / "summary.md")
    after = headline(HERE / "summary.md")
    text = f"""# Kernel corpus: before and after calibration

Median |error| per device x engine x error class, error = predicted / measured - 1, at
most 3,000 rows per device x engine x class (seed 0). **Before**: the hardware files'
datasheet-era constants ([before/summary.md](before/summary.md), its errors.csv and
gemm_dtypes.csv); **after**: the files calibrated to aiconfigurator-core 0.12.0's measured
kernels (../calibration/README.md), each engine's rows priced with that engine's block
([summary.md](summary.md)). '-': not scored then (no hardware file). Vidur, LLMCompass and
NCCL rows are priced with the top-level (vLLM) figures.

```bash
perfmodel kernels compare runs/corpus --sample 3000 --seed 0 --out reports/kernels
PYTHONPATH=. python reports/kernels/before_after.py
```

{table(before, after)}
"""
    (HERE / "README.md").write_text(text)
    print(table(before, after))


if __name__ == "__main__":
    main()
