"""Data-parallel replicas behind a router: which replica each request goes to, and how the
replicas are run (``fleet.replicas``; ``serving.engine_loop`` runs each one's engine).

Policies, as production routers have them:

- "round-robin": the i-th arrival to replica i mod N (vLLM's ``vllm-project/router`` and
  SGLang's ``sgl-router`` ``round_robin``);
- "least-requests": to the replica with the fewest requests sent and not finished, as the
  router counts them itself (llm-d's ``active-request-scorer``; ``sgl-router``'s
  in-flight ``worker.load()``); ties to the lowest index. It counts requests decoding as
  much as requests waiting for their prefill;
- "least-tokens": the fewest prompt + output tokens of requests sent and not finished
  (llm-d's token-load scorers);
- "power-of-two": two replicas drawn at random (seeded: the same run gives the same
  draws), the one with fewer requests in flight wins, the first on a tie (``sgl-router``'s
  and ``vllm-project/router``'s ``power_of_two``: ``policies/power_of_two.rs``, on the
  router's own in-flight count, which later versions add to the engines' reported
  token load);
- "queue-kv": llm-d's default load scoring (``guides/inference-scheduling``: the Gateway
  API Inference Extension's ``queue-scorer`` and ``kv-cache-utilization-scorer`` at equal
  weight, its prefix scorer left to "prefix-affinity"): each replica scores
  (max_q - q) / (max_q - min_q) (1 when all queues are equal) plus 1 - KV use, where q is
  the engine's waiting queue (vLLM's ``num_requests_waiting``) and KV use its blocks in
  use over its pool, both as the engine published them after its last step that ended by
  the arrival (vLLM computes its stats when a step's outputs are processed; llm-d scrapes
  them again every 50 ms, which this leaves out: it reads the latest); the highest score
  wins, ties to the lowest index (llm-d's ``max-score-picker`` breaks them at random);
- "session-affinity": a conversation's turns to one replica, by a hash of its session
  (vLLM's router ``consistent_hash`` on a session header); requests with no session
  round-robin;
- "prefix-affinity": requests that share a prompt prefix to one replica, by a hash of the
  prefix (the exact-match core of SGLang's ``cache_aware`` policy and llm-d's prefix-cache
  scorer, without their load balancing thresholds); requests with none round-robin.

Replicas share no state, so under a policy that reads only the request ("round-robin",
"session-affinity", "prefix-affinity") the requests are dealt first and each replica is
simulated on its own, in parallel worker processes when ``workers`` > 1, or as tasks on a
Dask cluster (``serving.fleet.cluster``, ``--cluster``). A policy that reads the replicas' load
cannot be dealt ahead: the load at an arrival depends on every completion before it, and
the completions on what was routed. Those run in lockstep, exactly: before each arrival
every replica is advanced to it (no step that starts at or after the arrival is
committed, and a step that straddles it has its finishes counted after it), the router
reads the loads, and the chosen replica is given the request (``tests/test_routers.py``
checks this against re-simulating every replica from scratch at each arrival).

This runs in one process, and ``--cluster`` refuses a load-aware router. Run apart, the
replicas would have to meet at every arrival (a conservative synchronisation whose window
is the gap to the next arrival: no replica may run past it before the router has read
every other), which is one round trip per request and more than the step or two of work
each replica does between arrivals; a wider window would let a replica commit steps that
a request routed to it inside the window should have joined, so it is not exact.

Under data-parallel attention (``--attention-dp``), a replica's ``ep`` ranks step in
lockstep (``ranks_lockstep``); a load-aware router picks the replica by its ranks' summed
load and the replica's controller the rank, as SGLang's ``DataParallelController`` does
(``--load-balance-method total_requests``: the fewest running + waiting requests;
``total_tokens``, used under "least-tokens": the fewest tokens, ties by requests; ties to
the lowest rank). SGLang refreshes those counts from its schedulers at most every 20 ms
and adds each dispatch to them meanwhile; here they are exact at each arrival.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np

from perfmodel.serving.requests import Requests
from perfmodel.specs.errors import SpecError

ROUTERS = ("round-robin", "least-requests", "least-tokens", "power-of-two", "queue-kv",
           "session-affinity", "prefix-affinity")
LOAD_AWARE = ("least-requests", "least-tokens", "power-of-two", "queue-kv")
_HASH = 0x9E3779B1          # Fibonacci hashing: spreads consecutive ids over the replicas


def check(router: str, workers: int, requests: Requests, engines: int,
          attention_ways: int = 1, cluster: str | None = None) -> None:
    if router not in ROUTERS:
        raise SpecError(f"--router: expected one of {', '.join(ROUTERS)}, got {router!r}")
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise SpecError(f"--workers: expected a whole number >= 1, got {workers!r}")
    if cluster is not None:
        from perfmodel.serving.fleet import cluster as dask

        dask.check(cluster)
        if router in LOAD_AWARE and engines > 1:
            raise SpecError(f"--cluster: --router {router} reads every replica's load at "
                            "each arrival, so its replicas run in lockstep in one process "
                            "(exact); drop --cluster, or use round-robin or an affinity "
                            "router")
    if router in LOAD_AWARE and engines > 1 and (requests.closed_loop or requests.client_cap):
        raise SpecError(f"--router {router}: a closed loop or client cap is dealt "
                        "round-robin only; use --rate or --trace")


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
             progress: Callable[[int, int, float], None] | None, ways: int = 1,
             record: Callable | None = None) -> tuple[list, list]:
    """Replicas run in lockstep under a load-aware ``router``: ``start(slots)`` makes an
    engine's run, ``advance(run)`` runs it to ``run.horizon``. Under data-parallel
    attention (``ways`` ranks a replica) a replica's ranks step together
    (``ranks_lockstep``, ``record`` the simulator's bookkeeping of a step): the router
    picks the replica, then the replica's rank by SGLang's DP controller (``_rank``)."""
    runs = [start(_slots(requests, 64)) for _ in range(engines)]
    for run in runs:
        run.known = 0
    groups = [runs[g:g + ways] for g in range(0, engines, ways)]
    local: list[list[int]] = [[] for _ in range(engines)]
    order = np.argsort(requests.arrival_s, kind="stable")
    tokens = requests.input_tokens + requests.output_tokens
    rng = np.random.default_rng(0)
    for i in order.tolist():
        t = float(requests.arrival_s[i])
        for group in groups:
            _advance_group(group, t, advance, record)
        loads = [[_load(run, t) for run in group] for group in groups]
        g = _replica(loads, router, rng)
        e = g * ways + _rank(loads[g], router)
        _place(runs[e], requests, i, int(tokens[i]))
        local[e].append(i)
        if progress is not None:
            progress(sum(r.done for r in runs), len(requests), t)
    for group in groups:
        _advance_group(group, np.inf, advance, record)
        for run in group:
            _trim(run)
    return [np.array(x, np.int64) for x in local], runs


def _advance_group(group: list, t: float, advance: Callable, record: Callable | None
                   ) -> None:
    for run in group:
        run.horizon = t
    if len(group) == 1:
        advance(group[0])
    else:
        ranks_lockstep(group, record, horizon=t)


def _load(run: object, t: float) -> tuple[int, int, int, int, int]:
    """What a router can read of an engine at ``t``: (requests sent and not finished,
    their prompt + output tokens, requests waiting and KV blocks in use as the engine
    published them after its last step that ended by ``t``, KV blocks in all). A step
    that straddles ``t`` (committed, as it started before) has its finishes counted
    after ``t``."""
    late = run.t > t
    requests = run.known - run.done + (run.last_done if late else 0)
    tokens = run.load_tokens + (run.last_done_tokens if late else 0)
    rows = run.log[-2:]
    if rows and rows[-1][0] + rows[-1][1] > t:
        rows = rows[:-1]
    waiting, used = (rows[-1][6], rows[-1][5]) if rows else (0, 0)
    return requests, tokens, waiting, used, run.state.pool.total


def _replica(loads: list, router: str, rng: np.random.Generator | None = None) -> int:
    """The replica ``router`` sends to, from its ranks' ``_load``s (``rng``: the
    power-of-two draws); ties to the lowest index."""
    if router == "power-of-two" and len(loads) > 1:
        first = int(rng.integers(len(loads)))
        second = (first + 1 + int(rng.integers(len(loads) - 1))) % len(loads)
        busy = [sum(x[0] for x in loads[e]) for e in (first, second)]
        return first if busy[0] <= busy[1] else second
    if router == "queue-kv":
        waiting = [sum(x[2] for x in ranks) for ranks in loads]
        usage = [sum(x[3] for x in ranks) for ranks in loads]
        low, high = min(waiting), max(waiting)
        queue = [1.0 if high == low else (high - w) / (high - low) for w in waiting]
        score = [q + 1.0 - u / sum(x[4] for x in ranks) for q, u, ranks in
                 zip(queue, usage, loads, strict=True)]
        return int(np.argmax(score))
    k = 1 if router == "least-tokens" else 0
    return int(np.argmin([sum(x[k] for x in ranks) for ranks in loads]))


def _rank(ranks: list, router: str) -> int:
    """The rank of a DP-attention replica its controller gives the request, as SGLang's
    ``DataParallelController`` does (``--load-balance-method total_requests``: the fewest
    running + waiting requests; ``total_tokens``, taken for "least-tokens": the fewest
    tokens, ties by requests; ties to the lowest rank)."""
    if len(ranks) == 1:
        return 0
    if router == "least-tokens":
        return min(range(len(ranks)), key=lambda r: (ranks[r][1], ranks[r][0]))
    return min(range(len(ranks)), key=lambda r: ranks[r][0])


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
    """Cut the arrays to the requests placed, as ``fleet.replicas.merge`` reads them."""
    k = run.known
    run.arrivals.arrival_s = run.arrivals.arrival_s[:k]
    for f in ("first_token_s", "finish_s", "scheduled_s"):
        setattr(run, f, getattr(run, f)[:k])
    run.state.preemptions = run.state.preemptions[:k]
    run.state.hit_tokens = run.state.hit_tokens[:k]
    run.token_offsets = run.token_offsets[:k + 1]


def ranks_lockstep(runs: list, record: Callable, progress: Callable | None = None,
                   horizon: float = np.inf) -> None:
    """The data-parallel attention ranks of one replica of an MoE model step together: each
    step every rank forms its own batch, an idle rank runs a dummy batch (one decode
    token, as SGLang's and vLLM's DP-attention ranks do to join the expert layer's
    collectives), and the step lasts as long as the slowest rank's (the expert layer
    waits for every rank's tokens). ``record(run, batch, effect, dt, queue_more)`` is the
    simulator's bookkeeping of a committed step; ``progress(done, total, clock_s)`` as in
    ``serving.simulate``. No step starting at or after ``horizon`` is run (the next
    arrival a load-aware router has yet to place: ``lockstep``)."""
    from perfmodel.serving.engines.state import Batch

    one = np.ones(1, np.int64)
    dummy = Batch(np.zeros(1, np.int64), one, one, False, False, 0)
    from perfmodel.serving import adp_balance

    pricer = runs[0].pricer
    balance = adp_balance.Balance.of(runs[0].state.engine)
    while any(r.done < r.known for r in runs) and runs[0].t < horizon:
        t = runs[0].t
        batches = []
        for run in runs:
            run.state.waiting.extend(run.arrivals.due(run.cutoff))
        held = balance is not None and balance.hold([run.state for run in runs])
        for run in runs:
            busy = run.state.running or run.state.waiting
            batches.append(adp_balance.schedule_held(run.state) if held else
                           run.state.schedule() if busy else None)
        if all(b is None for b in batches):
            t = min(r.arrivals.next_time() for r in runs)
            if not np.isfinite(t) and np.isfinite(horizon):
                return
            if not np.isfinite(t):
                raise RuntimeError("simulate: requests left that never arrive")
            for run in runs:
                run.t = run.cutoff = max(min(t, horizon), run.t)
            continue
        dt = float(pricer.times([b if b is not None else dummy for b in batches]).max())
        for run, batch in zip(runs, batches, strict=True):
            if batch is None:           # a dummy step: the next schedule sees as after one
                run.cutoff = run.t if run.state.lag else run.t + dt
                run.t += dt
                run.last_done = run.last_done_tokens = 0
                continue
            emit, done = run.state.commit(batch)
            effect = (emit, run.state.emitted[emit], done, run.state.pool.used,
                      len(run.state.waiting))
            record(run, batch, effect, dt, queue_more=True,
                   host=float(pricer.last_host.max()))
        if progress is not None:
            progress(sum(r.done for r in runs), sum(r.known for r in runs), runs[0].t)
