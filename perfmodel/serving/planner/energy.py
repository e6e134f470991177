"""Energy for the deployment planner (``plan --energy``, ``--objective energy``): each
candidate's joules per output token and mean power per device at the planned rate, and,
with prices, its cost per million output tokens there (device-hours, and electricity from
``usd_per_kwh``).

A replica full at the candidate's batch draws ``W`` per device and spends ``j_full`` joules
per output token: the estimate of its static request (``schedules.energy.estimates_energy``:
each step's roofline utilization through ``cost.power``). At a load share ``rho`` of its
capacity the fleet is taken to run full ``rho`` of the time and idle the rest, so

    J/token at the rate = j_full x (1 - idle / W) + gpus x idle / (rate x output_len)

(the work's own joules per token, plus idle power spread over the tokens served). A real
engine at part load runs smaller batches instead, at more joules per token of work; the
checking simulation's own energy (``simulate --energy``) prices that.
"""

from __future__ import annotations

import numpy as np

from perfmodel.cost.power import J_PER_KWH
from perfmodel.schedules.energy import estimates_energy
from perfmodel.schedules.estimates import Estimates
from perfmodel.specs.errors import SpecError
from perfmodel.specs.hardware import Hardware

COLUMNS = ("j_per_output_token_full", "watts_per_device_full", "idle_watts")
SECONDS_PER_HOUR = 3600.0


def energy_times(e: Estimates) -> dict[str, np.ndarray]:
    """``COLUMNS`` for every configuration of ``e`` (NaN where the device has no
    ``power:`` block)."""
    spent = estimates_energy(e)
    if spent is None:
        nan = np.full(len(e), np.nan)
        return dict.fromkeys(COLUMNS, nan)
    return {"j_per_output_token_full": spent["j_per_output_token"],
            "watts_per_device_full": spent["watts"],
            "idle_watts": np.full(len(e), spent["idle_watts"])}


def check_energy(cols: dict, hardware: list[Hardware]) -> None:
    """``--objective energy`` needs power figures for every device (one-line error)."""
    missing = sorted({str(h) for h, j in zip(cols["hardware"].tolist(),
                                              cols["j_per_output_token_full"].tolist(),
                                              strict=True) if not np.isfinite(j)})
    if missing:
        raise SpecError(f"--objective energy: no power figures for {', '.join(missing)} (give "
                        "a power: block with tdp_watts in its hardware YAML)")


def at_rate(cols: dict, output_len: float) -> dict:
    """``j_per_output_token`` and ``watts_per_device`` at each candidate's planned rate
    (``rate_req_s``; the module's formula)."""
    idle, full = cols["idle_watts"], cols["watts_per_device_full"]
    tokens_per_s = np.asarray(cols["rate_req_s"], float) * output_len
    joules = cols["j_per_output_token_full"] * (1 - idle / full) \
        + cols["gpus"] * idle / tokens_per_s
    return cols | {"j_per_output_token": joules,
                   "watts_per_device": joules * tokens_per_s / cols["gpus"]}


def energy_cost(cols: dict, output_len: float, usd_per_kwh: float | None) -> dict:
    """The energy at the planned rate (``at_rate``) and, with the devices priced
    (``usd_per_hour``), ``usd_per_million_tokens`` there; with ``usd_per_kwh`` its
    electricity part ``electricity_usd_per_million_tokens`` (included in the former)."""
    out = at_rate(cols, output_len)
    power = np.asarray(out["j_per_output_token"], float) * (usd_per_kwh or 0.0) \
        / J_PER_KWH * 1e6
    if usd_per_kwh is not None:
        out["electricity_usd_per_million_tokens"] = power
    if "usd_per_hour" in cols:
        tokens_per_hour = np.asarray(cols["rate_req_s"], float) * output_len * SECONDS_PER_HOUR
        out["usd_per_million_tokens"] = cols["usd_per_hour"] / tokens_per_hour * 1e6 + power
    return out


__all__ = ["COLUMNS", "at_rate", "check_energy", "energy_cost", "energy_times"]
