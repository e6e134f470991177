"""CLI command ``calibrate-serving``: fit one deployment's engine host time (per step, per
request, per prompt token) to a third of its measured runs, predict the others, and write
the engine profile that simulate, plan and compare-serving take (--engine-profile).

Module level: typer and the standard library only. No ``from __future__ import
annotations``: typer reads the Annotated option types.
"""

import json
from pathlib import Path
from typing import Annotated

import typer

from perfmodel.cli.common import fail, out_path, writing

PROFILE = "engine-profile.yaml"


def calibrate_serving_cmd(
    experiments: Annotated[Path, typer.Argument(help="experiments CSV (one row per run)")],
    requests: Annotated[Path, typer.Option(
        help="requests CSV: every request of the runs (replayed exactly)")],
    only: Annotated[str | None, typer.Option(
        help="only the runs whose id contains this text (one deployment)")] = None,
    every: Annotated[int, typer.Option(
        min=1, help="runs sorted by offered rate: every K-th (from the lowest) fits, the "
                    "rest are predicted")] = 3,
    out: Annotated[Path | None, typer.Option(
        parser=out_path, metavar="<path>",
        help=f"folder for {PROFILE}, calibration.md and calibration.json")] = None,
    progress: Annotated[bool, typer.Option(help="name each replay on stderr")] = True,
) -> None:
    """Fit the engine's host time (never a kernel constant) to some of a deployment's
    measured runs and report zero-shot against calibrated errors on the others."""
    from perfmodel.cli.serving_compare import load_runs
    from perfmodel.compare import serving_calibrate as cal
    from perfmodel.serving.host_time import write_profile
    from perfmodel.specs.errors import SpecError

    runs = [r for r in load_runs(experiments, requests, only, out) if not r.skip]
    if len(runs) < 2:
        fail(f"--only: expected at least two replayable runs, got {len(runs)}")
    fit, held = cal.split(runs, min(every, len(runs)))
    held = held or fit
    base = fit[0].engine.host
    names = sorted({r.engine.host.name for r in runs})
    if len(names) > 1:
        typer.echo(f"warning: the runs have {len(names)} shipped host profiles "
                   f"({'; '.join(names)}): one is fitted from {base.name}", err=True)

    def tell(run_id: str) -> None:
        if progress:
            typer.echo(f"replaying {run_id} ...", err=True)

    try:
        host, history = cal.fit(fit, base, tell)
        zero = cal.predict(held, None, tell)
        calibrated = cal.predict(held, host, tell)
    except SpecError as exc:
        fail(str(exc))
    report = _report(base, host, fit, held, history, zero, calibrated)
    typer.echo(_markdown(report))
    if out is not None:
        with writing(out) as folder:
            write_profile(folder / PROFILE, host, {
                "calibration": {"method": "perfmodel calibrate-serving: ITL p50 moves the "
                                          "per-step constant, low-load TTFT p50 the request's",
                                "experiments": str(experiments), "base": base.name,
                                "fitted": [cal.step_key(base), "request_s",
                                           "prompt_token_s"],
                                "fit_runs": [r.id for r in fit],
                                "held_out_median_abs_error": report["calibrated"]}})
            (folder / "calibration.md").write_text(_markdown(report))
            (folder / "calibration.json").write_text(json.dumps(report, indent=2, default=str))
        typer.echo(f"wrote {out}/ (use --engine-profile {out / PROFILE})")


def _report(base: object, host: object, fit: list, held: list, history: list,
            zero: list, calibrated: list) -> dict:
    from perfmodel.compare import serving_calibrate as cal

    keys = [k for _, k in cal.REPORTED]
    return {"shipped": base.constants(), "fitted": host.constants(),
            "base": base.name, "name": host.name,
            "fit_runs": [r.id for r in fit], "held_out_runs": [r.id for r in held],
            "zero_shot": cal.medians(zero), "calibrated": cal.medians(calibrated),
            "fit_rounds": [h["host"] for h in history],
            "runs": [{"id": z["id"], "low_load": z["low_load"],
                      "zero_shot": {k: z.get(k) for k in keys},
                      "calibrated": {k: c.get(k) for k in keys}}
                     for z, c in zip(zero, calibrated, strict=True)]}


def _pct(v: object) -> str:
    return "" if v is None else f"{v * 100:+.1f}%"


def _markdown(report: dict) -> str:
    from perfmodel.report.tables import markdown_table

    unit = {"prompt_token_s": ("us", 1e6)}
    consts = [[k, f"{report['shipped'][k] * unit.get(k, ('ms', 1e3))[1]:.4g} "
                  f"{unit.get(k, ('ms', 1e3))[0]}",
               f"{report['fitted'][k] * unit.get(k, ('ms', 1e3))[1]:.4g} "
               f"{unit.get(k, ('ms', 1e3))[0]}"]
              for k in report["shipped"] if k != "overlap"]
    stats = sorted(set(report["zero_shot"]) | set(report["calibrated"]),
                   key=list(report["zero_shot"]).index if report["zero_shot"] else str)
    med = [[s, f"{report['zero_shot'][s]['median_abs'] * 100:.1f}%",
            f"{report['calibrated'][s]['median_abs'] * 100:.1f}%",
            str(report["calibrated"][s]["runs"])] for s in stats]
    rows = [[r["id"] + (" (low load)" if r["low_load"] else "")]
            + [f"{_pct(r['zero_shot'][k])} / {_pct(r['calibrated'][k])}"
               for k in ("e2e_s.mean", "ttft_s.p50", "itl_s.p50")] for r in report["runs"]]
    return "\n".join([
        f"Fitted on {len(report['fit_runs'])} runs ({', '.join(report['fit_runs'])}); "
        f"predicted {len(report['held_out_runs'])}. Base: {report['base']}.", "",
        "Constants (only host time; kernel constants untouched):", "",
        markdown_table(["constant", "shipped", "fitted"], consts), "",
        "Median |error| over the held-out runs (TTFT p50: low-load runs only):", "",
        markdown_table(["statistic", "zero-shot", "calibrated", "runs"], med), "",
        markdown_table(["held-out run", "E2E zero-shot / calibrated", "TTFT p50",
                        "ITL p50"], rows), ""])
