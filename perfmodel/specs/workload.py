"""What is asked of the model: one workload, many workloads as arrays, and the parallelism plan.

``Workload`` is one configuration (batch, lengths, dtypes, serving options). ``Workloads``
holds N of them as numpy arrays, so the cost model prices all N in one call; a single
``Workload`` is the length-1 case. ``Parallelism`` is how one replica is split over devices.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields

import numpy as np

from perfmodel.specs.dtypes import CODE, DTYPES, dtype_code, weight_bytes
from perfmodel.specs.errors import SpecError
from perfmodel.specs.model import Model
from perfmodel.specs.workload_checks import (  # noqa: F401  (the limits: their names here too)
    _BOOL_FIELDS,
    _DTYPE_FIELDS,
    _FLOAT_RANGES,
    _GROUP_NONE,
    _INT_FIELDS,
    MAX_BATCH,
    MAX_DEVICES,
    MAX_GROUP,
    MAX_TOKENS,
    MAXIMUM,
    _check_groups,
    _check_length,
    _check_prefix,
    _column,
    _positive_int,
)


@dataclass(frozen=True)
class Workload:
    """One configuration: ``batch`` sequences, each a prompt of ``prompt_len`` tokens followed
    by ``gen_len`` generated tokens. The prefill emits the first generated token; the remaining
    ``gen_len - 1`` come from decode steps."""

    batch: int = 1
    prompt_len: int = 512
    gen_len: int = 128
    weights_dtype: str = "bf16"
    act_dtype: str = "bf16"
    kv_dtype: str = "bf16"
    weight_group_size: int | None = None   # group-quantized weights carry a scale per group
    weight_scale_bytes: float = 2.0        # bytes of scale (and zero point) per group
    # share of each quantized matrix's input channels kept in 16 bits (LLM.int8()-style)
    outlier_fraction: float = 0.0
    # the LM head at the weights' dtype, group size and scales (TorchAO's quantize_, GPTQ's
    # "lm_head": true), else at the activation dtype (vLLM's default); no effect on 16-bit
    # weights, refused for a head tied to the embedding (``cost.memory.quantized_head``)
    quantize_lm_head: bool = False
    # KV cache scales: kv_scale_bytes per group of kv_group_size cached elements; None: one
    # per (token, head) for an int8/int4 cache (LMDeploy's 16-bit scale and zero point), none
    # for fp8 (a per-tensor scale) and 16-bit caches; 0: none
    kv_group_size: int | None = None
    kv_scale_bytes: float = 4.0
    usable_memory_fraction: float = 0.9    # share of device memory the server may use
    kv_block_tokens: int = 16              # paged-KV block size; 1 = no paging
    cuda_graphs: bool = False              # decode launched as a graph: no per-kernel host cost
    # prefix caching: the first shared_prefix tokens of every prompt are one shared prefix (a
    # system prompt); a share prefix_hit_rate of the requests find its KV cached and prefill
    # only the rest. The prefix's KV blocks are stored once for the batch
    shared_prefix: int = 0
    prefix_hit_rate: float = 1.0
    # MoE routing skew: expert popularity ~ 1 / rank^expert_skew (0: uniform routing)
    expert_skew: float = 0.0

    def __post_init__(self) -> None:
        for name in _INT_FIELDS:
            object.__setattr__(self, name, _positive_int(getattr(self, name),
                                                         f"workload: {name}", MAXIMUM[name]))
        for name in _DTYPE_FIELDS:
            dtype_code(getattr(self, name), f"workload: {name}")
        if self.weight_group_size is not None:
            object.__setattr__(self, "weight_group_size", _positive_int(
                self.weight_group_size, "workload: weight_group_size", MAX_GROUP))
        if self.kv_group_size is not None:
            group = int(_column("kv_group_size", self.kv_group_size))
            object.__setattr__(self, "kv_group_size", None if group < 0 else group)
        if not 0 < self.usable_memory_fraction <= 1:
            raise SpecError("workload: usable_memory_fraction must be in (0, 1]")
        for name in _BOOL_FIELDS:
            object.__setattr__(self, name, bool(_column(name, getattr(self, name))))
        for name in ("weight_scale_bytes", "shared_prefix", "prefix_hit_rate", "expert_skew",
                     "outlier_fraction", "kv_scale_bytes"):
            _column(name, getattr(self, name))
        _check_prefix(np.array([self.shared_prefix]), np.array([self.prompt_len]))
        _check_length(np.array([self.prompt_len]), np.array([self.gen_len]))
        _check_groups({k: np.array([v]) for k, v in _arrays_of(self).items()})

    @classmethod
    def for_model(cls, model: Model, **fields: object) -> Workload:
        """A workload whose weights are stored as ``model``'s checkpoint stores them (its
        ``quantization``: dtype, group size, scale bytes, whether the LM head is quantized)
        unless ``weights_dtype`` is given; bf16 for an unquantized checkpoint. A field given
        as None takes that default."""
        q = model.quantization
        if q is not None and fields.get("weights_dtype") is None:
            fields["weights_dtype"] = q.weights_dtype
            fields.setdefault("weight_group_size", q.group_size)
            fields.setdefault("weight_scale_bytes", q.scale_bytes)
            if fields.get("quantize_lm_head") is None:
                fields["quantize_lm_head"] = q.lm_head
        fields = {k: v for k, v in fields.items() if v is not None or k in _GROUP_NONE}
        return cls(**fields)

    @property
    def weight_bytes_per_param(self) -> float:
        """Bytes per matmul weight, including the scales per group when grouped and the
        16-bit outlier channels (``dtypes.weight_bytes``)."""
        return float(weight_bytes(CODE[self.weights_dtype], self.weight_group_size or 0,
                                  self.weight_scale_bytes, self.outlier_fraction))

    @property
    def final_len(self) -> int:
        return self.prompt_len + self.gen_len


@dataclass(frozen=True)
class Parallelism:
    """How a model is served: each replica split by tensor (``tp``), pipeline (``pp``) and
    expert (``ep``) parallelism, and ``dp`` replicas; a workload's batch is per replica.

    Expert parallelism shards an MoE model's routed experts, whole, over ``ep`` devices:
    inside the tensor-parallel group (``ep == tp``: attention split by heads, every device
    sees every token and runs its own experts, the layer's output all-reduced as under TP),
    or with data-parallel attention (``attention_dp``: ``tp == 1``, each of the ``ep``
    devices runs attention on its share of the batch with whole attention weights, and the
    tokens go to their experts' devices and back by all-to-all).

    ``expert_replicas``: redundant copies of the hottest experts over the EP group, placed
    EPLB-style (``cost.routing.place``); each device then holds ceil((E + r) / ep) experts.
    DeepSeek-V3 serves prefill on EP32 with 32 redundant experts, one more per GPU beside
    its 8 (DeepSeek-V3 Technical Report, arXiv:2412.19437, section 3.4.1)."""

    tp: int = 1
    pp: int = 1
    ep: int = 1
    dp: int = 1
    attention_dp: bool = False
    expert_replicas: int = 0

    def __post_init__(self) -> None:
        for name in ("tp", "pp", "ep", "dp"):
            object.__setattr__(self, name, _positive_int(getattr(self, name),
                                                         f"parallelism: {name}"))
        if not isinstance(self.attention_dp, (bool, np.bool_)):
            raise SpecError(f"parallelism: attention_dp must be true or false, got "
                            f"{self.attention_dp!r}")
        object.__setattr__(self, "attention_dp", bool(self.attention_dp))
        if self.attention_dp and (self.tp != 1 or self.ep < 2):
            raise SpecError(f"parallelism: attention_dp needs tp=1 and ep >= 2 (each of the "
                            f"ep devices runs attention whole), got tp={self.tp}, ep={self.ep}")
        if not self.attention_dp and self.ep not in (1, self.tp):
            raise SpecError(f"parallelism: ep={self.ep} must equal tp={self.tp} (experts "
                            f"sharded inside the tensor-parallel group), or set attention_dp")
        if self.devices > MAX_DEVICES:
            raise SpecError(f"parallelism: {self.describe()} uses {self.devices:,} devices; "
                            f"expected at most {MAX_DEVICES:,}")
        r = self.expert_replicas
        if isinstance(r, (bool, np.bool_)) or not isinstance(r, (int, np.integer)) or r < 0:
            raise SpecError(f"parallelism: expert_replicas must be a non-negative integer, "
                            f"got {r!r}")
        object.__setattr__(self, "expert_replicas", int(r))
        if r and self.ep < 2:
            raise SpecError(f"parallelism: expert_replicas={r} needs expert parallelism "
                            f"(ep >= 2), got ep={self.ep}")

    def require_modelled(self) -> None:
        """SpecError for a plan the cost model does not price yet (never a silent answer).
        Every plan this record accepts is priced; kept for the plans still to come."""

    @property
    def attention_ways(self) -> int:
        """Devices a replica's batch is split over for attention: ep under data-parallel
        attention (each runs batch / ep sequences), else 1."""
        return self.ep if self.attention_dp else 1

    def describe(self) -> str:
        """'TP4 x PP2', 'EP16 (DP attention)', '... x 2 replicas'; '' for one device."""
        parts = [f"TP{self.tp}"] if self.tp > 1 else []
        if self.ep > 1:
            parts = [f"EP{self.ep}" + (", DP attention" if self.attention_dp else
                                       f" in TP{self.tp}")
                     + (f", +{self.expert_replicas} redundant experts"
                        if self.expert_replicas else "")]
        parts += [f"PP{self.pp}"] if self.pp > 1 else []
        text = " x ".join(parts)
        if self.dp > 1:
            text = f"{text or 'one device'} x {self.dp} replicas"
        return text

    @property
    def group(self) -> int:
        """Devices of one pipeline stage: the tensor- or expert-parallel group."""
        return max(self.tp, self.ep)

    @property
    def devices(self) -> int:
        """Devices the plan uses: the group x pp per replica, dp replicas."""
        return self.group * self.pp * self.dp


@dataclass(frozen=True, eq=False)
class Workloads:
    """N workloads as arrays (one entry per configuration); dtypes as codes (``DTYPES``),
    ``weight_group_size`` 0 for none, ``kv_group_size`` -1 (``KV_PER_VECTOR``) for the
    dtype's default. Build with ``of``, ``grid`` or ``from_list``."""

    batch: np.ndarray
    prompt_len: np.ndarray
    gen_len: np.ndarray
    weights_dtype: np.ndarray
    act_dtype: np.ndarray
    kv_dtype: np.ndarray
    weight_group_size: np.ndarray
    weight_scale_bytes: np.ndarray
    outlier_fraction: np.ndarray
    quantize_lm_head: np.ndarray
    kv_group_size: np.ndarray
    kv_scale_bytes: np.ndarray
    usable_memory_fraction: np.ndarray
    kv_block_tokens: np.ndarray
    cuda_graphs: np.ndarray
    shared_prefix: np.ndarray
    prefix_hit_rate: np.ndarray
    expert_skew: np.ndarray

    @classmethod
    def of(cls, **values: object) -> Workloads:
        """Workloads from per-field scalars or sequences, broadcast together (missing fields
        take ``Workload``'s defaults; dtypes by name). SpecError names a bad field."""
        unknown = set(values) - {f.name for f in fields(cls)}
        if unknown:
            raise SpecError(f"workload: unknown field {sorted(unknown)[0]!r}")
        default = Workload()
        raw = {f.name: values.get(f.name, getattr(default, f.name)) for f in fields(cls)}
        for name, none in _GROUP_NONE.items():
            if raw[name] is None:
                raw[name] = none
            elif isinstance(raw[name], (list, tuple)):
                raw[name] = [none if g is None else g for g in raw[name]]
        arrays = dict(zip(raw, np.broadcast_arrays(*(_column(k, v) for k, v in raw.items())),
                          strict=True))
        _check_groups(arrays)
        _check_prefix(arrays["shared_prefix"], arrays["prompt_len"])
        _check_length(arrays["prompt_len"], arrays["gen_len"])
        return cls(**{k: np.ascontiguousarray(v) for k, v in arrays.items()})

    @classmethod
    def grid(cls, **axes: object) -> Workloads:
        """The cartesian product of per-field value lists (the last field varies fastest); a
        single value (a number, a dtype name, None) is an axis of one."""
        names = list(axes)
        lists = [list(v) if isinstance(v, (list, tuple, range, np.ndarray)) else [v]
                 for v in axes.values()]
        sizes = [len(v) for v in lists]
        columns = {}
        for i, (name, values) in enumerate(zip(names, lists, strict=True)):
            inner = int(np.prod(sizes[i + 1:], dtype=np.int64))
            outer = int(np.prod(sizes[:i], dtype=np.int64))
            column = _column(name, [_GROUP_NONE[name] if v is None else v for v in values]) \
                if name in _GROUP_NONE else _column(name, values)
            columns[name] = np.tile(np.repeat(column, inner), outer)
        return cls.of(**columns)

    @classmethod
    def from_list(cls, workloads: Sequence[Workload]) -> Workloads:
        """Workloads of already-checked ``Workload`` records."""
        if len(workloads) == 1:       # one configuration: no need to check it again
            return cls(**{k: np.array([v]) for k, v in _arrays_of(workloads[0]).items()})
        values = {f.name: [getattr(w, f.name) for w in workloads] for f in fields(Workload)}
        return cls.of(**values)

    def __len__(self) -> int:
        return len(self.batch)

    def item(self, i: int) -> Workload:
        """The ``i``-th configuration as a ``Workload``."""
        values = {f.name: getattr(self, f.name)[i] for f in fields(self)}
        for name in _DTYPE_FIELDS:
            values[name] = DTYPES[int(values[name])]
        for name in (*_INT_FIELDS, *_GROUP_NONE):
            values[name] = int(values[name])
        for name, none in _GROUP_NONE.items():
            values[name] = None if values[name] == none else values[name]
        values["usable_memory_fraction"] = float(values["usable_memory_fraction"])
        for name in ("weight_scale_bytes", "prefix_hit_rate", "expert_skew",
                     "outlier_fraction", "kv_scale_bytes"):
            values[name] = float(values[name])
        values["shared_prefix"] = int(values["shared_prefix"])
        for name in _BOOL_FIELDS:
            values[name] = bool(values[name])
        return Workload(**values)

    def take(self, index: np.ndarray) -> Workloads:
        """The configurations at ``index`` (an integer or boolean array)."""
        return Workloads(**{f.name: getattr(self, f.name)[index] for f in fields(self)})

    @property
    def weight_bytes_per_param(self) -> np.ndarray:
        """Bytes per matmul weight: group scales and 16-bit outliers (``weight_bytes``)."""
        return weight_bytes(self.weights_dtype, self.weight_group_size, self.weight_scale_bytes,
                            self.outlier_fraction)

    @property
    def final_len(self) -> np.ndarray:
        return self.prompt_len + self.gen_len

    @property
    def prefix_hits(self) -> np.ndarray:
        """Requests of each batch that find the shared prefix cached: prefix_hit_rate x
        batch, rounded to whole requests (0 without a shared prefix). A hit prefills only
        the prompt_len - shared_prefix tokens after the prefix, which still attend the
        whole prompt; its prefix KV blocks are the one shared copy."""
        return np.where(self.shared_prefix > 0, np.rint(self.prefix_hit_rate * self.batch),
                        0).astype(np.int64)


def _arrays_of(w: Workload) -> dict[str, object]:
    """A ``Workload``'s fields as ``Workloads`` stores them (dtype codes, None groups as
    their array value), scalars."""
    out = {f.name: getattr(w, f.name) for f in fields(w)}
    out |= {name: np.int8(CODE[out[name]]) for name in _DTYPE_FIELDS}
    out |= {name: none if out[name] is None else out[name] for name, none in _GROUP_NONE.items()}
    return out | {name: float(out[name]) for name in _FLOAT_RANGES}
