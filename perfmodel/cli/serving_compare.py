"""CLI command ``compare-serving``: replay measured serving runs through the simulator and
print the error of TTFT, ITL, TPOT, end-to-end latency and throughput per run, with the
median over runs.

Module level: typer and the standard library only. No ``from __future__ import
annotations``: typer reads the Annotated option types.
"""

from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from perfmodel.cli.common import fail, out_dir, writing


class Format(str, Enum):
    table = "table"
    json = "json"
    markdown = "markdown"


def compare_serving_cmd(
    experiments: Annotated[Path, typer.Argument(help="experiments CSV (one row per run)")],
    requests: Annotated[Path | None, typer.Option(
        help="requests CSV: every request of the runs (replayed exactly)")] = None,
    only: Annotated[str | None, typer.Option(
        help="only the runs whose id contains this text")] = None,
    fmt: Annotated[Format, typer.Option("--format", "-f")] = Format.table,
    out: Annotated[Path | None, typer.Option(
        help="folder for report.md and runs.json")] = None,
    progress: Annotated[bool, typer.Option(help="name each run on stderr as it starts")
                        ] = True,
) -> None:
    """Replay measured serving runs (the schema of ../shared/measurements/serving) through
    the simulator and report its error per run and the median over runs."""
    import json

    from perfmodel.compare import serving
    from perfmodel.report import serving_tables as tables
    from perfmodel.specs.errors import SpecError

    if out is not None:
        out_dir(out)
    try:
        runs = serving.load_runs(experiments, requests)
    except SpecError as exc:
        fail(str(exc))
    runs = [r for r in runs if only is None or only in r.id]
    if not runs:
        fail(f"--only: no run id contains {only!r}")
    rows = []
    for run in runs:
        if progress:
            typer.echo(f"replaying {run.id} ...", err=True)
        rows += serving.compare([run])
    summary = serving.summarize(rows)
    if fmt is Format.json:
        typer.echo(json.dumps({"runs": rows, "summary": summary}, indent=2, default=str))
    else:
        typer.echo(tables.compare_table(rows, fmt is Format.markdown))
        typer.echo(tables.compare_summary(summary, fmt is Format.markdown))
    if out is not None:
        with writing(out) as folder:
            (folder / "runs.json").write_text(json.dumps({"runs": rows, "summary": summary},
                                                         indent=2, default=str))
            (folder / "report.md").write_text(tables.compare_table(rows, True) + "\n"
                                              + tables.compare_summary(summary, True))
        typer.echo(f"wrote {out}/")
