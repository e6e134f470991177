"""What ``simulate --out`` writes (``write``), for the command and its disaggregated
form (``cli.simulate_disagg``).

Module level: typer and the standard library only (``perfmodel --help`` stays fast).
"""

from pathlib import Path

import typer

from perfmodel.cli.atomic import staged
from perfmodel.cli.common import save


def write(out: Path, runs: list, summaries: list[dict], dpi: int, capacity: float) -> None:
    """Each run's requests, steps, summary and time series, the latency CDFs, and with
    several rates the load curve, into ``out`` (all or nothing)."""
    from perfmodel.report import serving_plots as plots
    from perfmodel.report import serving_tables as tables

    with staged(out) as folder:   # Ctrl-C leaves no partial file
        for i, (_, res) in enumerate(runs):
            tag = "" if len(runs) == 1 else f"-{i}"
            (folder / f"requests{tag}.csv").write_text(tables.requests_csv(res))
            (folder / f"steps{tag}.csv").write_text(tables.steps_csv(res))
            (folder / f"summary{tag}.json").write_text(tables.summary_json(summaries[i]))
            save(plots.time_series(res), folder / f"timeseries{tag}.png", dpi)
        results = [res for _, res in runs]
        save(plots.latency_cdfs(results, [r.label for r in results]),
             folder / "latency_cdf.png", dpi)
        if len(runs) > 1:
            points = [(r, s) for (r, _), s in zip(runs, summaries, strict=True)]
            save(plots.load_curve(points, capacity), folder / "load.png", dpi)
            (folder / "load.txt").write_text(tables.load_table(points))
    typer.echo(f"wrote {out}/")
