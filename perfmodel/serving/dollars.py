"""Output tokens per dollar for the deployment planner, from the ``price:`` blocks of the
hardware files (``Hardware.price_per_hour``, US dollars per device-hour): a column, a second
ranking (``RANKS``), and the note saying which ranking the plan used.
"""

from __future__ import annotations

import numpy as np

from perfmodel.specs.errors import SpecError
from perfmodel.specs.hardware import Hardware

RANKS = {"gpu": "throughput_per_gpu", "cost": "tokens_per_dollar"}   # --rank: its column
SECONDS_PER_HOUR = 3600.0


def priced(cols: dict, hardware: list[Hardware], rank: str) -> tuple[dict, str]:
    """With a price for every device: its ``usd_per_gpu_hour`` and ``tokens_per_dollar`` =
    output tokens/s per GPU / (USD per GPU-hour / 3600) as columns (every candidate's GPUs
    are of one device, so its cost per hour is gpus x the device's price); and the note saying
    which ranking was used. ``rank`` "cost" needs every price (one-line error otherwise)."""
    prices = {h.name: h.price_per_hour for h in hardware}
    missing = [name for name, usd in prices.items() if usd is None]
    if missing and rank == "cost":
        raise SpecError(f"--rank cost: no price for {', '.join(missing)} (add a price: block, "
                        "usd_per_hour and source, to its hardware YAML)")
    if len(missing) == len(prices):
        return cols, "ranked per GPU only: no hardware file has a price (a price: block " \
                     "with usd_per_hour ranks per dollar-hour too)"
    if missing:
        return cols, f"ranked per GPU only: {', '.join(missing)} has no price while " \
                     f"{', '.join(n for n in prices if n not in missing)} has one, so " \
                     "tokens per dollar are not compared"
    usd = np.array([prices[name] for name in cols["hardware"].tolist()], dtype=float)
    how = "by output tokens per dollar (--rank cost)" if rank == "cost" else \
        "by throughput per GPU (--rank cost ranks by output tokens per dollar)"
    return cols | {"usd_per_gpu_hour": usd,
                   "tokens_per_dollar": cols["throughput_per_gpu"] / (usd / SECONDS_PER_HOUR)}, \
        f"ranked {how}; prices from the hardware files' price: blocks, which change"
