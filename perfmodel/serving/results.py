"""What a simulation returns: every request's times and every step's state, and the
metrics as vLLM's benchmark tool defines them (``vllm/benchmarks/serve.py``):

- TTFT: arrival to first token; E2E: arrival to last token;
- TPOT: per request, (last token - first token) / (output tokens - 1), requests of one
  output token left out;
- ITL: every gap between consecutive tokens of a request, pooled over requests;
- throughput: output tokens over the run's duration, from time 0 (the start of the run,
  before the first arrival) to the last token.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from perfmodel.serving.requests import Requests

PERCENTILES = (50, 90, 99)
METRICS = ("ttft_s", "tpot_s", "itl_s", "e2e_s", "queue_s")


@dataclass(frozen=True, eq=False)
class StepLog:
    """One entry per engine step: when it started, how long it took, the sequences and
    tokens it ran (``prefill_tokens`` of them prompt tokens), the KV blocks in use after
    it and the requests waiting; ``host_s``: the part of ``time_s`` that is the engine's
    host time (``serving.host_time``), the rest is GPU time. Under pipeline parallelism
    (``serving.pipeline``) a row is a micro-batch, from when it was scheduled until its
    output returned, and batches overlap in time: ``stage_s`` (rows x pp) its GPU seconds
    on each stage and ``send_s`` its sends between stages; the rest of ``time_s`` past
    those and the host's is waiting for busy stages."""

    start_s: np.ndarray
    time_s: np.ndarray
    seqs: np.ndarray
    tokens: np.ndarray
    prefill_tokens: np.ndarray
    kv_blocks: np.ndarray
    waiting: np.ndarray
    host_s: np.ndarray | None = None
    stage_s: np.ndarray | None = None
    send_s: np.ndarray | None = None

    @staticmethod
    def row(start: float, dt: float, batch: object, used: int, waiting: int,
            host: float) -> tuple:
        """One step's entry as the engine loops append it (the fields above, in order):
        ``batch`` (``serving.engines.state.Batch``) gives its sequences and tokens."""
        prompt = int(batch.new[batch.new > 1].sum()) if batch.prefill else 0
        return start, dt, len(batch.ids), int(batch.new.sum()), prompt, used, waiting, host

    @property
    def gpu_s(self) -> np.ndarray:
        """GPU seconds of each step (under pipeline parallelism: summed over its stages)."""
        if self.stage_s is not None:
            return self.stage_s.sum(axis=1)
        return self.time_s - (0.0 if self.host_s is None else self.host_s)

    def pipeline(self, duration_s: float) -> dict:
        """Pipeline parallelism's per-stage figures (empty without it): each stage's busy
        seconds and its share of ``duration_s``, and the sends' seconds."""
        if self.stage_s is None:
            return {}
        busy = self.stage_s.sum(axis=0)
        return {"stages": int(self.stage_s.shape[1]), "stage_busy_s": busy.tolist(),
                "stage_utilization": (busy / max(duration_s, 1e-30)).tolist(),
                "send_s": float(self.send_s.sum())}


@dataclass(frozen=True, eq=False)
class SimResult:
    """A simulated run. Per request (in ``requests`` order): ``arrival_s`` (a closed loop's
    resolved), ``scheduled_s`` (first scheduled), ``first_token_s``, ``finish_s``,
    ``preemptions``, ``prefix_hit_tokens``; every output token's time, ragged:
    request i's are ``token_s[token_offsets[i]:token_offsets[i + 1]]``."""

    requests: Requests
    arrival_s: np.ndarray
    scheduled_s: np.ndarray
    first_token_s: np.ndarray
    finish_s: np.ndarray
    preemptions: np.ndarray
    prefix_hit_tokens: np.ndarray
    token_offsets: np.ndarray
    token_s: np.ndarray
    steps: StepLog
    kv_blocks_total: int
    label: str = ""
    info: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.arrival_s)

    @property
    def ttft_s(self) -> np.ndarray:
        return self.first_token_s - self.arrival_s

    @property
    def e2e_s(self) -> np.ndarray:
        return self.finish_s - self.arrival_s

    @property
    def queue_s(self) -> np.ndarray:
        return self.scheduled_s - self.arrival_s

    @property
    def tpot_s(self) -> np.ndarray:
        """Per request of more than one output token."""
        out = self.requests.output_tokens
        many = out > 1
        return (self.finish_s[many] - self.first_token_s[many]) / (out[many] - 1)

    @property
    def itl_s(self) -> np.ndarray:
        """Every gap between consecutive tokens of one request, pooled."""
        gaps = np.diff(self.token_s)
        inside = np.ones(len(gaps), dtype=bool)
        inside[self.token_offsets[1:-1] - 1] = False     # a gap across two requests
        out = gaps[inside[:len(gaps)]] if len(gaps) else gaps
        if "speculation" in self.info:      # tokens of one chunk share its time: the
            return out[out > 0]             # client's ITL is between chunks
        return out

    @property
    def duration_s(self) -> float:
        return float(max(self.finish_s.max() - min(0.0, self.arrival_s.min()), 1e-12))

    @property
    def throughput_tokens_per_s(self) -> float:
        return float(self.requests.output_tokens.sum() / self.duration_s)

    @property
    def requests_per_s(self) -> float:
        return len(self) / self.duration_s

    def goodput(self, slo_ttft_s: float | None = None, slo_tpot_s: float | None = None
                ) -> float:
        """Requests per second that met both SLOs (a request of one token has no TPOT)."""
        ok = np.ones(len(self), dtype=bool)
        if slo_ttft_s is not None:
            ok &= self.ttft_s <= slo_ttft_s
        if slo_tpot_s is not None:
            out = self.requests.output_tokens
            tpot = np.zeros(len(self))
            tpot[out > 1] = self.tpot_s
            ok &= tpot <= slo_tpot_s
        return float(ok.sum() / self.duration_s)

    def summary(self, slo_ttft_s: float | None = None, slo_tpot_s: float | None = None
                ) -> dict:
        """Means and percentiles (seconds), throughput, and goodput when SLOs are given."""
        out: dict = {}
        for name in METRICS:
            values = getattr(self, name)
            out[name] = ({"mean": float(values.mean()),
                          **{f"p{p}": float(np.percentile(values, p)) for p in PERCENTILES}}
                         if len(values) else
                         {"mean": 0.0, **{f"p{p}": 0.0 for p in PERCENTILES}})
        out.update(throughput_tokens_per_s=self.throughput_tokens_per_s,
                   requests_per_s=self.requests_per_s, n_requests=len(self),
                   n_preempted=int((self.preemptions > 0).sum()),
                   preemptions=int(self.preemptions.sum()),
                   prefix_hit_tokens=int(self.prefix_hit_tokens.sum()),
                   prefix_hit_rate=float(self.prefix_hit_tokens.sum()
                                         / max(int(self.requests.input_tokens.sum()), 1)),
                   duration_s=self.duration_s, steps=len(self.steps.start_s),
                   kv_blocks_total=self.kv_blocks_total,
                   peak_kv_use=float(self.steps.kv_blocks.max() / max(self.kv_blocks_total, 1)),
                   peak_running=int(self.steps.seqs.max()),
                   engine_time=self.engine_time())
        if "lora" in self.info:
            out["lora"] = self.info["lora"]
        if self.steps.stage_s is not None:
            out["pipeline"] = self.steps.pipeline(self.duration_s)
        if "speculation" in self.info:
            out["speculation"] = self.info["speculation"]
        if slo_ttft_s is not None or slo_tpot_s is not None:
            out["goodput_requests_per_s"] = self.goodput(slo_ttft_s, slo_tpot_s)
        return out

    def engine_time(self) -> dict:
        """The first engine's steps' GPU and host seconds apart (totals), the host
        profile's name, the mean per request of the API server's delay before the engine,
        the mean per token of its wait for the API server's output work, and the stream's
        latency to the client."""
        host = self.info.get("host")
        api = self.info.get("api_server_s", 0.0)
        steps = self.steps
        return {"gpu_s": float(steps.gpu_s.sum()),
                "host_s": float(0.0 if steps.host_s is None else steps.host_s.sum()),
                "api_server_mean_s": float(np.mean(api)),
                "api_output_mean_s": float(self.info.get("api_output_s", 0.0)),
                "stream_s": float(getattr(host, "stream_s", 0.0)),
                "profile": getattr(host, "name", "none")}

    @property
    def itl_max_s(self) -> np.ndarray:
        """Each request's longest gap between two of its tokens (NaN: one token)."""
        gaps = np.diff(self.token_s, append=np.nan)
        starts = self.token_offsets[:-1]
        last = self.token_offsets[1:] - 1
        gaps[last] = -np.inf                      # no gap after a request's last token
        worst = np.maximum.reduceat(gaps, starts) if len(gaps) else gaps
        return np.where(self.requests.output_tokens > 1, worst, np.nan)

    def records(self) -> dict[str, np.ndarray]:
        """One row per request (pandas-ready columns)."""
        r = self.requests
        out = r.output_tokens
        tpot = np.full(len(self), np.nan)
        tpot[out > 1] = self.tpot_s
        return {"request": np.arange(len(self)), "arrival_s": self.arrival_s,
                "input_tokens": r.input_tokens, "output_tokens": out,
                "prefix_id": r.prefix_id, "prefix_hit_tokens": self.prefix_hit_tokens,
                "queue_s": self.queue_s, "ttft_s": self.ttft_s, "tpot_s": tpot,
                "itl_max_s": self.itl_max_s, "e2e_s": self.e2e_s,
                "preemptions": self.preemptions}


def record_output(run: object, emit: np.ndarray, counts: np.ndarray, done: np.ndarray,
                  t: float) -> list[int]:
    """A step's output taken at ``t`` on an engine's run (``serving.engine_loop.Run``): the
    emitted requests' token (their ``counts``-th) and first-token times, the finished ones'
    finish time and the run's counts of them; returns the requests the arrivals send next
    (a closed loop's users, a conversation's later turns)."""
    if getattr(run.state, "spec", None) is None:
        run.token_s[run.token_offsets[emit] + counts - 1] = t
    else:                   # several tokens a step (``engines.speculation``)
        _record_chunk(run, emit, counts, t)
    first = emit[np.isnan(run.first_token_s[emit])]
    run.first_token_s[first] = t
    run.last_done, run.last_done_tokens = len(done), 0
    if not len(done):
        return []
    run.finish_s[done] = t
    run.done += len(done)
    req = run.arrivals.requests
    run.last_done_tokens = int((req.input_tokens[done] + req.output_tokens[done]).sum())
    run.load_tokens -= run.last_done_tokens
    return run.arrivals.finished(t, done)


def _record_chunk(run: object, emit: np.ndarray, counts: np.ndarray, t: float) -> None:
    """Every token a speculative step emitted (a verify's accepted drafts and the target's
    own) at the step's end ``t``: the client gets them in one chunk (``SimResult.itl_s``
    counts the gaps between chunks)."""
    seen = getattr(run, "spec_recorded", None)
    if seen is None:
        seen = run.spec_recorded = np.zeros(len(run.token_offsets) - 1, np.int64)
    size = counts - seen[emit]
    start = run.token_offsets[emit] + seen[emit]
    idx = np.repeat(start - np.cumsum(size) + size, size) + np.arange(int(size.sum()))
    run.token_s[idx] = t
    seen[emit] = counts
