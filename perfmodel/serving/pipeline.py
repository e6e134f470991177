"""Pipeline parallelism in the serving simulator, as vLLM's v1 engine runs it.

How vLLM runs it (read from its source):

- ``vllm/v1/engine/core.py``, ``EngineCore.step_with_batch_queue``: the engine core keeps
  a queue of ``batch_queue_size = vllm_config.max_concurrent_batches`` batches. It
  schedules and launches a new batch whenever the queue is not full and the scheduler has
  tokens to schedule ("fulfilling the batch queue has a higher priority than getting model
  outputs"); otherwise it blocks on the oldest batch's output and updates the scheduler
  from it (``Scheduler.update_from_output``).
- ``vllm/v1/executor/multiproc_executor.py`` (and the Ray executor),
  ``max_concurrent_batches``: ``pipeline_parallel_size``; ``vllm/config/vllm.py``
  (``VllmConfig.__post_init__``) turns async scheduling off when pipeline_parallel_size >
  1 ("Async scheduling is not yet supported with pipeline_parallel_size > 1"), so under PP
  the synchronous scheduler runs with pp batches in flight.
- ``vllm/v1/core/sched/scheduler.py``, ``Scheduler.schedule``: a request's
  ``num_computed_tokens`` advances when it is scheduled (``_update_after_schedule``); a
  running request with no token left to schedule ("PP>1 and we have already scheduled all
  prompt tokens but they are not finished yet") is skipped with ``continue``. So a
  decoding request rides in at most one batch in flight, while a long prompt's next chunk
  may be scheduled while the previous one is still in the pipe. A token is emitted when a
  batch that computed the request's whole prompt and output so far returns.

What this module adds to ``serving.engine_loop`` for ``plan.pp`` > 1:

- The scheduler is vLLM's (``serving.engines.state``) with the computed tokens advanced at
  schedule time and tokens emitted when the batch returns (``land``); a request preempted
  while in flight has that flight's output dropped.
- Stages: the step is priced for the whole replica (``serving.pricing.StepPricer``) and
  split into the stages' shares as ``perfmodel estimate --pp`` splits it
  (``schedules.pipeline.stage_seconds``: vLLM's layer split, the embedding on the first
  stage, the LM head on the last); each boundary is a point-to-point send of the batch's
  activations (``schedules.pipeline.boundary_seconds``).
- Timing: a batch scheduled at engine clock E takes the engine's host work w for it
  (``HostTime.step`` without overlap: vLLM runs synchronously under PP, so the mode's
  async overlap does not apply), enters stage 0 at max(E + w, stage 0 free), each later
  stage at max(the send's arrival, that stage free), and stage s is busy T_s. The engine
  lands the batch (its tokens) when it next blocks on it, at max(its clock, the return).
  A lone request's token takes w + sum_s T_s + the sends; with the pipe full the engine
  completes about one batch per slowest stage (plus the host's own gap).
- The step log has one row per batch (micro-batch): start is the engine clock when it
  was scheduled, time until its output returned; ``StepLog.stage_s`` its GPU seconds on
  each stage, ``send_s`` its sends; the rest of its time is host work and waiting for
  busy stages.
- Steps are priced ahead as in ``serving.engine_loop``: the same event loop is run forward on
  a copy of the state (no further arrivals) and its batches priced in one call; a priced
  batch is used only when the real loop forms the very same batch.

SGLang (``python/sglang/srt/managers/scheduler_pp_mixin.py``, ``event_loop_pp``: a running
batch of its own per micro-batch slot) and TensorRT-LLM
(``tensorrt_llm/_torch/pyexecutor/py_executor.py``, ``_executor_loop_pp``) run PP loops of
their own, which are not modelled: refused (``check``).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field, replace

import numpy as np

from perfmodel.schedules.pipeline import activation_bytes, boundary_seconds, stage_seconds
from perfmodel.serving.engines.state import Batch, EngineState
from perfmodel.serving.lookahead import Guess
from perfmodel.serving.pricing import StepPricer
from perfmodel.serving.results import SimResult, StepLog, record_output
from perfmodel.specs.dtypes import CODE
from perfmodel.specs.errors import SpecError
from perfmodel.specs.workload import Parallelism

LOOKAHEAD = 64      # batches priced together at most


def check(plan: Parallelism, engine: object) -> None:
    """SpecError for what pipeline parallelism is not modelled with."""
    if plan.pp == 1:
        return
    if engine.name != "vllm":
        source = {"sglang": "python/sglang/srt/managers/scheduler_pp_mixin.py: event_loop_pp",
                  "trtllm": "tensorrt_llm/_torch/pyexecutor/py_executor.py: "
                            "_executor_loop_pp"}.get(engine.name, "its own loop")
        raise SpecError(f"--pp: {plan.pp} with --engine {engine.name} is not simulated (its "
                        f"pipeline loop, {source}, is not modelled); use --engine vllm")
    if engine.scheduler == "static":
        raise SpecError("--pp: the static baseline (--scheduler static) runs no pipeline; "
                        "use --scheduler continuous")
    if plan.attention_dp:
        raise SpecError("--pp: pipeline stages with --attention-dp ranks in lockstep are not "
                        "simulated; use --pp 1")


class StagePricer:
    """Each batch's GPU seconds on each stage (at the band edge the step pricer uses), its
    sends across the stage boundaries, and the engine's host work for it."""

    def __init__(self, pricer: StepPricer) -> None:
        self.pricer = pricer
        self.pp = pricer.plan.pp
        self.work = replace(pricer.host, overlap=False, exposed_s=0.0)
        self.memo: dict[int, float] = {}

    def __call__(self, batches: list[Batch]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """((k, pp) stage seconds, (k, pp - 1) send seconds, (k,) host seconds)."""
        p = self.pricer
        gpu, cost, seqs = p.gpu(batches)
        whole = cost.time
        scale = np.divide(gpu, whole, out=np.ones_like(gpu), where=whole > 0)
        stage = stage_seconds(cost.time_s, cost.names, p.model, self.pp) * scale
        tokens = np.array([int(b.new.sum()) for b in batches], dtype=float)
        send = boundary_seconds(p.hw, p.plan, tokens * activation_bytes(
            p.model, CODE[p.act_dtype]))
        return stage.T, send.T, self.host_s(seqs)

    def host_s(self, seqs: np.ndarray | int) -> np.ndarray:
        """The engine's host work for batches of ``seqs`` sequences."""
        return self.work.step(np.zeros(np.shape(seqs)), seqs)

    def host_one(self, seqs: int) -> float:
        """``host_s`` of one batch, memoised by its sequences."""
        if seqs not in self.memo:
            self.memo[seqs] = float(self.host_s(seqs))
        return self.memo[seqs]


@dataclass(eq=False)
class Flight:
    """A batch in the pipe: its requests' preemption counts when it was scheduled, and
    when its output returns."""

    batch: Batch
    epochs: np.ndarray
    out_s: float


@dataclass(eq=False)
class Pipe:
    """One engine's pipeline: when each stage is next free, the batches in flight (oldest
    first), batches priced ahead, per logged batch its stage and send seconds, and
    ``guess``: a step's GPU time before it is priced, fitted to those priced so far
    (``serving.lookahead.Guess``, which places arrivals in the dry runs)."""

    pricer: StagePricer
    free: np.ndarray
    inflight: deque = field(default_factory=deque)
    ready: deque = field(default_factory=deque)
    lookahead: int = 4
    stood: int = 0
    stages: list = field(default_factory=list)
    sends: list = field(default_factory=list)
    guess: Guess = field(default_factory=Guess)

    @property
    def pp(self) -> int:
        return len(self.free)


def schedule(st: EngineState) -> tuple[Batch, np.ndarray] | None:
    """The next batch and its requests' preemption counts, the computed tokens advanced at
    once (vLLM's ``_update_after_schedule``)."""
    batch = st.schedule()
    if batch is None:
        return None
    st.computed[batch.ids] = batch.context
    return batch, st.preemptions[batch.ids].copy()


def land(st: EngineState, batch: Batch, epochs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Apply a returned batch: (requests that emitted a token, requests that finished). A
    request emits when the batch computed its whole prompt and output so far; one
    preempted since the batch was scheduled emits nothing from it."""
    ids = batch.ids
    kept = st.preemptions[ids] == epochs
    live, ctx = ids[kept], batch.context[kept]
    emit = live[ctx >= st.prompt[live] + st.emitted[live]]
    st.emitted[emit] += 1
    if st.engine.prefix_caching and st.sharing:
        st._publish(live)
    done = emit[st.emitted[emit] >= st.output[emit]]
    for r in done.tolist():
        st.finish(r)
    return emit, done


def advance(run: object, progress: object = None) -> None:
    """``serving.engine_loop``'s loop under pipeline parallelism: run the engine until
    every request it knows has finished, or until its clock reaches ``run.horizon`` (no
    batch is scheduled or landed at or after it)."""
    if run.pipe is None:
        run.pipe = Pipe(StagePricer(run.pricer), np.zeros(run.pricer.plan.pp))
        run.state.lag = False       # vLLM runs PP without async scheduling: no schedule ahead
    pipe = run.pipe
    while run.done < run.known and run.t < run.horizon:
        st = run.state
        st.waiting.extend(run.arrivals.due(run.t))
        formed = schedule(st) if len(pipe.inflight) < pipe.pp else None
        if formed is not None:
            _submit(run, pipe, *formed)
            continue
        if pipe.inflight:
            at = max(run.t, pipe.inflight[0].out_s)
            if at >= run.horizon:
                return
            _land(run, pipe.inflight.popleft(), at)
            if progress is not None:
                progress(run.done, run.known, run.t)
            continue
        t = run.arrivals.next_time()
        if not np.isfinite(t) and np.isfinite(run.horizon):
            return
        if not np.isfinite(t):
            raise RuntimeError("simulate: requests left that never arrive")
        run.t = max(run.t, min(t, run.horizon))


def _submit(run: object, pipe: Pipe, batch: Batch, epochs: np.ndarray) -> None:
    """Launch ``batch`` at the engine's clock: its host work, then stage by stage."""
    stage, send, host = _priced(run, pipe, batch, epochs)
    start = run.t
    t = start + host
    for s in range(pipe.pp):
        t = max(t + (send[s - 1] if s else 0.0), pipe.free[s]) + stage[s]
        pipe.free[s] = t
    pipe.inflight.append(Flight(batch, epochs, t))
    run.t = start + host
    fresh = batch.ids[np.isnan(run.scheduled_s[batch.ids])]
    run.scheduled_s[fresh] = start
    run.last_done = run.last_done_tokens = 0
    st = run.state
    run.log.append(StepLog.row(start, t - start, batch, st.pool.used, len(st.waiting),
                               float(host)))
    pipe.stages.append(stage)
    pipe.sends.append(float(send.sum()))


def _land(run: object, flight: Flight, at: float) -> None:
    """The engine takes ``flight``'s output at ``at``: tokens, finished requests, and a
    closed loop's next requests."""
    run.t = at
    st = run.state
    emit, done = land(st, flight.batch, flight.epochs)
    st.waiting.extend(record_output(run, emit, st.emitted[emit], done, at))


def _priced(run: object, pipe: Pipe, batch: Batch, epochs: np.ndarray
            ) -> tuple[np.ndarray, np.ndarray, float]:
    """``batch``'s (stage, send, host) seconds: priced ahead when the dry run formed this
    very batch, else priced now with the batches a dry run forms after it."""
    if pipe.ready and _same(pipe.ready[0][0], batch):
        pipe.stood += 1
        return pipe.ready.popleft()[1:]
    missed = bool(pipe.ready)
    pipe.lookahead = max(4, min(LOOKAHEAD, 2 * pipe.stood)) if missed else \
        min(LOOKAHEAD, 2 * pipe.lookahead)
    pipe.stood = 0
    ahead, features = _dry(run, pipe, batch, epochs, pipe.lookahead - 1)
    stage, send, host = pipe.pricer(ahead)
    pipe.guess.learn(features, stage.sum(axis=1))
    pipe.ready = deque(zip(ahead[1:], stage[1:], send[1:], host[1:].tolist(), strict=True))
    return stage[0], send[0], float(host[0])


def _dry(run: object, pipe: Pipe, batch: Batch, epochs: np.ndarray, k: int
         ) -> tuple[list[Batch], list[np.ndarray]]:
    """``batch`` and up to ``k`` batches the engine would form after it, and each one's
    ``Guess.features``: the same loop on a copy of
    the state, an open loop's arrivals let in where guessed times place them (each stage a
    pp-th of ``Pipe.guess``'s step time; a closed loop's next requests left out). Only
    which batches are priced ahead rests on the guess."""
    st, arrivals = run.state.copy(), run.arrivals
    sched, closed = arrivals.requests.arrival_s, bool(arrivals.requests.closed_loop)
    seen, ended, clock = arrivals.next_open, 0, run.t
    free = pipe.free.copy()
    queue = deque((f.batch, f.epochs, f.out_s) for f in pipe.inflight)

    out, features = [], []

    def launch(b: Batch, e: np.ndarray) -> None:
        nonlocal clock
        out.append(b)
        features.append(pipe.guess.features(b))
        each = max(pipe.guess(features[-1]), 0.0) / pipe.pp
        host = pipe.pricer.host_one(len(b.ids))
        t = clock + host
        for s in range(pipe.pp):
            t = free[s] = max(t, free[s]) + each
        clock += host
        queue.append((b, e, t))

    launch(batch, epochs)
    while len(out) <= k:
        room = seen if closed else min(len(sched), arrivals.limit(ended))
        while seen < room and sched[seen] <= clock:
            st.waiting.append(seen)
            seen += 1
        formed = schedule(st) if len(queue) < pipe.pp else None
        if formed is not None:
            launch(*formed)
        elif queue:
            b, e, t = queue.popleft()
            clock = max(clock, t)
            ended += len(land(st, b, e)[1])
        elif seen < room:
            clock = max(clock, float(sched[seen]))
        else:
            break
    return out, features


def _same(a: Batch, b: Batch) -> bool:
    return len(a.ids) == len(b.ids) and np.array_equal(a.ids, b.ids) and \
        np.array_equal(a.new, b.new) and np.array_equal(a.context, b.context)


def with_stages(res: SimResult, run: object) -> SimResult:
    """``res`` with the first engine's per-batch stage and send seconds in its step log."""
    pipe = run.pipe
    stage = np.array(pipe.stages, dtype=float).reshape(-1, pipe.pp)
    steps = replace(res.steps, stage_s=stage, send_s=np.array(pipe.sends, dtype=float))
    return replace(res, steps=steps)
