"""A request rate that varies over the day (``--rate-shape sine:PERIOD_S:AMPLITUDE``):
arrivals of a non-homogeneous Poisson process of rate

    lambda(t) = rate * (1 + amplitude * sin(2 pi t / period_s)),   0 <= amplitude < 1,

drawn by thinning (Lewis and Shedler 1979, "Simulation of nonhomogeneous Poisson processes
by thinning", Naval Research Logistics Quarterly 26(3)): candidates of a homogeneous
Poisson process at the peak rate lambda_max = rate * (1 + amplitude), each kept with
probability lambda(t) / lambda_max, until ``n`` are kept. The mean rate over whole periods
is ``rate``; one seeded generator gives the same stream every time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from perfmodel.specs.errors import SpecError

FLAG = "--rate-shape"


@dataclass(frozen=True)
class RateShape:
    """lambda(t) / rate = 1 + amplitude * sin(2 pi t / period_s)."""
    period_s: float
    amplitude: float

    def factor(self, t: np.ndarray) -> np.ndarray:
        return 1.0 + self.amplitude * np.sin(2.0 * np.pi * np.asarray(t) / self.period_s)

    def describe(self) -> str:
        return f"sine: period {self.period_s:g} s, amplitude {self.amplitude:g}"


def parse(text: str | None) -> RateShape | None:
    """``sine:PERIOD_S:AMPLITUDE`` (period > 0 seconds, amplitude in [0, 1)), or None."""
    if text is None:
        return None
    parts = str(text).split(":")
    if len(parts) != 3 or parts[0] != "sine":
        raise SpecError(f"{FLAG}: expected sine:PERIOD_S:AMPLITUDE (e.g. sine:3600:0.8), "
                        f"got {text!r}")
    try:
        period, amplitude = float(parts[1]), float(parts[2])
    except ValueError:
        raise SpecError(f"{FLAG}: expected numbers in sine:PERIOD_S:AMPLITUDE, got "
                        f"{text!r}") from None
    if not (math.isfinite(period) and period > 0):
        raise SpecError(f"{FLAG}: expected a period > 0 seconds, got {parts[1]!r}")
    if not 0 <= amplitude < 1:
        raise SpecError(f"{FLAG}: expected an amplitude in [0, 1) (the rate never reaches "
                        f"zero), got {parts[2]!r}")
    return RateShape(period, amplitude)


def arrival_times(n: int, rate: float, shape: RateShape, rng: np.random.Generator
                  ) -> np.ndarray:
    """``n`` arrival times of the shaped Poisson process (thinning; see the module)."""
    if not (math.isfinite(rate) and rate > 0):
        raise SpecError(f"{FLAG}: needs a finite --rate > 0, got {rate}")
    peak = rate * (1.0 + shape.amplitude)
    kept: list[np.ndarray] = []
    have, t = 0, 0.0
    while have < n:
        batch = max(64, int(1.2 * (n - have) * (1.0 + shape.amplitude)))
        times = t + np.cumsum(rng.exponential(1.0 / peak, size=batch))
        keep = times[rng.random(batch) * (1.0 + shape.amplitude) < shape.factor(times)]
        kept.append(keep)
        have += len(keep)
        t = float(times[-1])
    return np.concatenate(kept)[:n]
