"""The 80% band of a simulation's headline figures.

A served run's latencies are not a sum of fixed steps: the steps' durations decide which
requests share the next step, how long the queue grows, when the KV pool fills. So the band
is not scaled onto the results; the run is simulated again twice, every engine step priced
at the low and then at the high edge of its own band (``StepPricer(edge=...)``,
``cost.band``: the step's operators grouped by error class, classes combined in quadrature).
Every step moves to the same edge in a run: one kernel family's error holds over all its
calls (fully correlated over steps, as ``schedules.bands`` assumes for a request), which
makes the run's band at most a little wider than summing classes over the whole run first
(the quadrature of sums is at most the sum of quadratures). Cost: two more simulations.

Each statistic's band is the smallest and largest of the three runs' values (queueing can
make a statistic move against its steps at the margins); throughputs come out right
without a special case (the fast run's throughput is the high edge).
"""

from __future__ import annotations

from perfmodel.schedules.estimate import NO_BAND

__all__ = ["NO_BAND", "banded_summary"]


def banded_summary(centre: dict, low: dict, high: dict, note: str) -> dict:
    """``centre`` (a ``SimResult.summary``) with ``<stat>_low`` / ``<stat>_high`` beside
    every latency statistic, ``<figure>_low`` / ``_high`` beside the throughputs, goodput and
    duration: the extremes over the three runs; ``band``: ``note``, whose band it is."""
    out = dict(centre, band=note)
    for key, value in centre.items():
        if isinstance(value, dict):
            out[key] = dict(value)
            for stat, x in value.items():
                edges = (x, low[key][stat], high[key][stat])
                out[key] |= {f"{stat}_low": min(edges), f"{stat}_high": max(edges)}
        elif key in BANDED:
            edges = (value, low[key], high[key])
            out |= {f"{key}_low": min(edges), f"{key}_high": max(edges)}
    return out


BANDED = ("throughput_tokens_per_s", "requests_per_s", "goodput_requests_per_s", "duration_s")

