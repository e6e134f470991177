"""Estimates of N configurations at once, and the public ``estimate`` / ``estimate_many``.

``estimate_many(hardware, model, workloads, plan)`` prices every configuration of a
``Workloads`` (arrays of batch, prompt, generated length, dtypes, ...) in one vectorised
call of the static-request schedule and returns ``Estimates``: arrays of every reported
number, ``columns()`` (one flat record per configuration, pandas-ready) and ``item(i)``,
the typed ``Estimate`` of one. ``estimate`` is the length-1 case.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from functools import cached_property

import numpy as np

from perfmodel.cost.band import kernel_band
from perfmodel.cost.dequant import converts
from perfmodel.cost.error_class import CODE
from perfmodel.cost.memory import MemoryEstimate, memory_estimate
from perfmodel.cost.ops import ByteCounts
from perfmodel.cost.params import param_counts
from perfmodel.cost.timebase import BOUNDS, COMPUTE
from perfmodel.schedules.assumptions import Assumption, assumptions, check_plan, joined
from perfmodel.schedules.bands import FIGURES, Edges, request_bands
from perfmodel.schedules.diffusion import (
    DENOISE,
    Diffusion,
    diffusion_assumptions,
    diffusion_request,
)
from perfmodel.schedules.draft_memory import with_draft
from perfmodel.schedules.estimate import (
    Estimate,
    OpSummary,
    Phase,
    band_note,
    context_warning,
    diffusion_latency,
    expert_imbalance,
    mean_step,
    memory_warning,
    throughputs,
)
from perfmodel.schedules.phases import DEQUANT, PhaseCost
from perfmodel.schedules.pipeline import pipelined_request
from perfmodel.schedules.speculate import SpeculationArrays, speculate, with_break_even
from perfmodel.schedules.speculative import Speculation
from perfmodel.schedules.static import static_request
from perfmodel.specs.dtypes import DTYPES, compute_codes
from perfmodel.specs.errors import SpecError
from perfmodel.specs.hardware import Hardware
from perfmodel.specs.model import Model
from perfmodel.specs.uncertainty import ERROR_CLASSES, Uncertainty
from perfmodel.specs.workload import Parallelism, Workload, Workloads


def _edge(figure: str, side: int) -> property:
    def get(self: Estimates) -> np.ndarray:
        edges = self.bands
        return getattr(self, figure) if edges is None else edges[figure][side]
    get.__doc__ = (f"(N,) the {('low', 'high')[side]} edge of ``{figure}``'s 80% band "
                   f"(``schedules.bands``); ``{figure}`` itself where the device has no band")
    return property(get)


@dataclass(frozen=True, eq=False)
class Estimates:
    """N estimates of one model on one device under one plan, as arrays (one entry each).
    Where the device has an ``uncertainty:`` block, each headline figure has an 80% band:
    ``ttft_s_low`` / ``ttft_s_high``, ``tpot_s_*``, ``e2e_s_*``,
    ``throughput_tokens_per_s_*``, ``decode_tokens_per_s_*`` (the pessimistic edge: the
    times' ``_high``, the throughputs' ``_low``); ``has_band`` says whether there is one."""

    hardware: Hardware
    model: Model
    plan: Parallelism
    workloads: Workloads
    params_total: float
    params_active: float
    memory: MemoryEstimate
    phases: tuple[PhaseCost, ...]
    assumed: tuple[Assumption, ...] = ()    # (mask, line): ``schedules.assumptions``
    uncached_ttft: np.ndarray | None = None  # prefill with no prefix cached (if any hits)
    speculation: SpeculationArrays | None = None     # speculative decoding, when on

    def __len__(self) -> int:
        return len(self.workloads)

    @cached_property
    def bands(self) -> Edges | None:
        """(low, high) per headline figure (``schedules.bands.FIGURES``); None without a
        band (the device's file has no ``uncertainty:`` block)."""
        unc = self.hardware.uncertainty
        if unc is None:
            return None
        w = self.workloads
        return request_bands(self.phases, unc, w.batch, w.gen_len, self.plan.dp,
                             self.hardware.composition)

    @property
    def has_band(self) -> bool:
        return self.hardware.uncertainty is not None

    ttft_s_low, ttft_s_high = _edge("ttft_s", 0), _edge("ttft_s", 1)
    tpot_s_low, tpot_s_high = _edge("tpot_s", 0), _edge("tpot_s", 1)
    e2e_s_low, e2e_s_high = _edge("e2e_s", 0), _edge("e2e_s", 1)
    throughput_tokens_per_s_low = _edge("throughput_tokens_per_s", 0)
    throughput_tokens_per_s_high = _edge("throughput_tokens_per_s", 1)
    decode_tokens_per_s_low = _edge("decode_tokens_per_s", 0)
    decode_tokens_per_s_high = _edge("decode_tokens_per_s", 1)

    def phase(self, name: str) -> PhaseCost:
        return next(p for p in self.phases if p.name == name)

    @property
    def ttft_s(self) -> np.ndarray:
        if any(p.name == DENOISE for p in self.phases):
            return self._diffusion()[0]
        return self.phase("prefill").time

    @property
    def tpot_s(self) -> np.ndarray:
        """Mean decode step (``estimate.mean_step``); a diffusion LM's denoise time / G."""
        if any(p.name == DENOISE for p in self.phases):
            return self._diffusion()[1]
        d = self.phase("decode")
        return mean_step(d.time, d.steps, d.first_step_s)

    def _diffusion(self) -> tuple[np.ndarray, np.ndarray]:
        return diffusion_latency(self.e2e_s, self.phase(DENOISE).time, self.workloads.gen_len)

    @property
    def e2e_s(self) -> np.ndarray:
        return sum(p.time for p in self.phases)

    @property
    def throughput_tokens_per_s(self) -> np.ndarray:
        w = self.workloads
        return throughputs(w.batch, w.gen_len, self.e2e_s, self.tpot_s, self.plan.dp)[0]

    @property
    def decode_tokens_per_s(self) -> np.ndarray:
        w = self.workloads
        return throughputs(w.batch, w.gen_len, self.e2e_s, self.tpot_s, self.plan.dp)[1]

    def item(self, i: int) -> Estimate:
        """The typed estimate of configuration ``i``."""
        converts = bool(self.converts[i])
        return Estimate(self.hardware, self.model, self.workloads.item(i), self.plan,
                        self.params_total, self.params_active, self.memory.item(i),
                        tuple(_phase(p, i, converts, self.hardware.uncertainty)
                              for p in self.phases),
                        tuple(line for mask, line in self.assumed
                              if np.broadcast_to(mask, (len(self),))[i]),
                        float(self.ttft_without_prefix_cache_s[i]),
                        self.speculation.item(i) if self.speculation else None,
                        None if self.bands is None else {
                            k: (float(lo[i]), float(hi[i])) for k, (lo, hi) in
                            self.bands.items()})

    @property
    def converts(self) -> np.ndarray:
        """(N,) where the GEMMs convert their weights in the kernel (``dequant.converts``):
        the estimates that show a ``dequant`` row."""
        w = self.workloads
        return np.broadcast_to(converts(self.hardware, w.weights_dtype,
                                        compute_codes(w.weights_dtype, w.act_dtype)), (len(w),))

    @property
    def ttft_without_prefix_cache_s(self) -> np.ndarray:
        """TTFT with nothing cached (equal to ``ttft_s`` where no request hits a prefix)."""
        return self.ttft_s if self.uncached_ttft is None else self.uncached_ttft

    def warnings(self) -> list[str]:
        """Per configuration: its warnings joined by "; " ('' for none): the context limit,
        the assumptions, then memory."""
        assumed = joined(list(self.assumed), len(self))
        out = [""] * len(self)
        final = self.workloads.final_len
        limit = self.model.max_position_embeddings
        for i in np.flatnonzero(final > limit) if limit else ():
            out[i] = context_warning(self.model, int(final[i]))
        for i in np.flatnonzero(assumed != "").tolist():
            out[i] = f"{out[i]}; {assumed[i]}" if out[i] else assumed[i]
        mem = self.memory
        bad = np.flatnonzero(~np.asarray(mem.fits))
        figures = [np.broadcast_to(getattr(mem, k), (len(self),))[bad].tolist() for k in (
            "weights_bytes", "workspace_bytes", "kv_cache_bytes", "usable_bytes", "max_batch")]
        for i, *values in zip(bad.tolist(), *figures, strict=True):
            text = memory_warning(MemoryEstimate(0.0, values[3], values[0], 0.0, 0.0,
                                                 values[2], values[1], values[4], False))
            out[i] = f"{out[i]}; {text}" if out[i] else text
        return out

    def columns(self) -> dict[str, np.ndarray | list]:
        """One flat record per configuration, as columns: the scalars of ``to_dict`` (model,
        hardware, params, memory figures, latencies, throughputs, warnings), ``workload_*``,
        the plan (``tp``, ``pp``, ``ep``, ``dp``), and ``<phase>_*`` per phase."""
        n, mem, w = len(self), self.memory, self.workloads
        out: dict[str, np.ndarray | list] = {
            "model": [self.model.name] * n, "hardware": [self.hardware.name] * n,
            "engine": [self.hardware.engine] * n,
            "params_total": np.full(n, self.params_total),
            "params_active": np.full(n, self.params_active),
            "weights_bytes": mem.weights_bytes,
            "kv_cache_bytes_per_token": mem.kv_cache_bytes_per_token * np.ones(n),
            "kv_cache_bytes": mem.kv_cache_bytes, "max_batch": mem.max_batch,
            "fits": mem.fits, "ttft_s": self.ttft_s, "tpot_s": self.tpot_s,
            "e2e_s": self.e2e_s, "throughput_tokens_per_s": self.throughput_tokens_per_s,
            "decode_tokens_per_s": self.decode_tokens_per_s, "warnings": self.warnings(),
            "ttft_without_prefix_cache_s": self.ttft_without_prefix_cache_s,
            "devices": np.full(n, self.plan.devices),
            "communication_share": sum(p.class_time("communication") for p in self.phases)
            / self.e2e_s,
            "expert_imbalance": expert_imbalance(self.model, self.plan, w.expert_skew),
            "throughput_per_device_tokens_per_s":
                self.throughput_tokens_per_s / self.plan.devices,
            "kv_cache_bytes_per_sequence": mem.kv_cache_bytes_per_sequence,
            "usable_bytes": mem.usable_bytes}
        for f in fields(w):
            value = getattr(w, f.name)
            if f.name.endswith("_dtype"):
                value = np.asarray(DTYPES)[value]
            elif f.name == "weight_group_size":
                value = np.where(value > 0, value, None)
            elif f.name == "kv_group_size":       # None: the KV dtype's default
                value = np.where(value >= 0, value, None)
            out[f"workload_{f.name}"] = value
        for f in fields(self.plan):
            out[f.name] = np.full(n, getattr(self.plan, f.name))
        out |= self.speculation.columns() if self.speculation else {}
        out["band"] = [band_note(self.hardware.uncertainty)] * n
        for figure in FIGURES if self.bands is not None else ():
            out |= {f"{figure}_low": self.bands[figure][0],
                    f"{figure}_high": self.bands[figure][1]}
        for p in self.phases:
            total = p.total_bytes.total
            out |= {f"{p.name}_time_s": p.time, f"{p.name}_flops": p.total_flops,
                    f"{p.name}_bytes": total,
                    f"{p.name}_bound": np.asarray(BOUNDS)[p.phase_bound],
                    f"{p.name}_steps": p.steps, f"{p.name}_first_step_s": p.first_step_s,
                    f"{p.name}_last_step_s": p.last_step_s,
                    f"{p.name}_dequant_s": p.class_time(DEQUANT)}
        return out


def _phase(p: PhaseCost, i: int, converts: bool = False,
           unc: Uncertainty | None = None) -> Phase:
    """Phase ``i`` of ``p``: its operators, each without the seconds its weight conversion
    adds, and where the weights are converted (``converts``) one ``dequant`` row with them
    (``cost.dequant``; a GEMM's error class), so the rows still add up to the phase; each
    operator with its own band under ``unc``."""
    live = [j for j in np.argsort(p.positions).tolist() if p.count[j, i] > 0]
    count, flops, time, bound, dequant, codes = (x[:, i].tolist() for x in (
        p.count, p.flops, p.time_s, p.bound, p.dequant_s, p.error_codes))
    nbytes = [b[:, i].tolist() for b in p.bytes.astuple()]
    ops = tuple(OpSummary(p.name, p.names[j], p.kinds[j], p.classes[j], count[j], flops[j],
                          ByteCounts(*(b[j] for b in nbytes)), time[j] - dequant[j],
                          BOUNDS[int(bound[j])], *_own_band(time[j] - dequant[j],
                                                            int(codes[j]), unc))
                for j in live)
    added = sum(dequant)
    if converts:
        ops += (OpSummary(p.name, DEQUANT, DEQUANT, DEQUANT, 0.0, 0.0, ByteCounts(), added,
                          BOUNDS[COMPUTE], *_own_band(added, CODE["gemm"], unc)),)
    total = ByteCounts(*(sum(b) for b in nbytes))
    return Phase(p.name, int(p.steps[i]), sum(time), sum(flops), total,
                 BOUNDS[int(p.phase_bound[i])], float(p.first_step_s[i]),
                 float(p.last_step_s[i]), ops, added)


def _own_band(t: float, code: int, unc: Uncertainty | None
              ) -> tuple[str, tuple[float, float] | None]:
    """(error class, its band on ``t`` seconds alone) for an operator of class ``code``: the
    class's kernel band (``cost.band.kernel_band``), the whole rule for one class."""
    name = ERROR_CLASSES[code]
    if unc is None:
        return name, None
    low, high = kernel_band(t, name, unc)
    return name, (float(low), float(high))


def device_batch(w: Workloads, plan: Parallelism) -> Workloads:
    """The workloads one device steps through: a replica's batch split over the devices
    of data-parallel attention (``Parallelism.attention_ways``), all stepping in lockstep."""
    ways = plan.attention_ways
    if ways == 1:
        return w
    return replace(w, batch=np.ceil(w.batch / ways).astype(np.int64))


def estimate_many(hardware: Hardware, model: Model, workloads: Workloads,
                  plan: Parallelism | None = None, speculation: Speculation | None = None,
                  diffusion: Diffusion | None = None) -> Estimates:
    """Predict every configuration of ``workloads`` in one vectorised call (``speculation``:
    decode by speculative rounds, ``schedules.speculate``; ``diffusion``: a diffusion LM's
    denoising steps instead of prefill and decode, ``schedules.diffusion``). Pure."""
    plan = plan or Parallelism()
    check_arguments(hardware, model, workloads, plan)
    plan.require_modelled()
    check_plan(hardware, model, plan)
    counts = param_counts(model)
    found = tuple(assumptions(hardware, model, workloads, plan))
    schedule = static_request if plan.pp == 1 else pipelined_request
    priced = device_batch(workloads, plan)
    if diffusion is not None:
        if speculation is not None:
            raise SpecError("estimate: speculative decoding and diffusion steps exclude "
                            "each other")
        return Estimates(hardware, model, plan, workloads, counts.total, counts.active(model),
                         memory_estimate(model, hardware, plan, workloads),
                         diffusion_request(model, hardware, plan, priced, diffusion),
                         (*found, *diffusion_assumptions(workloads, diffusion)))
    phases = schedule(model, hardware, plan, priced)
    spec = None
    if speculation is not None:
        phases, found, spec = speculate(model, hardware, plan, priced, speculation, phases,
                                        found)
    uncached = None
    if (priced.prefix_hits > 0).any():
        cold = replace(priced, shared_prefix=np.zeros_like(priced.shared_prefix))
        uncached = schedule(model, hardware, plan, cold)[0].time
    memory = memory_estimate(model, hardware, plan, workloads)
    if speculation is not None:
        memory = with_draft(memory, model, hardware, plan, priced, speculation)
    return Estimates(hardware, model, plan, workloads, counts.total, counts.active(model),
                     memory, phases, found,
                     uncached, spec)


def estimate(hardware: Hardware, model: Model, workload: Workload | None = None,
             plan: Parallelism | None = None, speculation: Speculation | None = None,
             diffusion: Diffusion | None = None) -> Estimate:
    """Predict one configuration (the length-1 case of ``estimate_many``; with
    ``speculation``, its break-even batch too). Pure: reads nothing, writes nothing."""
    workload = Workload() if workload is None else workload
    if isinstance(workload, Workloads):
        raise SpecError("estimate: workload is a Workloads (many configurations); price it "
                        "with estimate_many")
    check_arguments(hardware, model, workload, plan or Parallelism())
    e = estimate_many(hardware, model, Workloads.from_list([workload]), plan,
                      speculation, diffusion).item(0)
    if speculation is None:
        return e
    return replace(e, speculation=with_break_even(e.speculation, model, hardware, e.plan,
                                                  speculation, workload))


_EXPECTED = (("hardware", Hardware, "pm.hardware('h100-sxm')"),
             ("model", Model, "pm.model('llama-3-8b')"),
             ("workload", (Workload, Workloads), "pm.Workload(batch=8)"),
             ("plan", Parallelism, "pm.Parallelism(tp=2)"))


def check_arguments(*args: object) -> None:
    """SpecError naming the first argument of ``(hardware, model, workload(s), plan)`` that is
    not the record expected (a name where a record belongs, arguments swapped)."""
    for (what, kind, example), value in zip(_EXPECTED, args, strict=True):
        if not isinstance(value, kind):
            got = f"type {type(value).__name__}"
            hint = f" (a name: load it first, {example})" if isinstance(value, str) else ""
            raise SpecError(f"estimate: argument {what!r} must be a {what} record like "
                            f"{example}, got {got}{hint}; the order is (hardware, model, "
                            f"workload, plan)")
