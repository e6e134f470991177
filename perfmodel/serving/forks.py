"""Running an engine's scheduler ahead without copying every request's state: the dry runs
``serving.engine_loop`` prices ahead (``serving.lookahead``) work on a fork of the state that
shares its per-request arrays and writes them in place; ``rollback`` undoes what the fork
wrote, ``mark`` / ``back_to`` return a fork to an earlier step. Only the rows of requests
admitted and not finished (``lo:top``) can be written, so only they are saved: the cost of
a look-ahead follows the requests in flight, not the length of the trace.

A scheduler that writes a request's row for the first time calls ``admit`` first, and a
per-request array that scheduling changes is listed in the state's ``MUTABLE``.
"""

from __future__ import annotations

import copy
from collections import deque


class Forkable:
    """Forks, copies and marks of an engine state (``serving.engines.state.EngineState``)."""

    MUTABLE: tuple[str, ...] = ()

    def _detached(self) -> Forkable:
        """A shallow copy with its own queues, pool and list of late finishes."""
        new = copy.copy(self)
        new.pool, new.running, new.waiting = self.pool.copy(), list(self.running), \
            deque(self.waiting)
        new.saved, new.late = (), list(self.late)
        if self.lora is not None:
            new.lora = self.lora.copy()
        return new

    def fork(self) -> Forkable:
        """A state to run ahead on, the dry run's: its own queues and pool, and the same
        per-request arrays, written in place; ``rollback`` undoes what it wrote."""
        while self.lo < self.top and self.emitted[self.lo] >= self.output[self.lo] and \
                not self.padded[self.lo]:       # finished and freed: its rows are final
            self.lo += 1
        self.saved = tuple(getattr(self, f)[self.lo:self.top].copy() for f in self.MUTABLE)
        return self._detached()

    def copy(self) -> Forkable:
        """An independent copy, every per-request array copied: for a look-ahead that is
        simply dropped (``serving.pipeline``'s), where ``fork`` needs its ``rollback``."""
        new = self._detached()
        for f in self.MUTABLE:
            setattr(new, f, getattr(self, f).copy())
        return new

    def rollback(self, fork: Forkable) -> None:
        """Undo what ``fork``, made by ``self.fork()``, wrote in the shared arrays: the rows
        saved back, those of the requests it admitted first back to zero."""
        for f, rows in zip(self.MUTABLE, self.saved, strict=True):
            a = getattr(self, f)
            a[self.lo:self.top] = rows
            a[self.top:fork.top] = 0
        self.saved = ()

    def mark(self) -> tuple:
        """What ``back_to`` needs to return a fork to where it is now."""
        rows = tuple(getattr(self, f)[self.lo:self.top].copy() for f in self.MUTABLE)
        return self._detached(), rows

    def back_to(self, mark: tuple) -> Forkable:
        """The fork as it was at ``mark`` (its ``mark()``): the shared arrays' rows put
        back, those of requests it admitted since back to zero."""
        here, rows = mark
        for f, saved in zip(self.MUTABLE, rows, strict=True):
            a = getattr(self, f)
            a[self.lo:here.top] = saved
            a[here.top:self.top] = 0
        return here

    def admit(self, r: int) -> None:
        """``r`` is about to be written for the first time (it leaves the queue)."""
        if r >= self.top:
            self.top = r + 1
