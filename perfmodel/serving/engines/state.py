"""What every engine's scheduler keeps per request, and the rules all three engines share
(``serving.engines``: each engine's ``schedule`` forms a step from this state).

``EngineState`` holds arrays over all requests (tokens computed and emitted, KV blocks
held alone and shared, preemptions, prefix-cache hits), the running list and waiting
queue, and the paged KV pool (``serving.kvpool``). Shared by the engines: a step's
``commit`` (a request whose computed tokens reach its prompt plus output so far emits one
token; one that has emitted all its output finishes and frees its blocks), ``finish``,
``preempt`` (free a request's blocks, its own chain left cached, and requeue it at the
head), the prefix cache's hits (``_hits``, ``_take_hits``, ``_publish``) and a
conversation's growing chain (``_grow_chain``).

Under async scheduling (``lag``: vLLM v1 with ``async_scheduling`` or SGLang's overlap
scheduler, ``engines.sglang``; the profile's ``schedule_ahead``) step n+1 is scheduled
while step n runs (``vllm/v1/engine/core.py``, ``step_with_batch_queue``), before step n's
output is processed: a request that finished in step n still holds its seat and blocks in
that schedule and is not scheduled again (``scheduler.py`` skips one that reached
``max_tokens``); it leaves ``running`` once the schedule is formed (``late``, ``settle``).
The simulator lets that schedule see only the requests that had arrived by step n's start
(``serving.engine_loop``).

A schedule is computed on the state; ``fork`` (``serving.forks``) makes the dry runs the
simulator prices ahead (``serving.engine_loop``) and ``rollback`` undoes one.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import perfmodel.serving.engines.speculation as speculation
from perfmodel.serving.forks import Forkable
from perfmodel.serving.kvpool import KVPool

EngineSettings = Any    # an engine's settings (``serving.engines``), which import this module
LAGS = ("vllm", "sglang")   # engines whose ``schedule_ahead`` is modelled (``engines.sglang``)


@dataclass(eq=False)
class Batch:
    """One scheduled step: the requests, their new tokens and context after the step,
    whether any is a prompt chunk, and whether the waiting queue ran dry with room to
    spare (``open``: a request arriving before the step would have joined it)."""

    ids: np.ndarray
    new: np.ndarray
    context: np.ndarray
    prefill: bool
    open: bool
    preempted: int
    drafts: np.ndarray | None = None    # drafted tokens each row verifies (speculation)
    lora: tuple | None = None   # (tokens with an adapter, distinct adapters, loads), or None


@dataclass(eq=False)
class EngineState(Forkable):
    """What the scheduler keeps per request (arrays over all requests) and its queues."""

    engine: EngineSettings
    prompt: np.ndarray
    output: np.ndarray
    prefix: np.ndarray          # shared-prefix id, -1 none
    prefix_full: np.ndarray     # full blocks of the shared prefix
    pool: KVPool
    computed: np.ndarray
    emitted: np.ndarray
    own: np.ndarray             # blocks held that are the request's alone
    shared: np.ndarray          # blocks of its shared prefix it references
    preemptions: np.ndarray
    hit_tokens: np.ndarray
    running: list
    waiting: deque
    padded: np.ndarray          # static batching: finished, kept as padding
    sharing: bool = False       # some request has a shared prefix of a full block
    prefilled: np.ndarray | None = None     # prompt tokens computed elsewhere (their KV came)
    grows: np.ndarray | None = None         # a conversation's turn: its KV extends the chain
    lag: bool = False           # async scheduling: finishes are applied after the next schedule
    late: list = field(default_factory=list)    # finished last step, seats not yet freed
    lo: int = 0         # every request below has finished: its state is final
    top: int = 0        # no request from here on has been admitted: its state is all zero
    saved: tuple = ()   # ``fork``'s copy of the rows ``lo:top`` of the arrays below
    spec: object = None     # speculative decoding's settings (``engines.speculation``)
    lora: Any = None    # the LoRA adapters' slots (``engines.lora.LoraSlots``), or None

    MUTABLE = ("computed", "emitted", "own", "shared", "preemptions", "hit_tokens", "padded")

    @classmethod
    def new(cls, engine: EngineSettings, prompt: np.ndarray, output: np.ndarray,
            prefix: np.ndarray, prefix_tokens: np.ndarray, blocks: int,
            prefilled: np.ndarray | None = None, grows: np.ndarray | None = None
            ) -> EngineState:
        n = len(prompt)
        zeros = [np.zeros(n, np.int64) for _ in range(6)]
        full = prefix_tokens // engine.block_size
        lag = engine.name in LAGS and engine.scheduler == "continuous" and \
            bool(getattr(engine.host, "schedule_ahead", False))
        state = cls(engine, prompt, output, prefix, full, KVPool(blocks), *zeros, [], deque(),
                    np.zeros(n, dtype=bool), bool(full.any()) or grows is not None,
                    prefilled, grows, lag)
        spec = getattr(engine, "speculative", None)
        if spec is not None:
            state.spec = spec
            speculation.attach(state, spec)
        return state

    def blocks_for(self, tokens: np.ndarray) -> np.ndarray:
        return -(-tokens // self.engine.block_size)

    def lora_step(self, batch: Batch | None) -> Batch | None:
        """``batch`` with its adapters activated and counted (``engines.lora``)."""
        if batch is not None and self.lora is not None:
            from perfmodel.serving.engines.lora import batch_info

            batch.lora = batch_info(self.lora, batch.ids, batch.new)
        return batch

    def settle(self) -> None:
        """Free the seats and blocks of the requests that finished before the schedule
        just formed (async scheduling: their output is processed after it)."""
        late, self.late = self.late, []
        for r in late:
            if r in self.running:
                self.finish(r)

    def stalled(self) -> bool:
        """Nothing to schedule but finished requests whose seats are not yet freed (async
        scheduling: the engine processes their output, then schedules afresh)."""
        return bool(self.late) and not self.waiting and len(self.late) == len(self.running)

    def preempt(self, r: int) -> None:
        """Free ``r``'s blocks (its own chain stays cached for its recomputation) and put it
        at the head of the waiting queue."""
        if r in self.late:          # it had finished: its output frees it, not a recompute
            self.late.remove(r)
            self.finish(r)
            return
        self.running.remove(r)
        full = min(int(self.computed[r]) // self.engine.block_size - int(self.shared[r]),
                   int(self.own[r]))
        key = ("r", r) if self.engine.prefix_caching else None
        self.pool.release(int(self.own[r]) - full)
        self.pool.release(full, key)
        if self.shared[r]:
            self.pool.dereference(int(self.prefix[r]))
        self.computed[r] = self.own[r] = self.shared[r] = 0
        self.preemptions[r] += 1
        self.waiting.appendleft(r)

    def _hits(self, r: int, tokens: int) -> tuple[int, int]:
        """(shared-prefix blocks, own blocks) the prefix cache gives ``r``: full blocks of
        its chain, at most one token short of ``tokens``."""
        if not self.engine.prefix_caching:
            return 0, 0
        cap = (tokens - 1) // self.engine.block_size
        p = int(self.prefix[r])
        hit_p = min(self.pool.prefix_blocks(p), int(self.prefix_full[r]), cap) if p >= 0 else 0
        own = 0
        if self.preemptions[r] and (p < 0 or hit_p == self.prefix_full[r]):
            own = min(self.pool.cached(("r", r)), cap - hit_p)
        return hit_p, own

    def _take_hits(self, r: int, hit_p: int, hit_own: int) -> None:
        if hit_p:
            self.pool.reference(int(self.prefix[r]), hit_p)
            self.shared[r] = hit_p
        if hit_own:
            self.pool.take_cached(("r", r), hit_own)
            self.own[r] += hit_own
        if self.preemptions[r]:
            self.pool.forget(("r", r))      # what it did not take is no longer its chain

    def commit(self, batch: Batch) -> tuple[np.ndarray, np.ndarray]:
        """Apply a step: (requests that emitted a token, requests that emitted their last:
        finished, though under static batching their seats are freed with the batch's)."""
        if self.spec is not None:         # several tokens a step (``engines.speculation``)
            return speculation.commit(self, batch)
        ids, static = batch.ids, self.engine.scheduler == "static"
        self.computed[ids] = batch.context
        if static:
            live = ids[~self.padded[ids]]
            emit = live[self.computed[live] >= self.prompt[live] + self.emitted[live]]
        else:           # no padding rows: every request's computed tokens are the context
            emit = ids[batch.context >= self.prompt[ids] + self.emitted[ids]]
        self.emitted[emit] += 1
        return self.finish_step(ids, emit)

    def finish_step(self, ids: np.ndarray, emit: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``commit``'s end, once the step's tokens are counted: publish shared prefixes,
        finish the requests that emitted their last (static batching and async scheduling
        hold their seats as padding)."""
        static = self.engine.scheduler == "static"
        if self.engine.prefix_caching and self.sharing:
            self._publish(ids)
        done = emit[self.emitted[emit] >= self.output[emit]]
        if static:          # the batch holds its seats to the end
            self.padded[done] = True
            if self.padded[self.running].all():
                for r in list(self.running):
                    self.finish(r)
            return emit, done
        if self.lag:        # held as padding until freed: ``fork`` keeps their rows saved
            self.padded[done] = True
            self.late.extend(done.tolist())
            return emit, done
        for r in done.tolist():
            self.finish(r)
        return emit, done

    def finish(self, r: int) -> None:
        self.running.remove(r)
        self.padded[r] = False      # read only while running; False: finished (``fork``)
        if self.grows is not None and self.grows[r] and self.engine.prefix_caching:
            self._grow_chain(r)
            return
        self.pool.release(int(self.own[r]))
        if self.shared[r]:
            self.pool.dereference(int(self.prefix[r]))
        self.own[r] = self.shared[r] = 0

    def _publish(self, ids: np.ndarray) -> None:
        """Requests that just computed their whole shared prefix make it the cached chain
        (vLLM caches a block once it is full of computed tokens)."""
        full = self.prefix_full[ids]
        fresh = ids[(self.prefix[ids] >= 0) & (self.shared[ids] == 0) & (full > 0)
                    & (self.computed[ids] >= full * self.engine.block_size)]
        for r in fresh.tolist():
            if self.pool.publish(int(self.prefix[r]), int(self.prefix_full[r])):
                self.own[r] -= self.prefix_full[r]
                self.shared[r] = self.prefix_full[r]

    def _grow_chain(self, r: int) -> None:
        """A conversation's turn finished: its prompt and output so far (full blocks of the
        computed tokens) become its session's cached chain, the prefix the next turn asks
        for (vLLM caches every full block, output included; SGLang's ``cache_finished_req``
        inserts the whole sequence into the radix tree). The chain cannot grow while another
        turn of the session still shares it: then the blocks are freed uncached."""
        p, own, shared = int(self.prefix[r]), int(self.own[r]), int(self.shared[r])
        full = max(min(int(self.computed[r]) // self.engine.block_size - shared, own), 0)
        self.own[r] = self.shared[r] = 0
        if shared:
            held = self.pool.active[p]
            held[1] -= 1
            if held[1] > 0:
                self.pool.release(own)
                return
            del self.pool.active[p]
        elif p in self.pool.active:
            self.pool.release(own)
            return
        self.pool.forget(("p", p))
        self.pool.release(own - full)
        self.pool.release(shared + full, ("p", p))
