"""The estimate of one configuration, as typed records: phases, operators, memory, warnings.

``Estimate`` is what ``perfmodel estimate`` reports; it holds a list of phases (a static
request has "prefill" and "decode"), each with its operators summed over the phase.
``to_dict`` is the JSON output (SI units). ``estimates.Estimates.item`` builds these from
the arrays the vectorised core returns; ``estimate`` is the length-1 case.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from perfmodel.cost.memory import MemoryEstimate
from perfmodel.cost.ops import ByteCounts, Num
from perfmodel.cost.routing import device_imbalance
from perfmodel.specs.hardware import Hardware
from perfmodel.specs.model import Model
from perfmodel.specs.uncertainty import Uncertainty
from perfmodel.specs.workload import Parallelism, Workload


@dataclass(frozen=True)
class OpSummary:
    """One operator summed over a phase (all layers, all steps); ``count`` is per step.
    ``error_class``: its kernels' (``cost.error_class``); ``band``: the 80% band of its own
    time from its class's band alone (None: the device has none)."""

    phase: str
    name: str
    kind: str
    op_class: str
    count: float
    flops: float
    bytes: ByteCounts
    time_s: float
    bound: str
    error_class: str = ""
    band: tuple[float, float] | None = None

    @property
    def intensity(self) -> float:
        """FLOPs per byte: inf for FLOPs without traffic, 0 for a row of neither (the
        ``dequant``, ``pipeline_bubble`` rows)."""
        if self.bytes.total:
            return self.flops / self.bytes.total
        return float("inf") if self.flops else 0.0

    def to_dict(self) -> dict:
        row = {k: v for k, v in asdict(self).items() if k not in ("bytes", "band")}
        if self.band is not None:
            row["time_s_low"], row["time_s_high"] = self.band
        row.update({f"bytes_{k}": v for k, v in asdict(self.bytes).items()})
        row["bytes"] = self.bytes.total
        row["intensity"] = self.intensity
        return row


@dataclass(frozen=True)
class Phase:
    """A run of steps: its total time, FLOPs and bytes, the bound of most of its time, its
    first and last step, its operators, and of its time the seconds weight-only GEMMs'
    in-kernel conversion adds (``dequant_s``, ``cost.dequant``: the ``dequant`` row)."""

    name: str
    steps: int
    time_s: float
    flops: float
    bytes: ByteCounts
    bound: str
    first_step_s: float
    last_step_s: float
    ops: tuple[OpSummary, ...]
    dequant_s: float = 0.0

    def to_dict(self) -> dict:
        return {"time_s": self.time_s, "flops": self.flops, "bytes": self.bytes.total,
                "bytes_by_source": asdict(self.bytes), "bound": self.bound,
                "steps": self.steps, "first_step_s": self.first_step_s,
                "last_step_s": self.last_step_s, "dequant_s": self.dequant_s}


@dataclass(frozen=True)
class SpeculationSummary:
    """Speculative decoding in one estimate (``schedules.speculate``): drafted tokens per
    round ``k``, the acceptance (one rate or K per-position rates), the draft ("model",
    "mtp", "heads"), expected tokens per round, a round's draft and verify seconds (at the
    mean context), the TPOT of the same configuration without speculation, the speedup
    (plain TPOT / TPOT) and the smallest batch at which speculation stops paying, when
    ``searched`` (1: it pays at no batch; None: it still pays at the search's largest)."""

    k: int
    acceptance: float | list[float]
    draft: str
    tokens_per_round: float
    draft_s_per_round: float
    verify_s_per_round: float
    plain_tpot_s: float
    speedup: float
    break_even_batch: int | None = None
    searched: bool = False          # break_even_batch was searched (single estimates only)

    def to_dict(self) -> dict:
        out = asdict(self)
        del out["searched"]
        if not self.searched:
            del out["break_even_batch"]
        return out


NO_BAND = "no band: device has no kernel measurements"


def band_note(unc: Uncertainty | None) -> str:
    """Whose band the figures carry, in one line (or that there is none)."""
    if unc is None:
        return NO_BAND
    return f"{unc.describe()}; kernel errors correlated within a class, independent across " \
        "classes"



def mean_step(total_s: Num, steps: Num, first_step_s: Num) -> Num:
    """TPOT: the mean decode step (the step at context S+1 when no decode step runs)."""
    return np.where(steps > 0, total_s / np.maximum(steps, 1), first_step_s)


def diffusion_latency(phases_s: Num, denoise_s: Num, gen_len: Num) -> tuple[Num, Num]:
    """(TTFT, TPOT) of a diffusion LM (``schedules.diffusion``): the first token arrives with
    the whole output, after every phase; TPOT = the denoising time / the G tokens."""
    return phases_s, denoise_s / np.maximum(gen_len, 1)


def throughputs(batch: Num, gen_len: Num, e2e_s: Num, tpot_s: Num,
                replicas: int = 1) -> tuple[Num, Num]:
    """(generated tokens per second over the whole request, prefill included; tokens per
    second in decode, 0 when no decode step runs: gen_len 1), over all ``replicas`` (data
    parallelism: each runs its own batch, at one replica's latency)."""
    return (replicas * batch * gen_len / e2e_s,
            np.where(np.asarray(gen_len) > 1, replicas * batch / tpot_s, 0.0))


def expert_imbalance(model: Model, plan: Parallelism, skew: Num) -> Num:
    """The busiest expert-parallel device's (token, expert) pairs over the mean, for routing
    skew ``skew`` under ``plan`` (its ep and redundant experts, ``routing.device_imbalance``);
    1.0 for a dense model or ep = 1."""
    if model.moe is None or plan.ep == 1:
        return np.ones_like(np.asarray(skew, dtype=float))[()]
    return device_imbalance(model.moe.n_experts, model.moe.top_k, skew, plan.ep,
                            plan.expert_replicas)[()]


def context_warning(model: Model, final_len: int) -> str | None:
    """Set when prompt + generation runs past the model's trained context."""
    limit = model.max_position_embeddings
    if limit and final_len > limit:
        return (f"prompt + generated = {final_len} tokens exceeds {model.name}'s "
                f"context limit (max_position_embeddings = {limit})")
    return None


def memory_warning(mem: MemoryEstimate) -> str | None:
    """Set when weights + workspace + KV exceed the usable memory (the sum spelled out)."""
    if mem.fits:
        return None
    return (f"does not fit: weights {mem.weights_bytes:.4g} B + workspace "
            f"{mem.workspace_bytes:.4g} B + KV {mem.kv_cache_bytes:.4g} B > usable "
            f"{mem.usable_bytes:.4g} B (max batch {mem.max_batch})")


@dataclass(frozen=True)
class Estimate:
    """Everything ``perfmodel estimate`` reports for one configuration."""

    hardware: Hardware
    model: Model
    workload: Workload
    plan: Parallelism
    params_total: float
    params_active: float
    memory: MemoryEstimate
    phases: tuple[Phase, ...]
    assumed: tuple[str, ...] = ()       # what the numbers assume (``schedules.assumptions``)
    ttft_without_prefix_cache_s: float | None = None   # the prefill with nothing cached
    speculation: SpeculationSummary | None = None      # speculative decoding, when on
    # the 80% band of each headline figure, (low, high) by name (``schedules.bands``);
    # None: the device has no kernel measurements, so no band
    band: dict[str, tuple[float, float]] | None = None

    def edges(self, figure: str) -> tuple[float, float] | None:
        """(low, high) of ``figure`` ("ttft_s", "tpot_s", "e2e_s",
        "throughput_tokens_per_s", "decode_tokens_per_s"); None without a band."""
        return None if self.band is None else self.band[figure]

    @property
    def band_note(self) -> str:
        """Whose band the figures carry, in one line (or that there is none)."""
        return band_note(self.hardware.uncertainty if self.band is not None else None)

    def phase(self, name: str) -> Phase:
        for p in self.phases:
            if p.name == name:
                return p
        raise KeyError(f"no phase {name!r} (phases: {', '.join(p.name for p in self.phases)})")

    @property
    def prefill(self) -> Phase:
        return self.phase("prefill")

    @property
    def decode(self) -> Phase:
        return self.phase("decode")

    @property
    def denoise(self) -> Phase | None:
        """A diffusion LM's denoising phase (``schedules.diffusion``), None otherwise."""
        return next((p for p in self.phases if p.name == "denoise"), None)

    @property
    def ttft_s(self) -> float:
        if self.denoise is not None:
            return float(self._diffusion()[0])
        return self.prefill.time_s

    @property
    def tpot_s(self) -> float:
        """Mean decode step time (``mean_step``); a diffusion LM's denoise time / G."""
        if self.denoise is not None:
            return float(self._diffusion()[1])
        d = self.decode
        return float(mean_step(d.time_s, d.steps, d.first_step_s))

    def _diffusion(self) -> tuple[Num, Num]:
        return diffusion_latency(self.e2e_s, self.denoise.time_s, self.workload.gen_len)

    @property
    def e2e_s(self) -> float:
        return sum(p.time_s for p in self.phases)

    @property
    def throughput_tokens_per_s(self) -> float:
        """Generated tokens per second over the whole request batch, prefill included."""
        wl = self.workload
        return float(throughputs(wl.batch, wl.gen_len, self.e2e_s, self.tpot_s,
                                 self.plan.dp)[0])

    @property
    def decode_tokens_per_s(self) -> float:
        wl = self.workload
        return float(throughputs(wl.batch, wl.gen_len, self.e2e_s, self.tpot_s,
                                 self.plan.dp)[1])

    @property
    def communication_share(self) -> float:
        """Share of the request's time spent in transfers on the critical path (collectives,
        pipeline point-to-point)."""
        comm = sum(o.time_s for o in self.ops if o.op_class == "communication")
        return comm / self.e2e_s

    @property
    def expert_imbalance(self) -> float:
        """Busiest expert-parallel device's (token, expert) pairs over the mean (1.0: none)."""
        return float(expert_imbalance(self.model, self.plan, self.workload.expert_skew))

    @property
    def context_warning(self) -> str | None:
        return context_warning(self.model, self.workload.final_len)

    @property
    def memory_warning(self) -> str | None:
        return memory_warning(self.memory)

    @property
    def warnings(self) -> list[str]:
        """Things the user should know the numbers rest on (one line each)."""
        return [w for w in (self.context_warning, *self.assumed, self.memory_warning) if w]

    @property
    def ops(self) -> tuple[OpSummary, ...]:
        """Every operator of every phase."""
        return tuple(o for p in self.phases for o in p.ops)

    def to_dict(self) -> dict:
        mem = asdict(self.memory)
        out = {
            "model": self.model.name, "hardware": self.hardware.name,
            **self.hardware.provenance(),
            "workload": asdict(self.workload), "parallelism": asdict(self.plan),
            "params_total": self.params_total, "params_active": self.params_active,
            "weights_bytes": self.memory.weights_bytes,
            "kv_cache_bytes_per_token": self.memory.kv_cache_bytes_per_token,
            "kv_cache_bytes": self.memory.kv_cache_bytes,
            "max_batch": self.memory.max_batch, "fits": self.memory.fits,
            "memory": mem | {"free_bytes": self.memory.free_bytes},
            "ttft_s": self.ttft_s, "tpot_s": self.tpot_s, "e2e_s": self.e2e_s,
            "throughput_tokens_per_s": self.throughput_tokens_per_s,
            "decode_tokens_per_s": self.decode_tokens_per_s, "devices": self.plan.devices,
            "throughput_per_device_tokens_per_s":
                self.throughput_tokens_per_s / self.plan.devices,
            "communication_share": self.communication_share,
            "expert_imbalance": self.expert_imbalance,
        }
        if self.workload.shared_prefix:
            out["ttft_without_prefix_cache_s"] = self.ttft_without_prefix_cache_s
        for figure, (low, high) in (self.band or {}).items():
            out |= {f"{figure}_low": low, f"{figure}_high": high}
        out["band"] = self.band_note
        out |= {p.name: p.to_dict() for p in self.phases}
        if self.speculation is not None:
            out["speculation"] = self.speculation.to_dict()
        out["warnings"] = self.warnings
        return out

    def operators(self):  # -> pandas.DataFrame (pandas imported lazily: keeps the CLI fast)
        """Every operator of every phase, one row each, as a pandas DataFrame."""
        import pandas as pd

        return pd.DataFrame([o.to_dict() for o in self.ops])
