"""The 80% band of a ``simulate`` run, shared by the command and the browser page: the
summaries at the band's edges (``edge_pair``) and each run's summary with its band
(``banded_summaries``).

Module level: the standard library only (``perfmodel --help`` stays fast).
"""

from typing import Any


def edge_pair(res: Any, reqs: Any, run: Any, slo_ttft: float | None,
              slo_tpot: float | None) -> tuple[dict, dict]:
    """(low, high) summaries of the run ``res`` of ``reqs`` (``serving.bands.edge_summaries``:
    on a sample of a large run); ``run(requests, edge)`` simulates."""
    from perfmodel.serving.bands import edge_summaries

    return edge_summaries(reqs, res, run, (slo_ttft, slo_tpot))


def banded_summaries(runs: list, edges: list | None, hw: Any, slo_ttft: float | None,
               slo_tpot: float | None) -> list[dict]:
    """Each run's summary, with its 80% band where ``edges`` has the (low, high)
    summaries (``edge_pair``)."""
    from perfmodel.serving.bands import NO_BAND, banded_summary

    out = [res.summary(slo_ttft, slo_tpot) for _, res in runs]
    if edges is None:
        note = NO_BAND if hw.uncertainty is None else "no band: --no-band"
        return [dict(s, band=note) for s in out]
    return [banded_summary(s, *pair,
                           hw.uncertainty.describe() + "; every step at its band's edge")
            for s, pair in zip(out, edges, strict=True)]
