"""The energy and cost options that ``estimate``, ``simulate`` and ``plan`` share: ``--energy``
(report power, joules and joules per token) and ``--prices FILE`` (device-hour and
electricity prices: cost per million tokens, and energy with it).

Module level: typer and the standard library only (``perfmodel --help`` stays fast).
"""

from pathlib import Path
from typing import Annotated, Any

import typer

EnergyOpt = Annotated[bool, typer.Option(
    "--energy", help="report power per device, joules per token (prefill and decode) and, "
    "with --prices, $ per million tokens (cost/power.py; docs/energy.md)")]
EstimatePricesOpt = Annotated[Path | None, typer.Option(
    "--prices", help="YAML of usd_per_gpu_hour per device and optionally usd_per_kwh "
    "(docs/prices.2026.example.yaml): $ per million tokens; implies --energy")]


def read_price_file(path: Path | None) -> tuple[dict[str, float], float | None]:
    """(device -> $ per device-hour, $ per kWh or None) from ``--prices`` (empty, None
    without a file); one-line SpecError for a bad file."""
    if path is None:
        return {}, None
    from perfmodel.serving.planner.prices import read_energy_price, read_prices

    return read_prices(path), read_energy_price(path)


def estimate_energy_of(result: Any, prices: Path | None) -> Any:
    """The ``EnergySummary`` of an estimate, priced from ``prices`` (then the hardware
    file's ``price:`` block); None where the device has no ``power:`` block."""
    from perfmodel.schedules.energy import estimate_energy

    table, kwh = read_price_file(prices)
    hw = result.hardware
    return estimate_energy(result, table.get(hw.name, hw.price_per_hour) if prices or
                           hw.price_per_hour else None, kwh)


def no_power(name: str) -> str:
    """The line shown where a device has no ``power:`` block."""
    return (f"energy: {name} has no power: block (tdp_watts) in its hardware YAML, so no "
            "energy figure")


def with_energy(runs: list, summaries: list[dict], m: Any, hw: Any, layout: Any, wl: Any,
                prices: Path | None) -> list[dict]:
    """``summaries`` with each run's ``energy`` block (``serving.energy.sim_energy``; None
    where the device has no ``power:`` block), priced per million output tokens from
    ``prices`` (device-hours over the run, electricity) where given."""
    from perfmodel.cost.power import J_PER_KWH
    from perfmodel.serving.energy import sim_energy

    table, kwh = read_price_file(prices)
    usd_hour = table.get(hw.name, hw.price_per_hour)
    out = []
    for (_, res), s in zip(runs, summaries, strict=True):
        e = sim_energy(res, m, hw, layout, wl)
        if e is not None:
            tokens = float(res.requests.output_tokens.sum())
            cost = {}
            if usd_hour is not None:
                cost["devices"] = usd_hour * e["devices"] * res.duration_s / 3600.0 \
                    / tokens * 1e6
            if kwh is not None:
                cost["electricity"] = kwh * e["joules"] / J_PER_KWH / tokens * 1e6
            if cost:
                e["usd_per_million_tokens"] = cost | {"total": sum(cost.values())}
        out.append(dict(s, energy=e))
    return out
