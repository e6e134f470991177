"""Prefill, decode, end-to-end latency and throughput: a pure function of specs.

Prefill runs the prompt in one step (T = C = prompt) and emits the first token, so
TTFT = prefill time. The other G - 1 tokens each take one decode step; the step that emits
token i + 1 processes token i at context S + i, so decode reads contexts S+1 ... S+G-1.
Decode time is the sum over those steps: exact for up to ``decode_samples`` (default 65)
steps, beyond that the trapezoid rule on that many evenly spaced contexts (step time is
piecewise linear in the context, so the error is confined to the few kinks).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from perfmodel import ops
from perfmodel.memory import MemoryEstimate, memory_estimate
from perfmodel.ops import ByteCounts, Op
from perfmodel.params import param_counts
from perfmodel.roofline import OpTime, op_time
from perfmodel.specs import Hardware, Model, Workload
from perfmodel.transformer import step_ops

DECODE_SAMPLES = 65


@dataclass(frozen=True)
class OpSummary:
    """One operator summed over a phase (all layers, all steps)."""

    phase: str
    name: str
    kind: str
    op_class: str
    count: float
    flops: float
    bytes: ByteCounts
    time_s: float
    bound: str

    @property
    def intensity(self) -> float:
        return self.flops / self.bytes.total if self.bytes.total else float("inf")

    def to_dict(self) -> dict:
        row = {k: v for k, v in asdict(self).items() if k != "bytes"}
        row.update({f"bytes_{k}": v for k, v in asdict(self.bytes).items()})
        row["bytes"] = self.bytes.total
        row["intensity"] = self.intensity
        return row


@dataclass(frozen=True)
class Phase:
    name: str
    steps: int
    time_s: float
    flops: float
    bytes: ByteCounts
    bound: str
    first_step_s: float
    last_step_s: float
    ops: tuple[OpSummary, ...]

    def to_dict(self) -> dict:
        return {"time_s": self.time_s, "flops": self.flops, "bytes": self.bytes.total,
                "bytes_by_source": asdict(self.bytes), "bound": self.bound,
                "steps": self.steps, "first_step_s": self.first_step_s,
                "last_step_s": self.last_step_s}


def _summarize(name: str, samples: list[list[OpTime]], weights: list[float], steps: int,
               first: float, last: float) -> Phase:
    """Weighted sum of per-step op times (``weights`` sum to the number of steps)."""
    rows = []
    for i, base in enumerate(samples[0]):
        col = [s[i] for s in samples]
        time = flops = 0.0
        acc = [0.0] * 5
        bound_time: dict[str, float] = {}
        for w, t in zip(weights, col, strict=True):
            time += w * t.time_s
            scale = w * t.op.count
            flops += scale * t.op.flops
            for j, v in enumerate(t.op.bytes.astuple()):
                acc[j] += scale * v
            bound_time[t.bound] = bound_time.get(t.bound, 0.0) + w * t.time_s
        nbytes = ByteCounts(*acc)
        rows.append(OpSummary(name, base.op.name, base.op.kind, base.op.op_class, base.op.count,
                              flops, nbytes, time, max(bound_time, key=bound_time.get)))
    by_bound: dict[str, float] = {}
    for r in rows:
        by_bound[r.bound] = by_bound.get(r.bound, 0.0) + r.time_s
    total = ByteCounts()
    for r in rows:
        total = total + r.bytes
    return Phase(name, steps, sum(r.time_s for r in rows), sum(r.flops for r in rows), total,
                 max(by_bound, key=by_bound.get) if by_bound else "none", first, last,
                 tuple(rows))


def _key(op: Op) -> tuple:
    return (op.name, op.kind, op.flops, op.bytes, op.dtype, op.count,
            tuple(sorted(op.shape.items())))


def framework_ops(hw: Hardware, layers: float, timing: str, dtype: str) -> list[Op]:
    """The framework glue of ``layers`` decoder layers as one op, when it costs time.

    A sync device (timing="host", eager CPU) runs the host glue between kernels
    (``Efficiency.layer_overhead_s`` per layer) in series with them, so it adds to the step.
    On an async device the host glue overlaps device work and only matters when the host is
    the bottleneck, which this model does not describe: nothing is added (nor under CUDA
    graphs). Kept out of ``step_ops``, which stays device-independent."""
    if timing != "host" or hw.efficiency.layer_overhead_s <= 0:
        return []
    return [ops.layer_overhead("layer_overhead", layers, dtype=dtype)]


def step_times(model: Model, hw: Hardware, wl: Workload, new_tokens: int, context: int,
               timing: str = "stream", logits_all: bool = False,
               cache: dict | None = None) -> list[OpTime]:
    """Roofline times of every op of one step (timing: see roofline.op_time), plus the
    per-layer framework glue on a sync device (``framework_ops``). ``cache`` reuses the
    times of ops that do not change between steps (all but attention)."""
    out = []
    for op in step_ops(model, wl, new_tokens, context, logits_all) \
            + framework_ops(hw, model.n_layers, timing, wl.act_dtype):
        if cache is None:
            out.append(op_time(op, hw, timing))
            continue
        key = _key(op)
        if key not in cache:
            cache[key] = op_time(op, hw, timing)
        out.append(cache[key])
    return out


def phase_timing(hw: Hardware, wl: Workload, phase: str) -> str:
    """How host launches count in ``phase`` (see roofline.op_time): added on a sync device
    (CPU, "host"), overlapped with the device elsewhere ("stream"), and gone for decode steps
    replayed as CUDA graphs ("kernel"). One rule for the estimate and its figures."""
    if phase not in ("prefill", "decode"):
        raise ValueError(f"phase must be prefill or decode, got {phase!r}")
    if phase == "decode" and wl.cuda_graphs:
        return "kernel"
    return "host" if hw.efficiency.launch_mode == "sync" else "stream"


def prefill_phase(model: Model, hw: Hardware, wl: Workload) -> Phase:
    times = step_times(model, hw, wl, wl.prompt_len, wl.prompt_len,
                       phase_timing(hw, wl, "prefill"))
    total = sum(t.time_s for t in times)
    return _summarize("prefill", [times], [1.0], 1, total, total)


def decode_contexts(wl: Workload, samples: int = DECODE_SAMPLES
                    ) -> tuple[list[int], list[float]]:
    """Contexts to evaluate and their weights: weights sum to the G - 1 decode steps.
    One context per step when G - 1 <= ``samples``; else ``samples`` evenly spaced ones."""
    if samples < 2:
        raise ValueError(f"decode_samples must be at least 2, got {samples}")
    first, steps = wl.prompt_len + 1, wl.gen_len - 1
    if steps <= samples:
        n = max(steps, 1)
        return list(range(first, first + n)), [1.0 if steps else 0.0] * n
    last = first + steps - 1
    ctx = sorted({round(first + i * (last - first) / (samples - 1)) for i in range(samples)})
    w = [0.0] * len(ctx)
    for i in range(len(ctx) - 1):         # trapezoid over [first, last]
        gap = ctx[i + 1] - ctx[i]
        w[i] += gap / 2.0
        w[i + 1] += gap / 2.0
    scale = steps / sum(w)                # rescale to the integer step count
    return ctx, [x * scale for x in w]


def decode_phase(model: Model, hw: Hardware, wl: Workload,
                 samples: int = DECODE_SAMPLES) -> Phase:
    """The G - 1 decode steps, summed (see the module docstring and decode_contexts)."""
    contexts, weights = decode_contexts(wl, samples)
    timing = phase_timing(hw, wl, "decode")
    cache: dict = {}
    samples = [step_times(model, hw, wl, 1, c, timing, cache=cache) for c in contexts]
    step = [sum(t.time_s for t in s) for s in samples]
    return _summarize("decode", samples, weights, wl.gen_len - 1, step[0], step[-1])


@dataclass(frozen=True)
class Estimate:
    """Everything ``perfmodel estimate`` reports; ``to_dict`` is the JSON output (SI units)."""

    hardware: Hardware
    model: Model
    workload: Workload
    params_total: float
    params_active: float
    memory: MemoryEstimate
    prefill: Phase
    decode: Phase

    @property
    def ttft_s(self) -> float:
        return self.prefill.time_s

    @property
    def tpot_s(self) -> float:
        """Mean decode step time (the step at context S+1 when only one token is generated)."""
        steps = self.decode.steps
        return self.decode.time_s / steps if steps else self.decode.first_step_s

    @property
    def e2e_s(self) -> float:
        return self.prefill.time_s + self.decode.time_s

    @property
    def throughput_tokens_per_s(self) -> float:
        """Generated tokens per second over the whole request batch, prefill included."""
        return self.workload.batch * self.workload.gen_len / self.e2e_s

    @property
    def decode_tokens_per_s(self) -> float:
        return self.workload.batch / self.tpot_s

    @property
    def context_warning(self) -> str | None:
        """Set when prompt + generation runs past the model's trained context."""
        limit, length = self.model.max_position_embeddings, self.workload.final_len
        if limit and length > limit:
            return (f"prompt + generated = {length} tokens exceeds {self.model.name}'s "
                    f"context limit (max_position_embeddings = {limit})")
        return None

    @property
    def memory_warning(self) -> str | None:
        """Set when weights + workspace + KV exceed the usable memory (the sum spelled out)."""
        mem = self.memory
        if mem.fits:
            return None
        return (f"does not fit: weights {mem.weights_bytes:.4g} B + workspace "
                f"{mem.workspace_bytes:.4g} B + KV {mem.kv_cache_bytes:.4g} B > usable "
                f"{mem.usable_bytes:.4g} B (max batch {mem.max_batch})")

    @property
    def warnings(self) -> list[str]:
        """Things the user should know the numbers rest on (one line each)."""
        return [w for w in (self.context_warning, self.memory_warning) if w]

    def to_dict(self) -> dict:
        wl = self.workload
        mem = asdict(self.memory)
        return {
            "model": self.model.name, "hardware": self.hardware.name,
            "workload": asdict(wl),
            "params_total": self.params_total, "params_active": self.params_active,
            "weights_bytes": self.memory.weights_bytes,
            "kv_cache_bytes_per_token": self.memory.kv_cache_bytes_per_token,
            "kv_cache_bytes": self.memory.kv_cache_bytes,
            "max_batch": self.memory.max_batch, "fits": self.memory.fits,
            "memory": mem | {"free_bytes": self.memory.free_bytes},
            "ttft_s": self.ttft_s, "tpot_s": self.tpot_s, "e2e_s": self.e2e_s,
            "throughput_tokens_per_s": self.throughput_tokens_per_s,
            "decode_tokens_per_s": self.decode_tokens_per_s,
            "prefill": self.prefill.to_dict(), "decode": self.decode.to_dict(),
            "warnings": self.warnings,
        }

    def operators(self):  # -> pandas.DataFrame (pandas imported lazily: keeps the CLI fast)
        """Every operator of both phases, one row each, as a pandas DataFrame."""
        import pandas as pd

        return pd.DataFrame([o.to_dict() for o in self.prefill.ops + self.decode.ops])


def estimate(hardware: Hardware, model: Model, workload: Workload | None = None,
             decode_samples: int = DECODE_SAMPLES) -> Estimate:
    """Predict one configuration. Pure: reads nothing, writes nothing.
    ``decode_samples`` trades decode-integration precision for speed (sweeps use fewer)."""
    wl = workload or Workload()
    counts = param_counts(model)
    return Estimate(
        hardware=hardware, model=model, workload=wl, params_total=counts.total,
        params_active=counts.active(model), memory=memory_estimate(model, hardware, wl),
        prefill=prefill_phase(model, hardware, wl),
        decode=decode_phase(model, hardware, wl, decode_samples))
