"""CLI command ``compare-serving``: replay measured serving runs through the simulator and
print the error of TTFT, ITL, TPOT, end-to-end latency and throughput per run, with the
median over runs.

Module level: typer and the standard library only. No ``from __future__ import
annotations``: typer reads the Annotated option types.
"""

import csv
import io
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from perfmodel.cli.atomic import staged
from perfmodel.cli.common import fail, out_dir, out_path
from perfmodel.cli.devices import engine_option


class Format(str, Enum):
    table = "table"
    json = "json"
    markdown = "markdown"
    csv = "csv"


def _csv(records: list[dict]) -> str:
    """Flat records as CSV: the union of their columns, blank where a run has none."""
    names = list(dict.fromkeys(k for r in records for k in r))
    out = io.StringIO()
    writer = csv.DictWriter(out, names, restval="", lineterminator="\n")
    writer.writeheader()
    writer.writerows(records)
    return out.getvalue()


def load_runs(experiments: Path, requests: Path | None, only: str | None,
              out: Path | None) -> list:
    """The measured runs whose id contains ``only`` (all without it), after checking that
    ``out`` can be written; a bad file is the command's one-line error."""
    from perfmodel.compare import serving
    from perfmodel.specs.errors import SpecError

    if out is not None:
        out_dir(out)
    try:
        runs = serving.load_runs(experiments, requests)
    except SpecError as exc:
        fail(str(exc))
    return [r for r in runs if only is None or only in r.id]


def compare_serving_cmd(
    experiments: Annotated[Path, typer.Argument(help="experiments CSV (one row per run)")],
    requests: Annotated[Path | None, typer.Option(
        help="requests CSV: every request of the runs (replayed exactly)")] = None,
    only: Annotated[str | None, typer.Option(
        help="only the runs whose id contains this text")] = None,
    fmt: Annotated[Format, typer.Option("--format", "-f")] = Format.table,
    out: Annotated[Path | None, typer.Option(
        parser=out_path, metavar="<path>",
        help="folder for report.md, runs.json and runs.csv")] = None,
    progress: Annotated[bool, typer.Option(help="name each run on stderr as it starts")
                        ] = True,
    engine: Annotated[str | None, typer.Option(
        callback=lambda v: v if v is None else engine_option(v), show_default="each run's own",
        help="price every run with this engine's kernels (vllm, sglang, trtllm) instead of "
             "the one its engine column names")] = None,
    engine_profile: Annotated[Path | None, typer.Option(
        help="an engine profile (perfmodel calibrate-serving's) for every run's host time "
             "instead of the shipped one for its engine and version")] = None,
    host_time: Annotated[bool, typer.Option(
        help="add the engine's host time (off: GPU steps only)")] = True,
) -> None:
    """Replay measured serving runs (the schema of ../shared/measurements/serving) through
    the simulator and report its error per run and the median over runs."""
    from perfmodel.compare import serving
    from perfmodel.specs.errors import SpecError

    runs = load_runs(experiments, requests, only, out)
    for run in runs if engine is not None else ():
        run.kernels = engine
    try:
        serving.set_host(runs, engine_profile, host_time)
    except SpecError as exc:
        fail(str(exc))
    if not runs:
        fail(f"--only: no run id contains {only!r}")
    lacking = [r.id for r in runs if r.regenerated]
    if requests is not None and lacking:     # said, not silently regenerated
        typer.echo(f"warning: --requests: {requests.name} has no rows for "
                   f"{len(lacking)} of the {len(runs)} runs ({', '.join(lacking[:3])}"
                   f"{', ...' if len(lacking) > 3 else ''}, column experiment_id): they are "
                   "regenerated from their rate and mean lengths (Poisson)", err=True)
    rows = []
    for run in runs:
        if progress:
            typer.echo(f"replaying {run.id} ...", err=True)
        rows += serving.compare([run])
    _write(rows, serving.summarize(rows), fmt, out)


def _write(rows: list[dict], summary: dict, fmt: Format, out: Path | None) -> None:
    """Print the replays in ``fmt``; with ``out``, also write report.md, runs.json and
    runs.csv there."""
    import json

    from perfmodel.compare import serving
    from perfmodel.report import serving_tables as tables

    if fmt is Format.json:
        typer.echo(json.dumps({"runs": rows, "summary": summary}, indent=2, default=str))
    elif fmt is Format.csv:
        typer.echo(_csv(serving.flat(rows)), nl=False)
    else:
        typer.echo(tables.compare_table(rows, fmt is Format.markdown))
        typer.echo(tables.compare_summary(summary, fmt is Format.markdown))
    if out is not None:
        with staged(out) as folder:
            (folder / "runs.json").write_text(json.dumps({"runs": rows, "summary": summary},
                                                         indent=2, default=str))
            (folder / "runs.csv").write_text(_csv(serving.flat(rows)))
            (folder / "report.md").write_text(tables.compare_table(rows, True) + "\n"
                                              + tables.compare_summary(summary, True))
        typer.echo(f"wrote {out}/")
