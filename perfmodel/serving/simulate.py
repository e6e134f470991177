"""The discrete-event simulation of serving engines: requests arrive, queue, run in the
steps the scheduler forms (``serving.scheduler``), and leave; each step is priced by the
core (``serving.engine.StepPricer``, with the engine's host time: ``serving.host_time``).

Steps are priced ahead, many per ``price_step`` call: the scheduler is run forward on a
fork of the engine's state (``EngineState.fork``: the rows of the requests in flight saved,
not every request's) with arrivals placed by a guess of each step's time, the steps it
forms are priced together, and the real run keeps them up to the first step an arrival
could have changed, resuming from the fork's last mark before it: a step whose schedule
left the waiting queue empty with room to spare (``Batch.open``) starting after a request
the dry run did not see had arrived. A request
that arrives while others wait joins the tail of the queue, so it cannot change a step
until the queue ahead of it has drained: under load most steps are priced in blocks.

``plan.dp`` replicas (and, under data-parallel attention, each of the ``ep`` attention
devices) run their own engine; requests are dealt to them round-robin in arrival order
or by a router (``serving.fleet``); an engine left without a request idles.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np

from perfmodel.schedules.assumptions import check_plan
from perfmodel.serving import fleet, host_time, pipeline, sessions
from perfmodel.serving.arrivals import Arrivals
from perfmodel.serving.config import EngineConfig, context_limit
from perfmodel.serving.dry_run import Dry, Guess, dry_run
from perfmodel.serving.engine import StepPricer, kv_pool
from perfmodel.serving.requests import Requests
from perfmodel.serving.results import SimResult, StepLog, record_output
from perfmodel.serving.scheduler import EngineState
from perfmodel.specs.errors import SpecError
from perfmodel.specs.hardware import Hardware
from perfmodel.specs.model import Model
from perfmodel.specs.workload import Parallelism, Workload

LOOKAHEAD = 64      # steps priced together at most
Progress = Callable[[int, int, float], None]    # (requests done, of, simulated clock s)


@dataclass(eq=False)
class _Run:
    """One engine's simulation state and what it records."""
    state: EngineState
    pricer: StepPricer
    arrivals: Arrivals
    token_offsets: np.ndarray
    token_s: np.ndarray
    first_token_s: np.ndarray
    finish_s: np.ndarray
    scheduled_s: np.ndarray
    log: list = field(default_factory=list)
    t: float = 0.0
    done: int = 0
    known: int = 0                  # requests placed on this engine so far
    horizon: float = np.inf         # steps starting from then on wait (lockstep routing)
    guess: Guess = field(default_factory=lambda: Guess())
    last_done: int = 0              # requests the last committed step finished
    last_done_tokens: int = 0       # and their prompt + output tokens
    load_tokens: int = 0            # prompt + output tokens of unfinished requests
    pipe: object = None             # pipeline parallelism's state (``serving.pipeline``)
    cutoff: float = 0.0             # the next schedule sees the arrivals by then


def simulate(model: Model, hw: Hardware, requests: Requests,
             plan: Parallelism | None = None, engine: EngineConfig | None = None,
             workload: Workload | None = None, progress: Progress | None = None,
             label: str = "", router: str = "round-robin", workers: int = 1,
             edge: int | None = None, cluster: str | None = None) -> SimResult:
    """Serve ``requests`` on ``plan.dp`` replicas of ``model`` on ``hw`` (dtypes from
    ``workload``, default as the checkpoint stores them) with ``engine``'s scheduler,
    behind ``router`` (``serving.fleet``; ``workers`` processes for replicas run apart, on
    the Dask cluster ``cluster`` when given: ``serving.cluster``).
    ``progress(done, total, clock_s)`` is called as the simulation advances: requests
    finished and the simulated clock, per engine (dp engines run one after another, each
    ``total`` of the requests; engines in lockstep together). ``edge`` 0 / 1: every step's
    GPU time priced at the low / high edge of its 80% band (``serving.bands``)."""
    plan = plan or Parallelism()
    engine = engine or EngineConfig()
    workload = workload or Workload.for_model(model)
    pipeline.check(plan, engine)
    check_plan(hw, model, plan)
    limit = context_limit(model, engine)
    longest = int((requests.input_tokens + requests.output_tokens).max())
    if longest > limit:
        raise SpecError(f"simulate: a request of {longest} tokens (input + output) is longer "
                        f"than the context limit {limit} (--max-model-len / the model's "
                        "max_position_embeddings)")
    if not engine.chunked_prefill and longest > engine.max_num_batched_tokens and \
            engine.name != "sglang":      # SGLang always takes a prefill batch's first prompt
        raise SpecError(f"--max-num-batched-tokens: {engine.max_num_batched_tokens} cannot hold "
                        f"a request of {longest} tokens whole, which chunked prefill off needs"
                        " (vLLM refuses a budget below max_model_len without chunking)")
    engines = plan.dp * plan.attention_ways     # more than requests: the rest idle
    one = replace(plan, dp=1)
    pool = kv_pool(model, hw, one, workload, engine)
    if -(-longest // engine.block_size) > pool.blocks:
        raise SpecError(f"simulate: a request of {longest} tokens needs more KV blocks than "
                        f"the pool's {pool.blocks} on {hw.name}")
    engine = engine.resolved(pool.blocks, limit)
    fleet.check(router, workers, requests, engines, plan.attention_ways, cluster)
    if engines > 1 and router != "session-affinity":    # a session's turns run apart
        requests = sessions.at_nominal_times(requests)
    client, (requests, api_s) = requests, sessions.admitted(requests, engine.host)
    parts, runs = run_replicas(model, hw, one, workload, engine, requests, engines,
                               pool.blocks, router, workers, progress, edge, cluster)
    res = _merge(requests, parts, runs, pool.blocks, label,
                 {"engines": engines, "kv_pool": pool, "plan": plan.describe(),
                  "engine": engine, "router": router,
                  "steps_priced": sum(r.pricer.priced for r in runs),
                  "price_calls": sum(r.pricer.calls for r in runs)})
    if plan.pp > 1:
        res = pipeline.with_stages(res, runs[0])
    return sessions.client_side(host_time.client_side(res, client, requests, engine.host),
                                res.arrival_s, client, api_s)


def run_replicas(model: Model, hw: Hardware, plan: Parallelism, w: Workload,
                 engine: EngineConfig, requests: Requests, engines: int, blocks: int,
                 router: str, workers: int, progress: Progress | None,
                 edge: int | None = None, cluster: str | None = None) -> tuple[list, list]:
    """(each replica's requests, as indices in arrival order; each replica's ``_Run``):
    dealt ahead and run apart (in ``workers`` processes, or on the Dask ``cluster``:
    ``serving.cluster``), or, under a load-aware router,
    run in lockstep (``serving.fleet``). An engine given no request (fewer requests than
    engines) idles and is left out."""
    def start(reqs: Requests) -> _Run:
        return _start(model, hw, plan, w, engine, reqs, blocks, edge)

    if router in fleet.LOAD_AWARE and engines > 1:
        step = pipeline.advance if plan.pp > 1 else _advance
        parts, runs = fleet.lockstep(start, step, requests, engines, router, progress,
                                     plan.attention_ways, _record)
        kept = [e for e, idx in enumerate(parts) if len(idx)]
        return [parts[e] for e in kept], [runs[e] for e in kept]
    dealt = [sessions.engine_order(requests, idx)
             for idx in fleet.deal(requests, engines, router)]
    ways = plan.attention_ways
    shared = (model, hw, plan, w, engine, blocks, edge)
    if ways > 1:            # data-parallel attention: each replica's ranks in lockstep
        groups = [[idx for idx in dealt[g:g + ways] if len(idx)]    # an idle rank's dummy
                  for g in range(0, engines, ways)]                 # step is never longest
        groups = [group for group in groups if group]
        jobs = [[_subset(requests, idx, engines) for idx in group] for group in groups]
        ranks = _apart(_ranks, shared, jobs, workers, cluster, progress)
        return [idx for group in groups for idx in group], [r for rs in ranks for r in rs]
    parts = [idx for idx in dealt if len(idx)]
    jobs = [_subset(requests, idx, engines) for idx in parts]
    return parts, _apart(_replica, shared, jobs, workers, cluster, progress)


def _apart(fn: Callable, shared: tuple, jobs: list, workers: int, cluster: str | None,
           progress: Progress | None) -> list:
    """``[fn(job, shared) for job in jobs]``: here (with ``progress``), in ``workers``
    forked processes, or as tasks on the Dask ``cluster`` (``serving.cluster``)."""
    if cluster is not None:
        from perfmodel.serving import cluster as dask

        return dask.map_apart(fn, shared, jobs, cluster, workers)
    if workers == 1 or len(jobs) == 1:
        return [fn(job, shared, progress, keep=True) for job in jobs]
    import multiprocessing as mp

    # the workers leave Ctrl-C to this process (a SIGINT reaches the whole process group:
    # each worker printed its own traceback); the wait here takes it within 0.2 s, and
    # leaving the block terminates the workers
    with mp.get_context("fork").Pool(min(workers, len(jobs)), initializer=_ignore_sigint
                                      ) as pool:
        result = pool.starmap_async(fn, [(job, shared) for job in jobs], chunksize=1)
        while not result.ready():
            result.wait(0.2)
        return result.get()


def _ignore_sigint() -> None:
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _light(run: _Run) -> _Run:
    """``run`` without the model and hardware, not needed back from a worker: a small
    pickle."""
    run.pricer.model = run.pricer.hw = None
    return run


def _replica(requests: Requests, shared: tuple, progress: Progress | None = None,
             keep: bool = False) -> _Run:
    """One replica's run; ``shared``: (model, hw, plan, workload, engine, blocks, edge),
    sent to a Dask worker once while the task carries only the requests; from a worker
    (not ``keep``) returned ``_light``."""
    model, hw, plan, w, engine, blocks, edge = shared
    run = _simulate_one(model, hw, plan, w, engine, requests, blocks, progress, edge)
    return run if keep else _light(run)


def _ranks(subsets: list, shared: tuple, progress: Progress | None = None,
           keep: bool = False) -> list[_Run]:
    """One data-parallel-attention replica: its ranks (``subsets``, one ``Requests`` each)
    run in lockstep (``fleet.ranks_lockstep``); as ``_replica`` otherwise."""
    model, hw, plan, w, engine, blocks, edge = shared
    runs = [_start(model, hw, plan, w, engine, reqs, blocks, edge) for reqs in subsets]
    fleet.ranks_lockstep(runs, _record, progress)
    return runs if keep else [_light(run) for run in runs]


def _subset(requests: Requests, idx: np.ndarray, engines: int) -> Requests:
    if engines == 1:
        return requests if requests.think_s is None else sessions.engine_view(requests, idx)
    users = -(-requests.closed_loop // engines) if requests.closed_loop else 0
    return sessions.engine_view(requests, idx, closed_loop=users, client_cap=0, turn=None)


def _simulate_one(model: Model, hw: Hardware, plan: Parallelism, w: Workload,
                  engine: EngineConfig, requests: Requests, blocks: int,
                  progress: Progress | None, edge: int | None = None) -> _Run:
    run = _start(model, hw, plan, w, engine, requests, blocks, edge)
    (pipeline.advance if plan.pp > 1 else _advance)(run, progress)
    return run


def _start(model: Model, hw: Hardware, plan: Parallelism, w: Workload,
           engine: EngineConfig, requests: Requests, blocks: int,
           edge: int | None = None) -> _Run:
    n = len(requests)
    offsets = np.concatenate([[0], np.cumsum(requests.output_tokens)])
    grows = None if requests.session_id is None else requests.session_id >= 0
    state = engine.state(requests.input_tokens, requests.output_tokens, requests.prefix_id,
                         requests.prefix_tokens, blocks, requests.prefilled, grows)
    nan = np.full(n, np.nan)
    return _Run(state, StepPricer(model, hw, plan, w, engine, edge), Arrivals(requests),
                offsets, np.zeros(int(offsets[-1])), nan.copy(), nan.copy(), nan.copy(),
                known=n)


def _advance(run: _Run, progress: Progress | None = None) -> None:
    """Run the engine until every request it knows has finished, or (a replica run in
    lockstep under a router) until its clock reaches ``run.horizon``, the next arrival the
    router has yet to place: no step that starts at or after it is committed."""
    guess = run.guess
    while run.done < run.known and run.t < run.horizon:
        run.state.waiting.extend(run.arrivals.due(run.cutoff))
        if run.state.stalled():         # async scheduling: the engine processes the last
            run.state.settle()          # step's output, then schedules what is there now
            run.cutoff = run.t
            continue
        if not run.state.running and not run.state.waiting:
            t = run.arrivals.next_time()
            if not np.isfinite(t) and np.isfinite(run.horizon):
                return
            if not np.isfinite(t):
                raise RuntimeError("simulate: requests left that never arrive")
            run.t = run.cutoff = max(min(t, run.horizon), run.t)
            continue
        dry = dry_run(run, guess)
        if not dry.plans and run.state.late:    # async: finished requests held the seats;
            run.state.rollback(dry.state)       # their output frees them (a queue waiting
            run.state.settle()                  # or not), and the engine schedules afresh
            run.cutoff = run.t
            continue
        times = run.pricer.times(dry.plans)
        guess.learn(dry.features, times)
        stood = _replay(run, dry, times, run.pricer.last_host)
        if guess.wants_tables:
            e = run.state.engine
            guess.tables = run.pricer.tables(e.max_num_batched_tokens, guess.UNIT,
                                             min(e.max_num_seqs, guess.SEQS))
        guess.lookahead = int(min(LOOKAHEAD, max(4, 2 * stood)))
        guess.marks = stood < len(dry.plans)
        if progress is not None:
            progress(run.done, run.known, run.t)


def _valid(run: _Run, dry: Dry, times: np.ndarray) -> tuple[int, list]:
    """(how many of the priced steps stand, the open-loop arrivals by each step's schedule
    cutoff and by the next one after the last). A step's schedule sees the arrivals by its
    cutoff: its start, or under async scheduling the previous step's start. A step stands
    unless a request that had arrived by its cutoff was not let in while it left the queue
    empty with room (``Batch.open``), or one the dry run let in early was scheduled in it
    or before, or sits in the queue ahead of a request the step preempted (SGLang's
    retraction joins the queue's tail)."""
    t, starts = run.t, []
    for dt in times.tolist():          # added one at a time, as ``_record`` adds them
        starts.append(t)
        t += dt
    lag = run.state.lag
    cuts = [run.cutoff, *starts[:-1]] if lag else starts
    arrivals = run.arrivals
    done = dry.ended[-1] + len(dry.effects[-1][2])
    real = arrivals.open_count(np.array([*cuts, starts[-1] if lag else t]), arrivals.limit(
        np.array([*dry.ended, done]))).astype(np.int64).tolist()
    pending = arrivals.pending[0][0] if arrivals.pending else np.inf   # after a think time
    closed = arrivals.requests.closed_loop
    for j, batch in enumerate(dry.plans):
        if starts[j] >= run.horizon:
            return j, real
        late = j and cuts[j] >= pending   # open arrivals may have joined behind it
        if ((real[j] > dry.seen[j] or late) and batch.open) or (late and not closed) or \
                (real[j] < dry.seen[j] and (dry.top[j] >= real[j] or batch.preempted)):
            return j, real
    return len(dry.plans), real


def _replay(run: _Run, dry: Dry, times: np.ndarray, host: np.ndarray) -> int:
    """Commit the steps that stand (how many, returned): the dry run's state after them, or
    after the last of its marks before the first that does not (less the arrivals it let
    in early), and from there the real state run again through the rest."""
    cut, real = _valid(run, dry, times)
    kept = cut if cut == len(dry.plans) else max((k for k in dry.marks if k <= cut), default=0)
    if kept:
        state = dry.state if kept == len(dry.plans) else dry.state.back_to(dry.marks[kept])
        if not run.arrivals.requests.closed_loop:
            waiting = state.waiting
            sched = run.arrivals.requests.arrival_s     # inf: a turn sent after an answer
            while waiting and waiting[-1] >= real[kept] and \
                    waiting[-1] >= run.arrivals.next_open and sched[waiting[-1]] < np.inf:
                waiting.pop()
            _sent(run, dry, times, min(dry.seen[kept - 1], real[kept]), kept)
        run.state = state
    else:
        run.state.rollback(dry.state)
    st = run.state
    for j in range(cut):
        if j < kept:        # the dry run's queue held the requests it let in, not those due
            batch, (emit, counts, done, used, waiting) = dry.plans[j], dry.effects[j]
            effect = (emit, counts, done, used, waiting + real[j] - dry.seen[j])
        else:
            if j:
                st.waiting.extend(run.arrivals.due(run.cutoff))
            batch = st.schedule()
            emit, done = st.commit(batch)
            effect = (emit, st.emitted[emit], done, st.pool.used, len(st.waiting))
        _record(run, batch, effect, float(times[j]), j >= kept, float(host[j]))
    return cut


def _sent(run: _Run, dry: Dry, times: np.ndarray, upto: int, kept: int) -> None:
    """The send times of the open-loop requests the first ``kept`` steps of the dry run
    let in: when due, or, held back by the client's cap, at the start of the step it let
    them in."""
    arrivals = run.arrivals
    sched = arrivals.requests.arrival_s
    starts = [run.t]
    for dt in times[:kept].tolist():
        starts.append(starts[-1] + dt)
    first = arrivals.next_open
    step = np.searchsorted(np.array(dry.seen[:kept]), np.arange(first, upto), side="right")
    capped = [dry.seen[j] >= arrivals.limit(dry.ended[j]) for j in range(kept)]
    for i, j in zip(range(first, upto), step.tolist(), strict=True):
        held = capped[j - 1] and sched[i] <= starts[j - 1]   # due, but the cap held it
        arrivals.arrival_s[i] = starts[j] if held else sched[i]
    arrivals.next_open = upto
    last = kept - 1
    held = capped[last] and upto < len(sched) and sched[upto] <= starts[last]
    arrivals.held_upto = float(starts[last]) if held else -np.inf


def _record(run: _Run, batch: object, effect: tuple, dt: float, queue_more: bool,
            host: float = 0.0) -> None:
    """Times of a committed step (``host`` of its ``dt`` the engine's host time): (emitted,
    their output counts, finished, KV blocks in use, waiting) from ``effect``."""
    emit, counts, done, used, waiting = effect
    start, run.t = run.t, run.t + dt
    run.cutoff = start if run.state.lag else run.t     # what the next schedule sees
    fresh = batch.ids[np.isnan(run.scheduled_s[batch.ids])]
    run.scheduled_s[fresh] = start
    more = record_output(run, emit, counts, done, run.t)
    if queue_more:
        run.state.waiting.extend(more)
    run.log.append(StepLog.row(start, dt, batch, used, waiting, host))


def _merge(requests: Requests, parts: list, runs: list, blocks: int, label: str,
           info: dict) -> SimResult:
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
