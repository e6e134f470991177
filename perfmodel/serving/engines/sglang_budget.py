"""SGLang's prefill budgets (``sglang==0.5.14``, ``python/sglang/srt/managers/
schedule_policy.py`` ``PrefillAdder``): what ``engines.sglang`` spends as it adds
requests to a prefill batch, and the adder's verdict after each (``AddReqResult``:
continue, no_token, other)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(eq=False)
class PrefillBudget:
    """``PrefillAdder``'s budgets: tokens left in the pool (``rem_total_tokens``, less the
    running requests' expected output), prefill tokens (``rem_input_tokens``) and chunk
    tokens (``rem_chunk_tokens``, None without chunking)."""

    offset: float
    input: int
    chunk: int | None
    page: int
    cur_offset: int = 0
    fresh: int = 0          # blocks allocated in this pass (SGLang allocates after it)
    full: bool = False

    def total(self, free: int) -> float:
        return (free + self.fresh) * self.page - self.offset      # pool counted in pages

    def ceil(self, tokens: int) -> int:
        return -(-tokens // self.page) * self.page

    def spend(self, extend: int, max_new: int) -> None:
        self.offset += extend + max_new + self.page
        self.cur_offset += extend + self.page
        self.input -= extend
        if self.chunk is not None:
            self.chunk -= extend

    def state(self, free: int) -> str:
        cur = (free + self.fresh) * self.page - self.cur_offset
        if self.full or self.total(free) <= 0 or cur <= 0:
            return "no_token"
        if self.input <= 0 or (self.chunk is not None and self.chunk <= 0):
            return "other"
        return "continue"
