"""Conversations: requests that are the turns of a session. A turn's prompt is the
conversation so far (every earlier turn's prompt and answer) followed by its new message,
so its shared prefix is the previous turn's prompt plus output; the engine keeps a
finished turn's KV as the session's cached chain (``serving.engines.state._grow_chain``),
which the next turn hits unless it was evicted meanwhile.

A trace gives ``session_id`` (any text) and ``turn`` (whole numbers, increasing with
arrival within a session); ``input_tokens`` is the turn's whole prompt. ``generate`` makes
sessions of ``turns`` turns: the first prompt of the drawn input length, each later one
adding the previous answer and a new message of ``turn_growth`` tokens (drawn as the
inputs are).

When a turn is sent. A user sends the next turn ``think_time`` seconds after the client has
received the previous turn's last token (``Requests.think_s``): the engine sees it that
long after the previous turn finished there, plus the stream's delay to the client and
the new request's own API-server time (``serving.host_time``; it does not queue behind
other requests there), so a slow answer delays every later turn. The generator's first
turns arrive at the session starts (``rate / turns`` per second: the requests' rate is
then below ``rate`` by the answers' time); every later turn follows its answer. A trace's
turns keep their recorded ``arrival_s`` (a recorded client already waited for its
answers); ``after_answers`` (``simulate --trace F --think-time S``) re-sends each later
turn S seconds after the previous answer instead, the recorded times unused.

The answer's time is known only where the session's turns run on one engine: one replica,
or ``--router session-affinity``. Replicas dealt otherwise run apart, so there every turn
is sent at its nominal time (``at_nominal_times``: the generator's session start plus
``think_time`` per turn, arrival to arrival; a trace's recorded time), and the command
says so. A turn that arrives before the previous one has finished finds only what is
cached by then.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from perfmodel.serving import host_time
from perfmodel.serving.requests import Requests
from perfmodel.serving.results import SimResult
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
    """Sessions beginning at ``starts``: session j's turn k (0-based, k >= 1) is sent
    ``think_time`` after turn k-1's answer (nominal time ``starts[j] + k * think_time``);
    its prompt is turn k-1's prompt and output plus
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
    think = np.where(k > 0, float(think_time), np.nan)
    return Requests(arrival[order], prompt[order], outputs[order].astype(np.int64),
                    j[order].astype(np.int64), prefix[order], session_id=j[order],
                    turn=k[order] + 1, think_s=think[order])


def after_answers(requests: Requests, think_time: float, where: str = "--think-time"
                  ) -> Requests:
    """A trace's later turns re-sent ``think_time`` after the previous turn's answer (their
    recorded arrival times kept only as nominal times)."""
    check(1, think_time, 1)
    sid = requests.session_id
    if sid is None or not np.any(sid >= 0):
        raise SpecError(f"{where}: applies to a trace with session_id,turn columns (or to "
                        "--turns), expected conversations")
    first = np.zeros(len(sid), bool)
    first[np.unique(sid, return_index=True)[1]] = True
    later = (sid >= 0) & ~first
    return replace(requests, think_s=np.where(later, float(think_time), np.nan))


def follows(requests: Requests) -> np.ndarray:
    """Which requests are sent after their previous turn's answer."""
    if requests.think_s is None:
        return np.zeros(len(requests), bool)
    return np.isfinite(requests.think_s)


def at_nominal_times(requests: Requests) -> Requests:
    """Every turn sent at its nominal time (replicas that run apart)."""
    return replace(requests, think_s=None)


def engine_order(requests: Requests, idx: np.ndarray) -> np.ndarray:
    """An engine's requests ``idx`` (in arrival order) with those sent after an answer
    last (in order): the engine's open loop is the rest, by time."""
    dyn = follows(requests)[idx]
    return idx if not dyn.any() else np.concatenate([idx[~dyn], idx[dyn]])


def engine_view(requests: Requests, idx: np.ndarray, **changes: object) -> Requests:
    """An engine's requests ``idx`` (``engine_order``; ``changes`` to the part's fields)
    as ``serving.arrivals`` takes them: a turn sent after an answer arrives never on its
    own (time inf), only when that answer is."""
    dyn = follows(requests)[idx]
    if not dyn.any():
        return replace(requests.take(idx), **changes)
    part = replace(replace(requests, arrival_s=np.zeros(len(requests))).take(idx), **changes)
    with np.errstate(invalid="ignore"):         # inf - inf in the sortedness check
        return replace(part, arrival_s=np.where(dyn, np.inf, requests.arrival_s[idx]))


def next_turns(part: Requests) -> np.ndarray | None:
    """For each of an engine's requests (``engine_view``), the one sent after its answer
    (-1: none); None when there are none."""
    dyn = follows(part)
    if not dyn.any():
        return None
    order = np.argsort(part.session_id, kind="stable")      # a session's turns in order
    s = part.session_id[order]
    same = (s[1:] == s[:-1]) & (s[1:] >= 0) & dyn[order[1:]]
    out = np.full(len(part), -1, np.int64)
    out[order[:-1][same]] = order[1:][same]
    return out


def admitted(requests: Requests, host: host_time.HostTime
             ) -> tuple[Requests, np.ndarray | None]:
    """(the requests as the engine sees them, each later turn's own API-server time or
    None): the rest through ``host_time.admitted``; a turn sent after an answer waits
    ``think_s`` plus the stream's delay and its own API-server time after the engine
    finished the previous turn."""
    dyn = follows(requests)
    if not dyn.any():
        return host_time.admitted(requests, host), None
    arrival = requests.arrival_s.astype(float).copy()
    arrival[~dyn] = host_time.admitted(requests.take(~dyn), host).arrival_s
    work = np.zeros(len(requests))
    for tokens in np.unique(requests.input_tokens[dyn]).tolist():
        alone = float(host.admit(np.zeros(1), np.array([tokens]))[0])
        work[dyn & (requests.input_tokens == tokens)] = alone
    think = np.where(dyn, requests.think_s + host.stream_s + work, np.nan)
    seen = replace(requests, arrival_s=np.maximum.accumulate(arrival), think_s=think)
    return seen, work


def client_side(res: SimResult, engine_arrival: np.ndarray, requests: Requests,
                work: np.ndarray | None) -> SimResult:
    """``res`` (``host_time.client_side`` applied) with each turn sent after an answer sent
    at its engine arrival less its own API-server time."""
    if work is None:
        return res
    dyn = follows(requests)
    arrival = np.where(dyn, engine_arrival - work, res.arrival_s)
    info = dict(res.info)
    if "api_server_s" in info:
        info["api_server_s"] = np.where(dyn, work, info["api_server_s"])
    return replace(res, arrival_s=arrival, info=info)


def single_shot(requests: Requests, arrival_s: np.ndarray | None = None) -> Requests:
    """The same requests (times and lengths) as unrelated single-shot requests: the
    baseline a conversation's prefix-cache saving is measured against. ``arrival_s``: the
    times to send them at instead (a simulated conversation's, whose later turns followed
    its answers), in ``requests`` order."""
    times = requests.arrival_s if arrival_s is None else np.asarray(arrival_s, float)
    order = np.argsort(times, kind="stable")
    return Requests(times[order], requests.input_tokens[order],
                    requests.output_tokens[order], np.full(len(requests), -1, np.int64),
                    np.zeros(len(requests), np.int64), requests.closed_loop)


def check(turns: int, think_time: float, turn_growth: int) -> None:
    if isinstance(turns, bool) or not isinstance(turns, (int, np.integer)) or turns < 1:
        raise SpecError(f"--turns: expected a whole number >= 1, got {turns!r}")
    if not np.isfinite(think_time) or think_time < 0:
        raise SpecError(f"--think-time: expected seconds >= 0, got {think_time!r}")
    if isinstance(turn_growth, bool) or not isinstance(turn_growth, (int, np.integer)) \
            or turn_growth < 1:
        raise SpecError(f"--turn-growth: expected a whole number of tokens >= 1, got "
                        f"{turn_growth!r}")
