"""``simulate --autoscale``: the stream replayed on a fleet an autoscaler sizes
(``serving.fleet.scaling``) and on fixed fleets of its minimum and maximum size, each
with its GPU-hours, cost and SLO attainment (``serving.fleet.usage``).

Module level: typer and the standard library only.
"""

import json
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any

import typer

from perfmodel.cli.common import fail, save

_SCALE = "autoscaling (--autoscale)"
_TRAFFIC = "traffic (one source: --trace, --rate, or --concurrency)"
Opt = typer.Option
RateShapeOpt = Annotated[str | None, Opt(rich_help_panel=_TRAFFIC, help=(
    "sine:PERIOD_S:AMPLITUDE: a day-shaped Poisson rate, --rate x (1 + AMPLITUDE x "
    "sin(2 pi t / PERIOD_S))"))]
AutoscaleOpt = Annotated[str | None, Opt(rich_help_panel=_SCALE, help=(
    "queue | running | kv | ttft: replicas added and removed by that metric (HPA's rule), "
    "against fixed fleets of --min-replicas and --max-replicas"))]
TargetOpt = Annotated[float | None, Opt(rich_help_panel=_SCALE, help=(
    "per replica: waiting requests (queue, default 4), requests in flight (running, 64), "
    "KV share in use (kv, 0.7); p90 TTFT seconds (ttft, default --slo-ttft)"))]
MinReplicasOpt = Annotated[int, Opt(min=1, rich_help_panel=_SCALE)]
MaxReplicasOpt = Annotated[int, Opt(min=1, rich_help_panel=_SCALE)]
IntervalOpt = Annotated[float, Opt(rich_help_panel=_SCALE, help=(
    "seconds between decisions (HPA's sync period)"))]
DownWindowOpt = Annotated[float, Opt(rich_help_panel=_SCALE, help=(
    "seconds of scale-down stabilization (HPA's default 300)"))]
StartupOpt = Annotated[float | None, Opt(rich_help_panel=_SCALE, help=(
    "a launched replica's start-up, seconds (default: weights load + CUDA graphs + an "
    "assumed 30 s engine start)"))]


def check(p: dict) -> Any:
    """The autoscaler's ``Policy`` from the options, or None without --autoscale."""
    if p["autoscale"] is None:
        return None
    from perfmodel.serving.fleet.autoscale import policy

    return policy(p["autoscale"], p["autoscale_target"], p["min_replicas"],
                  p["max_replicas"], p["scale_interval"], p["scale_down_window"],
                  p["slo_ttft"])


def main(p: dict, m: Any, hw: Any, wl: Any, layout: Any, engine: Any, streams: list,
         folder: Path | None, dpi: int) -> None:
    """Simulate and show the three fleets (one line each), as a table or JSON."""
    from perfmodel.serving.simulate import simulate

    pol = check(p)
    if len(streams) != 1:
        fail("--autoscale: give one --rate (or one --trace), not several")
    if p["startup_s"] is not None and not p["startup_s"] >= 0:
        fail(f"--startup-s: expected seconds >= 0, got {p['startup_s']}")
    _, reqs, label = streams[0]
    from perfmodel.serving.fleet import scaling

    scaling.check(p["router"], reqs, layout.dp, layout.attention_ways, p["cluster"])
    usd = _price(p["prices"], hw)
    devices = layout.group * layout.pp
    _warn_startup(p["startup_s"], engine, m, hw, layout, wl)
    router = p["router"]
    scaled = simulate(m, hw, reqs, layout, engine, wl, label=label, router=router,
                      autoscale=pol, startup_s=p["startup_s"])
    rows = [("autoscaled " + pol.metric, scaled)]
    for n in sorted({pol.min_replicas, pol.max_replicas}):
        fixed = simulate(m, hw, reqs, replace(layout, dp=n), engine, wl, label=label,
                         router=router)
        rows.append((f"fixed {n}", fixed))
    from perfmodel.serving.fleet.usage import usage

    table = [dict(fleet=name, **usage(res, devices, p["slo_ttft"], p["slo_tpot"], usd))
             for name, res in rows]
    info = scaled.info["autoscale"].to_dict()
    if p["fmt"].value == "json":
        typer.echo(json.dumps({"autoscale": info, "fleets": table}, indent=2))
    else:
        _table(pol, info, table, label, p)
    if folder is not None:
        from perfmodel.report.autoscale_plots import autoscale_figure

        save(autoscale_figure(reqs, scaled.info["autoscale"], table, pol.interval_s),
             folder / "autoscale.png", dpi)
        (folder / "autoscale.json").write_text(json.dumps({"autoscale": info,
                                                            "fleets": table}, indent=2))
        typer.echo(f"wrote {folder}/")


def _price(path: Path | None, hw: Any) -> float | None:
    if path is None:
        return hw.price_per_hour
    from perfmodel.serving.planner.prices import read_prices
    from perfmodel.specs.errors import SpecError

    try:
        return read_prices(path).get(hw.name, hw.price_per_hour)
    except SpecError as exc:
        fail(str(exc))


def _warn_startup(given: float | None, engine: Any, m: Any, hw: Any, layout: Any,
                  wl: Any) -> None:
    """The start-up a launched replica waits, said with its assumed part."""
    if given is not None:
        typer.echo(f"warning: --startup-s {given:g}: every launched replica serves that "
                   "long after its launch", err=True)
        return
    from perfmodel.serving.fleet.startup import startup
    from perfmodel.serving.pricing import kv_pool

    pool = kv_pool(m, hw, replace(layout, dp=1), wl, engine)
    s = startup(pool.weights_bytes * layout.group * layout.pp, engine.max_num_seqs,
                engine.cuda_graphs)
    typer.echo(f"warning: --autoscale: a launched replica serves after {s.describe()}; "
               "the container and engine start is an assumption (--startup-s sets the "
               "whole)", err=True)


def _table(pol: Any, info: dict, table: list, label: str, p: dict) -> None:
    typer.echo(f"autoscaler: {pol.describe()}; {label}")
    typer.echo(f"start-up {info['startup_s']:.1f} s a replica; {info['replicas_launched']} "
               "replicas launched in all")
    slo = p["slo_ttft"] is not None or p["slo_tpot"] is not None
    head = f"{'fleet':<20}{'GPU-hours':>10}{'mean repl.':>11}{'USD':>9}" \
           f"{'SLO met':>9}{'TTFT p90':>10}{'TPOT p90':>10}"
    typer.echo(head)
    for row in table:
        usd = "-" if row["usd"] is None else f"{row['usd']:.2f}"
        met = f"{row['slo_attainment']:.1%}" if slo else "-"
        typer.echo(f"{row['fleet']:<20}{row['gpu_hours']:>10.3f}{row['mean_replicas']:>11.2f}"
                   f"{usd:>9}{met:>9}{row['ttft_p90_s'] * 1e3:>8.0f}ms"
                   f"{row['tpot_p90_s'] * 1e3:>8.1f}ms")
    if not slo:
        typer.echo("SLO attainment: give --slo-ttft and/or --slo-tpot")
    times = info["replicas_over_time"]
    typer.echo("replicas over time (serving + starting at each decision): " + ", ".join(
        f"{t:.0f}s:{a}+{b}" for t, a, b in _changes(times)))


def _changes(times: dict) -> list:
    """The decisions where the serving or starting count changed."""
    out, last = [], None
    for t, a, b in zip(times["t_s"], times["serving"], times["starting"], strict=True):
        if (a, b) != last:
            out.append((t, a, b))
            last = (a, b)
    return out
