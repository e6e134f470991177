"""The kernel corpus report: ``summary.md`` (tables per device x engine x error class x
regime), ``errors.csv`` (the same groups, machine-readable), ``gemm_dtypes.csv`` (GEMM
rows by dtype and kernel) and one predicted-against-measured figure per device.

error = predicted / measured - 1 (negative: the model is too fast); median and p90 of
|error|, and the signed median (bias), per group of at least one row.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

from perfmodel.compare.errors import summarize
from perfmodel.cost.error_class import ERROR_CLASSES
from perfmodel.kernels.compare import compare_files
from perfmodel.report.palette import error_class_color

GROUPS = ("device", "engine", "error_class", "regime")
GEMM_GROUPS = ("device", "engine", "dtype", "weight_format", "act_quant", "kernel")
MAX_POINTS = 4000      # points drawn per panel


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _signed(x: float) -> str:
    return f"{100 * x:+.1f}%"


def _table(df, columns: list[str]) -> list[str]:
    """A markdown table of ``df``'s groups with n, median |error|, p90 |error|, bias."""
    head = [*columns, "n", "median abs", "p90 abs", "bias (signed median)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in df.itertuples(index=False):
        cells = [str(getattr(r, c)) or "-" for c in columns]
        cells += [str(r.n), _pct(r.median_abs_error), _pct(r.p90_abs_error),
                  _signed(r.median_error)]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def headline(rows) -> list[str]:
    """Median |error| (bias) per device x engine (rows) and error class (columns)."""
    by = summarize(rows, ("device", "engine", "error_class"))
    classes = [c for c in ERROR_CLASSES if c in set(by["error_class"])]
    lines = ["| device | engine | " + " | ".join(classes) + " |",
             "|---|---|" + "---|" * len(classes)]
    for (device, engine), part in by.groupby(["device", "engine"], sort=True):
        cell = {r.error_class: f"{_pct(r.median_abs_error)} ({_signed(r.median_error)})"
                for r in part.itertuples()}
        lines.append(f"| {device} | {engine} | "
                     + " | ".join(cell.get(c, "") for c in classes) + " |")
    return lines


def figure(rows, device: str, path: Path) -> None:
    """Predicted against measured, log-log, one panel per engine, coloured by error class."""
    from matplotlib.figure import Figure

    engines = sorted(set(rows["engine"]))
    fig = Figure(figsize=(4.2 * len(engines), 4.4), layout="constrained")
    axes = fig.subplots(1, len(engines), squeeze=False)[0]
    lo = float(min(rows["measured_s"].min(), rows["predicted_s"].min()))
    hi = float(max(rows["measured_s"].max(), rows["predicted_s"].max()))
    for ax, engine in zip(axes, engines, strict=True):
        part = rows[rows["engine"] == engine]
        if len(part) > MAX_POINTS:           # a seeded thinning keeps the PNG small
            part = part.sample(MAX_POINTS, random_state=0)
        for name in ERROR_CLASSES:
            pts = part[part["error_class"] == name]
            if len(pts):
                ax.scatter(pts["measured_s"], pts["predicted_s"], s=3, alpha=0.4,
                           color=error_class_color(name), label=f"{name} ({len(pts)})",
                           rasterized=True)
        for factor, style in ((1.0, "-"), (1.25, ":"), (0.8, ":")):
            ax.plot([lo, hi], [lo * factor, hi * factor], style, color="black", lw=0.7)
        ax.set(xscale="log", yscale="log", xlabel="measured (s)", title=f"{device} {engine}")
        ax.legend(fontsize=6, markerscale=3, loc="upper left")
    axes[0].set_ylabel("predicted (s)")
    fig.savefig(path, dpi=80)


def _import_notes(corpus: Path) -> list[str]:
    """What the import left out, from the corpus manifest (nothing without one)."""
    import yaml

    path = corpus / "manifest.yaml"
    if not path.is_file():
        return []
    manifest = yaml.safe_load(path.read_text()) or {}
    lines = ["## Left out at import", "",
             f"Source: {manifest.get('source', '?')} {manifest.get('source_version', '')}. "
             "Rows the database derives rather than measures and rows without a positive "
             "time are not in the corpus (`perfmodel.kernels.aiconfigurator`):", ""]
    lines += [f"- {why}: {n}" for why, n in (manifest.get("skipped") or {}).items()]
    for why, paths in (manifest.get("not_read") or {}).items():
        lines.append(f"- {why}: {len(paths)} files")
    return [*lines, ""]


def compare_corpus(corpus: str | Path, out: str | Path, devices: Iterable[str] | None = None,
                   engines: Iterable[str] | None = None, sample: int = 3000, seed: int = 0,
                   figures: bool = True, progress: Callable[[str], None] = lambda s: None
                   ) -> dict:
    """Score ``corpus`` and write the report under ``out``; a summary dict (rows scored)."""
    import pandas as pd

    result = compare_files(corpus, devices, engines, sample, seed, progress)
    rows = result["rows"]
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for column in GEMM_GROUPS:
        rows[column] = rows[column].fillna("") if column in rows else ""
    groups = summarize(rows, GROUPS)
    groups.to_csv(out / "errors.csv", index=False, float_format="%.4f")
    gemm = rows[rows["op"] == "gemm"]
    by_dtype = summarize(gemm, GEMM_GROUPS) if len(gemm) else pd.DataFrame()
    by_dtype.to_csv(out / "gemm_dtypes.csv", index=False, float_format="%.4f")
    available = sum(result["available"].values())
    lines = [
        "# Kernel corpus: predicted against measured, shipped defaults", "",
        f"Corpus `{corpus}`; {len(rows)} rows scored (at most {sample or 'all'} per device x "
        f"engine x class, seed {seed}) of {available} the model can predict. "
        "error = predicted / measured - 1 (negative: the model is too fast); each row is "
        "predicted as the kernels its measured call ran, timed as it was measured.", "",
        f"Reproduce: `perfmodel kernels compare {corpus} --sample {sample} --seed {seed} "
        f"--out {out}`", ""]
    if result["no_hardware"]:
        lines += [f"Not scored (no hardware file): {', '.join(sorted(result['no_hardware']))}.",
                  ""]
    lines += ["## Median |error| (bias) per device x engine x class", "", *headline(rows), "",
              "## Per device x engine x class x regime", "",
              "Regime: compute or memory bound at peak rates; collectives: algorithm "
              "(nccl, or the engine's custom all-reduce) and bytes per device; `eager`: "
              "rows not timed as device time alone (launched one call at a time without a "
              "CUDA graph, so the framework's host time per call is their floor).", ""]
    for device, part in groups.groupby("device", sort=True):
        lines += [f"### {device}", "", *_table(part, ["engine", "error_class", "regime"]), ""]
        if figures:
            name = f"{device}.png"
            figure(rows[rows["device"] == device], device, out / name)
            lines += [f"![{device}]({name})", ""]
    if len(by_dtype):
        lines += ["## GEMMs by dtype, weight format, activation quantization and kernel", "",
                  *_table(by_dtype, list(GEMM_GROUPS)), ""]
    lines += _import_notes(Path(corpus))
    lines += ["## Rows not scored", "", "| device | engine | reason | rows |", "|---|---|---|---|"]
    for (device, engine), counts in sorted(result["skipped"].items()):
        lines += [f"| {device} | {engine} | {why} | {n} |" for why, n in sorted(counts.items())]
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    return {"scored": len(rows), "available": available, "groups": groups}
