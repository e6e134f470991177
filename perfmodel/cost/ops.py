"""Operator records: FLOPs and bytes moved, split by where the bytes come from.

One record type per byte formula (``Gemm``, ``Attention``, ``Pointwise`` for the elementwise
kinds, ``Embedding``, ``KvWrite``, ``AllReduce`` and ``AllToAll``, ``LayerOverhead``); the
kinds themselves are declared in ``specs.kinds``. A record's fields are numbers or numpy arrays
that broadcast together: one record holds any number of instances (every GEMM of a step for N
configurations, or 72,000 measured GEMM rows), and the cost model prices them in one call.
``Attention``'s ``batch``, ``q_len`` and ``kv_len`` carry a last axis of sequence groups (a
step mixing prefill chunks and decodes at different contexts); its other fields, like every
other record's, have the instance shape. Dtypes are codes (``specs.dtypes``).

``count`` is how many times an instance runs in a step (its layers); FLOPs and bytes are per
instance. Each property here is the one formula for its kernel type: ``cost.layers`` builds
records from a model, ``compare`` from measurement rows, and the harness times the kernels
they describe, so the model and its validation cannot drift apart.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from functools import cached_property
from typing import ClassVar

import numpy as np

from perfmodel.cost.positions import attended_positions, kept_positions
from perfmodel.specs.dtypes import DTYPES
from perfmodel.specs.kinds import KINDS, POINTWISE, POINTWISE_CODE

Num = float | np.ndarray
_BF16 = DTYPES.index("bf16")


@dataclass(frozen=True)
class ByteCounts:
    """Bytes moved to or from device memory, by source (numbers or arrays). Summable."""

    weights: Num = 0.0
    act_read: Num = 0.0
    act_write: Num = 0.0
    kv_read: Num = 0.0
    kv_write: Num = 0.0

    @property
    def total(self) -> Num:
        return self.weights + self.act_read + self.act_write + self.kv_read + self.kv_write

    def __add__(self, other: ByteCounts) -> ByteCounts:
        return ByteCounts(*(a + b for a, b in zip(self.astuple(), other.astuple(), strict=True)))

    def scaled(self, factor: Num) -> ByteCounts:
        return ByteCounts(*(a * factor for a in self.astuple()))

    def astuple(self) -> tuple[Num, Num, Num, Num, Num]:
        return (self.weights, self.act_read, self.act_write, self.kv_read, self.kv_write)


@dataclass(frozen=True, kw_only=True, eq=False)
class OpRecord:
    """Fields every record has: a label, the compute dtype (code) and instances per step."""

    kind: ClassVar[str] = ""
    name: str = ""
    dtype: Num = _BF16
    count: Num = 1.0

    @property
    def rule(self) -> str:
        """The roofline rule that times this record (``specs.kinds``)."""
        return KINDS[self.kind].rule

    @property
    def flops(self) -> Num:
        return 0.0

    @property
    def bytes(self) -> ByteCounts:
        return ByteCounts()

    @property
    def intensity(self) -> Num:
        """Arithmetic intensity in FLOP per byte of memory traffic (inf without traffic)."""
        total = np.asarray(self.bytes.total, dtype=float)
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(total > 0, self.flops / np.where(total > 0, total, 1.0), np.inf)

    @property
    def shape(self) -> tuple[int, ...]:
        """The instance shape: every field broadcast together (groups excluded)."""
        return np.broadcast_shapes(*(np.shape(getattr(self, f)) for f in self._instance()))

    def _instance(self) -> tuple[str, ...]:
        return tuple(f.name for f in fields(self) if f.name != "name")

    def take(self, index: int | np.ndarray) -> OpRecord:
        """The instances at ``index`` along the first axis (fields broadcast first)."""
        shape = self.shape
        out = {}
        for name in self._instance():
            value = np.asarray(getattr(self, name))
            full = np.broadcast_to(value, shape + value.shape[len(shape):]) \
                if value.ndim > len(shape) else np.broadcast_to(value, shape)
            out[name] = full[index]
        return replace(self, **out)

    def dtype_name(self, i: int = 0) -> str:
        return DTYPES[int(np.ravel(self.dtype)[i])]


@dataclass(frozen=True, kw_only=True, eq=False)
class Gemm(OpRecord):
    """[m, k] x [k, n] matmul, repeated for ``groups`` independent weight matrices (experts).
    FLOPs = 2*m*n*k per group. Bytes: the weight matrix once per group (k*n, plus n bias
    terms when ``bias``), the input m*k and output m*n activations. With
    ``weights_are_activations`` (e.g. the MLA absorbed projections) the k*n operand counts
    as activations. ``weight_bytes`` and ``act_bytes`` are bytes per element (the weights'
    with their group scales). ``weight_dtype``: the stored weights' code when narrower than
    ``dtype`` (weight-only, dequantized in the kernel: ``cost.dequant``), else -1.
    ``experts``: a fused MoE's expert GEMM, priced by its kernel's constants (``cost.moe``);
    ``slots``: on the layer's first expert GEMM (0 on the others), the (token, top-k) slots
    its routing and sort read, and ``scan`` the threads of its three-step sort
    (``cost.moe.expert_scan``; both priced by ``cost.moe.fixed_cost``)."""

    kind: ClassVar[str] = "gemm"
    m: Num
    n: Num
    k: Num
    groups: Num = 1.0
    weight_bytes: Num = 2.0
    act_bytes: Num = 2.0
    bias: Num = 0.0
    weights_are_activations: Num = False
    weight_dtype: Num = -1
    experts: Num = False
    slots: Num = 0.0
    scan: Num = 0.0

    @property
    def flops(self) -> Num:
        return 2.0 * self.m * self.n * self.k * self.groups

    @property
    def bytes(self) -> ByteCounts:
        weight = (self.k * self.n + self.n * self.bias) * self.weight_bytes * self.groups
        acts_in = self.m * self.k * self.act_bytes * self.groups
        acts_out = self.m * self.n * self.act_bytes * self.groups
        moved = np.asarray(self.weights_are_activations, dtype=bool)
        return ByteCounts(weights=np.where(moved, 0.0, weight),
                          act_read=acts_in + np.where(moved, weight, 0.0), act_write=acts_out)


@dataclass(frozen=True, kw_only=True, eq=False)
class Grouped(OpRecord):
    """A record over groups of sequences: ``batch``, ``q_len`` and ``kv_len`` carry a last
    axis of groups (``batch`` sequences with ``q_len`` new tokens each, ``kv_len``
    positions after the step; batch 0 is padding); the other fields the instance shape."""

    batch: Num
    q_len: Num
    kv_len: Num

    _GROUPED: ClassVar[tuple[str, ...]] = ("batch", "q_len", "kv_len")

    def __post_init__(self) -> None:
        for name in self._GROUPED:
            object.__setattr__(self, name, np.asarray(getattr(self, name)))

    def g(self, name: str) -> np.ndarray:
        """Field ``name`` with a groups axis: grouped fields as they are, the others with a
        trailing axis of 1 (so the two broadcast)."""
        value = np.asarray(getattr(self, name))
        return value if name in self._GROUPED else value[..., None]

    @property
    def shape(self) -> tuple[int, ...]:
        grouped = np.broadcast_shapes(*(np.shape(getattr(self, f)) for f in self._GROUPED))
        others = [np.shape(getattr(self, f)) for f in self._instance()
                  if f not in self._GROUPED]
        return np.broadcast_shapes(grouped[:-1], *others)

    def take(self, index: int | np.ndarray) -> Grouped:
        shape = self.shape
        out = {}
        for name in self._instance():
            value = np.asarray(getattr(self, name))
            if name in self._GROUPED:
                value = np.broadcast_to(value, shape + value.shape[-1:])
            else:
                value = np.broadcast_to(value, shape)
            out[name] = value[index]
        return replace(self, **out)

    @cached_property
    def flops(self) -> Num:     # a subclass's _per_group: (FLOPs, bytes) with a groups axis
        return self._per_group[0].sum(axis=-1)

    @cached_property
    def bytes(self) -> ByteCounts:
        return ByteCounts(*(np.sum(b, axis=-1) for b in self._per_group[1].astuple()))


@dataclass(frozen=True, kw_only=True, eq=False)
class Attention(Grouped):
    """Fused (FlashAttention-style) attention over groups of sequences.

    ``batch``, ``q_len`` and ``kv_len`` have a last axis of groups: ``batch`` sequences with
    ``q_len`` new tokens each, attending ``kv_len`` positions (the new ones included; causal
    when q_len > 1); a group with batch 0 is padding. Per group: FLOPs =
    2 * batch * n_heads * A * (qk_dim + v_dim), A = attended positions; bytes: Q in and O out
    once, K and V read once per KV head over the positions kept (min(kv_len, window); with
    ``chunk`` C, from the start of the chunk holding the first new token to kv_len);
    no score matrix touches memory. ``cache_elems`` is what one position holds per KV head
    (2 * head_dim for K and V; the shared latent for MLA). ``kv_from_cache`` false: K and V
    are activations (MLA's expanded form). ``causal`` false: bidirectional (a diffusion LM's
    denoising step), each new token attends every kept position. FLOPs and bytes are summed
    over the groups."""

    kind: ClassVar[str] = "attention"
    n_heads: Num
    n_kv_heads: Num
    qk_dim: Num
    v_dim: Num
    cache_elems: Num
    window: Num = 0
    chunk: Num = 0
    kv_from_cache: Num = True
    act_bytes: Num = 2.0
    kv_bytes: Num = 2.0
    causal: Num = True

    def kept(self) -> np.ndarray:
        """Positions each group reads per KV head (``positions.kept_positions``)."""
        return kept_positions(self.q_len, self.kv_len, self.g("window"), self.g("chunk"))

    def group_flops(self) -> np.ndarray:
        """FLOPs of each group (the groups axis kept)."""
        return self._per_group[0]

    def group_bytes(self) -> ByteCounts:
        """Bytes of each group (the groups axis kept)."""
        return self._per_group[1]

    @cached_property
    def _per_group(self) -> tuple[np.ndarray, ByteCounts]:
        heads, ab = self.g("n_heads"), self.g("act_bytes")
        att = attended_positions(self.q_len, self.kv_len, self.g("window"), self.g("chunk"),
                                 self.g("causal"))
        flops = 2.0 * self.batch * heads * att * (self.g("qk_dim") + self.g("v_dim"))
        from_cache = self.g("kv_from_cache").astype(bool)
        kv = self.batch * self.g("n_kv_heads") * self.kept() * self.g("cache_elems") \
            * np.where(from_cache, self.g("kv_bytes"), ab)
        rows = self.batch * self.q_len * heads * ab
        return flops, ByteCounts(act_read=rows * self.g("qk_dim") + np.where(from_cache, 0.0, kv),
                                 act_write=rows * self.g("v_dim"),
                                 kv_read=np.where(from_cache, kv, 0.0))


_TABLE = np.array([(KINDS[k].reads, KINDS[k].writes, KINDS[k].flops) for k in POINTWISE],
                  dtype=float)
# weights per row of n: a norm reads its n scales (layer_norm also n biases)
_WEIGHT_ROWS = np.array([{"rms_norm": 1.0, "layer_norm": 2.0}.get(k, 0.0) for k in POINTWISE])


@dataclass(frozen=True, kw_only=True, eq=False)
class Pointwise(OpRecord):
    """Memory-bound elementwise pass over ``rows`` rows of ``n`` features; ``code`` picks the
    kind (``specs.kinds.POINTWISE``). Reads and writes follow the measurement schema
    (silu_and_mul reads 2n and writes n per row; add reads two operands); norms also read
    their n weights (2n for layer_norm), or ``weight_elems`` where it is >= 0 (weights
    shared by the heads of a row: the q/k norm, ``layers._attention``)."""

    kind: ClassVar[str] = "pointwise"
    code: Num
    rows: Num
    n: Num
    act_bytes: Num = 2.0
    weight_elems: Num = -1.0

    @property
    def rule(self) -> str:
        return "stream"

    @property
    def kinds(self) -> np.ndarray:
        """The registry kind of each instance."""
        return np.asarray(POINTWISE, dtype=object)[np.asarray(self.code, dtype=int)]

    @property
    def flops(self) -> Num:
        return _TABLE[self.code, 2] * self.rows * self.n

    @property
    def bytes(self) -> ByteCounts:
        reads, writes = _TABLE[self.code, 0], _TABLE[self.code, 1]
        weights = np.where(np.asarray(self.weight_elems) < 0, _WEIGHT_ROWS[self.code] * self.n,
                           self.weight_elems)
        return ByteCounts(weights=weights * self.act_bytes,
                          act_read=reads * self.rows * self.n * self.act_bytes,
                          act_write=writes * self.rows * self.n * self.act_bytes)


@dataclass(frozen=True, kw_only=True, eq=False)
class Embedding(OpRecord):
    """Gather ``rows`` rows of a [vocab, n] table: reads rows*n weights, writes rows*n."""

    kind: ClassVar[str] = "embedding"
    rows: Num
    n: Num
    act_bytes: Num = 2.0

    @property
    def bytes(self) -> ByteCounts:
        moved = self.rows * self.n * self.act_bytes
        return ByteCounts(weights=moved, act_write=moved)


@dataclass(frozen=True, kw_only=True, eq=False)
class KvWrite(OpRecord):
    """Store ``rows`` new tokens' K/V (``n`` elements per token) into the cache."""

    kind: ClassVar[str] = "kv_cache_write"
    rows: Num
    n: Num
    act_bytes: Num = 2.0
    kv_bytes: Num = 2.0

    @property
    def bytes(self) -> ByteCounts:
        return ByteCounts(act_read=self.rows * self.n * self.act_bytes,
                          kv_write=self.rows * self.n * self.kv_bytes)


@dataclass(frozen=True, kw_only=True, eq=False)
class AllReduce(OpRecord):
    """All-reduce of ``payload`` bytes (each device's buffer) over ``devices`` on ``nodes``
    nodes: 2*(n-1)/n * S per device leave (and as many arrive), the ring's bytes; the time
    (ring or tree) is ``cost.collectives``'."""

    kind: ClassVar[str] = "all_reduce"
    passes: ClassVar[float] = 2.0
    payload: Num
    devices: Num
    nodes: Num = 1.0

    @property
    def bytes(self) -> ByteCounts:
        moved = self.passes * (self.devices - 1) / self.devices * self.payload
        return ByteCounts(act_read=moved, act_write=moved)


@dataclass(frozen=True, kw_only=True, eq=False)
class AllToAll(AllReduce):
    """All-to-all (expert-parallel dispatch or combine) of ``payload`` bytes per device,
    spread evenly over the devices: (n-1)/n * S leave each device and as many arrive."""

    kind: ClassVar[str] = "all_to_all"
    passes: ClassVar[float] = 1.0
    off_node: Num = -1.0        # share over the NIC (``collectives.all_to_all_parts``)
    # a DeepEP kernel (index in ``cost.ep.KERNELS``; -1: NCCL's even all-to-all): then
    # ``payload`` is every byte its SMs copy, ``link_bytes`` / ``network_bytes`` the bytes
    # over NVLink and RDMA, ``copies`` the token copies its SMs make, ``sms`` the SMs that
    # copy (``cost.ep.ep_parts``)
    kernel: Num = -1.0
    link_bytes: Num = 0.0
    network_bytes: Num = 0.0
    copies: Num = 0.0
    sms: Num = 0.0


@dataclass(frozen=True, kw_only=True, eq=False)
class LayerOverhead(OpRecord):
    """Framework glue of ``count`` decoder layers (Python, module calls, views): no FLOPs, no
    bytes; timed as ``Efficiency.layer_overhead_s`` per layer on a host-timed device."""

    kind: ClassVar[str] = "layer_overhead"


def kind_names(op: OpRecord) -> np.ndarray:
    """The registry kind of every instance of ``op`` (an array of the instance shape)."""
    if isinstance(op, Pointwise):
        return np.broadcast_to(op.kinds, op.shape)
    return np.full(op.shape, op.kind, dtype=object)


def pointwise(kind: str, rows: Num, n: Num, **fields: Num) -> Pointwise:
    """A ``Pointwise`` record of registry kind ``kind``."""
    return Pointwise(code=POINTWISE_CODE[kind], rows=rows, n=n, **fields)
