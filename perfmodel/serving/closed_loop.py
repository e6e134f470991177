"""A closed-loop client's round trip: each user sends its next request only once the last
chunk of its previous answer has reached it, and the engine sees that request only after
the API server has taken it in.

A benchmark client of C users (vLLM's ``benchmark_serving.py --max-concurrency C``: a
semaphore around each request task; the next task starts when one has read its response's
last chunk) does not hand the engine a new request at the instant the old one finished:
the finished request's last token reaches the client ``stream_s`` after its step ended
(``host_time.client_side``), and the new one reaches the engine's scheduler after the API
server's intake (``request_s`` plus ``prompt_token_s`` per prompt token:
``HostTime.intake``). Being later than the step's end, it is an arrival like any other:
it joins the first schedule whose cutoff it precedes. Under SGLang's overlap loop
(``scheduler.py`` ``event_loop_overlap``: batch n+1 is launched before batch n's result is
processed and streamed) that is two steps after the one that finished the old request, so
its prefill waits about two decode steps; under an engine that schedules at a step's start,
one. Without host time (``HostTime()``: GPU steps only, as ``perfmodel estimate``) the
loop stays as it was: the next request joins at once.

A conversation's later turns already wait so (``sessions.admitted``); this is the same
delay for a closed loop's users.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from perfmodel.serving.requests import Requests


def intake_s(requests: Requests, host: object) -> np.ndarray:
    """Each request's API-server intake, alone (no queue: a closed loop's users send one
    at a time), in seconds."""
    return host.request_s + host.prompt_token_s * requests.input_tokens.astype(float)


def admitted(requests: Requests, host: object) -> Requests:
    """A closed loop as the engine sees it: the first users' requests after their intake;
    each later one ``stream_s`` (its predecessor's last chunk reaching the client) plus its
    intake after the engine finished its predecessor (``arrival_s`` holds these delays,
    ``arrivals.Arrivals.finished`` adds them to the finish)."""
    if host.none or not requests.closed_loop:
        return requests
    users = min(requests.closed_loop, len(requests))
    gap = intake_s(requests, host)
    gap[users:] += host.stream_s
    return replace(requests, arrival_s=requests.arrival_s + gap)


def sent_s(engine_arrival_s: np.ndarray, requests: Requests, host: object) -> np.ndarray:
    """When the client sent each request of a closed loop: its engine arrival less its
    intake (``requests``: the client's)."""
    if host.none:
        return engine_arrival_s
    return engine_arrival_s - intake_s(requests, host)
