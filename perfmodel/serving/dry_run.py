"""The dry run ``serving.simulate`` prices steps ahead with: the scheduler run forward on a
copy of an engine's state, letting arrivals in where a guess of each step's time places
them (``Guess``, fitted to the steps priced so far). Only where arrivals land rests on the
guess: ``serving.simulate`` prices every step it commits and keeps those that stand.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from perfmodel.serving.scheduler import EngineState


class Guess:
    """A step's time guessed before it is priced, to place arrivals in a dry run: a least-
    squares fit of the steps priced so far on the step's tokens, sequences, cached context
    and prompt-chunk attention (recent steps weigh most). Only where arrivals land rests on
    it: every committed step is priced."""

    def __init__(self) -> None:
        self.xtx = np.eye(5) * 1e-9
        self.xty = np.zeros(5)
        self.coef = np.array([1e-3, 0, 0, 0, 0])
        self.lookahead = 16

    @staticmethod
    def features(batch: object) -> np.ndarray:
        chunk = batch.new > 1
        return np.array([1.0, batch.new.sum(), len(batch.ids), batch.context.sum() * 1e-3,
                         (batch.new * batch.context)[chunk].sum() * 1e-6])

    def __call__(self, features: np.ndarray) -> float:
        return float(features @ self.coef)

    def learn(self, features: list, times: np.ndarray) -> None:
        x = np.array(features)
        self.xtx = 0.9 * self.xtx + x.T @ x
        self.xty = 0.9 * self.xty + x.T @ times
        self.coef = np.linalg.lstsq(self.xtx + np.eye(5) * 1e-12, self.xty, rcond=None)[0]


@dataclass(eq=False)
class Dry:
    """Steps formed ahead on a copy of the state: each step's batch and effect (emitted,
    their output counts, finished, KV blocks in use, waiting), the open-loop arrivals the
    dry run had let in before it (``seen``) and the highest request it had scheduled."""

    state: EngineState
    plans: list = field(default_factory=list)
    effects: list = field(default_factory=list)
    seen: list = field(default_factory=list)
    top: list = field(default_factory=list)
    features: list = field(default_factory=list)
    ended: list = field(default_factory=list)     # requests finished before each step


def dry_run(run: object, guess: Guess) -> Dry:
    """Up to ``LOOKAHEAD`` steps formed from a copy of the state, letting in the open loop's
    arrivals at the steps the guessed times place them (a closed loop's users with no
    think time send their next requests at once; one with a think time ends the run)."""
    dry = Dry(run.state.fork())
    arrivals = run.arrivals
    sched = arrivals.requests.arrival_s
    closed = arrivals.requests.closed_loop
    seen, queued, top, t, ended = arrivals.next_open, arrivals.next_closed, -1, run.t, 0
    for j in range(guess.lookahead):
        room = min(len(sched), arrivals.limit(ended))
        while j and not closed and seen < room and sched[seen] <= t:
            dry.state.waiting.append(seen)
            seen += 1
        batch = dry.state.schedule()
        if batch is None:
            break
        emit, done = dry.state.commit(batch)
        top = max(top, int(batch.ids.max()))
        dry.plans.append(batch)
        dry.effects.append((emit, dry.state.emitted[emit], done, dry.state.pool.used,
                            len(dry.state.waiting)))
        dry.seen.append(seen)
        dry.top.append(top)
        dry.ended.append(ended)
        dry.features.append(guess.features(batch))
        t += guess(dry.features[-1])
        ended += len(done)
        if t >= run.horizon:
            break
        if closed and len(done):
            nxt = list(range(queued, min(queued + len(done), len(sched))))
            queued += len(nxt)
            if any(sched[i] > 0 for i in nxt):
                break
            dry.state.waiting.extend(nxt)
        if not dry.state.running and not dry.state.waiting:
            break
    return dry
