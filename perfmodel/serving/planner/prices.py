"""Cost for the deployment planner: US dollars per GPU-hour from a prices YAML a user edits
(``--prices``, ``read_prices``) or the hardware files' ``price:`` blocks
(``Hardware.price_per_hour``); the cost columns, the objectives (``OBJECTIVES``), and the
note saying which objective the plan used.

A prices file::

    source: "where and when the figures were read"
    usd_per_gpu_hour:
      h100-sxm: 2.69
      h200-sxm: 3.59
    usd_per_kwh: 0.08        # optional: electricity, for the energy part of the cost

``usd_per_kwh`` (``read_energy_price``) prices the joules ``cost.power`` gives a plan or
an estimate; ``usd_per_gpu_hour`` alone leaves it out.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from perfmodel.specs.errors import SpecError
from perfmodel.specs.fields import Fields, read_mapping
from perfmodel.specs.hardware import Hardware

# --objective: (its column, +1 smallest first / -1 largest first)
OBJECTIVES = {"gpus": ("gpus", 1), "cost": ("usd_per_hour", 1),
              "goodput": ("throughput_per_gpu", -1), "energy": ("j_per_output_token", 1)}
# "devices": GPUs, TPU chips or HPUs alike (the plan's own lines name the unit)
WORDS = {"gpus": "fewest devices", "cost": "lowest cost per hour",
         "goodput": "most goodput (output tokens/s within the SLOs) per device",
         "energy": "fewest joules per output token (cost/power.py)"}
SECONDS_PER_HOUR = 3600.0
MAX_USD = 1000.0            # per GPU-hour: above it is a typo, or a node's price
MAX_USD_PER_KWH = 10.0      # electricity: above it is a typo (or cents, not dollars)


def read_prices(path: Path) -> dict[str, float]:
    """Device name -> US dollars per GPU-hour, from a prices YAML (one-line errors naming
    the file and field)."""
    f = Fields(read_mapping(path, "a prices YAML"), str(path),
               allowed=("source", "usd_per_gpu_hour", "usd_per_kwh"))
    f.text("source")
    table = f.sub("usd_per_gpu_hour")
    out = {}
    for name in list(table.data):
        value = table.raw(name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or not 0 < value <= MAX_USD:
            raise table.error(name, f"expected US dollars per GPU-hour in (0, {MAX_USD:g}], "
                              f"got {value!r}")
        out[str(name)] = float(value)
    return out


def read_energy_price(path: Path) -> float | None:
    """US dollars per kWh of electricity from a prices YAML's optional ``usd_per_kwh``
    (None where the file gives none; one-line errors naming the file and field)."""
    f = Fields(read_mapping(path, "a prices YAML"), str(path),
               allowed=("source", "usd_per_gpu_hour", "usd_per_kwh"))
    if not f.has("usd_per_kwh"):
        return None
    value = f.raw("usd_per_kwh")
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not 0 < value <= MAX_USD_PER_KWH:
        raise f.error("usd_per_kwh", f"expected US dollars per kWh in (0, "
                      f"{MAX_USD_PER_KWH:g}], got {value!r}")
    return float(value)


def priced(cols: dict, hardware: list[Hardware], objective: str,
           prices: dict[str, float] | None = None) -> tuple[dict, str]:
    """With a price for every device (``prices`` first, then the hardware file's):
    ``usd_per_gpu_hour``, ``usd_per_hour`` (gpus x it) and ``tokens_per_dollar`` (output
    tokens/s per GPU at the SLO load / USD per GPU-second) as columns; and the note saying
    how the plan ranked. ``objective`` "cost" needs every price (one-line error)."""
    given = prices or {}
    table = {h.name: given.get(h.name, h.price_per_hour) for h in hardware}
    missing = [name for name, usd in table.items() if usd is None]
    if missing and objective == "cost":
        raise SpecError(f"--objective cost: no price for {', '.join(missing)} (give --prices "
                        "FILE with usd_per_gpu_hour for it, or a price: block in its "
                        "hardware YAML)")
    how = f"ranked by {WORDS[objective]} (--objective {objective})"
    if missing:
        return cols, how + (f"; no cost shown: {', '.join(missing)} has no price"
                            if len(missing) < len(table) else
                            "; no cost shown: no price given (--prices FILE)")
    usd = np.array([table[name] for name in cols["hardware"].tolist()], dtype=float)
    src = "--prices" if given else "the hardware files' price: blocks"
    return cols | {"usd_per_gpu_hour": usd, "usd_per_hour": usd * cols["gpus"],
                   "tokens_per_dollar": cols["throughput_per_gpu"] / (usd / SECONDS_PER_HOUR)
                   }, how + f"; prices from {src}, which change"
