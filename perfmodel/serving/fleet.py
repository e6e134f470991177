"""Data-parallel replicas behind a router: which replica each request goes to, and how the
replicas are run (``serving.simulate`` runs each one's engine).

Policies, as production routers have them:

- "round-robin": the i-th arrival to replica i mod N (vLLM's ``vllm-project/router`` and
  SGLang's ``sgl-router`` ``round_robin``);
- "least-requests": to the replica with the fewest requests sent and not finished
  (llm-d's inference scheduler scores replicas by queue depth; SGLang's router balances on
  each worker's running-request load); ties to the lowest index;
- "least-tokens": the fewest prompt + output tokens of requests sent and not finished;
- "session-affinity": a conversation's turns to one replica, by a hash of its session
  (vLLM's router ``consistent_hash`` on a session header); requests with no session
  round-robin;
- "prefix-affinity": requests that share a prompt prefix to one replica, by a hash of the
  prefix (the exact-match core of SGLang's ``cache_aware`` policy and llm-d's prefix-cache
  scorer, without their load balancing thresholds); requests with none round-robin.

Replicas share no state, so under a policy that reads only the request ("round-robin",
"session-affinity", "prefix-affinity") the requests are dealt first and each replica is
simulated on its own, in parallel worker processes when ``workers`` > 1. A policy that
reads the replicas' load cannot be dealt ahead: the load at an arrival depends on every
completion before it. Those are run in lockstep, exactly: before each arrival every
replica is advanced to it (no step that starts at or after the arrival is committed, and
a step that straddles it has its finishes counted after it), the router reads the counts,
and the chosen replica is given the request. This runs in one process.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np

from perfmodel.serving.requests import Requests
from perfmodel.specs.errors import SpecError

ROUTERS = ("round-robin", "least-requests", "least-tokens", "session-affinity",
           "prefix-affinity")
LOAD_AWARE = ("least-requests", "least-tokens")
_HASH = 0x9E3779B1          # Fibonacci hashing: spreads consecutive ids over the replicas


def check(router: str, workers: int, requests: Requests, engines: int,
          attention_ways: int = 1) -> None:
    if router not in ROUTERS:
        raise SpecError(f"--router: expected one of {', '.join(ROUTERS)}, got {router!r}")
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise SpecError(f"--workers: expected a whole number >= 1, got {workers!r}")
    if router in LOAD_AWARE and engines > 1 and (requests.closed_loop or requests.client_cap):
        raise SpecError(f"--router {router}: a closed loop or client cap is dealt "
                        "round-robin only; use --rate or --trace")
    if router in LOAD_AWARE and attention_ways > 1:
        raise SpecError(f"--router {router}: not simulated with --attention-dp (its ranks "
                        "step in lockstep); use round-robin or an affinity router")


def deal(requests: Requests, engines: int, router: str) -> list[np.ndarray]:
    """Each replica's requests under a policy that reads only the request."""
    n = len(requests)
    order = np.arange(n) if requests.closed_loop else \
        np.argsort(requests.arrival_s, kind="stable")
    if engines == 1:
        return [order]
    if router == "round-robin" or router in LOAD_AWARE:
        return [order[e::engines] for e in range(engines)]
    key = requests.session_id if router == "session-affinity" else requests.prefix_id
    key = np.full(n, -1, np.int64) if key is None else key
    keyed = key[order] >= 0
    target = np.zeros(n, np.int64)
    target[keyed] = (key[order][keyed].astype(np.uint64) * np.uint64(_HASH)
                     % np.uint64(2 ** 32) % np.uint64(engines)).astype(np.int64)
    target[~keyed] = np.arange(int((~keyed).sum())) % engines
    return [order[target == e] for e in range(engines)]


def lockstep(start: Callable[[Requests], object], advance: Callable[[object], None],
             requests: Requests, engines: int, router: str,
             progress: Callable[[int, int, float], None] | None) -> tuple[list, list]:
    """Replicas run in lockstep under a load-aware ``router``: ``start(slots)`` makes an
    engine's run, ``advance(run)`` runs it to ``run.horizon``."""
    runs = [start(_slots(requests, 64)) for _ in range(engines)]
    for run in runs:
        run.known = 0
    local: list[list[int]] = [[] for _ in range(engines)]
    order = np.argsort(requests.arrival_s, kind="stable")
    tokens = requests.input_tokens + requests.output_tokens
    for i in order.tolist():
        t = float(requests.arrival_s[i])
        loads = []
        for run in runs:
            run.horizon = t
            advance(run)
            late = run.t > t                # the step that straddles t finishes after it
            if router == "least-requests":
                loads.append(run.known - run.done + (run.last_done if late else 0))
            else:
                loads.append(run.load_tokens + (run.last_done_tokens if late else 0))
        e = int(np.argmin(loads))
        _place(runs[e], requests, i, int(tokens[i]))
        local[e].append(i)
        if progress is not None:
            progress(sum(r.done for r in runs), len(requests), t)
    for run in runs:
        run.horizon = np.inf
        advance(run)
        _trim(run)
    return [np.array(x, np.int64) for x in local], runs


def _slots(requests: Requests, n: int) -> Requests:
    """``n`` empty request slots (arriving never) to place requests into."""
    session = None if requests.session_id is None else np.full(n, -1, np.int64)
    with np.errstate(invalid="ignore"):         # inf - inf in the sortedness check
        return Requests(np.full(n, np.inf), np.ones(n, np.int64), np.ones(n, np.int64),
                        np.full(n, -1, np.int64), np.zeros(n, np.int64),
                        session_id=session)


def _place(run: object, requests: Requests, i: int, tokens: int) -> None:
    """Give request ``i`` to the replica: its next slot (growing the arrays when full)."""
    k = run.known
    if k >= len(run.arrivals.requests):
        _grow(run, 2 * k)
    mine = run.arrivals.requests
    for name in ("input_tokens", "output_tokens", "prefix_id", "prefix_tokens"):
        getattr(mine, name)[k] = getattr(requests, name)[i]
    if requests.session_id is not None:
        mine.session_id[k] = requests.session_id[i]
        run.state.grows[k] = requests.session_id[i] >= 0
    run.state.prefix_full[k] = requests.prefix_tokens[i] // run.state.engine.block_size
    run.state.sharing = run.state.sharing or bool(run.state.prefix_full[k]) or \
        run.state.grows is not None
    mine.arrival_s[k] = run.arrivals.arrival_s[k] = requests.arrival_s[i]
    end = run.token_offsets[k] + int(requests.output_tokens[i])
    run.token_offsets[k + 1] = end
    if end > len(run.token_s):
        run.token_s = np.concatenate([run.token_s, np.zeros(max(end, len(run.token_s)))])
    run.known = k + 1
    run.load_tokens += tokens


def _grow(run: object, cap: int) -> None:
    """Every per-request array of the replica, ``cap`` long (new slots empty)."""
    old = run.arrivals.requests
    n = len(old)
    more = _slots(old, cap - n)
    with np.errstate(invalid="ignore"):
        new = replace(old, **{f: np.concatenate([getattr(old, f), getattr(more, f)])
                              for f in ("arrival_s", "input_tokens", "output_tokens",
                                        "prefix_id", "prefix_tokens", "session_id")
                              if getattr(old, f) is not None})
    run.arrivals.requests = new
    run.arrivals.arrival_s = np.concatenate([run.arrivals.arrival_s, more.arrival_s])
    st = run.state
    st.prompt, st.output, st.prefix = new.input_tokens, new.output_tokens, new.prefix_id
    pad = np.zeros(cap - n, np.int64)
    for f in ("prefix_full", "computed", "emitted", "own", "shared", "preemptions",
              "hit_tokens"):
        setattr(st, f, np.concatenate([getattr(st, f), pad]))
    st.padded = np.concatenate([st.padded, pad.astype(bool)])
    if st.grows is not None:
        st.grows = np.concatenate([st.grows, pad.astype(bool)])
    nan = np.full(cap - n, np.nan)
    for f in ("first_token_s", "finish_s", "scheduled_s"):
        setattr(run, f, np.concatenate([getattr(run, f), nan]))
    run.token_offsets = np.concatenate([run.token_offsets, np.zeros(cap - n, np.int64)])


def _trim(run: object) -> None:
    """Cut the arrays to the requests placed, as ``serving.simulate._merge`` reads them."""
    k = run.known
    run.arrivals.arrival_s = run.arrivals.arrival_s[:k]
    for f in ("first_token_s", "finish_s", "scheduled_s"):
        setattr(run, f, getattr(run, f)[:k])
    run.state.preemptions = run.state.preemptions[:k]
    run.state.hit_tokens = run.state.hit_tokens[:k]
    run.token_offsets = run.token_offsets[:k + 1]


def ranks_lockstep(runs: list, record: Callable, progress: Callable | None = None) -> None:
    """The data-parallel attention ranks of one replica of an MoE model step together: each
    step every rank forms its own batch, an idle rank runs a dummy batch (one decode
    token, as SGLang's and vLLM's DP-attention ranks do to join the expert layer's
    collectives), and the step lasts as long as the slowest rank's (the expert layer
    waits for every rank's tokens). ``record(run, batch, effect, dt, queue_more)`` is the
    simulator's bookkeeping of a committed step; ``progress(done, total, clock_s)`` as in
    ``serving.simulate``."""
    from perfmodel.serving.scheduler import Batch

    one = np.ones(1, np.int64)
    dummy = Batch(np.zeros(1, np.int64), one, one, False, False, 0)
    pricer = runs[0].pricer
    while any(r.done < r.known for r in runs):
        t = runs[0].t
        batches = []
        for run in runs:
            run.state.waiting.extend(run.arrivals.due(run.cutoff))
            busy = run.state.running or run.state.waiting
            batches.append(run.state.schedule() if busy else None)
        if all(b is None for b in batches):
            t = min(r.arrivals.next_time() for r in runs)
            if not np.isfinite(t):
                raise RuntimeError("simulate: requests left that never arrive")
            for run in runs:
                run.t = run.cutoff = max(t, run.t)
            continue
        dt = float(pricer.times([b if b is not None else dummy for b in batches]).max())
        for run, batch in zip(runs, batches, strict=True):
            if batch is None:           # a dummy step: the next schedule sees as after one
                run.cutoff = run.t if run.state.lag else run.t + dt
                run.t += dt
                continue
            emit, done = run.state.commit(batch)
            effect = (emit, run.state.emitted[emit], done, run.state.pool.used,
                      len(run.state.waiting))
            record(run, batch, effect, dt, queue_more=True,
                   host=float(pricer.last_host.max()))
        if progress is not None:
            progress(sum(r.done for r in runs), sum(r.known for r in runs), runs[0].t)
