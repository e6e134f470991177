"""The dry run ``serving.engine_loop`` prices steps ahead with: the scheduler run forward on a
copy of an engine's state, letting arrivals in where a guess of each step's time places
them (``Guess``, fitted to the steps priced so far). Only where arrivals land rests on the
guess: ``serving.engine_loop`` prices every step it commits and keeps those that stand.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from perfmodel.serving.engines.state import EngineState

MARK_EVERY = 8      # dry-run steps between marks: a look-ahead cut short at step j resumes
                    # from the last mark before j, and only the steps since are run again


class Guess:
    """A step's time guessed before it is priced, to place arrivals in a dry run: least-
    squares fits of the steps priced so far on the step's tokens, sequences, cached context
    and prompt-chunk attention (recent steps weigh most), one for steps with a prompt chunk
    and one for pure decodes (priced as a prefill and as a graph replay, compute- and
    memory-bound: one line through both misplaces arrivals). Once ``TABLE_AFTER`` steps
    have been priced, each fit also reads the time of one prompt of the step's tokens, or of
    a decode step of its sequences, from ``tables`` (``StepPricer.tables``: the GEMMs' tile
    and wave steps, which no line follows). Only where arrivals land rests on it: every
    committed step is priced."""

    TABLE_AFTER = 64    # steps priced before the tables are worth their pricing calls
    UNIT = 16           # tokens between the prompt table's entries
    SEQS = 512          # the decode table's largest step (beyond it, scaled)

    def __init__(self) -> None:
        self.xtx = np.stack([np.eye(6) * 1e-9] * 2)
        self.xty = np.zeros((2, 6))
        self.coef = np.array([[1e-3, 0, 0, 0, 0, 0]] * 2)
        self.lookahead = 16
        self.tables: tuple | None = None
        self.steps = 0
        self.marks = True   # the last look-ahead was cut: mark this one (marks cost a copy)

    def features(self, batch: object) -> np.ndarray:
        """The fit's six features and, last, which fit (1: a prompt chunk)."""
        new, ctx = batch.new, batch.context
        tokens, seqs = int(new.sum()), len(batch.ids)
        attn, one = 0.0, 0.0
        if batch.prefill:
            attn = float((new * ctx)[new > 1].sum()) * 1e-6
        if self.tables is not None:
            table = self.tables[0 if batch.prefill else 1]
            at, unit = (tokens, self.UNIT) if batch.prefill else (seqs, 1)
            one = float(table[min(-(-at // unit), len(table)) - 1]) * \
                max(1.0, at / (len(table) * unit))
        return np.array([1.0, tokens, seqs, ctx.sum() * 1e-3, attn, one,
                         float(batch.prefill)])

    def __call__(self, features: np.ndarray) -> float:
        return float(features[:6] @ self.coef[int(features[6])])

    def learn(self, features: list, times: np.ndarray) -> None:
        x = np.array(features)
        self.steps += len(x)
        for kind in (0, 1):
            mine = x[:, 6] == kind
            if not mine.any():
                continue
            xk = x[mine, :6]
            self.xtx[kind] = 0.9 * self.xtx[kind] + xk.T @ xk
            self.xty[kind] = 0.9 * self.xty[kind] + xk.T @ times[mine]
            self.coef[kind] = np.linalg.lstsq(self.xtx[kind] + np.eye(6) * 1e-12,
                                              self.xty[kind], rcond=None)[0]

    @property
    def wants_tables(self) -> bool:
        return self.tables is None and self.steps >= self.TABLE_AFTER


@dataclass(eq=False)
class Dry:
    """Steps formed ahead on a fork of the state: each step's batch and effect (emitted,
    their output counts, finished, KV blocks in use, waiting), the open-loop arrivals the
    dry run had let in before it (``seen``) and the highest request it had scheduled; every
    ``MARK_EVERY`` steps, the state before the step (``marks``)."""

    state: EngineState
    plans: list = field(default_factory=list)
    effects: list = field(default_factory=list)
    seen: list = field(default_factory=list)
    top: list = field(default_factory=list)
    features: list = field(default_factory=list)
    ended: list = field(default_factory=list)     # requests finished before each step
    marks: dict = field(default_factory=dict)     # step -> the state before it (``mark``)


def dry_run(run: object, guess: Guess) -> Dry:
    """Up to ``LOOKAHEAD`` steps formed from a copy of the state, letting in the open loop's
    arrivals at the steps the guessed times place them (a closed loop's users with no
    think time send their next requests at once; one with a think time ends the run)."""
    dry = Dry(run.state.fork())
    arrivals = run.arrivals
    sched = arrivals.requests.arrival_s
    closed = arrivals.requests.closed_loop
    seen, queued, top, t, ended = arrivals.next_open, arrivals.next_closed, -1, run.t, 0
    cut = run.cutoff            # a step's schedule sees the arrivals by then
    for j in range(guess.lookahead):
        if j and j % MARK_EVERY == 0 and guess.marks:
            dry.marks[j] = dry.state.mark()
        room = min(len(sched), arrivals.limit(ended))
        while j and not closed and seen < room and sched[seen] <= cut:
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
        cut = t if dry.state.lag else None      # async scheduling: this step's start
        t += guess(dry.features[-1])
        cut = t if cut is None else cut
        ended += len(done)
        if t >= run.horizon or (len(done) and arrivals.sends_after(done)):
            break       # a turn sent after an answer: its time rests on this step's end
        if closed and len(done):
            nxt = list(range(queued, min(queued + len(done), len(sched))))
            queued += len(nxt)
            dry.state.waiting.extend(i for i in nxt if sched[i] <= 0)   # sent at once
            if any(sched[i] > 0 for i in nxt):      # one sent after a think time: its
                break                               # arrival is not placed ahead
        if (not dry.state.running and not dry.state.waiting) or dry.state.stalled():
            break
    return dry
