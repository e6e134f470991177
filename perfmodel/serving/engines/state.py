"""One engine step's schedule, by vLLM v1's rules (``vllm/v1/core/sched/scheduler.py``,
``Scheduler.schedule`` and ``update_from_output``):

1. Running requests first, in the order they were admitted: each asks for the tokens it
   has not computed (1 for a decode, the rest of its prompt for a chunked prefill), capped
   by what is left of the step's token budget (``max_num_batched_tokens``). Its KV blocks
   are allocated; when the pool cannot give them, the last-admitted running request is
   preempted (its blocks freed, its computed tokens reset: it is recomputed later, prompt
   and output so far) and put at the head of the waiting queue, until the allocation fits
   or the request itself is the one preempted.
2. Then, only if nothing was preempted, waiting requests in order while the budget lasts
   and fewer than ``max_num_seqs`` run: the prefix cache gives the full blocks already
   cached (capped one token short of the prompt: the last token is always recomputed), the
   rest is scheduled (a chunk of the budget, or, without chunked prefill, the whole prompt;
   a prompt larger than the budget left is skipped for this step and the next one tried),
   and the queue stops at the first request whose blocks do not fit.
3. After the step, a request whose computed tokens reach its prompt plus output so far
   emits one token; one that has emitted all its output finishes and frees its blocks.

Under async scheduling (``lag``: vLLM v1 with ``async_scheduling`` or SGLang's overlap
scheduler, ``serving.engines.sglang``; the profile's ``schedule_ahead``) step n+1 is scheduled
while step n runs (``vllm/v1/engine/core.py``, ``step_with_batch_queue``), before step n's
output is processed: a request that finished in step n still holds its seat and blocks in
that schedule and is not scheduled again (``scheduler.py`` skips one that reached
``max_tokens``); it leaves ``running`` once the schedule is formed (``late``). The
simulator lets that schedule see only the requests that had arrived by step n's start
(``serving.engine_loop``).

The static baseline admits a batch only when the previous one has finished, reserves each
member's KV at its final length (no preemption), and keeps a finished member in the batch
as padding (a decode row that emits nothing) until the whole batch is done, as a static
``generate`` call runs. A schedule is computed on ``EngineState``; ``fork`` makes the
dry runs the simulator prices ahead (``serving.engine_loop``) and ``rollback`` undoes one.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

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
        return cls(engine, prompt, output, prefix, full, KVPool(blocks), *zeros, [], deque(),
                   np.zeros(n, dtype=bool), bool(full.any()) or grows is not None, prefilled,
                   grows, lag)

    def blocks_for(self, tokens: np.ndarray) -> np.ndarray:
        return -(-tokens // self.engine.block_size)

    def schedule(self) -> Batch | None:
        """The next step's batch (None: nothing to run)."""
        budget = self.engine.max_num_batched_tokens
        ids, new, preempted = self._running(budget)
        tokens = int(new.sum())
        budget -= tokens
        static = self.engine.scheduler == "static"
        admit = not preempted and (not static or not len(ids))
        context = self.computed[ids] + new
        if admit and self.waiting:
            more, chunks, budget = self._waiting(budget)
            if len(more):
                ids, new = np.concatenate([ids, more]), np.concatenate([new, chunks])
                context = np.concatenate([context, self.computed[more] + chunks])
                tokens += int(chunks.sum())
        room = budget > 0 and len(self.running) < self.engine.max_num_seqs
        self.settle()
        if not len(ids):
            return None
        prefill = tokens > len(ids)     # some request computes more than one token (each
        # computes at least one): not vLLM's uniform-decode batch
        return Batch(ids, new, context, prefill, admit and not self.waiting and room,
                     preempted)

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

    def _running(self, budget: int) -> tuple[np.ndarray, np.ndarray, int]:
        run = np.array(self.running, dtype=np.int64)
        if not len(run):
            return run, run, 0
        computed = self.computed[run]
        need = self.prompt[run] + self.emitted[run] - computed
        if self.late:           # finished, output not yet processed: not scheduled again
            need[np.isin(run, self.late)] = 0
        if self.engine.scheduler == "static":
            need = np.where(self.padded[run], 1, need)
        spent = need.cumsum()
        new = need if spent[-1] <= budget else \
            np.minimum(np.maximum(budget - spent + need, 0), need)
        if self.engine.scheduler == "static":      # KV reserved at admission
            return run[new > 0], new[new > 0], 0
        blocks = np.maximum(-(-(computed + new) // self.engine.block_size) - self.own[run]
                            - self.shared[run], 0)
        wanted = int(blocks.sum())
        if wanted <= self.pool.free:
            if wanted:      # most decode steps fill blocks they hold
                self.pool.allocate(wanted)
                self.own[run] += blocks
            if new.all():
                return run, new, 0
            keep = new > 0
            return run[keep], new[keep], 0
        return self._running_preempting(run, new, blocks)

    def _running_preempting(self, run: np.ndarray, new: np.ndarray, blocks: np.ndarray
                            ) -> tuple[np.ndarray, np.ndarray, int]:
        """The running loop one request at a time, preempting from the tail."""
        ids, chunks, preempted, i = [], [], 0, 0
        alive = len(run)
        while i < alive:
            r = int(run[i])
            if new[i] == 0:
                i += 1
                continue
            while not self.pool.allocate(int(blocks[i])):
                alive -= 1
                victim = int(run[alive])
                self.preempt(victim)
                preempted += 1
                if victim == r:
                    break
            if i >= alive:
                break
            self.own[r] += blocks[i]
            ids.append(r)
            chunks.append(int(new[i]))
            i += 1
        return np.array(ids, np.int64), np.array(chunks, np.int64), preempted

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

    def _waiting(self, budget: int) -> tuple[np.ndarray, np.ndarray, int]:
        ids, chunks = [], []
        static = self.engine.scheduler == "static"
        skipped = []
        while self.waiting and budget > 0 and len(self.running) < self.engine.max_num_seqs:
            r = self.waiting[0]
            tokens = int(self.prompt[r] + self.emitted[r])
            hit_p, hit_own = self._hits(r, tokens)
            done = (hit_p + hit_own) * self.engine.block_size
            if self.prefilled is not None and not self.preemptions[r]:
                done = max(done, int(self.prefilled[r]))     # its KV came with it
            need = tokens - done
            if not self.engine.chunked_prefill and need > budget:
                skipped.append(self.waiting.popleft())    # vLLM goes on to the next one
                continue
            new = min(need, budget)
            final = tokens + int(self.output[r] - self.emitted[r]) if static else done + new
            fresh = int(self.blocks_for(np.int64(final))) - hit_p - hit_own
            cached = hit_own + (hit_p if int(self.prefix[r]) not in self.pool.active else 0)
            if fresh + cached > self.pool.free:
                break
            self.admit(r)
            self._take_hits(r, hit_p, hit_own)
            self.pool.allocate(fresh)
            self.own[r] += fresh
            self.computed[r] = done
            if not self.preemptions[r]:
                self.hit_tokens[r] = done
            self.waiting.popleft()
            self.running.append(r)
            ids.append(r)
            chunks.append(new)
            budget -= new
        self.waiting.extendleft(reversed(skipped))
        return np.array(ids, np.int64), np.array(chunks, np.int64), budget

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
        ids, static = batch.ids, self.engine.scheduler == "static"
        self.computed[ids] = batch.context
        if static:
            live = ids[~self.padded[ids]]
            emit = live[self.computed[live] >= self.prompt[live] + self.emitted[live]]
        else:           # no padding rows: every request's computed tokens are the context
            emit = ids[batch.context >= self.prompt[ids] + self.emitted[ids]]
        self.emitted[emit] += 1
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
