"""TensorRT-LLM's attention-DP balance (``attention_dp_config.enable_balance``): the
ranks of a data-parallel-attention replica hold their new prompts back until every rank
has one, so that one rank's prefill does not stretch the lockstep step of all the others.

The rule, from ``tensorrt_llm/_torch/pyexecutor/py_executor.py`` ``_balance_adp_requests``
(the ranks allgather how many context and generation requests each has scheduled):

- every rank has a free seat and a context request: the contexts run (the wait count is
  reset); if every rank also has generation requests, they first wait
  ``batching_wait_iters`` iterations (to gather more);
- otherwise no rank runs its contexts, and the wait count grows by one each iteration; at
  ``timeout_iters``, or when some rank has no generation request left, they run and the
  count is reset. The count grows whether or not any context is waiting, so a lone prompt
  waits up to ``timeout_iters`` iterations (by the count's phase), not always all of them.

TensorRT-LLM's defaults (``AttentionDpConfig``): enable_balance false, timeout_iters 50,
batching_wait_iters 10.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass


@dataclass
class Balance:
    """One replica's counts; ``timeout_iters`` and ``batching_wait_iters`` as the config."""

    timeout_iters: int
    batching_wait_iters: int
    waited: int = 0
    batched: int = 0

    @classmethod
    def of(cls, engine: object) -> Balance | None:
        """The balance of ``engine``'s settings, or None where it does not balance."""
        if not getattr(engine, "attention_dp_balance", False):
            return None
        return cls(engine.attention_dp_timeout_iters, engine.attention_dp_batching_wait_iters)

    def hold(self, states: list) -> bool:
        """Whether this iteration's new prompts wait, every rank's ``states`` (their queues
        and running requests, before the schedule) as they stand."""
        limit = states[0].engine.max_batch_size
        has_gen = all(len(s.running) for s in states)
        if all(len(s.waiting) and len(s.running) < limit for s in states):
            self.waited = 0
            if has_gen and self.batched < self.batching_wait_iters:
                self.batched += 1
                return True
            self.batched = 0
            return False
        self.waited += 1
        if self.waited >= self.timeout_iters or not has_gen:
            self.waited = 0
            return False
        return True


def schedule_held(state: object) -> object:
    """``state``'s batch with its queue held back (generating requests only); what the
    schedule put back in the queue goes ahead of the held requests."""
    held, state.waiting = state.waiting, deque()
    try:
        return state.schedule() if state.running else None
    finally:
        state.waiting.extend(held)
