"""A step is the unit the core prices: ``price_step(model, hw, plan, step, dtypes)``.

A ``Step`` holds N rows (configurations, or engine steps), each a set of G groups of
sequences: ``count`` sequences with ``new_tokens`` new tokens each and ``context`` positions
in the cache after the step (numpy arrays of shape (N, G); a group with count 0 is
padding). A uniform step is one group: prefill T = C = prompt; a decode step T = 1.
Linear layers and elementwise passes run on the step's total tokens; attention and KV
reads are priced per group (``cost.attention``). The operators come from
``layers.step_template``; each kind's records are built for all N rows at once and priced
by ``roofline.op_time`` in one call.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import numpy as np

from perfmodel.cost import instantiate
from perfmodel.cost.band import class_seconds
from perfmodel.cost.error_class import error_code
from perfmodel.cost.layers import step_template
from perfmodel.cost.memory import format_bytes, kv_bytes_per_element, quantized_head
from perfmodel.cost.ops import ByteCounts, OpRecord
from perfmodel.cost.params import other_formats
from perfmodel.cost.roofline import op_time
from perfmodel.cost.timebase import GRAPH, HOST, STREAM, timing_code
from perfmodel.specs.dtypes import (
    BYTES,
    CODE,
    KV_PER_VECTOR,
    compute_codes,
    dtype_code,
    scaled_bytes,
    weight_bytes,
)
from perfmodel.specs.errors import SpecError
from perfmodel.specs.formats import weight_format
from perfmodel.specs.hardware import Hardware
from perfmodel.specs.kinds import op_class
from perfmodel.specs.matmul_path import matmul_codes
from perfmodel.specs.model import Model
from perfmodel.specs.workload import Parallelism

PARTS = ("all", "static", "context")


@dataclass(frozen=True, eq=False)
class Step:
    """N steps of G sequence groups each (arrays of shape (N, G)); see the module docstring.
    ``logits_all``: logits for every new token (speculative verification), not only the
    last of each sequence. ``expert_skew``: the MoE routing's Zipf exponent per step (N,)
    or for all (0: uniform routing; ``cost.routing``). ``causal`` False: bidirectional
    attention, every new token attends all the context (a diffusion LM's denoising step)."""

    count: np.ndarray
    new_tokens: np.ndarray
    context: np.ndarray
    logits_all: bool = False
    expert_skew: np.ndarray | float = 0.0
    causal: bool = True
    extra_logits: np.ndarray | float = 0.0  # (N,) logit rows past one a sequence: drafts

    def __post_init__(self) -> None:
        arrays = [np.asarray(getattr(self, k)) for k in ("count", "new_tokens", "context")]
        if any(a.dtype.kind not in "iu" for a in arrays):
            raise SpecError("step: count, new_tokens and context must be integers")
        count, new, ctx = np.broadcast_arrays(*(np.atleast_2d(a) for a in arrays))
        if count.ndim != 2:
            raise SpecError(f"step: expected arrays of shape (steps, groups), got {count.shape}")
        live = count > 0
        if np.any(count < 0) or not np.all(live.any(axis=1)):
            raise SpecError("step: every step needs at least one sequence (count >= 0)")
        if np.any(live & ((new < 1) | (new > ctx))):
            raise SpecError("step: need 1 <= new_tokens <= context in every group")
        skew = np.asarray(self.expert_skew, dtype=float)
        if skew.ndim > 1 or not np.all(np.isfinite(skew) & (skew >= 0)):
            raise SpecError("step: expert_skew must be a Zipf exponent >= 0, one or per step")
        skew = np.broadcast_to(skew, count.shape[:1])
        for name, value in zip(("count", "new_tokens", "context", "expert_skew"),
                               (count, new, ctx, skew), strict=True):
            object.__setattr__(self, name, value)

    @classmethod
    def uniform(cls, batch: object, new_tokens: object, context: object,
                logits_all: bool = False, expert_skew: np.ndarray | float = 0.0,
                causal: bool = True) -> Step:
        """One group per step: ``batch`` sequences, each with ``new_tokens`` at ``context``."""
        b, t, c = np.broadcast_arrays(*(np.atleast_1d(np.asarray(x)) for x in
                                        (batch, new_tokens, context)))
        return cls(b[:, None], t[:, None], c[:, None], logits_all, expert_skew, causal)

    @classmethod
    def mixed(cls, groups: list[tuple[int, int, int]], logits_all: bool = False,
              expert_skew: float = 0.0) -> Step:
        """One step of several groups, each (count, new_tokens, context)."""
        if not groups or any(not isinstance(g, (tuple, list)) or len(g) != 3 for g in groups):
            bad = next((g for g in groups if not isinstance(g, (tuple, list)) or len(g) != 3),
                       "nothing")
            raise SpecError(f"step: mixed: expected groups of (count, new_tokens, context), "
                            f"got {bad!r}")
        count, new, ctx = (np.array([[g[i] for g in groups]]) for i in range(3))
        return cls(count, new, ctx, logits_all, expert_skew)

    def __len__(self) -> int:
        return self.count.shape[0]


@dataclass(frozen=True, eq=False)
class Dtypes:
    """Per-row dtypes (codes, see ``specs.dtypes``), weight group size (0: none), the bytes
    of scale per group and the share of 16-bit outlier channels; the KV cache's scale group
    (``KV_PER_VECTOR``: its dtype's default, ``dtypes.kv_group``) and bytes per group;
    whether the LM head is stored as the weights are (``quantize_lm_head``,
    ``memory.quantized_head``)."""

    weights: np.ndarray
    acts: np.ndarray
    kv: np.ndarray
    group_size: np.ndarray
    scale_bytes: np.ndarray | float = 2.0
    outlier_fraction: np.ndarray | float = 0.0
    kv_group_size: np.ndarray | int = KV_PER_VECTOR
    kv_scale_bytes: np.ndarray | float = 4.0
    quantize_lm_head: np.ndarray | bool = False

    @classmethod
    def of(cls, weights: str = "bf16", acts: str = "bf16", kv: str = "bf16",
           group_size: int | None = None, scale_bytes: float = 2.0,
           outlier_fraction: float = 0.0, kv_group_size: int | None = None,
           kv_scale_bytes: float = 4.0, quantize_lm_head: bool = False) -> Dtypes:
        codes = [np.array([dtype_code(d, f"dtypes: {n}")]) for n, d in
                 (("weights", weights), ("acts", acts), ("kv", kv))]
        kv_group = KV_PER_VECTOR if kv_group_size is None else kv_group_size
        return cls(*codes, *(np.array([x]) for x in (
            group_size or 0, float(scale_bytes), float(outlier_fraction), kv_group,
            float(kv_scale_bytes), bool(quantize_lm_head))))

    @classmethod
    def of_workloads(cls, w: object) -> Dtypes:
        """The dtypes of every configuration of a ``Workloads``."""
        return cls(w.weights_dtype, w.act_dtype, w.kv_dtype, w.weight_group_size,
                   w.weight_scale_bytes, w.outlier_fraction, w.kv_group_size,
                   w.kv_scale_bytes, w.quantize_lm_head)

    def take(self, index: np.ndarray) -> Dtypes:
        return Dtypes(*(np.broadcast_to(getattr(self, f.name), self.weights.shape)[index]
                        for f in fields(self)))

    @property
    def quantized_bytes(self) -> np.ndarray:
        """Bytes per quantized matmul weight with its group scales (``scaled_bytes``): the
        channels not kept in 16 bits (``cost.outliers``)."""
        return scaled_bytes(self.weights, self.group_size, self.scale_bytes)

    @property
    def weight_bytes(self) -> np.ndarray:
        """Bytes per matmul weight: group scales and 16-bit outliers (``weight_bytes``)."""
        return weight_bytes(self.weights, self.group_size, self.scale_bytes,
                            self.outlier_fraction)

    def kv_bytes(self, model: Model) -> np.ndarray:
        """Bytes per cached KV element of ``model``, scales included
        (``memory.kv_bytes_per_element``)."""
        return kv_bytes_per_element(model, self.kv, self.kv_group_size, self.kv_scale_bytes)

    def quantized_head(self, model: Model) -> np.ndarray:
        """Where ``model``'s LM head is stored at the weights' dtype, group size and scales
        (``memory.quantized_head``; SpecError for a tied head)."""
        return quantized_head(model, self.quantize_lm_head, self.weights)


class OperatorTotals:
    """Per-row totals of a cost held as (operators, N) arrays ``time_s``, ``flops``,
    ``bytes``, ``error_codes`` (each operator's error class, ``cost.error_class``): what a
    step or a phase adds up to."""

    time_s: np.ndarray
    flops: np.ndarray
    bytes: ByteCounts
    error_codes: np.ndarray

    def class_seconds(self) -> np.ndarray:
        """(error classes, N) seconds of each row per error class (``cost.band``)."""
        return class_seconds(self.time_s, self.error_codes)

    @property
    def time(self) -> np.ndarray:
        """Seconds of each row (N,)."""
        return self.time_s.sum(axis=0)

    @property
    def total_flops(self) -> np.ndarray:
        return self.flops.sum(axis=0)

    @property
    def total_bytes(self) -> ByteCounts:
        return ByteCounts(*(b.sum(axis=0) for b in self.bytes.astuple()))


@dataclass(frozen=True, eq=False)
class StepCost(OperatorTotals):
    """Every operator of N steps: arrays of shape (operators, N), operators grouped by
    record type (``names``, ``kinds``, ``classes``; ``positions``: each one's place in the
    step template, the order to show them in). ``count``: instances in the step
    (0: the operator does not run in that row); ``flops``, ``bytes`` and ``time_s`` cover all
    instances; ``compute_s``, ``memory_s``, ``fixed_s`` are per instance; ``bound`` codes
    (``roofline.BOUNDS``); ``dequant_s``: of ``time_s``, the seconds a weight-only GEMM's
    in-kernel conversion adds (``cost.dequant``; 0 for every other operator);
    ``error_codes``: each operator's error class in each row (``cost.error_class``), what
    its uncertainty band is read from (``cost.band``)."""

    names: tuple[str, ...]
    kinds: tuple[str, ...]
    classes: tuple[str, ...]
    positions: np.ndarray
    count: np.ndarray
    flops: np.ndarray
    bytes: ByteCounts
    time_s: np.ndarray
    compute_s: np.ndarray
    memory_s: np.ndarray
    fixed_s: np.ndarray
    bound: np.ndarray
    compute_efficiency: np.ndarray
    memory_efficiency: np.ndarray
    dtype: np.ndarray            # compute dtype codes (``specs.dtypes``)
    dequant_s: np.ndarray
    error_codes: np.ndarray

    def take(self, index: slice | np.ndarray) -> StepCost:
        """The steps at ``index`` (along N)."""
        arrays = {k: getattr(self, k)[:, index] for k in (
            "count", "flops", "time_s", "compute_s", "memory_s", "fixed_s", "bound",
            "compute_efficiency", "memory_efficiency", "dtype", "dequant_s", "error_codes")}
        return StepCost(self.names, self.kinds, self.classes, self.positions, bytes=ByteCounts(
            *(b[:, index] for b in self.bytes.astuple())), **arrays)



def default_timing(hw: Hardware) -> int:
    """How host launches count on ``hw``: added on a sync device, overlapped elsewhere."""
    return HOST if hw.efficiency.launch_mode == "sync" else STREAM


def price_step(model: Model, hw: Hardware, plan: Parallelism, step: Step, dtypes: Dtypes,
               timing: str | np.ndarray | int | None = None, part: str = "all") -> StepCost:
    """Time, FLOPs and bytes of every operator of every row of ``step``.

    ``timing``: how host launches count (``roofline``; None: the device's own, a name, or
    codes per row). ``part``: "all" operators, or only the "context" ones (whose shape moves
    with the context: attention, MLA's form-dependent projections) or the "static" rest."""
    check_records(model, hw, plan, step, dtypes)
    names, kinds, positions, t, built = _build(model, hw, plan, step, dtypes, timing, part)
    out = np.zeros((_FIELDS, len(names), len(step)))
    codes = np.zeros((len(names), len(step)), np.int8)
    start = 0
    for block, rec in built:
        end = start + len(block.positions)
        out[0, start:end] = rec.count
        if out[0, start:end].any():
            _priced(out[:, start:end], rec, hw, t)
            codes[start:end] = error_code(rec, codes[start:end].shape)
        start = end
    return StepCost(names, kinds, tuple(op_class(k) for k in kinds), positions, out[0], out[1],
                    ByteCounts(*out[2:7]), *out[7:], codes)


_RECORDS = (("model", Model, "pm.model('llama-3-8b')"),
            ("hw", Hardware, "pm.hardware('h100-sxm')"),
            ("plan", Parallelism, "pm.Parallelism()"),
            ("step", Step, "pm.Step.uniform(8, 1, 2048)"),
            ("dtypes", Dtypes, "pm.Dtypes.of()"))


def check_records(*args: object) -> None:
    """SpecError naming the first argument of ``price_step`` that is not the record its
    place expects (hardware and model swapped raised an AttributeError)."""
    for (what, kind, example), value in zip(_RECORDS, args, strict=True):
        if not isinstance(value, kind):
            hint = f" (a name: load it first, {example})" if isinstance(value, str) else ""
            raise SpecError(f"price_step: argument {what!r} must be a {kind.__name__} record "
                            f"like {example}, got type {type(value).__name__}{hint}; the "
                            "order is (model, hw, plan, step, dtypes)")


def step_records(model: Model, hw: Hardware | None, plan: Parallelism, step: Step,
                 dtypes: Dtypes, timing: str | np.ndarray | int | None = None
                 ) -> list[OpRecord]:
    """Every operator of ``step`` as its own named record over the N rows, in template
    order (what the harness times and ``compare`` reads); operators that run in no row are
    left out. ``roofline.op_time`` of each, summed, is ``price_step``'s time on ``hw``.
    ``hw`` None: the kernels only (the per-layer framework glue is priced on a device)."""
    names, _, positions, _, built = _build(model, hw, plan, step, dtypes, timing, "all")
    name_at = dict(zip(positions.tolist(), names, strict=True))
    out = {}
    for block, rec in built:
        for j, pos in enumerate(block.positions):
            one = replace(rec.take(j), name=name_at[pos])
            if np.any(one.count):
                out[pos] = one
    return [out[p] for p in sorted(out)]


def _build(model: Model, hw: Hardware | None, plan: Parallelism, step: Step, dtypes: Dtypes,
           timing: str | np.ndarray | int | None, part: str) -> tuple:
    """(names, kinds, positions, timing codes, [(block, record)]) of ``part`` of the template
    for every row of ``step`` (``hw`` None: no framework glue)."""
    plan.require_modelled()
    names, kinds, blocks, positions = compiled(model, plan.tp, part, plan.ep,
                                               plan.attention_dp)
    if timing is not None:
        t = timing_code(timing)
    else:
        t = default_timing(hw) if hw is not None else STREAM
    values = _values(model, step, dtypes, plan, hw)
    built = [(block, instantiate.build(block, values, step, hw, t)) for block in blocks]
    return names, kinds, positions, t, built


def compiled(model: Model, tp: int, part: str, ep: int = 1, dispatch: bool = False) -> tuple:
    """(names, kinds, blocks, positions) of the template's ``part``: the blocks of
    ``instantiate.compile_template``, and the operator names, kinds and template positions in
    block order (the order of a ``StepCost``'s rows). Cached on the model."""
    if part not in PARTS:
        raise ValueError(f"part must be one of {', '.join(PARTS)}, got {part!r}")
    key = ("compiled", tp, part, ep, dispatch)
    if key not in model.memo:
        specs = [s for s in step_template(model, tp, ep, dispatch)
                 if part == "all" or s.context == (part == "context")]
        blocks = instantiate.compile_template(specs)
        at = [i for b in blocks for i in b.positions]     # positions within ``specs``
        template = {id(s): i for i, s in enumerate(step_template(model, tp, ep, dispatch))}
        model.memo[key] = (tuple(specs[i].name for i in at),
                           tuple(instantiate.spec_kind(specs[i]) for i in at), blocks,
                           np.array([template[id(specs[i])] for i in at]))
    return model.memo[key]


_FIELDS = 16    # count, flops, 5 byte sources, time, compute, memory, fixed, bound, c, m,
                # the compute dtype, the conversion's seconds


def _priced(out: np.ndarray, rec: object, hw: Hardware, timing: np.ndarray | int) -> None:
    """Fill ``out`` (fields x operators x rows; the count already in field 0)."""
    count = out[0]
    times = op_time(rec, hw, timing)
    out[1] = rec.flops * count
    for j, b in enumerate(rec.bytes.astuple()):
        out[2 + j] = b * count
    for j, x in enumerate((times.time_s, times.compute_s, times.memory_s, times.fixed_s,
                           times.bound, times.compute_efficiency, times.memory_efficiency,
                           rec.dtype, times.dequant_s)):
        out[7 + j] = x


def _values(model: Model, step: Step, dtypes: Dtypes, plan: Parallelism | None = None,
            hw: Hardware | None = None) -> instantiate.Values:
    """The step quantities and per-row dtype figures the template's records need; the
    quantized linears' compute dtype and activation quantization as ``hw``'s engines run
    them (``specs.matmul_path``; ``hw`` None: the wider operand's dtype, weight-only)."""
    count, new, _ctx = step.count, step.new_tokens, step.context
    tokens = (count * new).sum(axis=1).astype(float)
    seqs = count.sum(axis=1).astype(float)
    values = instantiate.Values(
        tokens=tokens, seqs=seqs, logits=tokens if step.logits_all else seqs + step.extra_logits,
        ab=BYTES[dtypes.acts], kvb=dtypes.kv_bytes(model), wb=dtypes.quantized_bytes,
        outliers=np.asarray(dtypes.outlier_fraction, dtype=float), act=dtypes.acts,
        matmul=compute_codes(dtypes.weights, dtypes.acts) if hw is None else
        matmul_codes(hw, dtypes.weights, dtypes.group_size, dtypes.acts),
        weights=dtypes.weights,
        attention=compute_codes(dtypes.kv, dtypes.acts), head=dtypes.quantized_head(model))
    for name in set(other_formats(model).values()):
        f = weight_format(name)
        code = np.full(np.shape(dtypes.acts), CODE[f.weights])
        group = np.full(np.shape(dtypes.acts), f.group_size or 0)
        compute = compute_codes(code, dtypes.acts) if hw is None else \
            matmul_codes(hw, code, group, dtypes.acts)
        values.formats[name] = (format_bytes(name), CODE[f.weights], compute)
    if model.moe is not None:
        ep = plan.ep if plan is not None else 1
        spread = ep if plan is not None and plan.attention_dp else 1
        replicas = plan.expert_replicas if plan is not None else 0
        values.moe(model.moe.n_experts, model.moe.top_k, step.expert_skew, ep, spread,
                   replicas)
    if model.mla is not None:
        values.mla(model, step)
    return values


def composed_seconds(cost: StepCost, timing: np.ndarray | int) -> np.ndarray:
    """(N,) the fixed-cost seconds each step's kernels pay inside a CUDA graph (``timing``
    ``graph``; 0 for any other step): the seconds the band's composition term moves
    (``cost.band``, ``specs.composition``)."""
    graph = np.asarray(timing_code(timing)) == GRAPH
    return np.where(graph, (cost.fixed_s * cost.count).sum(axis=0), 0.0)


__all__ = ["CODE", "Dtypes", "Step", "StepCost", "composed_seconds", "default_timing",
           "price_step", "step_records"]
