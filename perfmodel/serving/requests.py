"""A stream of requests as arrays: when each arrives, its prompt and output lengths, and the
prompt prefix it shares with others (``serving.traffic`` makes and reads them)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from perfmodel.specs.errors import SpecError


@dataclass(frozen=True, eq=False)
class Requests:
    """N requests, sorted by arrival. ``prefix_id`` -1: no shared prefix; requests with one
    id share their first ``prefix_tokens`` prompt tokens (a system prompt). ``closed_loop``
    > 0: arrivals are not fixed but made by that many users, each sending its next request
    when the last one finishes (``arrival_s`` then holds each request's think time after its
    user's previous one; 0: at once). ``prefilled``: prompt tokens whose KV arrives with the
    request, computed elsewhere (a disaggregated decode instance's requests), or None.
    ``client_cap`` > 0: the client keeps at most that many requests in flight, sending one
    that is due only when an earlier one has finished (a load generator's concurrency
    limit, as ``vllm bench serve --max-concurrency`` has). ``session_id`` (-1: none) and
    ``turn``: a conversation's turns; a turn's prompt is the conversation so far (its
    shared prefix, ``prefix_id`` the session's chain) and its own new message; the KV of a
    finished turn stays cached as the chain the next turn asks for (``serving.traffic``
    sets them from a trace's ``session_id,turn`` columns or ``generate(turns=...)``).
    ``adapter`` (or None): each request's LoRA adapter, 0, 1, ... (-1: the base model;
    ``engines.lora``). ``think_s`` (or None): NaN where ``arrival_s`` is the request's time;
    a number where
    the request is a later turn sent that long after the client has its session's previous
    turn's last token (``serving.sessions``: ``arrival_s`` then holds a nominal time, used
    only where the turns cannot follow the answers)."""

    arrival_s: np.ndarray
    input_tokens: np.ndarray
    output_tokens: np.ndarray
    prefix_id: np.ndarray
    prefix_tokens: np.ndarray
    closed_loop: int = 0
    prefilled: np.ndarray | None = None
    client_cap: int = 0
    session_id: np.ndarray | None = None
    turn: np.ndarray | None = None
    think_s: np.ndarray | None = None
    adapter: np.ndarray | None = None       # each request's LoRA adapter id (-1: none)

    def __post_init__(self) -> None:
        n = len(self.arrival_s)
        for name in ("input_tokens", "output_tokens", "prefix_id", "prefix_tokens"):
            if len(getattr(self, name)) != n:
                raise SpecError(f"requests: {name} has {len(getattr(self, name))} entries, "
                                f"expected {n}")
        if n == 0:
            raise SpecError("requests: no requests")
        if np.any(np.diff(self.arrival_s) < 0) and not self.closed_loop:
            raise SpecError("requests: arrival_s must be sorted")
        if np.any(self.input_tokens < 1) or np.any(self.output_tokens < 1):
            raise SpecError("requests: input_tokens and output_tokens must be >= 1")
        if np.any(self.prefix_tokens > self.input_tokens):
            raise SpecError("requests: prefix_tokens must be <= input_tokens")
        if self.prefilled is not None and (len(self.prefilled) != n or np.any(
                (self.prefilled < 0) | (self.prefilled >= self.input_tokens))):
            raise SpecError("requests: prefilled must be 0 <= prefilled < input_tokens")
        if self.adapter is not None and len(self.adapter) != n:
            raise SpecError(f"requests: adapter has {len(self.adapter)} entries, expected {n}")

    @classmethod
    def of(cls, arrival_s: object, input_tokens: object, output_tokens: object,
           prefix_id: object = None, prefix_tokens: object = None,
           closed_loop: int = 0) -> Requests:
        """From array-likes (prefix columns optional)."""
        arrival = np.asarray(arrival_s, dtype=float).reshape(-1)
        n = len(arrival)
        ids = np.full(n, -1, np.int64) if prefix_id is None else np.asarray(prefix_id, np.int64)
        ptok = np.zeros(n, np.int64) if prefix_tokens is None else np.asarray(prefix_tokens,
                                                                               np.int64)
        return cls(arrival, np.asarray(input_tokens, np.int64).reshape(-1),
                   np.asarray(output_tokens, np.int64).reshape(-1),
                   np.where(ptok > 0, ids, -1), np.where(ids >= 0, ptok, 0), closed_loop)

    def take(self, keep: np.ndarray) -> Requests:
        """The requests ``keep`` picks (a boolean mask or increasing indices), every column
        with them; a closed loop keeps at most one user per request left."""
        def pick(a: np.ndarray | None) -> np.ndarray | None:
            return None if a is None else a[keep]
        n = len(self.arrival_s[keep])
        return Requests(self.arrival_s[keep], self.input_tokens[keep], self.output_tokens[keep],
                        self.prefix_id[keep], self.prefix_tokens[keep],
                        min(self.closed_loop, n), pick(self.prefilled), self.client_cap,
                        pick(self.session_id), pick(self.turn), pick(self.think_s),
                        pick(self.adapter))

    def __len__(self) -> int:
        return len(self.arrival_s)


# What a simulation keeps per request and per output token (each token's time, its step's
# log row): 58 B a token measured (maxrss, 2,000 against 8,000 requests of 512 output
# tokens, llama-3-8b on h100-sxm, --no-band), rounded up; the per-request figure covers
# the request arrays, the engine state and the merged results.
BYTES_PER_REQUEST = 512
BYTES_PER_OUTPUT_TOKEN = 64


def check_memory(n: int, mean_output: float, runs: int = 1, total: float | None = None
                 ) -> None:
    """SpecError, before anything is generated, for ``runs`` simulations of ``n`` requests
    of ``mean_output`` tokens each that would not fit in this machine's memory (``total``
    bytes, default the physical memory): 10^9 requests took 23 GB in 30 s and went on."""
    import os

    if total is None:
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    per = BYTES_PER_REQUEST + BYTES_PER_OUTPUT_TOKEN * mean_output
    need = n * per * runs
    if need > total:
        most = int(total // (per * runs))
        raise SpecError(f"--num-requests: {n:,} requests of {mean_output:g} output tokens "
                        f"need about {need / 1e9:,.0f} GB to simulate ({runs} run"
                        f"{'s' if runs > 1 else ''}: each token's time is kept), more than "
                        f"this machine's {total / 1e9:,.0f} GB; expected at most {most:,}")
