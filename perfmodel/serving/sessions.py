"""Conversations: requests that are the turns of a session. A turn's prompt is the
conversation so far (every earlier turn's prompt and answer) followed by its new message,
so its shared prefix is the previous turn's prompt plus output; the engine keeps a
finished turn's KV as the session's cached chain (``serving.scheduler._grow_chain``),
which the next turn hits unless it was evicted meanwhile.

A trace gives ``session_id`` (any text) and ``turn`` (whole numbers, increasing with
arrival within a session); ``input_tokens`` is the turn's whole prompt. ``generate`` makes
sessions of ``turns`` turns: the first prompt of the drawn input length, each later one
adding the previous answer and a new message of ``turn_growth`` tokens (drawn as the
inputs are); turns of a session arrive ``think_time`` seconds apart (the gap a trace
records between a user's turns: the answer's time and the user's). A turn that arrives
before the previous one has finished finds only what is cached by then.
"""

from __future__ import annotations

import numpy as np

from perfmodel.serving.requests import Requests
from perfmodel.specs.errors import SpecError


def attach(requests: Requests, session: list[str], turn: list[int], where: str) -> Requests:
    """``requests`` (in arrival order) with the sessions of a trace: ``session`` labels
    ("" none) and ``turn`` numbers, in the same order. Each turn's prefix is the previous
    turn's prompt plus output; the session's chain id is its ``prefix_id``."""
    if np.any(requests.prefix_id >= 0):
        raise SpecError(f"{where}: give prefix_id/prefix_tokens or session_id/turn, not both "
                        "(a session's prefix is its conversation so far)")
    n = len(requests)
    ids: dict[str, int] = {}
    sid = np.array([ids.setdefault(s, len(ids)) if s else -1 for s in session], np.int64)
    ptok = np.zeros(n, np.int64)
    last: dict[int, tuple[int, int]] = {}     # session -> (turn, its prompt + output)
    for i in range(n):
        s = int(sid[i])
        if s < 0:
            continue
        if s in last:
            before, context = last[s]
            if turn[i] <= before:
                raise SpecError(f"{where}: session {session[i]!r}: turn {turn[i]} arrives "
                                f"after turn {before}, expected a later turn")
            if context > requests.input_tokens[i]:
                raise SpecError(f"{where}: session {session[i]!r} turn {turn[i]}: "
                                f"input_tokens {int(requests.input_tokens[i])} is shorter "
                                f"than the conversation so far ({context} tokens: the last "
                                "turn's input and output), expected at least that")
            ptok[i] = context
        last[s] = (turn[i], int(requests.input_tokens[i] + requests.output_tokens[i]))
    return Requests(requests.arrival_s, requests.input_tokens, requests.output_tokens, sid,
                    ptok, requests.closed_loop, session_id=sid,
                    turn=np.asarray(turn, np.int64))


def generate(starts: np.ndarray, first: np.ndarray, growth: np.ndarray, outputs: np.ndarray,
             turns: int, think_time: float) -> Requests:
    """Sessions beginning at ``starts``: session j's turn k (0-based) arrives at
    ``starts[j] + k * think_time``; its prompt is turn k-1's prompt and output plus
    ``growth`` new tokens (turn 0: ``first``). ``first``, ``growth`` and ``outputs`` hold
    one entry per request, session-major."""
    sessions = len(starts)
    k = np.tile(np.arange(turns), sessions)
    j = np.repeat(np.arange(sessions), turns)
    arrival = starts[j] + k * think_time
    prompt = np.where(k == 0, first, growth).astype(np.int64)
    prefix = np.zeros(len(k), np.int64)
    for t in range(1, turns):       # turn t's prompt extends turn t-1's prompt and answer
        now, before = k == t, k == t - 1
        prefix[now] = prompt[before] + outputs[before]
        prompt[now] += prefix[now]
    order = np.argsort(arrival, kind="stable")
    return Requests(arrival[order], prompt[order], outputs[order].astype(np.int64),
                    j[order].astype(np.int64), prefix[order], session_id=j[order],
                    turn=k[order] + 1)


def single_shot(requests: Requests) -> Requests:
    """The same requests (times and lengths) as unrelated single-shot requests: the
    baseline a conversation's prefix-cache saving is measured against."""
    return Requests(requests.arrival_s, requests.input_tokens, requests.output_tokens,
                    np.full(len(requests), -1, np.int64), np.zeros(len(requests), np.int64),
                    requests.closed_loop)


def check(turns: int, think_time: float, turn_growth: int) -> None:
    if isinstance(turns, bool) or not isinstance(turns, (int, np.integer)) or turns < 1:
        raise SpecError(f"--turns: expected a whole number >= 1, got {turns!r}")
    if not np.isfinite(think_time) or think_time < 0:
        raise SpecError(f"--think-time: expected seconds >= 0, got {think_time!r}")
    if isinstance(turn_growth, bool) or not isinstance(turn_growth, (int, np.integer)) \
            or turn_growth < 1:
        raise SpecError(f"--turn-growth: expected a whole number of tokens >= 1, got "
                        f"{turn_growth!r}")
