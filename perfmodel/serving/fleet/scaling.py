"""Replicas added and removed by an autoscaler (``fleet.autoscale``) while a trace
replays: the replicas step in lockstep (as under a load-aware router: ``fleet.routers``),
the autoscaler reads their metric every ``interval_s`` and the router deals each arrival
to the replicas serving then.

A replica's life:

- launched at a decision (or at t = 0, ``min_replicas`` of them, already serving), it holds
  its devices from then on; it serves from ``launch + startup_s`` (``fleet.startup``);
- removed at a decision: a replica still starting is stopped at once; a serving one
  drains: it takes no new request, finishes those it has, and stops at its last finish
  (at the decision if it had none). The autoscaler removes the starting ones first, the
  newest first, then those serving for the shortest time (Kubernetes' ReplicaSet deletion
  order, ``pkg/controller/replicaset`` ``getPodsToDelete``: not ready before ready, then
  the most recently ready);
- at the end, every replica still held stops when the last request finishes.

GPU-seconds are each replica's held time times its devices; ``Scaled`` keeps the counts
at each decision (the replica count over time) and each replica's span.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from perfmodel.serving.fleet import routers
from perfmodel.serving.fleet.autoscale import PER_POD, TTFT_QUANTILE, Autoscaler, Policy
from perfmodel.serving.requests import Requests


@dataclass(eq=False)
class Replica:
    run: object
    launch_s: float
    ready_s: float
    drain_s: float | None = None
    stop_s: float | None = None
    local: list = field(default_factory=list)       # its requests, as stream indices

    def serving(self, t: float) -> bool:
        return self.ready_s <= t and self.drain_s is None and self.stop_s is None


@dataclass
class Scaled:
    """What the autoscaler did: at each decision (time, serving, starting, draining,
    wanted, metric or NaN: null in JSON); each replica's (launch, ready, drain or NaN,
    stop) times and (first, last) arrival routed to it (NaN: none)."""
    policy: Policy
    startup_s: float
    devices: int
    decisions: list = field(default_factory=list)
    spans: list = field(default_factory=list)
    served: list = field(default_factory=list)

    @property
    def gpu_seconds(self) -> float:
        return self.devices * sum(span[-1] - span[0] for span in self.spans)

    def to_dict(self) -> dict:
        cols = ("t_s", "serving", "starting", "draining", "wanted", "metric")
        return {"policy": self.policy.describe(), "startup_s": self.startup_s,
                "replicas_launched": len(self.spans), "gpu_hours": self.gpu_seconds / 3600,
                "replicas_over_time": {c: [None if d[i] != d[i] else d[i]  # NaN: none
                                           for d in self.decisions]
                                       for i, c in enumerate(cols)}}


def run_scaled(start: Callable[[Requests], object], advance: Callable[[object], None],
               requests: Requests, policy: Policy, startup_s: float, devices: int,
               router: str, progress: Callable | None = None) -> tuple[list, list, Scaled]:
    """(each replica's requests as stream indices, each replica's run, what the
    autoscaler did) for ``requests`` (open loop) under ``policy``."""
    fleet: list[Replica] = []
    scaler, out = Autoscaler(policy), Scaled(policy, startup_s, devices)

    def launch(t: float, ready: float) -> None:
        run = start(routers._slots(requests, 64))
        run.known, run.t, run.cutoff = 0, ready, ready
        fleet.append(Replica(run, t, ready))

    for _ in range(policy.min_replicas):
        launch(0.0, 0.0)
    order = np.argsort(requests.arrival_s, kind="stable").tolist()
    arrival = requests.arrival_s
    tokens = requests.input_tokens + requests.output_tokens
    rng, dealt, tick, now, k = np.random.default_rng(0), 0, policy.interval_s, 0.0, 0
    aware = router in routers.LOAD_AWARE
    while k < len(order):
        # the serving set holds until the next decision or a launched replica's readiness
        upto = min([tick] + [r.ready_s for r in fleet if r.stop_s is None and r.ready_s > now])
        serving = [r for r in fleet if r.serving(now)]
        while k < len(order) and arrival[order[k]] < upto:
            i, t = order[k], float(arrival[order[k]])
            if aware:           # the loads at the arrival: every replica advanced to it
                _advance(fleet, t, advance)
                pick = routers._replica([[routers._load(r.run, t)] for r in serving],
                                        router, rng)
            else:               # round-robin reads no state: dealt ahead to the event
                pick = dealt % len(serving)
            dealt += 1
            routers._place(serving[pick].run, requests, i, int(tokens[i]))
            serving[pick].local.append(i)
            k += 1
        if k == len(order):
            break
        _advance(fleet, upto, advance)
        if upto == tick:
            _decide(fleet, tick, scaler, out, requests, startup_s, launch)
            tick += policy.interval_s
        now = upto
        if progress is not None:
            progress(sum(r.run.done for r in fleet), len(requests), now)
    _advance(fleet, np.inf, advance)
    return _finish(fleet, out)


def _advance(fleet: list, t: float, advance: Callable) -> None:
    """Every replica not stopped run up to ``t`` (no step starting at or after it)."""
    for rep in fleet:
        if rep.stop_s is None:
            rep.run.horizon = t
            advance(rep.run)
            if rep.drain_s is not None and rep.run.done == rep.run.known:
                rep.stop_s = max(rep.drain_s, _last_finish(rep))


def _decide(fleet: list, t: float, scaler: Autoscaler, out: Scaled, requests: Requests,
            startup_s: float, launch: Callable) -> None:
    """One decision at ``t``: the metric read, the count wanted, replicas launched or
    removed."""
    serving = [r for r in fleet if r.serving(t)]
    starting = [r for r in fleet if r.stop_s is None and r.drain_s is None and r.ready_s > t]
    metric = _metric(serving, t, scaler.policy, requests)
    wanted = scaler.decide(t, metric, len(serving), len(starting))
    current = len(serving) + len(starting)
    for _ in range(wanted - current):
        launch(t, t + startup_s)
    victims = sorted(starting, key=lambda r: -r.launch_s) + \
        sorted(serving, key=lambda r: -r.ready_s)
    for rep in victims[:max(current - wanted, 0)]:
        if rep.ready_s > t:
            rep.stop_s = t
        else:
            rep.drain_s = t
            if rep.run.done == rep.run.known:
                rep.stop_s = t
    draining = sum(1 for r in fleet if r.drain_s is not None and r.stop_s is None)
    out.decisions.append((t, len(serving), len(starting), draining, wanted,
                          float("nan") if metric is None else metric))


def _metric(serving: list, t: float, p: Policy, requests: Requests) -> float | None:
    """The policy's metric at ``t`` over the serving replicas: a per-pod metric summed
    (requests waiting, in flight, or the KV pool's share in use, as each engine published
    them: ``routers._load``), or the p90 TTFT of the first tokens in the last
    ``window_s`` (None when there is none)."""
    if p.metric in PER_POD:
        loads = [routers._load(r.run, t) for r in serving]
        if p.metric == "queue":
            return float(sum(x[2] for x in loads))
        if p.metric == "running":
            return float(sum(_in_flight(r.run, t) for r in serving))
        return float(sum(x[3] / x[4] for x in loads))
    ttft = []
    for rep in serving:
        run = rep.run
        first = run.first_token_s[:run.known]
        seen = (first <= t) & (first > t - p.window_s)
        ttft.append(first[seen] - run.arrivals.arrival_s[:run.known][seen])
    waits = np.concatenate(ttft) if ttft else np.zeros(0)
    return float(np.percentile(waits, TTFT_QUANTILE)) if len(waits) else None


def _in_flight(run: object, t: float) -> int:
    """Requests sent to ``run`` by ``t`` and not finished by then (under round-robin a
    replica holds the requests dealt ahead to the next event: not yet sent)."""
    k = run.known
    sent = run.arrivals.requests.arrival_s[:k] <= t
    return int(np.count_nonzero(sent & ~(run.finish_s[:k] <= t)))


def _last_finish(rep: Replica) -> float:
    known = rep.run.known
    return float(np.max(rep.run.finish_s[:known])) if known else 0.0


def _finish(fleet: list, out: Scaled) -> tuple[list, list, Scaled]:
    """The replicas' runs cut to their requests, every replica's span (those still held
    stop at the last finish), and the replicas that served requests."""
    end = max((_last_finish(r) for r in fleet), default=0.0)
    for rep in fleet:
        routers._trim(rep.run)
        stop = end if rep.stop_s is None else rep.stop_s
        drain = np.nan if rep.drain_s is None else rep.drain_s
        out.spans.append((rep.launch_s, rep.ready_s, drain, max(stop, rep.launch_s)))
        times = rep.run.arrivals.requests.arrival_s[:rep.run.known]
        out.served.append((float(times.min()), float(times.max())) if len(times) else
                          (np.nan, np.nan))
    used = [r for r in fleet if r.local]
    return [np.array(r.local, np.int64) for r in used], [r.run for r in used], out


def check(router: str, requests: Requests, dp: int, attention_ways: int,
          cluster: str | None) -> None:
    """One-line errors for what an autoscaled fleet cannot run."""
    from perfmodel.specs.errors import SpecError

    if dp > 1 or attention_ways > 1:
        raise SpecError("--autoscale: sets the replica count itself (--min-replicas, "
                        "--max-replicas); drop --dp and --attention-dp")
    if router not in ("round-robin", *routers.LOAD_AWARE):
        raise SpecError(f"--autoscale: deals to the replicas serving at each arrival with "
                        f"round-robin or a load-aware router, not --router {router}")
    if cluster is not None:
        raise SpecError("--autoscale: its replicas run in lockstep in one process; drop "
                        "--cluster")
    if requests.closed_loop or requests.client_cap or requests.session_id is not None:
        raise SpecError("--autoscale: replays an open-loop stream of single requests "
                        "(--rate or --trace without sessions), not a closed loop, client "
                        "cap or conversations")
