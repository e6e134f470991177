"""CLI command ``compare-inferencex``: replay InferenceX's DeepSeek-R1 rows (the schema of
``../shared/measurements/inferencex``) through the simulator with each row's launch flags
and client, and report median |error| and bias of throughput per GPU, TTFT and TPOT per
GPU x engine (``compare.inferencex``).

Module level: typer and the standard library only. No ``from __future__ import
annotations``: typer reads the Annotated option types.
"""

from pathlib import Path
from typing import Annotated

import typer

from perfmodel.cli.common import fail, out_dir

LABELS = (("tput_per_gpu", "tput/GPU"), ("ttft_mean", "TTFT mean"),
          ("tpot_mean", "TPOT mean"), ("ttft_median", "TTFT p50"),
          ("tpot_median", "TPOT p50"))


def summary_table(summary: dict) -> str:
    """Markdown: one line per GPU x engine, each metric's median |error| and bias (rows)."""
    head = "| GPU / engine | replayed (skipped) | " + " | ".join(
        f"{label} \\|err\\| / bias (rows)" for _, label in LABELS) + " |"
    lines = [head, "|" + "---|" * (2 + len(LABELS))]
    for group, entry in summary.items():
        cells = []
        for metric, _ in LABELS:
            m = entry.get(metric)
            cells.append(f"{m['median_abs']:.1%} / {m['bias']:+.1%} ({m['rows']})" if m
                         else "-")
        lines.append(f"| {group} | {entry['replayed']} ({entry['skipped']}) | "
                     + " | ".join(cells) + " |")
    return "\n".join(lines)


def compare_inferencex_cmd(
    measurements: Annotated[Path, typer.Argument(
        help="InferenceX CSV (../shared/measurements/inferencex/*.csv)")],
    only: Annotated[str | None, typer.Option(
        help="only the rows whose GPU/engine (h200/sglang, h200/trt, mi300x/sglang) or id "
             "contains this text")] = None,
    every: Annotated[int, typer.Option(
        help="replay every n-th row of each GPU x engine (1: all)", min=1)] = 1,
    out: Annotated[Path | None, typer.Option(
        help="folder for rows.csv and summary.json")] = None,
    progress: Annotated[bool, typer.Option(help="name each row on stderr")] = True,
) -> None:
    """Replay InferenceX's DeepSeek-R1 rows with their launch flags and client; print the
    median |error| and bias per GPU x engine (these rows are for evaluation, not fitting)."""
    import json

    import pandas as pd

    from perfmodel.compare import inferencex as ix
    from perfmodel.specs.errors import SpecError

    if out is not None:
        out_dir(out)
    try:
        points = ix.sample(ix.load(measurements), every)
        points = [p for p in points if only is None or only in p.group or only in p.id]
        if not points:
            fail(f"--only: no row matches {only!r}")
        tell = (lambda p: typer.echo(f"replaying {p.id} ({p.group}) ...", err=True)) \
            if progress else None
        records = ix.compare(points, tell)
    except SpecError as exc:
        fail(str(exc))
    summary = ix.summarize(records)
    typer.echo(summary_table(summary))
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        pd.DataFrame(records).to_csv(out / "rows.csv", index=False)
        (out / "summary.json").write_text(json.dumps(summary, indent=2))
        typer.echo(f"wrote {out}/")
