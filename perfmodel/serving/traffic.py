"""Request streams: made from a rate or a number of users and a length distribution
(``generate``), read from and written to a CSV trace (``read_trace``, ``write_trace``), and
summed up in one line (``describe``).

A trace is a CSV file with the header ``arrival_s,input_tokens,output_tokens`` and, optionally,
``prefix_id,prefix_tokens``: requests with one ``prefix_id`` (any text; empty for none) share
their first ``prefix_tokens`` prompt tokens, which count in ``input_tokens``.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

import numpy as np

from perfmodel.serving.requests import Requests
from perfmodel.specs.errors import SpecError, did_you_mean, read_user_file

ARRIVALS = ("poisson", "constant", "gamma")
LENGTH_DISTS = ("fixed", "uniform", "lognormal", "empirical")
DEFAULT_SPREAD = 0.5   # uniform: +-50% around the mean; lognormal: sigma 0.5 (CV 0.53)
COLUMNS = ("arrival_s", "input_tokens", "output_tokens")
PREFIX_COLUMNS = ("prefix_id", "prefix_tokens")
_COLUMN_LIST = "arrival_s, input_tokens, output_tokens[, prefix_id, prefix_tokens]"
_EXPECTED = f"expected {_COLUMN_LIST}"
MAX_TOKENS = 1_000_000_000     # per request: beyond any context limit, within int64 sums
MAX_ARRIVAL_S = 1e9            # about 32 years: a later arrival is a unit or typing mistake
MAX_LOGNORMAL_SIGMA = 3.0      # CV 90, median mean/90: wider puts most requests at 1 token


def generate(n: int, *, rate: float | None = None, concurrency: int = 0,
             arrival: str = "poisson", burstiness: float = 1.0, input_len: int,
             output_len: int, length_dist: str = "fixed", spread: float = DEFAULT_SPREAD,
             lengths_from: Requests | None = None, shared_prefix: int = 0,
             seed: int = 0) -> Requests:
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
    if rate is None:
        times = np.zeros(n)
    else:
        times = _arrival_times(n, rate, arrival, burstiness, arrival_rng)
    prefix_id = np.full(n, 0 if shared_prefix else -1, np.int64)
    return Requests(times, inputs + shared_prefix, outputs, prefix_id,
                    np.full(n, shared_prefix, np.int64), concurrency)


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
    _check_int(input_len, "--input-len", 1, MAX_TOKENS)
    _check_int(output_len, "--output-len", 1, MAX_TOKENS)
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
    pre = None if requests.prefilled is None else requests.prefilled[keep]
    users = min(requests.closed_loop, int(np.count_nonzero(keep)))
    return Requests(requests.arrival_s[keep], requests.input_tokens[keep],
                    requests.output_tokens[keep], requests.prefix_id[keep],
                    requests.prefix_tokens[keep], users, pre, requests.client_cap), dropped


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


def read_trace(path: str | Path) -> Requests:
    """The requests of a CSV trace (see the module docstring), sorted by arrival (stable);
    distinct ``prefix_id`` values become 0, 1, ... in order of first arrival. A mistake is a
    one-line SpecError naming the file, column and row ("row N" is line N of the file, the
    header being row 1, as a spreadsheet numbers them)."""
    path = Path(path)
    return read_user_file(path, "a CSV trace", _parse_trace,
                          (csv.Error, UnicodeDecodeError), expected="a CSV trace file")


def _parse_trace(path: Path) -> Requests:
    with path.open(newline="", encoding="utf-8-sig") as file:
        reader = csv.reader(file)
        rows = [(reader.line_num, [f.strip() for f in row]) for row in reader
                if any(f.strip() for f in row)]
    if not rows:
        raise SpecError(f"{path}: empty file, expected a CSV header line ({_COLUMN_LIST})")
    index = _columns(path, rows[0][1])
    if len(rows) == 1:
        raise SpecError(f"{path}: no requests, only a header")
    table = _Table(path, index)
    for line, row in rows[1:]:
        table.add(line, row)
    return table.requests()


def _columns(path: Path, header: list[str]) -> dict[str, int]:
    """Column name -> position; a missing, unknown or repeated column is an error."""
    known = COLUMNS + PREFIX_COLUMNS
    for i, name in enumerate(header):
        if name not in known:
            raise SpecError(f"{path}: unknown column {name!r}{did_you_mean(name, known)} "
                            f"({_EXPECTED})")
        if name in header[:i]:
            raise SpecError(f"{path}: column {name!r} given twice ({_EXPECTED})")
    for name in COLUMNS:
        if name not in header:
            raise SpecError(f"{path}: missing column {name!r} ({_EXPECTED})")
    if (PREFIX_COLUMNS[0] in header) != (PREFIX_COLUMNS[1] in header):
        given, other = PREFIX_COLUMNS if PREFIX_COLUMNS[0] in header else PREFIX_COLUMNS[::-1]
        raise SpecError(f"{path}: missing column {other!r}: {given!r} needs it ({_EXPECTED})")
    return {name: i for i, name in enumerate(header)}


class _Table:
    """The trace's rows as they are checked and gathered, one column list each."""

    def __init__(self, path: Path, index: dict[str, int]) -> None:
        self.path, self.index = path, index
        self.arrival: list[float] = []
        self.tokens: tuple[list[int], list[int], list[int]] = ([], [], [])
        self.prefix: list[str] = []
        self.prefix_seen: dict[str, tuple[int, int]] = {}   # id -> (tokens, row)

    def where(self, column: str, line: int) -> str:
        return f"{self.path}: column {column!r}, row {line}"

    def add(self, line: int, row: list[str]) -> None:
        if len(row) != len(self.index):
            raise SpecError(f"{self.path}: row {line}: expected {len(self.index)} fields "
                            f"({', '.join(self.index)}), got {len(row)}")
        cell = {name: row[i] for name, i in self.index.items()}
        self.arrival.append(_time(cell["arrival_s"], self.where("arrival_s", line)))
        inputs = _tokens(cell["input_tokens"], self.where("input_tokens", line), 1)
        self.tokens[0].append(inputs)
        self.tokens[1].append(_tokens(cell["output_tokens"], self.where("output_tokens", line),
                                      1))
        prefix_id = cell.get("prefix_id", "")
        self.prefix.append(prefix_id)
        self.tokens[2].append(self.prefix_tokens(line, prefix_id, cell.get("prefix_tokens", ""),
                                                 inputs))

    def prefix_tokens(self, line: int, prefix_id: str, text: str, inputs: int) -> int:
        where = self.where("prefix_tokens", line)
        if not prefix_id:
            if text and _tokens(text, where, 0) != 0:
                raise SpecError(f"{where}: expected an empty field where prefix_id is empty, "
                                f"got {text}")
            return 0
        tokens = _tokens(text, where, 1)
        if tokens > inputs:
            raise SpecError(f"{where}: expected at most input_tokens ({inputs}), got {tokens}")
        first, first_line = self.prefix_seen.setdefault(prefix_id, (tokens, line))
        if tokens != first:
            raise SpecError(f"{where}: prefix_id {prefix_id!r} has {first} tokens at row "
                            f"{first_line}, expected the same, got {tokens}")
        return tokens

    def requests(self) -> Requests:
        order = np.argsort(np.asarray(self.arrival), kind="stable")
        labels = [self.prefix[i] for i in order]
        ids: dict[str, int] = {}
        prefix_id = [ids.setdefault(x, len(ids)) if x else -1 for x in labels]
        inputs, outputs, prefix_tokens = (np.asarray(t, np.int64)[order] for t in self.tokens)
        return Requests.of(np.asarray(self.arrival)[order], inputs, outputs, prefix_id,
                           prefix_tokens)


def _number(text: str, where: str, expected: str) -> float:
    try:
        value = float(text)
    except ValueError:
        got = repr(text) if text else "an empty field"
        raise SpecError(f"{where}: expected {expected}, got {got}") from None
    if not math.isfinite(value):
        raise SpecError(f"{where}: expected {expected}, got {text}")
    return value


def _time(text: str, where: str) -> float:
    value = _number(text, where, "a time >= 0 s")
    if value < 0:
        raise SpecError(f"{where}: expected a time >= 0 s, got {text}")
    if value > MAX_ARRIVAL_S:    # 1e300 printed a 300-digit duration
        raise SpecError(f"{where}: expected a time <= {MAX_ARRIVAL_S:g} s (about 32 years), "
                        f"got {text}")
    return value


def _tokens(text: str, where: str, minimum: int) -> int:
    expected = f"a whole number of tokens >= {minimum}"
    value = _number(text, where, expected)
    if value > MAX_TOKENS:       # 10^23 overflowed int64 further on
        raise SpecError(f"{where}: expected at most {MAX_TOKENS:,} tokens, got {text}")
    if value != math.floor(value) or value < minimum:
        raise SpecError(f"{where}: expected {expected}, got {text}")
    return int(value)


def write_trace(requests: Requests, path: str | Path) -> None:
    """Write ``requests`` as a CSV trace that ``read_trace`` reads back unchanged (times to
    full float precision; prefix columns only when some request has a shared prefix)."""
    if requests.closed_loop:
        raise SpecError(f"{path}: a trace holds arrival times; closed-loop requests "
                        f"(--concurrency {requests.closed_loop}) have none to write")
    shared = bool(np.any(requests.prefix_id >= 0))
    try:
        with Path(path).open("w", newline="", encoding="utf-8") as file:
            writer = csv.writer(file)
            writer.writerow(COLUMNS + (PREFIX_COLUMNS if shared else ()))
            writer.writerows(_trace_rows(requests, shared))
    except OSError as exc:
        raise SpecError(f"{path}: cannot write: {exc.strerror or type(exc).__name__}") from None


def _trace_rows(requests: Requests, shared: bool) -> list[list[str]]:
    rows = []
    for i in range(len(requests)):
        row = [repr(float(requests.arrival_s[i])), str(int(requests.input_tokens[i])),
               str(int(requests.output_tokens[i]))]
        if shared:
            pid = int(requests.prefix_id[i])
            row += [str(pid), str(int(requests.prefix_tokens[i]))] if pid >= 0 else ["", ""]
        rows.append(row)
    return rows
