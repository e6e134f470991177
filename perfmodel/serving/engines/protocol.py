"""The interface every serving engine gives the simulator, declared: an ``Engine`` (its
settings, a frozen record named with its own flags) makes a ``Scheduler`` (its state over
a stream of requests), which the event loop (``serving.engine_loop``) drives one step at a
time. vLLM (``engines.vllm``), SGLang (``engines.sglang``) and TensorRT-LLM
(``engines.trtllm``) implement both; ``tests/test_engine_protocol.py`` checks that each
does, and holds each to the invariants below on seeded streams.

The loop, for every step::

    batch = state.schedule()          # None: nothing can run now
    dt = pricer.price(batch)          # the step's time (core: serving.pricing)
    emit, done = state.commit(batch)  # apply it

Invariants (what the loop and the look-ahead rely on):

- ``schedule`` reserves what the step needs: every request in the batch holds the KV
  blocks for its context after the step (``batch.context``) when ``schedule`` returns;
  ``commit`` applies the step and frees what a finished request held (its blocks go back
  to the pool, or into the prefix cache, still counted free), and ``rollback`` of a fork
  undoes everything a dry run's ``schedule`` and ``commit`` wrote. Once every request has
  finished, the pool's free blocks are its total again.
- A batch is never empty and every request in it computes at least one token
  (``batch.new >= 1``): a committed step always advances time by its priced duration (> 0)
  and the state by at least one token, so the loop ends.
- A request emits at most one token per step (with speculative decoding, ``engine
  .speculative``, a verify's accepted drafts and one more: ``engines.speculation``), and
  exactly its ``output`` tokens in all;
  ``commit`` returns those that emitted and those that emitted their last.
- ``schedule`` and ``commit`` are deterministic functions of the state: a fork run ahead
  forms the same steps the real run forms, given the same arrivals (the look-ahead's
  pricing ahead rests on this, ``serving.lookahead``).
- Under async scheduling (``lag``) a finished request's seat and blocks are freed one
  schedule late (``late``, ``settle``); ``stalled`` says the engine has nothing to run but
  those seats.
"""

from __future__ import annotations

from collections import deque
from typing import Protocol, runtime_checkable

import numpy as np

from perfmodel.serving.engines.state import Batch
from perfmodel.serving.host_time import HostTime
from perfmodel.serving.kvpool import KVPool
from perfmodel.specs.hardware import Hardware


@runtime_checkable
class Scheduler(Protocol):
    """One engine's scheduler state over a stream of requests (arrays over all requests,
    in arrival order), as ``Engine.state`` makes it."""

    engine: Engine
    pool: KVPool                # the paged KV pool (``serving.kvpool``)
    running: list               # admitted and not finished, in admission order
    waiting: deque              # arrived and not admitted (the loop appends arrivals)
    emitted: np.ndarray         # output tokens emitted so far, per request
    preemptions: np.ndarray     # times each request was preempted (recomputed)
    hit_tokens: np.ndarray      # prompt tokens the prefix cache gave each on admission
    lag: bool                   # async scheduling: finishes are applied a schedule late

    def schedule(self) -> Batch | None:
        """The next step's batch, its KV blocks reserved (None: nothing can run now)."""
        ...

    def commit(self, batch: Batch) -> tuple[np.ndarray, np.ndarray]:
        """Apply ``batch`` (the one ``schedule`` just returned): (requests that emitted a
        token, requests that emitted their last); a finished request's blocks are freed
        here, or at the next ``settle`` under ``lag``."""
        ...

    def settle(self) -> None:
        """Free the seats and blocks of requests that finished before the last schedule
        (async scheduling; nothing otherwise)."""
        ...

    def stalled(self) -> bool:
        """Nothing to schedule but finished requests whose seats are not yet freed."""
        ...

    def fork(self) -> Scheduler:
        """A state to run ahead on, sharing the per-request arrays (``serving.forks``)."""
        ...

    def rollback(self, fork: Scheduler) -> None:
        """Undo everything ``fork`` (from ``self.fork()``) wrote in the shared arrays."""
        ...

    def mark(self) -> tuple:
        """A point a fork can return to (``back_to``)."""
        ...

    def back_to(self, mark: tuple) -> Scheduler:
        """The fork as it was at ``mark``."""
        ...


@runtime_checkable
class Engine(Protocol):
    """An engine's settings, named with its own flags, and the common names the pricing
    and the pool read."""

    name: str                   # "vllm", "sglang", "trtllm"
    host: HostTime              # its time outside the GPU (``serving.host_time``)
    block_size: int             # tokens per KV block (page)
    max_num_seqs: int           # requests in one step at most
    max_num_batched_tokens: int     # tokens in one step at most
    chunked_prefill: bool
    prefix_caching: bool
    cuda_graphs: bool           # pure-decode steps replay a CUDA graph
    max_model_len: int          # 0: the model's context limit
    gpu_memory_utilization: float
    scheduler: str              # "continuous", or vLLM's "static" baseline

    def state(self, prompt: np.ndarray, output: np.ndarray, prefix_id: np.ndarray,
              prefix_tokens: np.ndarray, blocks: int, prefilled: np.ndarray | None = None,
              grows: np.ndarray | None = None) -> Scheduler:
        """Its scheduler over a stream (prompt and output tokens per request; shared
        prefix id, -1 none, and its tokens; a KV pool of ``blocks``; prompt tokens whose
        KV came from elsewhere; turns whose KV extends their session's chain)."""
        ...

    def kv_bytes(self, hw: Hardware, weights: float, acts: float) -> float:
        """Its rule for the KV pool's bytes on ``hw`` after the weights and activations."""
        ...

    def resolved(self, blocks: int, context_len: int) -> Engine:
        """Itself with what the engine derives at start-up from the pool and context."""
        ...

    def flags(self) -> str:
        """The same settings as the engine's own command-line flags."""
        ...
