"""Request streams: made from a rate or a number of users and a length distribution
(``generate``), read from and written to a CSV trace (``read_trace``, ``write_trace``: their
home is ``serving.trace``, which describes the format), and summed up in one line
(``describe``).
"""

from __future__ import annotations

import math

import numpy as np

from perfmodel.serving.requests import Requests
from perfmodel.serving.trace import MAX_ARRIVAL_S
from perfmodel.serving.trace import read_trace as read_trace
from perfmodel.serving.trace import write_trace as write_trace
from perfmodel.specs.errors import SpecError, did_you_mean
from perfmodel.specs.workload import MAX_TOKENS

ARRIVALS = ("poisson", "constant", "gamma")
LENGTH_DISTS = ("fixed", "uniform", "lognormal", "empirical")
DEFAULT_SPREAD = 0.5   # uniform: +-50% around the mean; lognormal: sigma 0.5 (CV 0.53)
MAX_LOGNORMAL_SIGMA = 3.0      # CV 90, median mean/90: wider puts most requests at 1 token


def generate(n: int, *, rate: float | None = None, concurrency: int = 0,
             arrival: str = "poisson", burstiness: float = 1.0, input_len: int,
             output_len: int, length_dist: str = "fixed", spread: float = DEFAULT_SPREAD,
             lengths_from: Requests | None = None, shared_prefix: int = 0,
             seed: int = 0, turns: int = 1, think_time: float = 0.0,
             turn_growth: int | None = None, rate_shape: object = None) -> Requests:
    """``n`` requests, open loop at ``rate`` req/s or closed loop with ``concurrency`` users.

    Arrivals (open loop; the first arrives one gap after t=0), as vLLM's ``vllm bench
    serve`` makes them (``get_request`` in vllm-project/vllm ``vllm/benchmarks/serve.py``,
    commit 009e6d4a): gaps are gamma with shape ``burstiness`` and scale
    ``1/(rate*burstiness)``, so the mean gap is 1/rate and the squared coefficient of
    variation is 1/burstiness (below 1: burstier than Poisson; inf: constant gaps), and the
    arrival times are then scaled so the last one lands at exactly ``n/rate``. "poisson" is
    burstiness 1, "constant" gaps of exactly 1/rate; ``rate`` inf: all arrive at t=0.
    Closed loop: ``closed_loop=concurrency`` and think time 0 (``arrival_s`` all 0).

    Lengths (``input_len``/``output_len`` are the means; ignored by "empirical"):
    "fixed"; "uniform": integers in [floor(L*(1-spread)), ceil(L*(1+spread))], at least 1,
    spread in [0, 1) (vLLM's random dataset with ``--random-range-ratio spread``);
    "lognormal": log-normal with mean L and sigma ``spread``, rounded, at least 1;
    "empirical": (input, output) pairs drawn with replacement from ``lengths_from``.

    ``shared_prefix`` S > 0: every prompt is one shared S-token system prompt followed by the
    request's own tokens, so input = S + own length (prefix_id 0, prefix_tokens S).

    ``turns`` > 1: conversations of that many turns (``serving.sessions.generate``; the
    sessions start at ``rate / turns`` per second, so requests arrive at about ``rate``;
    a later turn adds the last answer and ``turn_growth`` new tokens, mean, default
    ``input_len``, drawn as inputs are, from a fourth spawned generator).

    ``rate_shape`` (``serving.rate_shape.RateShape``, Poisson arrivals only): a rate that
    varies over time about ``rate``, drawn by thinning (``serving.rate_shape``).

    One seed gives one stream; arrivals, input and output lengths each draw from their own
    ``np.random.default_rng`` spawned from ``np.random.SeedSequence(seed)``, so a new rate
    keeps the lengths and a new output length keeps the inputs and arrivals.
    """
    _check_int(n, "--num-requests", 1)
    _check_load(rate, concurrency, arrival, burstiness)
    _check_int(shared_prefix, "--shared-prefix", 0)
    _check_int(seed, "--seed", 0)
    arrival_rng, input_rng, output_rng = (
        np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(3))
    inputs, outputs = _lengths(n, length_dist, input_len, output_len, spread, lengths_from,
                               input_rng, output_rng)
    if rate_shape is not None and (rate is None or arrival != "poisson" or turns != 1):
        raise SpecError("--rate-shape: shapes a Poisson --rate (--arrival poisson, one "
                        "turn a conversation)")
    if turns != 1 or think_time or turn_growth is not None:
        return _conversations(n, rate, arrival, burstiness, dist_args=(
            length_dist, spread), inputs=inputs, outputs=outputs, seed=seed, turns=turns,
            think_time=think_time, turn_growth=turn_growth or input_len,
            arrival_rng=arrival_rng, concurrency=concurrency, shared_prefix=shared_prefix)
    if rate is None:
        times = np.zeros(n)
    else:
        times = _arrival_times(n, rate, arrival, burstiness, arrival_rng) \
            if rate_shape is None else _shaped(n, rate, rate_shape, arrival_rng)
        _check_span(times, n, rate)
    prefix_id = np.full(n, 0 if shared_prefix else -1, np.int64)
    return Requests(times, inputs + shared_prefix, outputs, prefix_id,
                    np.full(n, shared_prefix, np.int64), concurrency)


def _conversations(n: int, rate: float | None, arrival: str, burstiness: float, *,
                   dist_args: tuple, inputs: np.ndarray, outputs: np.ndarray, seed: int,
                   turns: int, think_time: float, turn_growth: int,
                   arrival_rng: np.random.Generator, concurrency: int,
                   shared_prefix: int) -> Requests:
    from perfmodel.serving import sessions

    sessions.check(turns, think_time, turn_growth)
    if rate is None or concurrency or shared_prefix:
        raise SpecError("--turns: conversations need --rate (open loop) and no "
                        "--shared-prefix (a turn's prefix is the conversation so far)")
    count = -(-n // turns)
    starts = _arrival_times(count, rate / turns, arrival, burstiness, arrival_rng)
    _check_span(starts, n, rate)
    growth_rng = np.random.default_rng(np.random.SeedSequence(seed).spawn(4)[3])
    growth = _sample(n, dist_args[0] if dist_args[0] != "empirical" else "fixed",
                     turn_growth, dist_args[1], growth_rng)
    # the last session is cut short to give n requests: its missing turns are padded (by
    # repeating the draws, which may be fewer than the padding: 20 requests of 50 turns)
    full = [np.resize(a, count * turns) for a in (inputs, growth, outputs)]
    reqs = sessions.generate(starts, *full[:2], full[2], turns, think_time)
    keep = np.sort(np.argsort(reqs.session_id * turns + reqs.turn, kind="stable")[:n])
    return reqs.take(keep)


def check_lengths(input_len: object, output_len: object) -> None:
    """SpecError for a mean length that is not a whole number in [1, MAX_TOKENS]."""
    _check_int(input_len, "--input-len", 1, MAX_TOKENS)
    _check_int(output_len, "--output-len", 1, MAX_TOKENS)


def _check_span(times: np.ndarray, n: int, rate: float) -> None:
    """SpecError for generated arrivals past MAX_ARRIVAL_S, as a trace's are (--rate 1e-300
    printed a 300-digit duration)."""
    if len(times) and times[-1] > MAX_ARRIVAL_S:
        raise SpecError(f"--rate: {rate:g} req/s spreads {n:,} requests over "
                        f"{times[-1]:.3g} s; expected arrivals within {MAX_ARRIVAL_S:g} s "
                        f"(about 32 years): a higher rate")


def _check_int(value: object, flag: str, minimum: int, maximum: int | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum \
            or (maximum is not None and value > maximum):
        within = f">= {minimum}" if maximum is None else f"in [{minimum}, {maximum:,}]"
        raise SpecError(f"{flag}: expected a whole number {within}, got {value!r}")


def _check_choice(value: str, flag: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise SpecError(f"{flag}: expected one of {', '.join(choices)}, got {value!r}"
                        f"{did_you_mean(value, choices)}")


def _check_load(rate: float | None, concurrency: int, arrival: str, burstiness: float) -> None:
    """Exactly one of rate and concurrency; arrival and burstiness fit the one given."""
    _check_int(concurrency, "--concurrency", 0)
    if (rate is None) == (concurrency == 0):
        raise SpecError("give exactly one of --rate (requests/s, open loop) and "
                        f"--concurrency (users, closed loop); got --rate {rate} and "
                        f"--concurrency {concurrency}")
    _check_choice(arrival, "--arrival", ARRIVALS)
    if not burstiness > 0:
        raise SpecError(f"--burstiness: expected a number > 0, got {burstiness}")
    if rate is None:
        if arrival != "poisson" or burstiness != 1.0:
            raise SpecError("--arrival and --burstiness apply only with --rate (open loop); "
                            f"--concurrency {concurrency} sends each user's next request "
                            "when its last one finishes")
        return
    if not rate > 0:
        raise SpecError(f"--rate: expected requests per second > 0, got {rate}")
    if burstiness != 1.0 and arrival != "gamma":
        raise SpecError(f"--burstiness applies only to --arrival gamma, got --arrival "
                        f"{arrival} with --burstiness {burstiness}")


def _arrival_times(n: int, rate: float, arrival: str, burstiness: float,
                   rng: np.random.Generator) -> np.ndarray:
    """Arrival times from t=0, the first one gap in (vLLM ``get_request``, see ``generate``)."""
    if math.isinf(rate):
        return np.zeros(n)
    if arrival == "constant" or math.isinf(burstiness):
        return np.arange(1, n + 1) / rate
    shape = burstiness if arrival == "gamma" else 1.0
    times = np.cumsum(rng.gamma(shape, 1.0 / (rate * shape), size=n))
    return times * (n / rate / times[-1])   # vLLM: the last request at exactly n/rate


def _shaped(n: int, rate: float, shape: object, rng: np.random.Generator) -> np.ndarray:
    from perfmodel.serving import rate_shape

    return rate_shape.arrival_times(n, rate, shape, rng)


def _lengths(n: int, dist: str, input_len: int, output_len: int, spread: float,
             lengths_from: Requests | None, input_rng: np.random.Generator,
             output_rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(input, output) token counts of ``n`` requests (own tokens, before a shared prefix)."""
    _check_choice(dist, "--length-dist", LENGTH_DISTS)
    if (dist == "empirical") != (lengths_from is not None):
        raise SpecError("--length-dist empirical needs a trace to draw lengths from "
                        f"(--lengths-from), and only it takes one; got --length-dist {dist} "
                        f"{'with' if lengths_from is not None else 'without'} one")
    if lengths_from is not None:
        pick = input_rng.integers(0, len(lengths_from), size=n)
        return (lengths_from.input_tokens[pick].astype(np.int64),
                lengths_from.output_tokens[pick].astype(np.int64))
    check_lengths(input_len, output_len)
    _check_spread(dist, spread)
    return (_sample(n, dist, input_len, spread, input_rng),
            _sample(n, dist, output_len, spread, output_rng))


def _check_spread(dist: str, spread: float) -> None:
    """uniform: [0, 1); lognormal: [0, 3] (sigma 50 put every request at 1 token: the
    median is the mean times exp(-sigma^2/2)); fixed: >= 0 (unused)."""
    if dist == "uniform":
        ok, within = 0 <= spread < 1.0, "in [0, 1) (a fraction of the mean)"
    elif dist == "lognormal":
        ok = 0 <= spread <= MAX_LOGNORMAL_SIGMA
        within = (f"in [0, {MAX_LOGNORMAL_SIGMA:g}] (the sigma of log length; "
                  f"{MAX_LOGNORMAL_SIGMA:g} already puts the median at mean/90)")
    else:
        ok, within = spread >= 0, ">= 0"
    if not ok:
        raise SpecError(f"--spread: expected a number {within} for --length-dist {dist}, "
                        f"got {spread}")


def _sample(n: int, dist: str, mean: int, spread: float,
            rng: np.random.Generator) -> np.ndarray:
    if dist == "fixed":
        return np.full(n, mean, np.int64)
    if dist == "uniform":
        low = max(1, math.floor(mean * (1 - spread)))
        return rng.integers(low, math.ceil(mean * (1 + spread)) + 1, size=n, dtype=np.int64)
    mu = math.log(mean) - spread**2 / 2   # E[exp(N(mu, s^2))] = exp(mu + s^2/2) = mean
    return np.maximum(1, np.rint(rng.lognormal(mu, spread, size=n))).astype(np.int64)


def within_limit(requests: Requests, limit: int) -> tuple[Requests, int]:
    """``requests`` less those whose input + output passes ``limit`` tokens (the context
    limit), and how many went: vLLM's OpenAI server answers such a request with HTTP 400
    ("This model's maximum context length is ... tokens", ``OpenAIServing._validate_input``
    in vllm-project/vllm ``vllm/entrypoints/openai/serving_engine.py``) and ``vllm bench
    serve`` counts it as failed; it never reaches the engine. Raises SpecError when none
    is left."""
    keep = requests.input_tokens + requests.output_tokens <= limit
    dropped = int(len(keep) - np.count_nonzero(keep))
    if not dropped:
        return requests, 0
    if not np.any(keep):
        raise SpecError(f"simulate: every one of the {len(keep)} requests is longer (input + "
                        f"output) than the context limit {limit}; expected shorter lengths "
                        "or a larger --max-model-len")
    return requests.take(keep), dropped


def describe(requests: Requests) -> str:
    """One line: how many requests, their rate or users, mean lengths and prefix sharing."""
    n = len(requests)
    return (f"{n} request{'' if n == 1 else 's'}, {_load_text(requests)}; mean input "
            f"{float(np.mean(requests.input_tokens)):.0f} tokens, mean output "
            f"{float(np.mean(requests.output_tokens)):.0f} tokens; {_prefix_text(requests)}")


def _load_text(requests: Requests) -> str:
    if requests.closed_loop:
        think = float(np.mean(requests.arrival_s))
        return (f"closed loop, {requests.closed_loop} concurrent users"
                + (f", mean think time {think:.3g} s" if think > 0 else ""))
    last = float(requests.arrival_s[-1])
    if last <= 0:
        return "all arriving at t=0"
    return f"{len(requests) / last:.3g} req/s over {last:.4g} s"


def _prefix_text(requests: Requests) -> str:
    shared = requests.prefix_id >= 0
    if not np.any(shared):
        return "no shared prefix"
    groups = len(np.unique(requests.prefix_id[shared]))
    tokens = float(np.sum(requests.prefix_tokens)) / float(np.sum(requests.input_tokens))
    return (f"{np.mean(shared):.0%} share {'a prefix' if groups == 1 else f'{groups} prefixes'}"
            f" ({tokens:.0%} of prompt tokens)")
