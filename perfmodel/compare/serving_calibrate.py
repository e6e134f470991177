"""Calibrate one deployment's engine host time from its own measured runs
(``perfmodel calibrate-serving``): only the host constants of ``serving.host_time`` move,
never a kernel constant.

Fitted: the per-step constant (``exposed_s`` when the engine overlaps its host work with
the GPU, else ``step_s``), the API server's time per request (``request_s``) and per
prompt token (``prompt_token_s``). Each is read off the statistic it alone moves: a pure
decode step's gap (ITL p50) moves one for one with the per-step constant; the TTFT p50 of
a run without a queue moves one for one with the request's API-server time. So each round
simulates the fitting runs once and moves the constants by the measured-minus-simulated
gaps (a Gauss-Newton step whose Jacobian is known), bounded to physical ranges; two rounds.

A run has "no queue" when its measured TTFT p90 is within ``LOW_LOAD_SPREAD`` of its p50
(a queue widens the TTFT distribution) and, where its request rows give one, its p50 is
within ``LOW_LOAD_FLOOR`` of its shortest TTFT (a saturated run's queue is long for every
request: narrow, but far above the floor); without such a run among the fitting runs the
request constants keep their shipped values.

Cross-validation by run: the runs sorted by offered rate, every ``every``-th (from the
lowest) fits, the others are predicted with the fitted profile and with the shipped one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np

from perfmodel.compare.serving import Run, errors, replay
from perfmodel.serving.host_time import HostTime

LOW_LOAD_SPREAD = 1.25      # measured TTFT p90 / p50 at most, for a run without a queue
LOW_LOAD_FLOOR = 1.5        # and measured TTFT p50 / the run's shortest TTFT at most
ROUNDS = 2
BOUNDS = {"step_s": (0.0, 20e-3), "exposed_s": (0.0, 20e-3), "request_s": (0.0, 0.1),
          "prompt_token_s": (0.0, 50e-6)}
REPORTED = (("E2E", "e2e_s.mean"), ("TTFT", "ttft_s.mean"), ("TTFT p50", "ttft_s.p50"),
            ("ITL p50", "itl_s.p50"), ("ITL p99", "itl_s.p99"), ("TPOT", "tpot_s.mean"))


def low_load(run: Run) -> bool:
    """The run's measured TTFT shows no queue (p90 within ``LOW_LOAD_SPREAD`` of p50, p50
    within ``LOW_LOAD_FLOOR`` of the shortest where the rows give it)."""
    ttft = run.measured.get("ttft_s", {})
    floor = run.ttft_floor_s
    return "p90" in ttft and ttft["p90"] <= LOW_LOAD_SPREAD * ttft["p50"] and \
        not ttft["p50"] > LOW_LOAD_FLOOR * floor


def offered_rate(run: Run) -> float:
    """Requests per second the run's send schedule offers."""
    t = run.requests.arrival_s
    return float((len(t) - 1) / max(t.max() - t.min(), 1e-9)) if len(t) > 1 else 0.0


def split(runs: list[Run], every: int = 3) -> tuple[list[Run], list[Run]]:
    """(fitting, held-out): sorted by offered rate (then id), every ``every``-th fits."""
    order = sorted(runs, key=lambda r: (offered_rate(r), r.id))
    fit = [r for i, r in enumerate(order) if i % every == 0]
    return fit, [r for r in order if r not in fit]


def step_key(host: HostTime) -> str:
    return "exposed_s" if host.overlap else "step_s"


def _with(run: Run, host: HostTime) -> Run:
    return replace(run, engine=replace(run.engine, host=host), notes=list(run.notes))


def predict(runs: list[Run], host: HostTime | None,
            progress: Callable[[str], None] | None = None) -> list[dict]:
    """Each run replayed with ``host`` (None: its own shipped profile): summary, errors."""
    out = []
    for run in runs:
        if progress is not None:
            progress(run.id)
        r = run if host is None else _with(run, host)
        predicted = replay(r)
        out.append({"id": run.id, "predicted": predicted, "low_load": low_load(run),
                    **errors(predicted, run.measured)})
    return out


def _round(host: HostTime, runs: list[Run], rows: list[dict]) -> HostTime:
    """One update of the fitted constants from the measured-minus-simulated gaps."""
    values = host.constants()
    key = step_key(host)
    gaps = [run.measured["itl_s"]["p50"] - row["predicted"]["itl_s"]["p50"]
            for run, row in zip(runs, rows, strict=True)
            if "p50" in run.measured.get("itl_s", {})]
    if gaps:
        values[key] += float(np.median(gaps))
    quiet = [(run, row) for run, row in zip(runs, rows, strict=True) if row["low_load"]]
    if quiet:
        x = np.array([[1.0, float(run.requests.input_tokens.mean())] for run, _ in quiet])
        y = np.array([run.measured["ttft_s"]["p50"] - row["predicted"]["ttft_s"]["p50"]
                      for run, row in quiet])
        if len({round(v) for v in x[:, 1]}) > 1:       # two prompt lengths: both constants
            delta = np.linalg.lstsq(x, y, rcond=None)[0]
        else:                                          # one length: the per-request share
            delta = np.array([float(np.median(y)), 0.0])
        values["request_s"] += float(delta[0])
        values["prompt_token_s"] += float(delta[1])
    for k, (lo, hi) in BOUNDS.items():
        values[k] = float(np.clip(values[k], lo, hi))
    return replace(host, **values)


def fit(runs: list[Run], base: HostTime, progress: Callable[[str], None] | None = None,
        first: list[dict] | None = None) -> tuple[HostTime, list[dict]]:
    """The host constants fitted to ``runs`` from ``base`` (and each round's replays);
    ``first``: the runs' replays with ``base`` when already made."""
    host, history = base, []
    for k in range(ROUNDS):
        rows = first if k == 0 and first is not None else predict(runs, host, progress)
        history.append({"host": host.constants(), "rows": rows})
        host = _round(host, runs, rows)
    name = f"{base.name.split(' (')[0]} calibrated on {len(runs)} runs"
    return replace(host, name=name, sources={}), history


def medians(rows: list[dict]) -> dict:
    """Median |error| of each reported statistic (TTFT p50 over the low-load runs only)."""
    out = {}
    for label, key in REPORTED:
        pool = [r for r in rows if key in r and (label != "TTFT p50" or r["low_load"])]
        if pool:
            out[label] = {"median_abs": float(np.median([abs(r[key]) for r in pool])),
                          "runs": len(pool)}
    return out
