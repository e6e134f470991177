"""The 80% band of a request's headline figures, from its phases' operators (``cost.band``).

Each phase carries its operators' times and error classes; a figure's band is the band of
the per-class seconds it adds up: TTFT the prefill's, E2E every phase's (one class's
error holds in prefill and decode alike, so classes are summed over the phases before
they are combined), TPOT the decode phase's over its steps (the first step's where none
runs). A diffusion LM's TTFT is its E2E and its TPOT the denoising phase's / G
(``estimate.diffusion_latency``). A phase replayed as CUDA graphs adds the composition
term (``cost.band``; its seconds ``PhaseCost.composed_s``). Throughputs are tokens over a
time, so their low edge comes from the time's high edge and the other way round.
"""

from __future__ import annotations

import numpy as np

from perfmodel.cost.band import band, class_seconds
from perfmodel.schedules.estimate import diffusion_latency, mean_step, throughputs
from perfmodel.schedules.phases import PhaseCost
from perfmodel.specs.composition import Composition
from perfmodel.specs.uncertainty import Uncertainty

FIGURES = ("ttft_s", "tpot_s", "e2e_s", "throughput_tokens_per_s", "decode_tokens_per_s")
Edges = dict[str, tuple[np.ndarray, np.ndarray]]


def request_bands(phases: tuple[PhaseCost, ...], unc: Uncertainty, batch: np.ndarray,
                  gen_len: np.ndarray, replicas: int,
                  composition: Composition | None = None) -> Edges:
    """(low, high) of each of ``FIGURES`` per configuration; ``composition``: the device's
    (``specs.composition``), whose term widens the phases timed as CUDA graphs."""
    per = {p.name: p.class_seconds() for p in phases}
    comp = composition or Composition()
    graphs = {p.name: np.asarray(p.composed_s, dtype=float) for p in phases}

    def term(seconds: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
        return comp.edges(seconds) if np.any(seconds) else None

    e2e = band(sum(per.values()), unc, composed=term(sum(graphs.values())))
    if "denoise" in per:
        denoise = band(per["denoise"], unc)
        ttft, tpot = (tuple(diffusion_latency(e, d, gen_len)[j] for e, d in zip(
            e2e, denoise, strict=True)) for j in (0, 1))
    else:
        d = next(p for p in phases if p.name == "decode")
        ttft = band(per["prefill"], unc, composed=term(graphs["prefill"]))
        steps = np.maximum(d.steps, 1)
        first = band(class_seconds(d.first_step_ops_s, d.error_codes), unc,
                     composed=term(graphs["decode"] / steps))
        tpot = tuple(mean_step(total, d.steps, one) for total, one in zip(
            band(per["decode"], unc, composed=term(graphs["decode"])), first, strict=True))
    out = {"ttft_s": ttft, "tpot_s": tpot, "e2e_s": e2e}
    slow = throughputs(batch, gen_len, e2e[1], tpot[1], replicas)
    fast = throughputs(batch, gen_len, e2e[0], tpot[0], replicas)
    out["throughput_tokens_per_s"] = (slow[0], fast[0])
    out["decode_tokens_per_s"] = (slow[1], fast[1])
    return out
