"""Replicas of one engine: the requests dealt to ``plan.dp`` replicas (and, under
data-parallel attention, to each of the ``ep`` attention ranks) by the router
(``fleet.routers``), each replica's engine run (``serving.engine_loop``) apart (here, in
worker processes or on Dask: ``fleet.workers``) or in lockstep under a load-aware router,
and their runs merged into one result in the stream's order (``merge``). An engine left
without a request idles and is left out.
"""

from __future__ import annotations

import numpy as np

from perfmodel.serving import engine_loop as loop
from perfmodel.serving import pipeline, sessions
from perfmodel.serving.engine_loop import Progress, Run
from perfmodel.serving.engines.vllm import EngineConfig
from perfmodel.serving.fleet import routers
from perfmodel.serving.fleet.workers import run_apart
from perfmodel.serving.requests import Requests
from perfmodel.serving.results import SimResult, StepLog
from perfmodel.specs.hardware import Hardware
from perfmodel.specs.model import Model
from perfmodel.specs.workload import Parallelism, Workload


def run_replicas(model: Model, hw: Hardware, plan: Parallelism, w: Workload,
                 engine: EngineConfig, requests: Requests, engines: int, blocks: int,
                 router: str, workers: int, progress: Progress | None,
                 edge: int | None = None, cluster: str | None = None) -> tuple[list, list]:
    """(each replica's requests, as indices in arrival order; each replica's ``Run``):
    dealt ahead and run apart (in ``workers`` processes, or on the Dask ``cluster``:
    ``fleet.workers``), or, under a load-aware router, run in lockstep (``fleet.routers``).
    An engine given no request (fewer requests than engines) idles and is left out."""
    def start(reqs: Requests) -> Run:
        return loop.start(model, hw, plan, w, engine, reqs, blocks, edge)

    if router in routers.LOAD_AWARE and engines > 1:
        step = pipeline.advance if plan.pp > 1 else loop.advance
        parts, runs = routers.lockstep(start, step, requests, engines, router, progress,
                                       plan.attention_ways, loop.record)
        kept = [e for e, idx in enumerate(parts) if len(idx)]
        return [parts[e] for e in kept], [runs[e] for e in kept]
    dealt = [sessions.engine_order(requests, idx)
             for idx in routers.deal(requests, engines, router)]
    ways = plan.attention_ways
    shared = (model, hw, plan, w, engine, blocks, edge)
    if ways > 1:            # data-parallel attention: each replica's ranks in lockstep
        groups = [[idx for idx in dealt[g:g + ways] if len(idx)]    # an idle rank's dummy
                  for g in range(0, engines, ways)]                 # step is never longest
        groups = [group for group in groups if group]
        jobs = [[subset(requests, idx, engines) for idx in group] for group in groups]
        ranks = run_apart(_ranks, shared, jobs, workers, cluster, progress)
        return [idx for group in groups for idx in group], [r for rs in ranks for r in rs]
    parts = [idx for idx in dealt if len(idx)]
    jobs = [subset(requests, idx, engines) for idx in parts]
    return parts, run_apart(_replica, shared, jobs, workers, cluster, progress)


def run_autoscaled(model: Model, hw: Hardware, plan: Parallelism, w: Workload,
                   engine: EngineConfig, requests: Requests, blocks: int, router: str,
                   policy: object, startup_s: float, progress: Progress | None,
                   edge: int | None = None) -> tuple[list, list, object]:
    """As ``run_replicas``, the replica count set by the autoscaler ``policy``
    (``fleet.scaling``: replicas launched take ``startup_s`` to serve)."""
    from perfmodel.serving.fleet import scaling

    def start(reqs: Requests) -> Run:
        return loop.start(model, hw, plan, w, engine, reqs, blocks, edge)

    step = pipeline.advance if plan.pp > 1 else loop.advance
    return scaling.run_scaled(start, step, requests, policy, startup_s,
                              plan.group * plan.pp, router, progress)


def _light(run: Run) -> Run:
    """``run`` without the model and hardware, not needed back from a worker: a small
    pickle."""
    run.pricer.model = run.pricer.hw = None
    return run


def _replica(requests: Requests, shared: tuple, progress: Progress | None = None,
             keep: bool = False) -> Run:
    """One replica's run; ``shared``: (model, hw, plan, workload, engine, blocks, edge),
    sent to a Dask worker once while the task carries only the requests; from a worker
    (not ``keep``) returned ``_light``."""
    model, hw, plan, w, engine, blocks, edge = shared
    run = loop.simulate_one(model, hw, plan, w, engine, requests, blocks, progress, edge)
    return run if keep else _light(run)


def _ranks(subsets: list, shared: tuple, progress: Progress | None = None,
           keep: bool = False) -> list[Run]:
    """One data-parallel-attention replica: its ranks (``subsets``, one ``Requests`` each)
    run in lockstep (``routers.ranks_lockstep``); as ``_replica`` otherwise."""
    model, hw, plan, w, engine, blocks, edge = shared
    runs = [loop.start(model, hw, plan, w, engine, reqs, blocks, edge) for reqs in subsets]
    routers.ranks_lockstep(runs, loop.record, progress)
    return runs if keep else [_light(run) for run in runs]


def subset(requests: Requests, idx: np.ndarray, engines: int) -> Requests:
    """The requests ``idx`` as one of ``engines`` engines sees them (a closed loop's users
    shared out, a conversation's turns in the engine's order: ``sessions.engine_view``)."""
    if engines == 1:
        return requests if requests.think_s is None else sessions.engine_view(requests, idx)
    users = -(-requests.closed_loop // engines) if requests.closed_loop else 0
    return sessions.engine_view(requests, idx, closed_loop=users, client_cap=0, turn=None)


def merge(requests: Requests, parts: list, runs: list, blocks: int, label: str,
          info: dict) -> SimResult:
    """One result from the replicas' runs (``parts``: each one's requests, as indices into
    ``requests``), every request and token back in its place; the steps logged are the
    first engine's."""
    n = len(requests)
    out = {k: np.zeros(n) for k in ("arrival_s", "scheduled_s", "first_token_s", "finish_s")}
    pre, hits = np.zeros(n, np.int64), np.zeros(n, np.int64)
    offsets = np.concatenate([[0], np.cumsum(requests.output_tokens)])
    token_s = np.zeros(int(offsets[-1]))
    for idx, run in zip(parts, runs, strict=True):
        out["arrival_s"][idx] = run.arrivals.arrival_s
        for k in ("scheduled_s", "first_token_s", "finish_s"):
            out[k][idx] = getattr(run, k)
        pre[idx], hits[idx] = run.state.preemptions, run.state.hit_tokens
        mine = run.token_offsets[:len(idx) + 1]         # each token to its place, at once
        shift = offsets[idx] - mine[:-1]
        token_s[np.arange(mine[-1]) + np.repeat(shift, np.diff(mine))] = \
            run.token_s[:mine[-1]]
    log = np.array(runs[0].log, dtype=float).reshape(-1, 8)
    steps = StepLog(log[:, 0], log[:, 1], *(log[:, i].astype(np.int64) for i in range(2, 7)),
                    host_s=log[:, 7])
    return SimResult(requests, out["arrival_s"], out["scheduled_s"], out["first_token_s"],
                     out["finish_s"], pre, hits, offsets, token_s, steps, blocks, label, info)
