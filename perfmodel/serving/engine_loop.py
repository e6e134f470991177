"""One engine's event loop: requests arrive, queue, run in the steps its scheduler forms
(``serving.engines``: each engine's ``schedule`` and ``commit``), and leave; each step is
priced by the core (``serving.pricing.StepPricer``, with the engine's host time:
``serving.host_time``), and its times recorded (``record``, ``serving.results``).

Steps are priced ahead, many per ``price_step`` call: the scheduler is run forward on a
fork of the engine's state (``EngineState.fork``: the rows of the requests in flight saved,
not every request's) with arrivals placed by a guess of each step's time
(``serving.lookahead``), the steps it forms are priced together, and the real run keeps
them up to the first step an arrival could have changed, resuming from the fork's last mark
before it: a step whose schedule left the waiting queue empty with room to spare
(``Batch.open``) starting after a request the dry run did not see had arrived. A request
that arrives while others wait joins the tail of the queue, so it cannot change a step
until the queue ahead of it has drained: under load most steps are priced in blocks.
Pipeline parallelism runs its own loop over the same pieces (``serving.pipeline``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from perfmodel.serving import pipeline
from perfmodel.serving.arrivals import Arrivals
from perfmodel.serving.engines import lora
from perfmodel.serving.engines.state import EngineState
from perfmodel.serving.engines.vllm import EngineConfig
from perfmodel.serving.lookahead import Dry, Guess, dry_run
from perfmodel.serving.pricing import StepPricer
from perfmodel.serving.requests import Requests
from perfmodel.serving.results import StepLog, record_output
from perfmodel.specs.errors import SpecError
from perfmodel.specs.hardware import Hardware
from perfmodel.specs.model import Model
from perfmodel.specs.workload import Parallelism, Workload

LOOKAHEAD = 64      # steps priced together at most
Progress = Callable[[int, int, float], None]    # (requests done, of, simulated clock s)


@dataclass(eq=False)
class Run:
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


def simulate_one(model: Model, hw: Hardware, plan: Parallelism, w: Workload,
                  engine: EngineConfig, requests: Requests, blocks: int,
                  progress: Progress | None, edge: int | None = None) -> Run:
    run = start(model, hw, plan, w, engine, requests, blocks, edge)
    (pipeline.advance if plan.pp > 1 else advance)(run, progress)
    return run


def start(model: Model, hw: Hardware, plan: Parallelism, w: Workload,
           engine: EngineConfig, requests: Requests, blocks: int,
           edge: int | None = None) -> Run:
    n = len(requests)
    offsets = np.concatenate([[0], np.cumsum(requests.output_tokens)])
    grows = None if requests.session_id is None else requests.session_id >= 0
    state = engine.state(requests.input_tokens, requests.output_tokens, requests.prefix_id,
                         requests.prefix_tokens, blocks, requests.prefilled, grows)
    state.lora = lora.slots(engine, requests)
    nan = np.full(n, np.nan)
    return Run(state, StepPricer(model, hw, plan, w, engine, edge), Arrivals(requests),
                offsets, np.zeros(int(offsets[-1])), nan.copy(), nan.copy(), nan.copy(),
                known=n)


def advance(run: Run, progress: Progress | None = None) -> None:
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
        if not dry.plans:
            _stuck(run)
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


def _stuck(run: Run) -> None:
    """No step can be formed: with nothing running, the engine's admission rule refuses the
    request at the head of the queue for good (SGLang's reserves room for the output past
    the prompt, so a prompt near the whole pool is never admitted, where a real server
    rejects or hangs). One clear error naming the request, not a loop that cannot end."""
    st = run.state
    if st.running or not st.waiting:
        raise RuntimeError("simulate: no step could be formed with requests in flight")
    r = st.waiting[0]
    req = run.arrivals.requests
    raise SpecError(f"simulate: {st.engine.name} cannot admit request {r} "
                    f"({int(req.input_tokens[r])} prompt + {int(req.output_tokens[r])} output "
                    f"tokens) into a KV pool of {st.pool.total} blocks of "
                    f"{st.engine.block_size} tokens, even alone: give it a larger pool "
                    "(--gpu-memory-utilization / --mem-fraction-static) or a shorter request")


def _valid(run: Run, dry: Dry, times: np.ndarray) -> tuple[int, list]:
    """(how many of the priced steps stand, the open-loop arrivals by each step's schedule
    cutoff and by the next one after the last). A step's schedule sees the arrivals by its
    cutoff: its start, or under async scheduling the previous step's start. A step stands
    unless a request that had arrived by its cutoff was not let in while it left the queue
    empty with room (``Batch.open``), or one the dry run let in early was scheduled in it
    or before, or sits in the queue ahead of a request the step preempted (SGLang's
    retraction joins the queue's tail)."""
    t, starts = run.t, []
    for dt in times.tolist():          # added one at a time, as ``record`` adds them
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


def _replay(run: Run, dry: Dry, times: np.ndarray, host: np.ndarray) -> int:
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
        record(run, batch, effect, float(times[j]), j >= kept, float(host[j]))
    return cut


def _sent(run: Run, dry: Dry, times: np.ndarray, upto: int, kept: int) -> None:
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


def record(run: Run, batch: object, effect: tuple, dt: float, queue_more: bool,
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
