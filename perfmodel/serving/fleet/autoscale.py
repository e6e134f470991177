"""Autoscaling policy: how many replicas a fleet wants, decided every ``interval_s`` from a
metric of its replicas, as Kubernetes' Horizontal Pod Autoscaler decides it (the
algorithm in kubernetes.io/docs/tasks/run-application/horizontal-pod-autoscale/, "Algorithm
details"; ``pkg/controller/podautoscaler`` ``replica_calculator.go`` and
``horizontal.go``); KEDA and the vLLM production-stack's KEDA recipe feed the same HPA
with a Prometheus metric such as ``vllm:num_requests_waiting``.

Metrics (``METRICS``):

- "queue": requests waiting for their prefill per replica (vLLM's
  ``num_requests_waiting``, the production-stack's KEDA trigger), a per-pod average;
- "running": requests in flight (sent and not finished) per replica (Knative's
  concurrency target; llm-d's active-request count), a per-pod average;
- "kv": KV-cache blocks in use over the pool per replica (vLLM's ``kv_cache_usage_perc``),
  a per-pod average utilization;
- "ttft": the fleet's p90 TTFT over the last ``window_s`` of first tokens against the
  SLO target (an SLO planner's signal, as NVIDIA Dynamo's planner and llm-d's SLO-aware
  scaling read it), an object metric of the whole fleet.

Each decision, with ``ready`` replicas serving and ``starting`` ones loading:

1. usage ratio r = metric / target (a per-pod metric: the sum over the ready replicas
   over ``ready * target``); within the tolerance (|r - 1| <= ``tolerance``, HPA's
   ``--horizontal-pod-autoscaler-tolerance`` default 0.1) the proposal is the current
   count ``ready + starting``; else ceil(r * ready) (``replicaCountProposal``);
2. replicas still starting report no metric: scaling up, HPA counts them at 0 and computes
   the ratio again over ``ready + starting``; if that ratio is within the tolerance or
   points the other way, the proposal is the current count (``calcPlainMetricReplicas``);
3. stabilization (``stabilizeRecommendationWithBehaviors``): the proposal is kept with
   its time; scaling down takes the largest proposal of the last ``down_window_s``
   (default 300 s: ``--horizontal-pod-autoscaler-downscale-stabilization``), scaling up
   the smallest of the last ``up_window_s`` (default 0: the newest alone);
4. rate limit on the way up (HPA's default ``scaleUp`` policies: 100% or 4 pods per 15 s,
   the larger): at most max(2 * current, current + 4) a decision; none on the way down
   (its default: 100% per 15 s);
5. clamped to [``min_replicas``, ``max_replicas``].

No metric (no first token in the TTFT window): no change, as HPA skips a metric it
cannot read.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from perfmodel.specs.errors import SpecError

METRICS = ("queue", "running", "kv", "ttft")
PER_POD = ("queue", "running", "kv")
DEFAULT_TARGET = {"queue": 4.0, "running": 64.0, "kv": 0.7}
SYNC_PERIOD_S = 15.0            # --horizontal-pod-autoscaler-sync-period
DOWN_WINDOW_S = 300.0           # --horizontal-pod-autoscaler-downscale-stabilization
TOLERANCE = 0.1                 # --horizontal-pod-autoscaler-tolerance
TTFT_WINDOW_S = 60.0            # the TTFT metric's window of first tokens
TTFT_QUANTILE = 90.0


@dataclass(frozen=True)
class Policy:
    """An autoscaler's settings (see the module for the decision)."""
    metric: str
    target: float
    min_replicas: int
    max_replicas: int
    interval_s: float = SYNC_PERIOD_S
    down_window_s: float = DOWN_WINDOW_S
    up_window_s: float = 0.0
    tolerance: float = TOLERANCE
    window_s: float = TTFT_WINDOW_S

    def describe(self) -> str:
        return (f"{self.metric} target {self.target:g}, {self.min_replicas}-"
                f"{self.max_replicas} replicas, every {self.interval_s:g} s, scale-down "
                f"window {self.down_window_s:g} s, tolerance {self.tolerance:g}")


def policy(metric: str, target: float | None, min_replicas: int, max_replicas: int,
           interval_s: float = SYNC_PERIOD_S, down_window_s: float = DOWN_WINDOW_S,
           slo_ttft: float | None = None) -> Policy:
    """A checked ``Policy`` (one-line errors naming the option); the TTFT metric's target
    defaults to ``slo_ttft``."""
    if metric not in METRICS:
        raise SpecError(f"--autoscale: expected one of {', '.join(METRICS)}, got {metric!r}")
    if target is None:
        target = slo_ttft if metric == "ttft" else DEFAULT_TARGET[metric]
    if target is None:
        raise SpecError("--autoscale ttft: needs a target: --autoscale-target SECONDS or "
                        "--slo-ttft SECONDS")
    if not (math.isfinite(target) and target > 0) or (metric == "kv" and target > 1):
        within = "in (0, 1] (a share of the KV pool)" if metric == "kv" else "> 0"
        raise SpecError(f"--autoscale-target: expected a number {within} for --autoscale "
                        f"{metric}, got {target}")
    for flag, value in (("--min-replicas", min_replicas), ("--max-replicas", max_replicas)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise SpecError(f"{flag}: expected a whole number >= 1, got {value!r}")
    if max_replicas < min_replicas:
        raise SpecError(f"--max-replicas: expected at least --min-replicas {min_replicas}, "
                        f"got {max_replicas}")
    for flag, value, low in (("--scale-interval", interval_s, 0.0),
                             ("--scale-down-window", down_window_s, -1.0)):
        if not (math.isfinite(value) and value > low):
            raise SpecError(f"{flag}: expected seconds {'> 0' if low == 0 else '>= 0'}, "
                            f"got {value}")
    return Policy(metric, float(target), min_replicas, max_replicas, float(interval_s),
                  float(down_window_s))


@dataclass
class Autoscaler:
    """The policy's state between decisions: its recent proposals, with their times."""
    policy: Policy
    proposals: deque = field(default_factory=deque)    # (time s, proposal)

    def decide(self, t: float, metric: float | None, ready: int, starting: int) -> int:
        """The replica count wanted at ``t`` (steps 1-5 of the module), ``metric`` the
        per-pod sum over the ready replicas (or the fleet's value for "ttft"; None: not
        measured)."""
        p, current = self.policy, ready + starting
        raw = current if metric is None or ready == 0 else self._proposal(
            metric, ready, starting)
        self.proposals.append((t, raw))
        keep = max(p.down_window_s, p.up_window_s)
        while self.proposals and self.proposals[0][0] < t - keep:
            self.proposals.popleft()
        down = max(x for s, x in self.proposals if s >= t - p.down_window_s)
        up = min(x for s, x in self.proposals if s >= t - p.up_window_s)
        wanted = current
        if wanted < up:
            wanted = min(up, max(2 * current, current + 4))
        if wanted > down:
            wanted = down
        return max(p.min_replicas, min(p.max_replicas, wanted))

    def _proposal(self, metric: float, ready: int, starting: int) -> int:
        """HPA's count from the usage ratio (steps 1 and 2)."""
        p, current = self.policy, ready + starting
        per_pod = p.metric in PER_POD
        ratio = metric / (ready * p.target) if per_pod else metric / p.target
        if abs(ratio - 1.0) <= p.tolerance:
            return current
        if starting and ratio > 1.0:      # the starting ones counted at 0
            again = metric / (current * p.target) if per_pod else ratio * ready / current
            if again <= 1.0 or abs(again - 1.0) <= p.tolerance:
                return current
            return math.ceil(again * current)
        return math.ceil(ratio * ready)
