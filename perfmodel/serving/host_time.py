"""Engine time outside the GPU's kernels: per step (scheduling, input preparation, the
sampler's CPU side, output processing, and how much of it the engine hides behind the GPU)
and per request (the API server's serial work before the engine sees a request, its work on
each output token, and the path from the engine's token to the client). The figures live in
``engines/profiles/<engine>.yaml`` (each with its source, or the statement that it has none),
by engine, version and mode; ``perfmodel calibrate-serving`` writes a deployment's own.

The one formula home: ``HostTime.step`` (what a step adds to its GPU time),
``HostTime.admit`` (when the engine sees each request), ``api_server`` (when the API
server has processed each token: one process, its work serialised) and
``HostTime.stream_s`` (the constant from there to the client's chunk). ``schedule_ahead``
(vLLM's async scheduling) is the scheduler's rule, applied by ``serving.engines.state``.
``perfmodel estimate`` prices the GPU only; the simulator adds these on top of the same GPU
steps, so a lone simulated request with ``HostTime()`` (none) costs exactly what the estimate says.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field, fields, replace
from functools import cache
from pathlib import Path

import numpy as np

from perfmodel.serving.requests import Requests
from perfmodel.serving.results import SimResult
from perfmodel.specs.errors import SpecError
from perfmodel.specs.fields import Fields, read_mapping

HERE = Path(__file__).parent / "engines" / "profiles"
STEP_KEYS = ("step_s", "seq_s", "exposed_s")
FRONT_KEYS = ("request_s", "prompt_token_s", "output_token_s", "stream_s")
FRONTENDS = ("http", "in-process")
LIMIT_S = 1.0        # no engine spends a second of host time on one step or request


@dataclass(frozen=True)
class HostTime:
    """Host time of one engine deployment (seconds). A step of ``n`` sequences does
    ``step_s + seq_s * n`` of host work; with ``overlap`` it runs while the GPU runs the
    previous step, so only the excess over the GPU's time shows, plus ``exposed_s`` that no
    overlap hides. A request spends ``request_s + prompt_token_s * prompt tokens`` in the
    API server (one process: requests queue for it) before the engine sees it, and each
    token reaches the client ``stream_s`` after the engine's step ends. A step run eagerly
    (no CUDA graph) dispatches each operator instance in ``eager_op_s``, so it takes at
    least their dispatch (``serving.eager``); ``prefill_graph``: the engine replays short
    prefill steps as a piecewise CUDA graph (``eager.graph_tokens``)."""

    step_s: float = 0.0
    seq_s: float = 0.0
    exposed_s: float = 0.0
    overlap: bool = False
    request_s: float = 0.0
    prompt_token_s: float = 0.0
    output_token_s: float = 0.0
    stream_s: float = 0.0
    schedule_ahead: bool = False
    tokenize_apart: bool = False
    eager_op_s: float = 0.0
    prefill_graph: bool = False
    name: str = "none"
    sources: dict = field(default_factory=dict, compare=False)

    @property
    def none(self) -> bool:
        return not any(getattr(self, k) for k in STEP_KEYS + FRONT_KEYS) and \
            not self.schedule_ahead and not self.eager_op_s

    def step(self, gpu_s: np.ndarray, seqs: np.ndarray) -> np.ndarray:
        """Host time each step adds to its GPU time ``gpu_s`` (``seqs`` sequences)."""
        work = self.step_s + self.seq_s * np.asarray(seqs, dtype=float)
        hidden = np.maximum(work - gpu_s, 0.0) if self.overlap else work
        return hidden + self.exposed_s

    def admit(self, arrival_s: np.ndarray, input_tokens: np.ndarray) -> np.ndarray:
        """When the engine sees each request (arrivals sorted): the API server serves them
        one at a time, first come first served; with ``tokenize_apart`` the prompts are
        tokenized one at a time on their own thread first, then the process's own work."""
        loop_at, loop_work = self.intake(arrival_s, input_tokens)
        if not loop_work.any():
            return loop_at
        return fcfs(loop_at, loop_work)

    def intake(self, arrival_s: np.ndarray, input_tokens: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray]:
        """(when each request's work reaches the API server's event loop, that work)."""
        arrival_s = np.asarray(arrival_s, dtype=float)
        tokenize = self.prompt_token_s * np.asarray(input_tokens, dtype=float)
        if self.tokenize_apart:
            ready = fcfs(arrival_s, tokenize) if tokenize.any() else arrival_s
            return ready, np.full(len(arrival_s), self.request_s)
        return arrival_s, self.request_s + tokenize

    def constants(self) -> dict:
        """The numbers (and the flags), as a profile file writes them."""
        return {k: getattr(self, k) for k in (*STEP_KEYS, "overlap", "schedule_ahead",
                                              *FRONT_KEYS, "tokenize_apart", "eager_op_s",
                                              "prefill_graph")}

    def describe(self) -> str:
        if self.none:
            return "no host time (GPU steps only)"
        return (f"{self.name}: step {self.step_s * 1e3:.3g} ms + {self.seq_s * 1e6:.3g} us/seq"
                f"{' overlapped' if self.overlap else ''}, exposed {self.exposed_s * 1e3:.3g} ms"
                f"{', scheduled a step ahead' if self.schedule_ahead else ''}"
                f"{self._eager()};"
                f" request {self.request_s * 1e3:.3g} ms + {self.prompt_token_s * 1e6:.3g} "
                f"us/prompt token{' (own thread)' if self.tokenize_apart else ''}, "
                f"{self.output_token_s * 1e6:.3g} us/output token, "
                f"stream {self.stream_s * 1e3:.3g} ms")


    def _eager(self) -> str:
        if not self.eager_op_s:
            return ""
        graph = ", short prefills as a piecewise graph" if self.prefill_graph else ""
        return f", eager steps >= {self.eager_op_s * 1e6:.3g} us/operator{graph}"


NO_HOST = HostTime()        # GPU steps only, as ``perfmodel estimate``


def _version(text: str, where: str) -> tuple[int, ...]:
    found = re.match(r"\s*v?(\d+(?:\.\d+)*)", str(text))
    if not found:
        raise SpecError(f"{where}: expected a version like 0.24.0, got {text!r}")
    return tuple(int(p) for p in found.group(1).split("."))


@cache
def _table(engine: str) -> dict:
    path = HERE / f"{engine}.yaml"
    if not path.is_file():
        raise SpecError(f"--engine: no host-time profile for {engine!r} "
                        f"(shipped: {', '.join(shipped())})")
    return read_mapping(path)


def shipped() -> list[str]:
    """The engines with a shipped profile."""
    return sorted(p.stem for p in HERE.glob("*.yaml"))


def modes(engine: str) -> list[str]:
    return list(_table(engine)["modes"])


def default_mode(engine: str, version: str | None = None) -> str:
    """The mode ``engine`` ``version`` runs unless told (its profile's ``versions``)."""
    table = _table(engine)
    v = _version(version or table["default_version"], "--engine-version")
    for rule in table["versions"]:
        if v >= _version(rule["from"], f"{engine}.yaml: versions.from"):
            return rule["mode"]
    return table["versions"][-1]["mode"]


def past_profile(engine: str, version: str | None) -> str | None:
    """The warning for a ``version`` newer than ``engine``'s profile was measured on (its
    ``default_version``): its host time is that version's, an assumption; None otherwise."""
    if version is None:
        return None
    newest = _table(engine)["default_version"]
    if _version(version, "--engine-version") <= _version(newest, f"{engine}.yaml"):
        return None
    return (f"--engine-version {version}: newer than {engine}'s profile ({newest}, the "
            f"newest measured): priced with {newest}'s host time")


def resolve(engine: str = "vllm", version: str | None = None, mode: str | None = None,
            frontend: str = "http") -> HostTime:
    """The shipped profile of ``engine`` at ``version`` (default: the profile's
    ``default_version``), in ``mode`` (default: the version's) behind ``frontend``."""
    table = _table(engine)
    mode = mode or default_mode(engine, version)
    if mode not in table["modes"]:
        raise SpecError(f"--engine-mode: expected one of {', '.join(table['modes'])} for "
                        f"{engine}, got {mode!r}")
    if frontend not in table["frontends"]:
        raise SpecError(f"--frontend: expected one of {', '.join(FRONTENDS)}, got {frontend!r}")
    step, front = table["modes"][mode], table["frontends"][frontend]
    sources = {k: f"{v}" for k, v in {**step.get("sources", {}),
                                      **front.get("sources", {})}.items()}
    values = {k: float(step[k]) for k in STEP_KEYS} | {k: float(front[k]) for k in FRONT_KEYS}
    name = f"{engine} {version or table['default_version']} ({mode}, {frontend})"
    return HostTime(**values, overlap=bool(step["overlap"]),
                    schedule_ahead=bool(step.get("schedule_ahead", False)),
                    eager_op_s=float(step.get("eager_op_s", 0.0)),
                    prefill_graph=bool(step.get("prefill_graph", False)),
                    tokenize_apart=bool(front.get("tokenize_apart", False)), name=name,
                    sources=sources)


def load_profile(path: str | Path) -> HostTime:
    """An engine profile file (``perfmodel calibrate-serving`` writes them): ``host:`` with
    every constant of ``HostTime``; other top-level keys are provenance."""
    path = Path(path)
    data = read_mapping(path, "an engine profile YAML (perfmodel calibrate-serving --out)")
    top = Fields(data, f"--engine-profile: {path}")
    host = top.sub("host")
    values = {k: host.quantity(k, "s", positive=False, maximum=LIMIT_S,
                               **({"default": 0.0} if k == "output_token_s" else {}))
              for k in STEP_KEYS + FRONT_KEYS}     # profiles written before it: none
    overlap = host.flag("overlap")
    ahead = host.flag("schedule_ahead", False)
    apart = host.flag("tokenize_apart", False)
    eager = host.quantity("eager_op_s", "s", positive=False, maximum=LIMIT_S, default=0.0)
    graph = host.flag("prefill_graph", False)
    host.finish()
    name = str(data.get("name") or path.stem)
    return HostTime(**values, overlap=overlap, schedule_ahead=ahead, tokenize_apart=apart,
                    eager_op_s=eager, prefill_graph=graph, name=name)


def write_profile(path: Path, host: HostTime, provenance: dict) -> None:
    """``host`` and its provenance as a profile file ``load_profile`` reads."""
    import yaml

    body = {"name": host.name, "host": host.constants(), **provenance}
    path.write_text(yaml.safe_dump(body, sort_keys=False, width=92))


def with_constants(host: HostTime, **values: float) -> HostTime:
    """``host`` with some constants replaced (names checked)."""
    known = {f.name for f in fields(HostTime)}
    bad = [k for k in values if k not in known]
    if bad:
        raise SpecError(f"host time: unknown constant {bad[0]!r}")
    return replace(host, **values)


def as_dict(host: HostTime) -> dict:
    """Everything but the sources, for a JSON summary."""
    out = asdict(host)
    out.pop("sources")
    return out


def fcfs(arrival_s: np.ndarray, work_s: np.ndarray) -> np.ndarray:
    """When each job is done at one server taking them first come first served (arrivals
    sorted)."""
    out = np.empty(len(work_s))
    free = -np.inf
    for i, (t, w) in enumerate(zip(np.asarray(arrival_s, dtype=float).tolist(),
                                   np.asarray(work_s, dtype=float).tolist(), strict=True)):
        free = max(t, free) + w
        out[i] = free
    return out


def admitted(requests: Requests, host: HostTime) -> Requests:
    """The requests as the engine sees them: after the API server (``HostTime.admit``);
    a closed loop's users after their round trip (``serving.closed_loop``)."""
    if requests.closed_loop:
        from perfmodel.serving import closed_loop

        return closed_loop.admitted(requests, host)
    seen = host.admit(requests.arrival_s, requests.input_tokens)
    return replace(requests, arrival_s=seen) if (seen != requests.arrival_s).any() \
        else requests


def api_server(arrival_s: np.ndarray, work_s: np.ndarray, token_s: np.ndarray,
               per_token_s: float) -> np.ndarray:
    """When the API server has processed each token (``token_s``: when the engine's step
    that made it ended). One process serves, first come first served, each request's
    intake (``work_s`` from its ``arrival_s``) and each step's tokens (``per_token_s``
    apiece from the step's end, all of them before any leaves: vLLM's output handler runs
    ``process_outputs`` over a step's outputs in the API server's one event loop, the
    request handlers read them after). Intake comes first at a tie."""
    token_s = np.asarray(token_s, dtype=float)
    if not per_token_s or not len(token_s):
        return token_s
    ends, inverse, counts = np.unique(token_s, return_inverse=True, return_counts=True)
    times = np.concatenate([np.asarray(arrival_s, dtype=float), ends])
    work = np.concatenate([np.asarray(work_s, dtype=float), counts * float(per_token_s)])
    order = np.lexsort((np.r_[np.zeros(len(arrival_s)), np.ones(len(ends))], times))
    done = np.empty(len(times))
    free = -np.inf
    for i, t, w in zip(order.tolist(), times[order].tolist(), work[order].tolist(),
                       strict=True):
        free = max(t, free) + w
        done[i] = free
    return done[len(arrival_s):][inverse]


def client_side(res: SimResult, client: Requests, seen: Requests, host: HostTime
                ) -> SimResult:
    """A simulated run's times as the client sees them: its requests sent before the API
    server's delay (``seen``: as the engine saw them); each token once the API server has
    processed its step's tokens (``api_server``: behind the intake and output work queued
    ahead of it) and ``stream_s`` more. The engine saw the requests as ``admit`` placed
    them, by intake work alone: exact when no output work is queued at an arrival (a
    burst, which the server takes in before any token; light load); otherwise each
    arrival is late by at most the output work queued ahead of it, which is left out.

    The client's ITL is the gap between its chunks: one per request per engine step
    (vLLM's ``stream_interval`` 1), so the engine's step period, plus the difference of
    the two steps' waits in the API server; ``stream_s`` cancels out of ITL and TPOT."""
    if host.none:
        return res
    delay = seen.arrival_s - client.arrival_s if not client.closed_loop else 0.0
    sent = res.arrival_s - delay
    if client.closed_loop:      # a closed loop's sends are not queued for the API server
        from perfmodel.serving import closed_loop

        sent = closed_loop.sent_s(res.arrival_s, client, host)
        at, work = sent, np.zeros(len(sent))
    else:
        at, work = host.intake(sent, client.input_tokens)
    out = api_server(at, work, res.token_s, host.output_token_s)
    wait = out - res.token_s
    token_s = out + host.stream_s
    first, last = res.token_offsets[:-1], res.token_offsets[1:] - 1
    return replace(res, requests=client, arrival_s=sent, first_token_s=token_s[first],
                   finish_s=token_s[last], token_s=token_s,
                   info={**res.info, "host": host, "api_server_s": delay,
                         "api_output_s": float(wait.mean()) if len(wait) else 0.0})
