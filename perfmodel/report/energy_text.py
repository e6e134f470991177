"""Energy and cost as text: the lines ``perfmodel estimate --energy`` prints under its table
(``schedules.energy.EnergySummary``), and the number formats the plan and simulate tables
share."""

from __future__ import annotations

from perfmodel.schedules.energy import EnergySummary


def j_per_token(joules: float) -> str:
    """Joules per token, to three significant figures."""
    return f"{joules:.3g} J/token"


def usd_per_million(usd: float) -> str:
    return f"${usd:.3g}/M tokens"


def energy_lines(s: EnergySummary) -> list[str]:
    """The energy block: mean power and joules per token by phase, the request's joules per
    output token, the cost per million output tokens where priced, and the power note."""
    out = [f"energy ({s.devices} device{'s' if s.devices > 1 else ''} a replica):"]
    for p in s.phases:
        unit = "prompt token" if p.name == "prefill" else "token"
        out.append(f"  {p.name:<8} {p.watts_per_device:6.0f} W/device  "
                   f"{p.j_per_token:.3g} J/{unit}")
    out.append(f"  request  {s.watts_per_device:6.0f} W/device  "
               f"{j_per_token(s.j_per_output_token)} (per output token)")
    cost = s.usd_per_million_tokens()
    if cost and s.usd_per_device_hour is None:
        out.append(f"  (no usd_per_gpu_hour for {s.power.name} in --prices nor a price: block "
                   "in its hardware YAML: the devices' cost is left out)")
    if cost:
        parts = ", ".join(f"{k} {usd_per_million(v)}" for k, v in cost.items()
                          if k != "total")
        out.append(f"  cost     {usd_per_million(cost['total'])} ({parts})")
    out.append(f"  {s.power.note}")
    return out


__all__ = ["energy_lines", "j_per_token", "usd_per_million"]
