"""Validation report: predictions for measured rows, error tables, summary.md, figures.

No torch here: the report can be rebuilt from the CSVs alone (``write_report``).
Rows measured while other processes kept the CPUs busy (``others_busy`` above
``records.CONTENDED``) are listed but left out of the statistics; rows whose shape was used
for fitting the hardware (its ``calibration.fit_shapes``) are not held out and are left out
too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from perfmodel.compare import predict_rows, shape_key, summarize
from perfmodel.cost.roofline import op_time
from perfmodel.report import tables
from perfmodel.specs import Hardware, Model
from validate import figures
from validate.records import CONTENDED, contended
from validate.suites import MODELS, Step

FIGURES = {"predicted_vs_measured.png": "predicted against measured, held-out kernels",
           "error_by_class.png": "signed error per operator class, held-out kernels",
           "roofline.png": "measured kernels on the device roofline"}


def fit_keys(hw: Hardware) -> set[str]:
    """Shape keys the hardware was fitted on (from its calibration block): the efficiency's
    ``fit_shapes`` and the kernels the layer glue subtracts (``layer_overhead.kernel_shapes``)."""
    cal = hw.calibration or {}
    return set(cal.get("fit_shapes", [])) \
        | set((cal.get("layer_overhead") or {}).get("kernel_shapes", []))


def kernel_predictions(rows: list[dict], hw: Hardware):  # -> pandas.DataFrame
    """Predicted rows with ``heldout`` (shape not fitted) and ``contended`` flags."""
    import pandas as pd

    keys = fit_keys(hw)
    df = pd.DataFrame(predict_rows(rows, hw, timing="auto"))
    for column in ("measured_s", "predicted_s", "error", "flops", "bytes", "intensity"):
        df[column] = pd.to_numeric(df[column])
    df["heldout"] = [shape_key(r) not in keys for r in rows]
    df["contended"] = [contended(r) for r in rows]
    return df


def step_prediction(row: dict, hw: Hardware, timing: str,
                    models: dict[str, Model] = MODELS) -> float:
    """Predicted seconds of a layer or model step row (steps.csv): ``step_seconds``."""
    return step_seconds(Step.from_row(row, models), hw, timing)


def step_seconds(step: Step, hw: Hardware, timing: str) -> float:
    """Predicted seconds of ``step``: the sum of ``op_time`` over its records, the framework
    glue of its layers (the ``layer_overhead`` operator) included where ``hw`` has some."""
    return float(sum(np.sum(op_time(op, hw, timing).time_s)
                     for op in step.records(hw, timing)))


def step_predictions(rows: list[dict], hw: Hardware,
                     models: dict[str, Model] = MODELS):  # -> pandas.DataFrame
    import pandas as pd

    out = []
    for row in rows:
        measured = float(row["measured_s"])
        predicted = step_prediction(row, hw, row.get("timing") or "host", models)
        out.append(dict(row) | {"measured_s": measured, "predicted_s": predicted,
                                "error": predicted / measured - 1.0,
                                "contended": contended(row)})
    return pd.DataFrame(out)


def markdown_table(df, percent: tuple[str, ...] = ()) -> str:
    """A DataFrame as a GitHub markdown table; ``percent`` columns as percentages (signed
    for the signed errors)."""
    def cell(c: str, v: object) -> str:
        if c in percent:
            sign = "+" if c in SIGNED else ""
            return f"{100 * v:{sign}.1f}%" if isinstance(v, float) and math.isfinite(v) else ""
        return f"{v:.4g}" if isinstance(v, float) else str(v)

    columns = [str(c) for c in df.columns]
    body = ([cell(c, r[c]) for c in df.columns] for _, r in df.iterrows())
    return tables.markdown_table(columns, body)


PCT = ("median_abs_error", "p90_abs_error", "median_error", "error")
SIGNED = ("median_error", "error")


def target_lines(df) -> list[str]:
    """Median absolute error of GEMMs and of memory-bound non-GEMM ops (the issue's
    targets), and of everything held out."""
    gemm = df[df["op_class"] == "gemm"]
    memory = df[(df["op_class"] != "gemm") & (df["regime"] == "memory")]
    out = []
    for label, part in (("GEMMs", gemm), ("memory-bound ops (non-GEMM)", memory),
                        ("all held-out kernels", df)):
        if len(part):
            out.append(f"- {label}: median |error| {100 * part['error'].abs().median():.1f}%, "
                       f"p90 {100 * part['error'].abs().quantile(0.9):.1f}% (n={len(part)})")
    return out


@dataclass(frozen=True)
class Written:
    """What write_report wrote: summary.md's path and its held-out headline (for the CLI)."""

    path: Path
    held_out: list[str]


def write_report(out: Path, hw: Hardware, hw_path: str, kernel_rows: list[dict],
                 step_rows: list[dict], header: list[str],
                 models: dict[str, Model] = MODELS, plots: bool = True,
                 suite: str = "quick") -> Written:
    """Write predictions.csv, step_predictions.csv, summary.md and (``plots``) the figures
    into ``out`` (``suite``: the suite's name, for the text)."""
    kdf = kernel_predictions(kernel_rows, hw)
    kdf.to_csv(out / "predictions.csv", index=False)
    held = kdf[kdf["heldout"] & ~kdf["contended"]]
    lines = [*header, "", f"Hardware: `{hw_path}` ({hw.name}).", ""]
    cal = hw.calibration or {}
    if cal:
        glue = set((cal.get("layer_overhead") or {}).get("kernel_shapes", []))
        extra = glue - set(cal.get("fit_shapes", []))
        lines += [f"Efficiency fitted on {len(cal.get('fit_shapes', []))} calibration shapes "
                  f"(`calibration.fit_shapes` in the hardware file; suite "
                  f"`{cal.get('suite', '?')}`)"
                  + (f"; `layer_overhead_s` from {len(glue)} measured kernel shapes of the "
                     f"calibration layers ({len(extra)} of them measured for it alone; "
                     f"`calibration.layer_overhead.kernel_shapes`)" if glue else "") + ": "
                  + ", ".join(f"{k} = {v:.4g}" for k, v in cal.get("fitted", {}).items()), ""]
    targets = target_lines(held)
    headline = [f"Held-out kernels ({len(held)} rows):", *targets]
    lines += [f"## Held-out kernels ({len(held)} rows)", "",
              f"{suite.capitalize()}-suite kernels whose shape was not used for fitting; "
              f"{int((~kdf['heldout']).sum())} fitted shapes and "
              f"{int((kdf['heldout'] & kdf['contended']).sum())} rows measured while other "
              f"processes used more than {CONTENDED:.0%} of the CPUs are left out. "
              f"Error = predicted / measured - 1.", "", *targets, "",
              "### By operator class, regime and size", "",
              markdown_table(summarize(held), PCT), "", "### By operator", "",
              markdown_table(summarize(held, by=("op", "regime")), PCT), ""]
    if step_rows:
        sdf = step_predictions(step_rows, hw, models)
        sdf.to_csv(out / "step_predictions.csv", index=False)
        show = sdf[["scope", "phase", "model", "batch", "q_len", "kv_len", "measured_s",
                    "predicted_s", "error", "contended"]]
        lines += ["## Whole decoder layer and model steps", "",
                  "Predicted = sum of `op_time` over `cost.step.step_records` of the same "
                  "model record (one layer: the layer's operators of a 1-layer model), the "
                  "framework glue (`layer_overhead_s` per layer on a sync device) included.",
                  "",
                  markdown_table(show, ("error",)), ""]
    if plots and len(held):
        figures.predicted_vs_measured(held, out / "predicted_vs_measured.png",
                                      f"held-out kernels on {hw.name}")
        figures.error_by_class(held, out / "error_by_class.png", f"held-out kernels, {hw.name}")
    if plots:
        figures.roofline(kdf, hw, out / "roofline.png", f"measured kernels on {hw.name}")
        lines += ["## Figures", ""] + [f"- `{n}`: {what}" for n, what in FIGURES.items()]
    path = out / "summary.md"
    path.write_text("\n".join(lines) + "\n")
    return Written(path, headline)
