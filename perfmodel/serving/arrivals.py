"""Requests yet to arrive at an engine: an open loop's fixed times, in order, or a closed
loop's users, each sending its next request when its last one finishes (after that
request's think time), and a conversation's later turns, each sent when the previous turn
finishes (after its think time: ``serving.sessions``; the engine's requests come with
those last, ``sessions.engine_view``). Both wait in ``pending``: one home for a request
sent a think time after another finished."""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

import numpy as np

from perfmodel.serving import sessions
from perfmodel.serving.requests import Requests


@dataclass(eq=False)
class Arrivals:
    """``next_open``: the open loop's next request (requests are in arrival order);
    ``pending``: a closed loop's requests sent after a think time, by time."""

    requests: Requests
    next_open: int = 0
    pending: list = field(default_factory=list)     # heap of (time, request)
    next_closed: int = 0
    arrival_s: np.ndarray = field(default_factory=lambda: np.zeros(0))
    finished_total: int = 0
    held_upto: float = -np.inf      # requests due by then were held back by the cap
    follow: np.ndarray | None = None    # the turn sent after each request's answer (-1)

    @property
    def cap(self) -> float:
        return self.requests.client_cap or np.inf

    def limit(self, finished: int = 0) -> float:
        """Open-loop requests that may have been sent once ``finished`` more are done."""
        return self.finished_total + finished + self.cap

    def __post_init__(self) -> None:
        r = self.requests
        self.arrival_s = r.arrival_s.astype(float).copy()
        self.follow = sessions.next_turns(r)
        if r.closed_loop:
            users = min(r.closed_loop, len(r))
            self.pending = [(float(r.arrival_s[i]), i) for i in range(users)]
            heapq.heapify(self.pending)
            self.next_closed = users
            self.next_open = len(r)

    def next_time(self) -> float:
        times = [np.inf]
        if self.next_open < len(self.requests):
            times.append(float(self.requests.arrival_s[self.next_open]))
        if self.pending:
            times.append(self.pending[0][0])
        return min(times)

    def due(self, t: float) -> list[int]:
        """Requests arrived by ``t``, in arrival order."""
        out = []
        while self.pending and self.pending[0][0] <= t:
            time, i = heapq.heappop(self.pending)
            self.arrival_s[i] = time
            out.append(i)
        sent, r, room = len(out), self.requests, self.limit()
        while self.next_open < min(len(r), room) and r.arrival_s[self.next_open] <= t:
            i = self.next_open
            self.arrival_s[i] = t if r.arrival_s[i] <= self.held_upto else r.arrival_s[i]
            out.append(i)
            self.next_open += 1
        held = self.next_open < len(r) and r.arrival_s[self.next_open] <= t
        self.held_upto = t if held else -np.inf
        if sent and len(out) > sent:       # turns after a think time among open arrivals
            out.sort(key=lambda i: self.arrival_s[i])
        return out

    def finished(self, t: float, done: np.ndarray) -> list[int]:
        """Requests ``done`` finished at ``t``: a closed loop's users send their next ones,
        those with no think time returned (they join at once), the others pending; a
        conversation's next turns pending (``think_s`` after ``t``)."""
        now = []
        count = len(done)
        self.finished_total += count
        if self.follow is not None:
            for j in self.follow[done].tolist():
                if j >= 0:
                    heapq.heappush(self.pending, (t + float(self.requests.think_s[j]), j))
        for _ in range(count):
            if not self.requests.closed_loop or self.next_closed >= len(self.requests):
                break
            i = self.next_closed
            self.next_closed += 1
            think = float(self.requests.arrival_s[i])
            if think <= 0:
                self.arrival_s[i] = t
                now.append(i)
            else:
                heapq.heappush(self.pending, (t + think, i))
        return now

    def sends_after(self, done: np.ndarray) -> bool:
        """Whether a request in ``done`` has a turn sent after its answer."""
        return self.follow is not None and bool((self.follow[done] >= 0).any())

    def open_count(self, t: np.ndarray | float, limit: np.ndarray | float = np.inf
                   ) -> np.ndarray | int:
        """Open-loop requests sent by ``t`` (counted from the first), at most ``limit``."""
        if self.requests.closed_loop:
            return np.zeros(np.shape(t), np.int64) + self.next_open
        return np.minimum(np.searchsorted(self.requests.arrival_s, t, side="right"), limit)
