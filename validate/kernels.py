"""Torch implementations of every operator the model predicts, built from operator records.

``build(rec, dev)`` turns a perfmodel record of one instance (``cost.ops``: from
``cost.step.step_records`` or from a measurement row via ``compare.row_op``) into a
``Kernel``: input sets of fresh random data, rotated so that together they exceed the
last-level cache, and ``call(i)`` running the op on set ``i % n_sets``. The functions below
are also the building blocks of ``tinymodel``, so a kernel measured alone and inside a layer
is the same code.

Layouts (comments give shapes): activations [rows, features]; linear weights [n, k]
(``torch.nn.Linear``); attention q [B, H, T, D], k/v [B, KV, C, D].
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields

import numpy as np
import torch
import torch.nn.functional as F

from perfmodel.cost.ops import Attention, OpRecord, kind_names
from validate.device import DeviceInfo
from validate.timers import rotation_sets

TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16,
                "tf32": torch.float32}
EMBED_TABLE_ROWS = 16384
EPS = 1e-6


def linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """[m, k] x [n, k]^T -> [m, n]."""
    return F.linear(x, w)


def rms_norm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return F.rms_norm(x, (x.shape[-1],), w, EPS)


def layer_norm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return F.layer_norm(x, (x.shape[-1],), w, b, EPS)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """[m, 2n] -> silu(x[:, :n]) * x[:, n:] = [m, n]."""
    n = x.shape[-1] // 2
    return F.silu(x[..., :n]) * x[..., n:]


def gelu_and_mul(x: torch.Tensor) -> torch.Tensor:
    n = x.shape[-1] // 2
    return F.gelu(x[..., :n], approximate="tanh") * x[..., n:]


def sigmoid_mul(x: torch.Tensor) -> torch.Tensor:
    """[m, 2n] -> sigmoid(x[:, :n]) * x[:, n:] = [m, n] (an output gate)."""
    n = x.shape[-1] // 2
    return torch.sigmoid(x[..., :n]) * x[..., n:]


def rotary(x: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """Rotate pairs of features by complex ``freqs`` [t, 1, D/2]: x [m, heads*D] -> same,
    row r at position r % t (m = batch x t: the batch's sequences one after another).

    One complex multiply (Meta's reference form): reads x once, writes once. ``freqs`` is a
    slice of a table made once (a serving framework's cos/sin cache), not recomputed per call.
    """
    m, n = x.shape
    t, d2 = freqs.shape[0], freqs.shape[-1]
    pairs = torch.view_as_complex(x.float().reshape(m // t, t, n // (2 * d2), d2, 2))
    return torch.view_as_real(pairs * freqs).reshape(m, n).to(x.dtype)


def rotary_freqs(positions: torch.Tensor, head_dim: int, theta: float = 10000.0
                 ) -> torch.Tensor:
    """Complex unit rotations [len(positions), 1, head_dim/2] (RoPE)."""
    inv = theta ** (-torch.arange(0, head_dim, 2, device=positions.device).float() / head_dim)
    angles = positions.float()[:, None] * inv[None, :]
    return torch.polar(torch.ones_like(angles), angles)[:, None, :]


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Fused attention, q [B, H, T, D] against k, v [B, KV, C, D] (the last T of C are new).

    Decode (T = 1) folds the H/KV query heads of a group into the query axis, so each KV head
    is read once (a [B, KV, H/KV, D] query; no mask is needed). Prefill (T = C) is causal;
    a chunk after earlier context (1 < T < C) gets an explicit causal mask offset by C - T.
    """
    b, h, t, d = q.shape
    kv, c = k.shape[1], k.shape[2]
    if t == 1:
        out = F.scaled_dot_product_attention(q.reshape(b, kv, h // kv, d), k, v)
        return out.reshape(b, h, 1, d)
    gqa = h != kv
    if t == c:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
    mask = torch.ones(t, c, dtype=torch.bool, device=q.device).tril(diagonal=c - t)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)


def embedding(ids: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    return F.embedding(ids, table)


def kv_cache_write(src: torch.Tensor, cache: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """Store rows of ``src`` [m, n] into ``cache`` [slots, n] at ``slots`` [m]."""
    return cache.index_copy_(0, slots, src)


@dataclass
class Kernel:
    """``call(i)`` runs the op on input set ``i % n_sets``."""

    call: Callable[[int], object]
    n_sets: int
    set_bytes: float


def _randn(shape: tuple[int, ...], dtype: torch.dtype, dev: torch.device,
           gen: torch.Generator) -> torch.Tensor:
    """Fresh standard-normal data (never zeros), generated in fp32 then cast."""
    return torch.randn(shape, generator=gen, device=dev, dtype=torch.float32).to(dtype)


def _one(op: OpRecord) -> dict[str, float]:
    """The fields of a one-instance record as numbers (ValueError for more instances, or
    attention over several sequence groups)."""
    values = {}
    for f in fields(op):
        name, value = f.name, getattr(op, f.name)
        if name == "name":
            continue
        if np.size(value) != 1:
            raise ValueError(f"{op.name or op.kind}: expected one operator instance, got "
                             f"{name} of shape {np.shape(value)}")
        values[name] = float(np.ravel(value)[0])
    return values


Maker = tuple[Callable[..., object], Callable[[], tuple]]   # (function, one fresh input set)


def _inputs(op: OpRecord, dtype: torch.dtype, dev: torch.device, gen: torch.Generator
            ) -> Maker:
    """(function, maker of one fresh input set) for the one instance of ``op``."""
    s, kind, label = _one(op), str(np.ravel(kind_names(op))[0]), op.name or op.kind
    m, n = max(1, round(s.get("m", s.get("rows", 1)))), int(s.get("n", 1))

    def rnd(*shape: int) -> torch.Tensor:
        return _randn(shape, dtype, dev, gen)

    if kind == "gemm":
        k, groups = int(s["k"]), int(s["groups"])
        if groups > 1:
            return torch.bmm, lambda: (rnd(groups, m, k), rnd(groups, k, n))
        return linear, lambda: (rnd(m, k), rnd(n, k))
    if isinstance(op, Attention):
        if s["window"]:
            raise ValueError(f"{label}: windowed attention is not implemented in the harness")
        b, t, c = int(s["batch"]), int(s["q_len"]), int(s["kv_len"])
        h, kv, d = int(s["n_heads"]), int(s["n_kv_heads"]), int(s["qk_dim"])
        return attention, lambda: (rnd(b, h, t, d), rnd(b, kv, c, d), rnd(b, kv, c, d))
    return _memory_pass(kind, label, m, n, rnd, dev, gen)


def _memory_pass(kind: str, label: str, m: int, n: int, rnd: Callable[..., torch.Tensor],
                 dev: torch.device, gen: torch.Generator) -> Maker:
    """(function, input maker) of a memory-bound kernel of ``m`` rows of ``n``."""
    if kind in ("rms_norm", "layer_norm"):
        weight = rnd(n)
        extra = (weight,) if kind == "rms_norm" else (weight, rnd(n))
        return (rms_norm if kind == "rms_norm" else layer_norm), lambda: (rnd(m, n), *extra)
    gated = {"silu_and_mul": silu_and_mul, "gelu_and_mul": gelu_and_mul,
             "sigmoid_mul": sigmoid_mul}
    if kind in gated:
        return gated[kind], lambda: (rnd(m, 2 * n),)
    if kind in ("gelu", "softmax"):
        fn = (lambda x: F.gelu(x, approximate="tanh")) if kind == "gelu" \
            else (lambda x: F.softmax(x, dim=-1))
        return fn, lambda: (rnd(m, n),)
    if kind == "add":
        return torch.add, lambda: (rnd(m, n), rnd(m, n))
    if kind == "rotary":
        d = 64 if n % 64 == 0 else n
        if n % d or d % 2:
            raise ValueError(f"{label}: rotary width {n} is not a multiple of an even head_dim")
        pos = torch.randint(0, 8192, (m,), generator=gen, device=dev)
        return rotary, lambda: (rnd(m, n), rotary_freqs(pos, d))
    if kind == "embedding":
        table = rnd(EMBED_TABLE_ROWS, n)
        return embedding, lambda: (torch.randint(0, EMBED_TABLE_ROWS, (m,), generator=gen,
                                                 device=dev), table)
    if kind == "kv_cache_write":
        cache = rnd(4 * m + 1024, n)
        return kv_cache_write, lambda: (
            rnd(m, n), cache, torch.randperm(cache.shape[0], generator=gen, device=dev)[:m])
    raise ValueError(f"{label}: no harness kernel for op kind {kind!r}")


def build(op: OpRecord, dev: DeviceInfo, seed: int = 0, n_sets: int | None = None) -> Kernel:
    """A kernel for ``op``, a record of one instance, with rotating input sets (see module
    docstring)."""
    dtype = op.dtype_name(0)
    if dtype not in TORCH_DTYPES:
        raise ValueError(f"{op.name or op.kind}: dtype {dtype} has no harness kernel")
    gen = torch.Generator(device=dev.torch_device).manual_seed(seed)
    fn, make = _inputs(op, TORCH_DTYPES[dtype], dev.torch_device, gen)
    set_bytes = float(np.sum(op.bytes.total))
    count = n_sets or rotation_sets(set_bytes, dev.llc_bytes)
    sets = [make() for _ in range(count)]

    def call(i: int) -> object:
        return fn(*sets[i % count])

    return Kernel(call, count, set_bytes)

