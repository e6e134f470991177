"""Turn a step template (``layers``) into operator records (``ops``) for N steps at once.

For each record type, the template's operators of that type become one record whose
fields have shape (operators, N): constants of the template broadcast against the step
quantities of each row (``Values``). An operator whose rows are 0 in some step (an MLA form
no group uses) gets count 0 there, and placeholder shapes that keep the arithmetic finite.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from perfmodel.cost import ep
from perfmodel.cost.layers import experts_touched, mla_absorbed
from perfmodel.cost.moe import expert_scan
from perfmodel.cost.operators import (
    ROW_QUANTITIES,
    AllReduceSpec,
    AllToAllSpec,
    AttentionSpec,
    ConvSpec,
    EmbeddingSpec,
    GemmSpec,
    KvWriteSpec,
    OverheadSpec,
    PointwiseSpec,
    ScanSpec,
)
from perfmodel.cost.ops import (
    AllReduce,
    AllToAll,
    Attention,
    Embedding,
    Gemm,
    KvWrite,
    LayerOverhead,
    OpRecord,
    Pointwise,
)
from perfmodel.cost.outliers import weight_gemm
from perfmodel.cost.routing import (
    device_imbalance,
    expected_max_touched,
    token_reach,
    zipf_distinct,
)
from perfmodel.cost.scan import Conv1d, LinearScan, Scan
from perfmodel.cost.timebase import HOST
from perfmodel.specs.dtypes import CODE, narrower_code
from perfmodel.specs.hardware import Hardware
from perfmodel.specs.kinds import POINTWISE_CODE
from perfmodel.specs.model import Model, MoE

SPEC_KIND = {GemmSpec: "gemm", AttentionSpec: "attention", EmbeddingSpec: "embedding",
             KvWriteSpec: "kv_cache_write", AllReduceSpec: "all_reduce",
             AllToAllSpec: "all_to_all", ConvSpec: "conv1d",
             OverheadSpec: "layer_overhead"}


def spec_kind(spec: object) -> str:
    """The registry kind of a template operator."""
    return spec.kind if isinstance(spec, PointwiseSpec | ScanSpec) else SPEC_KIND[type(spec)]


@dataclass(eq=False)
class Values:
    """Per-row (N,) quantities of the steps (see ``layers``) and dtype figures: bytes per
    element of activations (``ab``), KV cache (``kvb``) and quantized matmul weights with
    their group scales (``wb``), the share of input channels kept in 16 bits (``outliers``,
    ``cost.outliers``), the stored weights' dtype code (``weights``; None: the compute dtype),
    where the LM head is stored as the weights are (``head``, ``memory.quantized_head``);
    compute dtype codes of elementwise work (``act``), linear layers
    (``matmul``) and attention (``attention``)."""

    tokens: np.ndarray
    seqs: np.ndarray
    logits: np.ndarray
    ab: np.ndarray
    kvb: np.ndarray
    wb: np.ndarray
    act: np.ndarray
    matmul: np.ndarray
    attention: np.ndarray
    touched: np.ndarray = field(default_factory=lambda: np.zeros(1))
    expert_rows: np.ndarray = field(default_factory=lambda: np.zeros(1))
    expert_act_rows: np.ndarray = field(default_factory=lambda: np.zeros(1))
    absorbed: np.ndarray = field(default_factory=lambda: np.zeros(1))
    expanded_context: np.ndarray = field(default_factory=lambda: np.zeros(1))
    weights: np.ndarray | None = None               # (N,) stored weight dtype codes
    outliers: np.ndarray = field(default_factory=lambda: np.zeros(1))   # (N,) 16-bit share
    head: np.ndarray = field(default_factory=lambda: np.zeros(1, dtype=bool))  # (N,)
    pairs: np.ndarray = field(default_factory=lambda: np.zeros(1))  # (token, expert) here
    slots: np.ndarray = field(default_factory=lambda: np.zeros(1))  # (token, top-k) routed
    scan: np.ndarray = field(default_factory=lambda: np.zeros(1))   # three-step sort threads
    absorbed_groups: np.ndarray | None = None       # (N, G): MLA groups in latent form
    # classes stored in another format (``params.other_formats``): format name ->
    # (bytes per weight, stored dtype code, compute dtype codes (N,))
    formats: dict = field(default_factory=dict)
    _table: np.ndarray | None = None                 # every row quantity, filled on first use

    def moe(self, n_experts: int, top_k: int, skew: np.ndarray | float = 0.0,
            ep: int = 1, spread: int = 1, replicas: int = 0) -> None:
        """Routed tokens touch sum_i (1 - (1 - p_i)^N) distinct experts (E(1 - (1 - k/E)^N)
        without ``skew``, the Zipf exponent per row), each with the mean share of the N x k
        (token, expert) pairs. The weights read follow ``touched`` exactly; the rows are the
        mean: the hottest expert gets more (``routing.busiest_expert_load``), which a single
        device's grouped GEMM absorbs.
        Under expert parallelism (``ep`` devices of E/ep whole experts; the step's tokens are
        ``spread`` devices' worth: ep under data-parallel attention) the layer waits for the
        busiest device: the most touched experts any device drew
        (``routing.expected_max_touched``), with the pairs of the busiest device under skew
        (``routing.device_imbalance``) when those are more. With ``replicas`` redundant
        copies of the hottest experts (EPLB), each device holds ceil((E + replicas) / ep)
        copies, a token reaches one copy of its expert, and the touched copies and the
        busiest device follow the placement with replicas. The layer's routing and sort
        read every (token, top-k) slot of the tokens it routes (``slots``), and where they
        are many its sort scans them once per expert the device holds (``scan``)."""
        tokens = self.tokens * spread
        self.pairs = self.tokens * top_k                   # this device's (token, expert)
        self.slots = tokens * top_k
        self.scan = expert_scan(tokens, top_k, -(-(n_experts + replicas) // ep))
        touched = experts_touched(n_experts, top_k, tokens, skew)
        each = tokens * top_k / touched
        if ep == 1:
            self.touched, self.expert_rows = touched, each
        else:
            slots = n_experts + replicas
            if replicas:
                touched = zipf_distinct(n_experts, top_k, tokens, skew, replicas)
                each = tokens * top_k / touched
            local = expected_max_touched(-(-slots // ep), touched / slots, ep)
            pairs = np.maximum(local * each, tokens * top_k / ep
                               * device_imbalance(n_experts, top_k, skew, ep, replicas))
            self.touched, self.expert_rows = local, pairs / local
        self.expert_act_rows = self.expert_rows * self.touched

    def mla(self, model: Model, step: object) -> None:
        """Which groups run MLA's absorbed form, and the rows of each form."""
        absorbed = mla_absorbed(model, step.new_tokens, step.context)
        self.absorbed_groups = absorbed
        live = step.count * step.new_tokens
        self.absorbed = np.where(absorbed, live, 0).sum(axis=1).astype(float)
        self.expanded_context = np.where(absorbed, 0, step.count * step.context) \
            .sum(axis=1).astype(float)

    def rows(self, index: np.ndarray) -> np.ndarray:
        """(len(index), N) rows of the step quantities ``ROW_QUANTITIES[index]``."""
        if self._table is None:
            table = np.empty((len(ROW_QUANTITIES), len(self.tokens)))
            for i, name in enumerate(ROW_QUANTITIES):
                table[i] = getattr(self, name)
            self._table = table
        return self._table[index]


def _column(specs: list, attr: str) -> np.ndarray:
    return np.array([getattr(s, attr) for s in specs], dtype=float)[:, None]


_CONSTANTS = {
    GemmSpec: ("n", "k", "count", "bias"),
    PointwiseSpec: ("n", "count", "weight_elems"),
    AttentionSpec: ("heads", "kv_heads", "qk_dim", "v_dim", "cache_elems", "window", "chunk",
                    "count", "elem_bytes"),
    EmbeddingSpec: ("n", "count"),
    KvWriteSpec: ("n", "count", "elem_bytes"),
    AllReduceSpec: ("width", "devices", "count"),
    AllToAllSpec: ("width", "devices", "count", "elem_bytes"),
    OverheadSpec: ("count",),
    ScanSpec: ("heads", "qk_heads", "d_k", "d_v", "chunk", "delta", "gates", "count",
               "state_bytes", "l2norm_heads", "channel_gates"),
    ConvSpec: ("n", "width", "count"),
}


@dataclass(frozen=True, eq=False)
class Block:
    """The template operators of one spec type: their template positions, their constants
    as (operators, 1) arrays, and the step quantities that set their rows."""

    spec_type: type
    positions: tuple[int, ...]
    specs: tuple
    const: dict[str, np.ndarray]
    rows: np.ndarray        # indices into ROW_QUANTITIES


def compile_template(specs: list) -> tuple[Block, ...]:
    """Group a template's operators by spec type, constants precomputed (cache the result)."""
    by_type: dict[type, list[int]] = {}
    for i, s in enumerate(specs):
        by_type.setdefault(type(s), []).append(i)
    blocks = []
    for kind, index in by_type.items():
        group = [specs[i] for i in index]
        const = {a: _column(group, a) for a in _CONSTANTS[kind]}
        if kind is GemmSpec:
            touched = np.array([s.groups == "touched" for s in group])[:, None]
            const["touched"] = touched if touched.any() else None
            const["slots"] = np.array([s.slots for s in group])[:, None]
            const["groups"] = np.array([1.0 if s.groups == "touched" else s.groups
                                        for s in group])[:, None]
            const["act"] = np.array([s.weights == "act" for s in group])[:, None]
            const["head"] = np.array([s.weights == "head" for s in group])[:, None]
            const["format"] = np.array([s.weights.removeprefix("format:")
                                        if s.weights.startswith("format:") else ""
                                        for s in group], dtype=object)[:, None]
        if kind is PointwiseSpec:
            const["code"] = np.array([POINTWISE_CODE[s.kind] for s in group])[:, None]
        if kind is AttentionSpec:
            const["from_cache"] = np.array([s.from_cache for s in group])[:, None]
            const["math"] = np.array([CODE[s.math_dtype] if s.math_dtype else -1
                                      for s in group])[:, None]
        rows = np.array([ROW_QUANTITIES.index(getattr(s, "rows", "tokens")) for s in group])
        blocks.append(Block(kind, tuple(index), tuple(group), const, rows))
    return tuple(blocks)


def _present(rows: np.ndarray, count: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(rows with placeholders of 1 where there are none, count zeroed there)."""
    live = rows > 0
    return np.where(live, rows, 1.0), count * live


def _gemms(b: Block, v: Values) -> Gemm:
    """The GEMMs of ``b``: a "matmul" GEMM at the weights' bytes, compute dtype and stored
    dtype (converted in the kernel, ``cost.dequant``), an "act" one at the activations';
    the LM head ("head") as the former where ``v.head``, else as the latter."""
    c = b.const
    rows, count = _present(v.rows(b.rows), c["count"])
    groups = c["groups"] if c["touched"] is None else np.where(c["touched"], v.touched,
                                                                 c["groups"])
    act = c["act"] | (c["head"] & ~v.head) if c["head"].any() else c["act"]
    stored = -1 if v.weights is None else np.where(act, -1, v.weights)
    wb, dtype, outliers = np.where(act, v.ab, v.wb), np.where(act, v.act, v.matmul), \
        np.where(act, 0.0, v.outliers)
    for name, (fb, code, compute) in v.formats.items():     # classes in another format
        at = c["format"] == name
        wb, dtype, stored = np.where(at, fb, wb), np.where(at, compute, dtype), \
            np.where(at, code, stored)
        outliers = np.where(at, 0.0, outliers)
    return weight_gemm(outliers, m=rows, n=c["n"], k=c["k"], groups=groups,
                       weight_bytes=wb, act_bytes=v.ab, bias=c["bias"], dtype=dtype,
                       count=count, weight_dtype=narrower_code(stored, dtype),
                       experts=False if c["touched"] is None else c["touched"],
                       slots=np.where(c["slots"], v.slots, 0.0),
                       scan=np.where(c["slots"], v.scan, 0.0))


def _pointwise(b: Block, v: Values) -> Pointwise:
    rows, count = _present(v.rows(b.rows), b.const["count"])
    return Pointwise(code=b.const["code"], rows=rows, n=b.const["n"], act_bytes=v.ab,
                     dtype=v.act, count=count, weight_elems=b.const["weight_elems"])


def _cache_bytes(c: dict[str, np.ndarray], v: Values) -> np.ndarray:
    """Bytes per cached element: the spec's own (``elem_bytes`` > 0) or the KV dtype's."""
    return np.where(c["elem_bytes"] > 0, c["elem_bytes"], v.kvb)


def _attention(b: Block, v: Values, step: object) -> Attention:
    c = b.const
    live = step.count > 0
    masks = []
    for s in b.specs:
        if s.form == "all":
            masks.append(live)
        else:
            absorbed = v.absorbed_groups
            masks.append(live & (absorbed if s.form == "absorbed" else ~absorbed))
    batch = np.where(np.stack(masks), step.count, 0)
    return Attention(batch=batch, q_len=step.new_tokens[None], kv_len=step.context[None],
                     n_heads=c["heads"], n_kv_heads=c["kv_heads"], qk_dim=c["qk_dim"],
                     v_dim=c["v_dim"], cache_elems=c["cache_elems"], window=c["window"],
                     chunk=c["chunk"], kv_from_cache=c["from_cache"], act_bytes=v.ab,
                     kv_bytes=_cache_bytes(c, v), causal=step.causal,
                     dtype=np.where(c["math"] >= 0, c["math"], v.attention),
                     count=c["count"] * batch.any(axis=-1))


def _scan(b: Block, v: Values, step: object) -> Scan:
    """The recurrent layers' scans (one kind per model: Mamba or linear attention)."""
    c = b.const
    live = step.count > 0
    batch = np.where(live, step.count, 0)[None]
    record = LinearScan if b.specs[0].kind == "linear_attention" else Scan
    return record(batch=batch, q_len=step.new_tokens[None], kv_len=step.context[None],
                  heads=c["heads"], qk_heads=c["qk_heads"], d_k=c["d_k"], d_v=c["d_v"],
                  chunk=c["chunk"], delta=c["delta"].astype(bool), gates=c["gates"],
                  l2norm_heads=c["l2norm_heads"], channel_gates=c["channel_gates"],
                  act_bytes=v.ab,
                  state_bytes=c["state_bytes"], dtype=v.act,
                  count=c["count"] * batch.any(axis=-1))


def _other(b: Block, v: Values, hw: Hardware | None, timing: np.ndarray | int) -> OpRecord:
    c, kind = b.const, b.spec_type
    if kind is ConvSpec:
        return Conv1d(rows=v.tokens, seqs=v.seqs, n=c["n"], width=c["width"], act_bytes=v.ab,
                      state_bytes=v.kvb, dtype=v.act, count=c["count"])
    if kind is EmbeddingSpec:
        return Embedding(rows=v.tokens, n=c["n"], act_bytes=v.ab, dtype=v.act,
                         count=c["count"])
    if kind is KvWriteSpec:
        return KvWrite(rows=v.tokens, n=c["n"], act_bytes=v.ab, kv_bytes=_cache_bytes(c, v),
                       dtype=v.act, count=c["count"])
    if kind is AllReduceSpec:
        return AllReduce(payload=v.tokens * c["width"] * v.ab, devices=c["devices"],
                         dtype=v.act, count=c["count"])
    if kind is AllToAllSpec:
        return _deepep(b, v, hw)
    on = hw is not None and hw.efficiency.layer_overhead_s > 0
    host = np.asarray(timing) == HOST
    return LayerOverhead(dtype=v.act, count=c["count"] * (host & on) * np.ones_like(v.tokens))


def _deepep(b: Block, v: Values, hw: Hardware | None) -> AllToAll:
    """Expert-parallel dispatch / combine of this device's tokens as DeepEP runs them
    (``cost.ep``, one formula with the kernel corpus): low-latency for a decode step, normal
    mode otherwise (SGLang's ``--deepep-mode auto``: ``DeepEPMode.resolve``,
    python/sglang/srt/layers/moe/utils.py, picks NORMAL when ``is_extend_in_batch``, which
    the DP ranks OR-reduce, else LOW_LATENCY), at DeepEP's default SM budget.
    Tokens = this device's (token, expert) pairs over top-k; a spec without routing
    (``moe`` None) sends every pair evenly (``collectives.all_to_all_parts``)."""
    c = b.const
    per_node = hw.interconnect.max_devices if hw is not None else None
    elem = np.where(c["elem_bytes"] > 0, c["elem_bytes"], v.ab)
    devices = c["devices"]
    nodes = np.ceil(devices / (per_node or devices))
    if any(s.moe is None for s in b.specs):
        return AllToAll(payload=v.pairs * c["width"] * elem, devices=devices, nodes=nodes,
                        dtype=v.act, count=c["count"])
    topk = np.array([[s.moe.top_k] for s in b.specs], dtype=float)
    reach = np.array([ep.reach(s.moe.n_experts, s.moe.top_k, s.devices,
                               min(per_node or s.devices, s.devices), s.moe.n_groups,
                               s.moe.topk_groups) for s in b.specs])
    combine = np.array([[s.name.endswith("combine")] for s in b.specs], dtype=int)
    code = np.where(v.tokens <= v.seqs, 2, 0) + combine
    moved = ep.traffic(code, v.pairs / topk, ep.token_bytes(code, c["width"], elem, topk),
                       topk, devices, nodes, reach[:, :1], reach[:, 1:])
    experts = np.array([[s.moe.n_experts] for s in b.specs], dtype=float)
    sms = ep.sm_budget(code, ep.DEFAULT_SMS, experts, v.pairs / topk,
                       hw.compute_units if hw is not None else 10**6)
    return AllToAll(payload=moved.sent, devices=devices, nodes=nodes, dtype=v.act,
                    count=c["count"], kernel=code, link_bytes=moved.link,
                    network_bytes=moved.network, copies=moved.copies, sms=sms)


def build(block: Block, v: Values, step: object, hw: Hardware | None,
          timing: np.ndarray | int) -> OpRecord:
    """The record of ``block``'s operators for every row of ``step`` (``hw`` None: no
    framework glue)."""
    if block.spec_type is GemmSpec:
        return _gemms(block, v)
    if block.spec_type is PointwiseSpec:
        return _pointwise(block, v)
    if block.spec_type is AttentionSpec:
        return _attention(block, v, step)
    if block.spec_type is ScanSpec:
        return _scan(block, v, step)
    return _other(block, v, hw, timing)


def remote_share(moe: MoE | None, ep: int, per_node: int | None) -> float:
    """Share of a token's k (token, expert) pairs that cross the network when each token is
    sent once per remote node its experts sit on (DeepEP's internode dispatch, forwarded
    over NVLink on arrival): the expected remote nodes of ``routing.token_reach`` (group-
    limited routing included) over k. One node (or no hardware, ``per_node`` None): -1,
    the even rule, which sends nothing off the node."""
    if moe is None or per_node is None or ep <= per_node:
        return -1.0
    return token_reach(moe.n_experts, moe.top_k, ep, per_node, moe.n_groups,
                       moe.topk_groups).nodes / moe.top_k
