"""Row forms that are more than one kernel, or kernels at quantized dtypes.

A measured call is priced as the same set of kernels it timed (MODELING.md: "price the
same set of kernels"). ``parts`` turns rows of one op into (record, primary) pairs: every
row has one primary record (its class, regime and size come from it) and, where the
measured call ran more than one kernel, companion records whose times add to it:

- ``gemm``: optional ``weight_dtype`` (weights stored narrower than ``dtype``: the
  weight-only path of ``cost.dequant``), ``weight_format`` (a ``specs.formats``
  name: the weights' bytes with their scales) and ``act_quant`` (``tensor``: the call
  quantizes its 16-bit activations with a per-tensor dynamic scale, a reduction and a
  quantizing pass; ``token``: per token or per 128-element group, one pass;
  ``cost.quantize``);
- ``attention``: optional ``window`` (sliding window, 0: none), ``kv_dtype`` (the cache's
  dtype, default ``dtype``) and ``kv_write`` (1: the call also stores the new tokens' K and
  V, as a backend's forward does: a ``KvWrite`` of batch x q_len tokens);
- ``moe``: a MoE layer of ``m`` tokens, hidden size ``n``, expert width ``k`` per device,
  ``experts`` experts picked ``topk`` at a time, ``ep`` devices of expert parallelism and
  Zipf routing skew ``skew`` (``cost.routing``), on the busiest device (``busiest_rank``):
  the up/gate grouped GEMM over the experts it touches, the gated activation and the down
  grouped GEMM, as ``cost.layers`` prices a MoE block; ``weight_dtype``, ``weight_format``
  and ``act_quant`` as for a GEMM (both GEMMs);
- ``all_reduce`` / ``all_to_all``: ``message_bytes`` per device over ``n_devices``; nodes are
  ceil(n_devices / the device's ``interconnect.max_devices``) (``cost.collectives``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from functools import lru_cache

import numpy as np

from perfmodel.compare.moe_routing import is_known, routed_load
from perfmodel.cost.ops import AllReduce, AllToAll, Attention, Gemm, KvWrite, OpRecord, pointwise
from perfmodel.cost.quantize import ActQuant, act_scale_bytes
from perfmodel.cost.routing import expected_distinct, zipf_popularity
from perfmodel.specs.dtypes import BYTES, CODE, weight_bytes
from perfmodel.specs.errors import SpecError
from perfmodel.specs.formats import weight_formats
from perfmodel.specs.hardware import Hardware

Part = tuple[OpRecord, bool]
ACT_QUANT = ("", "tensor", "token")
_BF16 = CODE["bf16"]


def _text(rows: Sequence[dict], key: str) -> list[str]:
    return [str(r.get(key) or "").strip() for r in rows]


def _codes(rows: Sequence[dict], key: str, default: np.ndarray, where: str,
           line: Sequence[int]) -> np.ndarray:
    out = default.copy()
    for i, name in enumerate(_text(rows, key)):
        if name:
            if name not in CODE:
                raise SpecError(f"{where}: row {line[i]}: column {key}: unknown dtype {name!r}")
            out[i] = CODE[name]
    return out


def _numbers(rows: Sequence[dict], key: str, default: float, where: str,
             line: Sequence[int]) -> np.ndarray:
    out = np.full(len(rows), default, dtype=float)
    for i, text in enumerate(_text(rows, key)):
        if text:
            try:
                value = float(text)
            except ValueError:
                value = math.nan
            if not (math.isfinite(value) and value >= 0):
                raise SpecError(f"{where}: row {line[i]}: column {key}: expected a "
                                f"non-negative number, got {text!r}")
            out[i] = value
    return out


def _weights(rows: Sequence[dict], dtype: np.ndarray, where: str, line: Sequence[int]
             ) -> tuple[np.ndarray, np.ndarray]:
    """(bytes per stored weight, stored dtype code or -1) of GEMM / MoE rows."""
    stored = _codes(rows, "weight_dtype", dtype, where, line)
    wb = BYTES[stored].astype(float)
    formats = weight_formats()
    for i, name in enumerate(_text(rows, "weight_format")):
        if name:
            if name not in formats:
                raise SpecError(f"{where}: row {line[i]}: column weight_format: unknown "
                                f"{name!r}, expected one of {', '.join(formats)}")
            fmt, group, scale = formats[name].scheme
            stored[i] = CODE[fmt]
            wb[i] = float(weight_bytes(CODE[fmt], group or 0, scale))
    narrower = BYTES[stored] < BYTES[dtype]
    return wb, np.where(narrower, stored, -1)


def _act_quant(rows: Sequence[dict], where: str, line: Sequence[int]) -> np.ndarray:
    """Per row: -1 no quantization pass, 0 one pass, 1 a reduction and a pass."""
    out = np.full(len(rows), -1.0)
    for i, name in enumerate(_text(rows, "act_quant")):
        if name not in ACT_QUANT:
            raise SpecError(f"{where}: row {line[i]}: column act_quant: expected one of "
                            f"tensor, token or blank, got {name!r}")
        out[i] = {"": -1.0, "tensor": 1.0, "token": 0.0}[name]
    return out


def _quant_pass(rows: np.ndarray, n: np.ndarray, dtype: np.ndarray, mode: np.ndarray
                ) -> ActQuant:
    """The activation quantization of rows where ``mode`` >= 0 (count 0 elsewhere)."""
    return ActQuant(rows=rows, n=n, act_bytes=2.0, kv_bytes=BYTES[dtype],
                    reduce_pass=np.maximum(mode, 0.0),
                    scale_bytes=act_scale_bytes(dtype, mode), dtype=_BF16,
                    count=(mode >= 0).astype(float))


def gemm_parts(rows: Sequence[dict], col: Callable[[str], np.ndarray], dtype: np.ndarray,
               where: str, line: Sequence[int]) -> list[Part]:
    return linear(**gemm_inputs(rows, col, dtype, where, line))


def gemm_inputs(rows: Sequence[dict], col: Callable[[str], np.ndarray], dtype: np.ndarray,
                where: str, line: Sequence[int]) -> dict[str, np.ndarray]:
    """``linear``'s arguments for GEMM rows."""
    wb, stored = _weights(rows, dtype, where, line)
    return {"m": col("m"), "n": col("n"), "k": col("k"), "wb": wb, "stored": stored,
            "dtype": dtype, "mode": _act_quant(rows, where, line)}


def linear(m: np.ndarray, n: np.ndarray, k: np.ndarray, wb: np.ndarray, stored: np.ndarray,
           dtype: np.ndarray, mode: np.ndarray) -> list[Part]:
    """A framework's linear: the GEMM and, where ``mode`` >= 0, its activations'
    quantization (``_act_quant``)."""
    gemm = Gemm(m=m, n=n, k=k, weight_bytes=wb, act_bytes=BYTES[dtype], dtype=dtype,
                weight_dtype=stored)
    parts: list[Part] = [(gemm, True)]
    if (mode >= 0).any():
        parts.append((_quant_pass(m, k, dtype, mode), False))
    return parts


def attention_parts(rows: Sequence[dict], col: Callable[[str], np.ndarray],
                    dtype: np.ndarray, where: str, line: Sequence[int]) -> list[Part]:
    hd = col("head_dim")
    kv = _codes(rows, "kv_dtype", dtype, where, line)
    window = _numbers(rows, "window", 0.0, where, line)
    # MLA rows: the value width and the cached elements per token and KV head differ from
    # K's (blank: V as wide as K, K and V both cached)
    v_dim = _numbers(rows, "v_dim", 0.0, where, line)
    v_dim = np.where(v_dim > 0, v_dim, hd)
    cache = _numbers(rows, "cache_dim", 0.0, where, line)
    cache = np.where(cache > 0, cache, 2 * hd)
    batch, q_len = col("batch"), col("q_len")
    att = Attention(batch=batch[:, None], q_len=q_len[:, None], kv_len=col("kv_len")[:, None],
                    n_heads=col("n_heads"), n_kv_heads=col("n_kv_heads"), qk_dim=hd,
                    v_dim=v_dim, cache_elems=cache, window=window, act_bytes=BYTES[dtype],
                    kv_bytes=BYTES[kv], dtype=dtype)
    parts: list[Part] = [(att, True)]
    write = _numbers(rows, "kv_write", 0.0, where, line) > 0
    if write.any():
        parts.append((KvWrite(rows=batch * q_len, n=col("n_kv_heads") * cache,
                              act_bytes=BYTES[dtype], kv_bytes=BYTES[kv], dtype=dtype,
                              count=write.astype(float)), False))
    return parts


def moe_parts(rows: Sequence[dict], col: Callable[[str], np.ndarray], dtype: np.ndarray,
              where: str, line: Sequence[int]) -> list[Part]:
    return moe_layer(**moe_inputs(rows, col, dtype, where, line))


def moe_inputs(rows: Sequence[dict], col: Callable[[str], np.ndarray], dtype: np.ndarray,
               where: str, line: Sequence[int]) -> dict[str, np.ndarray]:
    """``moe_layer``'s arguments for MoE rows (the routing, weight bytes and activation
    quantization each row's columns give)."""
    pairs, groups = moe_routing(rows, col, where, line)
    wb, stored = _weights(rows, dtype, where, line)
    return {"tokens": col("m"), "topk": col("topk"), "hidden": col("n"), "width": col("k"),
            "pairs": pairs,
            "groups": groups, "wb": wb, "stored": stored, "dtype": dtype,
            "mode": _act_quant(rows, where, line)}


def moe_routing(rows: Sequence[dict], col: Callable[[str], np.ndarray], where: str,
                line: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """(token-expert pairs, experts touched) on the timed device of each MoE row: routed as
    aiconfigurator's collector routes where the row names its distribution
    (``compare.moe_routing``), else under Zipf routing of exponent ``skew``
    (``busiest_rank``)."""
    tokens, experts, topk = col("m"), col("experts"), col("topk")
    ep = np.maximum(_numbers(rows, "ep", 1.0, where, line), 1.0)
    skew = _numbers(rows, "skew", 0.0, where, line)
    routing = _text(rows, "distribution")
    pairs, groups = np.array([
        collector_rank(int(e), int(t), int(d), int(x), r) if is_known(r)
        else busiest_rank(int(e), int(t), x, s, int(d))
        for e, t, x, s, d, r in zip(experts, topk, tokens, skew, ep, routing, strict=True)]
    ).reshape(-1, 2).T
    return pairs, groups


def moe_layer(tokens: np.ndarray, topk: np.ndarray, hidden: np.ndarray, width: np.ndarray,
              pairs: np.ndarray, groups: np.ndarray, wb: np.ndarray, stored: np.ndarray,
              dtype: np.ndarray, mode: np.ndarray) -> list[Part]:
    """The kernels of a fused MoE layer on one device: the up/gate grouped GEMM over the
    ``groups`` experts its ``pairs`` (token, expert) pairs touch, the gated activation, the
    down grouped GEMM and, where ``mode`` >= 0, the activations' quantization before each
    GEMM (``_act_quant``)."""
    expert_rows = pairs / groups                # mean rows of each expert it touches
    ab = BYTES[dtype]
    up = Gemm(m=expert_rows, n=2 * width, k=hidden, groups=groups, weight_bytes=wb,
              act_bytes=ab, dtype=dtype, weight_dtype=stored, experts=True)
    down = Gemm(m=expert_rows, n=hidden, k=width, groups=groups, weight_bytes=wb,
                act_bytes=ab, dtype=dtype, weight_dtype=stored, experts=True)
    parts: list[Part] = [(up, True), (pointwise("silu_and_mul", pairs, width), False),
                         (down, False), (pointwise("gather", tokens * topk, hidden), False)]
    if (mode >= 0).any():
        parts += [(_quant_pass(tokens, hidden, dtype, mode), False),
                  (_quant_pass(pairs, width, dtype, mode), False)]
    return parts


@lru_cache(maxsize=256)
def _popularity(n_experts: int, top_k: int, skew: float) -> np.ndarray:
    return zipf_popularity(n_experts, top_k, skew)


def collector_rank(n_experts: int, top_k: int, ep: int, tokens: int, routing: str
                   ) -> tuple[float, float]:
    """(token-expert pairs, experts touched) on the device aiconfigurator's collector
    timed, routed as it routes (``compare.moe_routing``)."""
    pairs, touched, _ = routed_load(n_experts, top_k, ep, tokens, routing)
    return pairs, touched


def busiest_rank(n_experts: int, top_k: int, tokens: float, skew: float, ep: int
                 ) -> tuple[float, float]:
    """(token-expert pairs, experts touched) on the busiest of ``ep`` devices holding
    contiguous experts, the hottest together (aiconfigurator's collector gives EP rank 0,
    the one it times, the most loaded experts): the hottest E / ep experts of Zipf routing
    with exponent ``skew`` (``cost.routing``), T x their popularity and their expected
    distinct count (at least one)."""
    p = _popularity(n_experts, top_k, float(skew))[: max(n_experts // ep, 1)]
    touched = float(expected_distinct(p, tokens))
    return tokens * float(p.sum()), max(touched, 1.0)


def collective_parts(kind: str, rows: Sequence[dict], col: Callable[[str], np.ndarray],
                     hw: Hardware | None) -> list[Part]:
    devices = col("n_devices")
    per_node = hw.interconnect.max_devices if hw is not None else 8
    nodes = np.ceil(devices / per_node)
    record = AllToAll if kind == "all_to_all" else AllReduce
    return [(record(payload=col("message_bytes"), devices=devices, nodes=nodes), True)]
