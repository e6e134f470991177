"""The discrete-event simulation of serving engines: requests arrive, queue, run in the
steps the scheduler forms (``serving.scheduler``), and leave; each step is priced by the
core (``serving.engine.StepPricer``).

Steps are priced ahead, many per ``price_step`` call: the scheduler is run forward on a
copy of the engine's state as if no further request arrived, the steps it forms are
priced together, and the real run then replays them up to the first step an arrival could
have changed: a step whose schedule left the waiting queue empty with room to spare
(``Batch.open``) starting after a request the dry run did not see had arrived. A request
that arrives while others wait joins the tail of the queue, so it cannot change a step
until the queue ahead of it has drained: under load most steps are priced in blocks.

``plan.dp`` replicas (and, under data-parallel attention, each of the ``ep`` attention
devices) run their own engine; requests are dealt to them round-robin in arrival order.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np

from perfmodel.serving.arrivals import Arrivals
from perfmodel.serving.config import EngineConfig
from perfmodel.serving.engine import StepPricer, kv_pool
from perfmodel.serving.requests import Requests
from perfmodel.serving.results import SimResult, StepLog
from perfmodel.serving.scheduler import EngineState
from perfmodel.specs.errors import SpecError
from perfmodel.specs.hardware import Hardware
from perfmodel.specs.model import Model
from perfmodel.specs.workload import Parallelism, Workload

LOOKAHEAD = 64      # steps priced together at most


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


def simulate(model: Model, hw: Hardware, requests: Requests,
             plan: Parallelism | None = None, engine: EngineConfig | None = None,
             workload: Workload | None = None,
             progress: Callable[[int, int, float], None] | None = None,
             label: str = "", edge: int | None = None) -> SimResult:
    """Serve ``requests`` on ``plan.dp`` replicas of ``model`` on ``hw`` (dtypes from
    ``workload``, default as the checkpoint stores them) with ``engine``'s scheduler.
    ``progress(done, total, clock_s)`` is called as the simulation advances: requests
    finished and the simulated clock, per engine (dp engines run one after another).
    ``edge`` 0 / 1: every step priced at the low / high edge of its 80% band
    (``serving.bands``)."""
    plan = plan or Parallelism()
    engine = engine or EngineConfig()
    workload = workload or Workload.for_model(model)
    if plan.pp > 1:
        raise SpecError("simulate: --pp > 1 is not simulated yet (pipeline micro-batches "
                        "across steps); use --tp, --ep or --dp")
    limit = engine.max_model_len or model.max_position_embeddings
    longest = int((requests.input_tokens + requests.output_tokens).max())
    if longest > limit:
        raise SpecError(f"simulate: a request of {longest} tokens (input + output) is longer "
                        f"than the context limit {limit} (--max-model-len / the model's "
                        "max_position_embeddings)")
    if not engine.chunked_prefill and longest > engine.max_num_batched_tokens:
        raise SpecError(f"--max-num-batched-tokens: {engine.max_num_batched_tokens} cannot hold "
                        f"a request of {longest} tokens whole, which chunked prefill off needs"
                        " (vLLM refuses a budget below max_model_len without chunking)")
    engines = plan.dp * plan.attention_ways
    one = replace(plan, dp=1)
    pool = kv_pool(model, hw, one, workload, engine)
    if -(-longest // engine.block_size) > pool.blocks:
        raise SpecError(f"simulate: a request of {longest} tokens needs more KV blocks than "
                        f"the pool's {pool.blocks} on {hw.name}")
    order = np.argsort(requests.arrival_s, kind="stable")
    parts = [order[e::engines] for e in range(engines)] if not requests.closed_loop else \
        [np.arange(len(requests))[e::engines] for e in range(engines)]
    parts = [idx for idx in parts if len(idx)]   # fewer requests than engines: the rest idle
    runs = [_simulate_one(model, hw, one, workload, engine, _subset(requests, idx, engines),
                          pool.blocks, progress, edge) for idx in parts]
    return _merge(requests, parts, runs, pool.blocks, label,
                  {"engines": engines, "kv_pool": pool, "plan": plan.describe(),
                   "engine": engine, "steps_priced": sum(r.pricer.priced for r in runs),
                   "price_calls": sum(r.pricer.calls for r in runs)})


def _subset(requests: Requests, idx: np.ndarray, engines: int) -> Requests:
    if engines == 1:
        return requests
    users = -(-requests.closed_loop // engines) if requests.closed_loop else 0
    pre = None if requests.prefilled is None else requests.prefilled[idx]
    return Requests(requests.arrival_s[idx], requests.input_tokens[idx],
                    requests.output_tokens[idx], requests.prefix_id[idx],
                    requests.prefix_tokens[idx], users, pre)


def _simulate_one(model: Model, hw: Hardware, plan: Parallelism, w: Workload,
                  engine: EngineConfig, requests: Requests, blocks: int,
                  progress: Callable[[int, int, float], None] | None, edge: int | None = None
                  ) -> _Run:
    n = len(requests)
    offsets = np.concatenate([[0], np.cumsum(requests.output_tokens)])
    state = EngineState.new(engine, requests.input_tokens, requests.output_tokens,
                            requests.prefix_id, requests.prefix_tokens, blocks,
                            requests.prefilled)
    nan = np.full(n, np.nan)
    run = _Run(state, StepPricer(model, hw, plan, w, engine, edge), Arrivals(requests), offsets,
               np.zeros(int(offsets[-1])), nan.copy(), nan.copy(), nan.copy())
    guess = _Guess()
    while run.done < n:
        run.state.waiting.extend(run.arrivals.due(run.t))
        if not run.state.running and not run.state.waiting:
            run.t = run.arrivals.next_time()
            if not np.isfinite(run.t):
                raise RuntimeError("simulate: requests left that never arrive")
            continue
        dry = _dry_run(run, guess)
        times = run.pricer.times(dry.plans)
        guess.learn(dry.features, times)
        stood = _replay(run, dry, times)
        guess.lookahead = int(min(LOOKAHEAD, max(4, 2 * stood)))
        if progress is not None:
            progress(run.done, n, run.t)
    return run


class _Guess:
    """A step's time guessed before it is priced, to place arrivals in a dry run: a least-
    squares fit of the steps priced so far on the step's tokens, sequences, cached context
    and prompt-chunk attention (recent steps weigh most). Only where arrivals land rests on
    it: every committed step is priced."""

    def __init__(self) -> None:
        self.xtx = np.eye(5) * 1e-9
        self.xty = np.zeros(5)
        self.coef = np.array([1e-3, 0, 0, 0, 0])
        self.lookahead = 16

    @staticmethod
    def features(batch: object) -> np.ndarray:
        chunk = batch.new > 1
        return np.array([1.0, batch.new.sum(), len(batch.ids), batch.context.sum() * 1e-3,
                         (batch.new * batch.context)[chunk].sum() * 1e-6])

    def __call__(self, features: np.ndarray) -> float:
        return float(features @ self.coef)

    def learn(self, features: list, times: np.ndarray) -> None:
        x = np.array(features)
        self.xtx = 0.9 * self.xtx + x.T @ x
        self.xty = 0.9 * self.xty + x.T @ times
        self.coef = np.linalg.lstsq(self.xtx + np.eye(5) * 1e-12, self.xty, rcond=None)[0]


@dataclass(eq=False)
class _Dry:
    """Steps formed ahead on a copy of the state: each step's batch and effect (emitted,
    their output counts, finished, KV blocks in use, waiting), the open-loop arrivals the
    dry run had let in before it (``seen``) and the highest request it had scheduled."""

    state: EngineState
    plans: list = field(default_factory=list)
    effects: list = field(default_factory=list)
    seen: list = field(default_factory=list)
    top: list = field(default_factory=list)
    features: list = field(default_factory=list)
    ended: list = field(default_factory=list)     # requests finished before each step


def _dry_run(run: _Run, guess: _Guess) -> _Dry:
    """Up to ``LOOKAHEAD`` steps formed from a copy of the state, letting in the open loop's
    arrivals at the steps the guessed times place them (a closed loop's users with no
    think time send their next requests at once; one with a think time ends the run)."""
    dry = _Dry(run.state.copy())
    arrivals = run.arrivals
    sched = arrivals.requests.arrival_s
    closed = arrivals.requests.closed_loop
    seen, queued, top, t, ended = arrivals.next_open, arrivals.next_closed, -1, run.t, 0
    for j in range(guess.lookahead):
        room = min(len(sched), arrivals.limit(ended))
        while j and not closed and seen < room and sched[seen] <= t:
            dry.state.waiting.append(seen)
            seen += 1
        batch = dry.state.schedule()
        if batch is None:
            break
        emit, done = dry.state.commit(batch)
        top = max(top, int(batch.ids.max()))
        dry.plans.append(batch)
        dry.effects.append((emit, dry.state.emitted[emit], done, dry.state.pool.used,
                            len(dry.state.waiting)))
        dry.seen.append(seen)
        dry.top.append(top)
        dry.ended.append(ended)
        dry.features.append(guess.features(batch))
        t += guess(dry.features[-1])
        ended += len(done)
        if closed and len(done):
            nxt = list(range(queued, min(queued + len(done), len(sched))))
            queued += len(nxt)
            if any(sched[i] > 0 for i in nxt):
                break
            dry.state.waiting.extend(nxt)
        if not dry.state.running and not dry.state.waiting:
            break
    return dry


def _valid(run: _Run, dry: _Dry, times: np.ndarray) -> tuple[int, int]:
    """(how many of the priced steps stand, open-loop arrivals by the end of the last).
    A step stands unless a request that had arrived by its start was not let in while it
    left the queue empty with room (``Batch.open``), or one the dry run let in early was
    scheduled in it or before."""
    t, starts = run.t, []
    for dt in times.tolist():          # added one at a time, as ``_record`` adds them
        starts.append(t)
        t += dt
    arrivals = run.arrivals
    real = arrivals.open_count(np.array(starts), arrivals.limit(np.array(dry.ended)))
    pending = arrivals.pending[0][0] if arrivals.pending else np.inf   # after a think time
    for j, batch in enumerate(dry.plans):
        if ((real[j] > dry.seen[j] or (j and starts[j] >= pending)) and batch.open) or \
                (real[j] < dry.seen[j] and dry.top[j] >= real[j]):
            return j, int(real[j])
    done = dry.ended[-1] + len(dry.effects[-1][2])
    return len(dry.plans), int(arrivals.open_count(t, arrivals.limit(done)))


def _replay(run: _Run, dry: _Dry, times: np.ndarray) -> int:
    """Commit the steps that stand (how many, returned): the dry run's state when all do
    (less the arrivals it let in early), else the real state run again through them."""
    cut, arrived = _valid(run, dry, times)
    adopt = cut == len(dry.plans)
    if adopt:
        waiting = dry.state.waiting
        while waiting and not run.arrivals.requests.closed_loop and waiting[-1] >= arrived \
                and waiting[-1] >= run.arrivals.next_open:
            waiting.pop()
        run.state = dry.state
        if not run.arrivals.requests.closed_loop:
            _sent(run, dry, times, min(dry.seen[-1], arrived))
    st = run.state
    for j in range(cut):
        if adopt:
            batch, effect = dry.plans[j], dry.effects[j]
        else:
            if j:
                st.waiting.extend(run.arrivals.due(run.t))
            batch = st.schedule()
            emit, done = st.commit(batch)
            effect = (emit, st.emitted[emit], done, st.pool.used, len(st.waiting))
        _record(run, batch, effect, float(times[j]), queue_more=not adopt)
    return cut


def _sent(run: _Run, dry: _Dry, times: np.ndarray, upto: int) -> None:
    """The send times of the open-loop requests the adopted dry run let in: when due, or,
    held back by the client's cap, at the start of the step it let them in."""
    arrivals = run.arrivals
    sched = arrivals.requests.arrival_s
    starts = [run.t]
    for dt in times.tolist():
        starts.append(starts[-1] + dt)
    first = arrivals.next_open
    step = np.searchsorted(np.array(dry.seen), np.arange(first, upto), side="right")
    capped = [dry.seen[j] >= arrivals.limit(dry.ended[j]) for j in range(len(dry.plans))]
    for i, j in zip(range(first, upto), step.tolist(), strict=True):
        held = capped[j - 1] and sched[i] <= starts[j - 1]   # due, but the cap held it
        arrivals.arrival_s[i] = starts[j] if held else sched[i]
    arrivals.next_open = upto
    last = len(dry.plans) - 1
    held = capped[last] and upto < len(sched) and sched[upto] <= starts[last]
    arrivals.held_upto = float(starts[last]) if held else -np.inf


def _record(run: _Run, batch: object, effect: tuple, dt: float, queue_more: bool) -> None:
    """Times of a committed step: (emitted, their output counts, finished, KV blocks in
    use, waiting) from ``effect``."""
    emit, counts, done, used, waiting = effect
    start, run.t = run.t, run.t + dt
    fresh = batch.ids[np.isnan(run.scheduled_s[batch.ids])]
    run.scheduled_s[fresh] = start
    run.token_s[run.token_offsets[emit] + counts - 1] = run.t
    first = emit[np.isnan(run.first_token_s[emit])]
    run.first_token_s[first] = run.t
    if len(done):
        run.finish_s[done] = run.t
        run.done += len(done)
        more = run.arrivals.finished(run.t, len(done))
        if queue_more:
            run.state.waiting.extend(more)
    run.log.append((start, dt, len(batch.ids), int(batch.new.sum()),
                    int(batch.new[batch.new > 1].sum()) if batch.prefill else 0,
                    used, waiting))


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
        for local, i in enumerate(idx.tolist()):
            token_s[offsets[i]:offsets[i + 1]] = \
                run.token_s[run.token_offsets[local]:run.token_offsets[local + 1]]
    log = np.array(runs[0].log, dtype=float).reshape(-1, 7)
    steps = StepLog(log[:, 0], log[:, 1], *(log[:, i].astype(np.int64) for i in range(2, 7)))
    return SimResult(requests, out["arrival_s"], out["scheduled_s"], out["first_token_s"],
                     out["finish_s"], pre, hits, offsets, token_s, steps, blocks, label, info)
