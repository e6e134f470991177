"""The 80% band of a simulation's headline figures.

A served run's latencies are not a sum of fixed steps: the steps' durations decide which
requests share the next step, how long the queue grows, when the KV pool fills. So the band
is not scaled onto the steps of the run; the requests are simulated again, every engine
step priced at the low and then at the high edge of its own band (``StepPricer(edge=...)``,
``cost.band``: the step's operators grouped by error class, classes combined in quadrature).
Every step moves to the same edge in a run: one kernel family's error holds over all its
calls (fully correlated over steps, as ``schedules.bands`` assumes for a request), which
makes the run's band at most a little wider than summing classes over the whole run first
(the quadrature of sums is at most the sum of quadratures).

On a sample (``edge_summaries``): a run of more than ``SAMPLE_MIN`` requests has its edges
simulated on the first ``sample_size`` of them (a twelfth, at least ``SAMPLE_MIN``): a prefix
of the trace, so its queue builds as the whole run's does. Each edge statistic is the whole
run's centre times the ratio, over the first half of the prefix's requests, of the edge
run's statistic to the centre run's (``head``). The centre's side of that ratio comes from
the whole run itself: an engine's schedule up to a time depends only on the requests that
arrived by then, so the prefix's first half, finished (nearly all of it) before the
prefix's last arrival, ran in the whole run as it would have in the prefix alone. Cost: two
runs of a twelfth, about a third of the run with their set-up (two whole runs before).
The approximation: the edge moves each statistic by the same factor as on the prefix's
first half; a queue that keeps growing past it (an edge over capacity) grows further in the
whole run, so there the band is narrower than two whole runs would draw it. A run of at
most ``SAMPLE_MIN`` requests is simulated whole at each edge.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np

from perfmodel.schedules.estimate import NO_BAND

__all__ = ["NO_BAND", "SAMPLE_MIN", "banded_summary", "edge_summaries", "sample_size"]
SAMPLE_MIN = 800        # requests: a run up to this size has its edges simulated whole
SAMPLE_SHARE = 1 / 12   # two runs of a twelfth: a sixth of the requests, with each short
#                         run's set-up about a third of the run's time


def sample_size(n: int) -> int:
    """Requests the band's edges are simulated on: all of a small run, else a twelfth of
    it and at least ``SAMPLE_MIN``."""
    return n if n <= SAMPLE_MIN else max(SAMPLE_MIN, int(np.ceil(n * SAMPLE_SHARE)))


def edge_summaries(requests: object, centre: object,
                   run: Callable[[object, int], object], slos: tuple = (None, None)
                   ) -> tuple[dict, dict]:
    """(low, high) summaries of ``centre`` (the run of ``requests``, a ``SimResult``):
    ``run(requests, edge)`` simulates requests at an edge (0 low, 1 high); on a prefix
    sample where the run is large (the module docstring). ``slos``: (TTFT, TPOT) seconds
    for goodput."""
    k = sample_size(len(requests))
    if k == len(requests):
        return tuple(run(requests, edge).summary(*slos) for edge in (0, 1))
    part = requests.take(np.arange(k))
    whole, middle = centre.summary(*slos), head(centre, k // 2).summary(*slos)
    return tuple(scaled(whole, middle, head(run(part, edge), k // 2).summary(*slos))
                 for edge in (0, 1))


def head(res: object, k: int) -> object:
    """The first ``k`` requests of a ``SimResult`` (its requests are in arrival order), as
    a ``SimResult`` of their own (the steps kept whole)."""
    cut = int(res.token_offsets[k])
    return replace(res, requests=res.requests.take(np.arange(k)), arrival_s=res.arrival_s[:k],
                   scheduled_s=res.scheduled_s[:k], first_token_s=res.first_token_s[:k],
                   finish_s=res.finish_s[:k], preemptions=res.preemptions[:k],
                   prefix_hit_tokens=res.prefix_hit_tokens[:k],
                   token_offsets=res.token_offsets[:k + 1], token_s=res.token_s[:cut])


def scaled(centre: dict, part: dict, edge: dict) -> dict:
    """``centre``'s numbers each times ``edge`` / ``part`` at the same key (nested
    dictionaries alike); a number whose ``part`` is 0 stays the centre's."""
    out = {}
    for key, value in centre.items():
        if isinstance(value, dict) and isinstance(part.get(key), dict):
            out[key] = scaled(value, part[key], edge[key])
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and \
                isinstance(part.get(key), (int, float)) and part[key]:
            out[key] = value * edge[key] / part[key]
        else:
            out[key] = value
    return out


def banded_summary(centre: dict, low: dict, high: dict, note: str) -> dict:
    """``centre`` (a ``SimResult.summary``) with ``<stat>_low`` / ``<stat>_high`` beside
    every latency statistic, ``<figure>_low`` / ``_high`` beside the throughputs, goodput and
    duration: the extremes over the three runs; ``band``: ``note``, whose band it is."""
    out = dict(centre, band=note)
    for key, value in centre.items():
        if isinstance(value, dict) and not any(isinstance(x, dict) for x in value.values()):
            # (a block of blocks, ``serving.kvtiers.summary``'s, stays the centre's)
            out[key] = dict(value)
            for stat, x in value.items():
                edges = (x, low[key][stat], high[key][stat])
                out[key] |= {f"{stat}_low": min(edges), f"{stat}_high": max(edges)}
        elif key in BANDED:
            edges = (value, low[key], high[key])
            out |= {f"{key}_low": min(edges), f"{key}_high": max(edges)}
    return out


BANDED = ("throughput_tokens_per_s", "requests_per_s", "goodput_requests_per_s", "duration_s")

