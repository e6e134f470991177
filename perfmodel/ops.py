"""Operator records: FLOPs and bytes moved, split by where the bytes come from.

Each constructor here is the one formula for its kernel type. ``transformer`` composes them
into layers, and ``compare`` rebuilds the same records from measurement rows, so the model and
its validation can never drift apart.

Kinds follow the measurement schema's ``op`` column: gemm, attention, rms_norm, layer_norm,
silu_and_mul, gelu_and_mul, gelu, add, rotary, embedding, kv_cache_write, softmax, all_reduce;
and layer_overhead (host time per decoder layer outside every kernel, no FLOPs or bytes; see
``specs.Efficiency.layer_overhead_s``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

# kind -> operator class used in reports (error tables, stacked plots)
OP_CLASS = {
    "gemm": "gemm", "attention": "attention", "rms_norm": "norm", "layer_norm": "norm",
    "silu_and_mul": "activation", "gelu_and_mul": "activation", "gelu": "activation",
    "softmax": "elementwise", "add": "elementwise", "rotary": "elementwise",
    "kv_cache_write": "elementwise", "embedding": "embedding", "all_reduce": "communication",
    "layer_overhead": "framework",
}


@dataclass(frozen=True)
class ByteCounts:
    """Bytes moved to or from device memory, by source. Summable with ``+``."""

    weights: float = 0.0
    act_read: float = 0.0
    act_write: float = 0.0
    kv_read: float = 0.0
    kv_write: float = 0.0

    @property
    def total(self) -> float:
        return self.weights + self.act_read + self.act_write + self.kv_read + self.kv_write

    def __add__(self, other: ByteCounts) -> ByteCounts:
        return ByteCounts(*(a + b for a, b in zip(self.astuple(), other.astuple(), strict=True)))

    def scaled(self, factor: float) -> ByteCounts:
        return ByteCounts(*(a * factor for a in self.astuple()))

    def astuple(self) -> tuple[float, float, float, float, float]:
        return (self.weights, self.act_read, self.act_write, self.kv_read, self.kv_write)


@dataclass(frozen=True)
class Op:
    """One kernel of one layer; ``count`` identical instances run per step (e.g. layers).

    ``flops`` and ``bytes`` are per instance; ``shape`` holds the measurement-schema columns
    (m, n, k, batch, q_len, kv_len, ...) that the efficiency model and the harness use.
    """

    name: str
    kind: str
    flops: float
    bytes: ByteCounts
    dtype: str
    count: float = 1.0
    shape: dict[str, float] = field(default_factory=dict)

    @property
    def op_class(self) -> str:
        return OP_CLASS.get(self.kind, "elementwise")

    @property
    def intensity(self) -> float:
        """Arithmetic intensity in FLOP per byte of memory traffic."""
        total = self.bytes.total
        return self.flops / total if total else float("inf")

    def times(self, count: float) -> Op:
        return replace(self, count=self.count * count)


def gemm(name: str, m: float, n: int, k: int, *, weight_bytes: float, act_bytes: float,
         dtype: str, groups: float = 1.0, bias: bool = False, count: float = 1.0,
         weights_are_activations: bool = False) -> Op:
    """[m, k] x [k, n] matmul, repeated for ``groups`` independent weight matrices (experts).

    FLOPs = 2*m*n*k per group. Bytes: the weight matrix once per group (k*n, plus n bias),
    the input m*k and output m*n activations. With ``weights_are_activations`` (e.g. the
    MLA absorbed projections applied to a cache) the k*n operand counts as activations.
    """
    weight = (k * n + (n if bias else 0)) * weight_bytes * groups
    acts_in, acts_out = m * k * act_bytes * groups, m * n * act_bytes * groups
    split = ByteCounts(act_read=acts_in + weight, act_write=acts_out) if weights_are_activations \
        else ByteCounts(weights=weight, act_read=acts_in, act_write=acts_out)
    return Op(name, "gemm", 2.0 * m * n * k * groups, split, dtype, count,
              {"m": m, "n": n, "k": k, "groups": groups})


def attended_positions(q_len: int, kv_len: int, window: int | None = None) -> float:
    """Sum over the q_len new tokens of the positions each attends (causal, optional window).

    New token j (1..q_len) sits at position kv_len - q_len + j and attends
    min(that position, window) positions. Closed form of that sum.
    """
    prior = kv_len - q_len
    if window is None or window >= kv_len:
        return q_len * prior + q_len * (q_len + 1) / 2.0
    # positions p = prior+1 .. kv_len; attended = min(p, window)
    lo = prior + 1
    below = max(0, min(kv_len, window) - lo + 1)       # positions p <= window
    below_sum = below * (lo + lo + below - 1) / 2.0 if below else 0.0
    return below_sum + (q_len - below) * window


def attention(name: str, *, batch: int, q_len: int, kv_len: int, n_heads: int,
              n_kv_heads: int, qk_dim: int, v_dim: int, act_bytes: float, kv_bytes: float,
              dtype: str, window: int | None = None, cache_elems: int | None = None,
              kv_from_cache: bool = True, count: float = 1.0) -> Op:
    """Fused (FlashAttention-style) attention for ``batch`` sequences.

    FLOPs = 2 * batch * n_heads * A * (qk_dim + v_dim), A = attended positions (causal).
    Bytes: Q in and O out once; K and V read once per KV head over the positions kept
    (min(kv_len, window)); no score matrix touches memory. ``cache_elems`` is what one
    position holds per KV head (2*head_dim for K and V; the shared latent for MLA).
    """
    kept = min(kv_len, window) if window else kv_len
    cache = cache_elems if cache_elems is not None else qk_dim + v_dim
    kv = batch * n_kv_heads * kept * cache * (kv_bytes if kv_from_cache else act_bytes)
    q_in = batch * q_len * n_heads * qk_dim * act_bytes
    out = batch * q_len * n_heads * v_dim * act_bytes
    split = ByteCounts(act_read=q_in, act_write=out, kv_read=kv) if kv_from_cache \
        else ByteCounts(act_read=q_in + kv, act_write=out)
    flops = 2.0 * batch * n_heads * attended_positions(q_len, kv_len, window) * (qk_dim + v_dim)
    shape = {"batch": batch, "q_len": q_len, "kv_len": kv_len, "n_heads": n_heads,
             "n_kv_heads": n_kv_heads, "head_dim": qk_dim, "window": window or 0}
    return Op(name, "attention", flops, split, dtype, count, shape)


# reads (in units of n per row), writes, flops per output element
_ELEMENTWISE = {
    "rms_norm": (1, 1, 4), "layer_norm": (1, 1, 7), "add": (2, 1, 1), "softmax": (1, 1, 5),
    "silu_and_mul": (2, 1, 5), "gelu_and_mul": (2, 1, 9), "gelu": (1, 1, 8),
    "rotary": (1, 1, 3),
}
ELEMENTWISE_KINDS = tuple(_ELEMENTWISE)


def elementwise(name: str, kind: str, rows: float, n: int, *, act_bytes: float, dtype: str,
                count: float = 1.0) -> Op:
    """Memory-bound pass over ``rows`` rows of ``n`` features.

    Reads and writes follow the measurement schema: silu_and_mul reads 2n and writes n per
    row; add reads two operands; norms also read their n weights (2n for layer_norm).
    """
    reads, writes, flops_per = _ELEMENTWISE[kind]
    weights = {"rms_norm": n, "layer_norm": 2 * n}.get(kind, 0) * act_bytes
    split = ByteCounts(weights=weights, act_read=reads * rows * n * act_bytes,
                       act_write=writes * rows * n * act_bytes)
    return Op(name, kind, flops_per * rows * n, split, dtype, count, {"m": rows, "n": n})


def embedding(name: str, rows: float, n: int, *, act_bytes: float, dtype: str) -> Op:
    """Gather ``rows`` rows of an [vocab, n] table: reads rows*n weights, writes rows*n."""
    split = ByteCounts(weights=rows * n * act_bytes, act_write=rows * n * act_bytes)
    return Op(name, "embedding", 0.0, split, dtype, 1.0, {"m": rows, "n": n})


def kv_cache_write(name: str, rows: float, elems: int, *, act_bytes: float, kv_bytes: float,
                   dtype: str, count: float = 1.0) -> Op:
    """Store ``rows`` new tokens' K/V (``elems`` per token) into the cache."""
    split = ByteCounts(act_read=rows * elems * act_bytes, kv_write=rows * elems * kv_bytes)
    return Op(name, "kv_cache_write", 0.0, split, dtype, count, {"m": rows, "n": elems})


def all_reduce(name: str, payload_bytes: float, devices: int, *, dtype: str,
               count: float = 1.0) -> Op:
    """Ring all-reduce of ``payload_bytes`` over ``devices``: 2*(n-1)/n * S bytes per device
    leave over the link (and as many arrive); the reduction adds (n-1)/n * S/elem FLOPs."""
    moved = 2.0 * (devices - 1) / devices * payload_bytes
    return Op(name, "all_reduce", 0.0, ByteCounts(act_read=moved, act_write=moved), dtype,
              count, {"bytes": payload_bytes, "devices": devices})


def layer_overhead(name: str, layers: float, *, dtype: str) -> Op:
    """Framework glue of ``layers`` decoder layers (Python, module calls, views): no FLOPs, no
    bytes; timed by ``roofline.op_time`` as ``Efficiency.layer_overhead_s`` per layer."""
    return Op(name, "layer_overhead", 0.0, ByteCounts(), dtype, layers, {})
