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
- ``moe``: a fused MoE layer (``compare.moe_forms``);
- ``linear_attention``: a linear-attention layer's scan (``cost.scan.LinearScan``, the
  gated delta rule) over ``batch`` sequences of ``q_len`` new tokens, state before when
  kv_len > q_len, ``n_heads`` value heads of ``head_dim`` keys and ``v_dim`` values, q and
  k of ``n_kv_heads`` heads (L2-normalised in the call where ``l2norm`` is 1), chunks of
  ``chunk``, ``channel_gates`` decay channels per head (KDA; 0: one decay per head and
  token, Gated DeltaNet's g and beta); an fp32 state;
- ``conv1d``: the short causal conv over ``m`` tokens of ``n`` channels of ``batch``
  sequences, width ``width``, ``calls`` calls (``cost.scan.Conv1d``);
- ``all_reduce`` / ``all_to_all``: ``message_bytes`` per device over ``n_devices``; nodes are
  ceil(n_devices / the device's ``interconnect.max_devices``) (``cost.collectives``);
- ``ep_dispatch`` / ``ep_combine``: a DeepEP kernel (``ep_row_parts``, ``cost.ep``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from perfmodel.cost import ep
from perfmodel.cost.ops import AllReduce, AllToAll, Attention, Gemm, KvWrite, OpRecord
from perfmodel.cost.quantize import ActQuant, act_scale_bytes
from perfmodel.cost.scan import Conv1d, LinearScan
from perfmodel.specs.dtypes import BYTES, CODE, narrower_code, weight_bytes
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
    return wb, narrower_code(stored, dtype)


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


def collective_parts(kind: str, rows: Sequence[dict], col: Callable[[str], np.ndarray],
                     hw: Hardware | None) -> list[Part]:
    devices = col("n_devices")
    per_node = hw.interconnect.max_devices if hw is not None else 8
    nodes = np.ceil(devices / per_node)
    record = AllToAll if kind == "all_to_all" else AllReduce
    return [(record(payload=col("message_bytes"), devices=devices, nodes=nodes), True)]


def scan_parts(rows: Sequence[dict], col: Callable[[str], np.ndarray], dtype: np.ndarray,
               where: str, line: Sequence[int]) -> list[Part]:
    """A linear-attention scan row as the record the model's step prices it with
    (``cost.recurrent._linear`` / ``_kda``: q and k counted at the value heads)."""
    heads, d_k = col("n_heads"), col("head_dim")
    qk = _numbers(rows, "n_kv_heads", 0.0, where, line)
    v_dim = _numbers(rows, "v_dim", 0.0, where, line)
    chunk = np.maximum(_numbers(rows, "chunk", 64.0, where, line), 1.0)
    norm = _numbers(rows, "l2norm", 0.0, where, line) > 0
    channels = _numbers(rows, "channel_gates", 0.0, where, line)
    scan = LinearScan(batch=col("batch")[:, None], q_len=col("q_len")[:, None],
                      kv_len=col("kv_len")[:, None], heads=heads, qk_heads=heads, d_k=d_k,
                      d_v=np.where(v_dim > 0, v_dim, d_k), chunk=chunk, delta=True,
                      gates=np.where(channels > 0, 1, 2),
                      l2norm_heads=np.where(norm, np.where(qk > 0, qk, heads), 0),
                      channel_gates=channels, act_bytes=BYTES[dtype], state_bytes=4.0,
                      dtype=dtype)
    return [(scan, True)]


def conv_parts(rows: Sequence[dict], col: Callable[[str], np.ndarray], dtype: np.ndarray,
               where: str, line: Sequence[int]) -> list[Part]:
    """A short-conv row: ``calls`` causal_conv1d calls of ``m`` tokens, ``n`` channels."""
    seqs = np.maximum(_numbers(rows, "batch", 1.0, where, line), 1.0)
    width = np.maximum(_numbers(rows, "width", 4.0, where, line), 1.0)
    calls = np.maximum(_numbers(rows, "calls", 1.0, where, line), 1.0)
    return [(Conv1d(rows=col("m"), seqs=seqs, n=col("n"), width=width,
                    act_bytes=BYTES[dtype], state_bytes=BYTES[dtype], dtype=dtype,
                    count=calls), True)]


EP_OPS = ("ep_dispatch", "ep_combine")


def ep_row_parts(kind: str, rows: Sequence[dict], col: Callable[[str], np.ndarray],
                 hw: Hardware | None, where: str, line: Sequence[int]) -> list[Part]:
    """DeepEP dispatch / combine rows: ``mode`` normal | ll, ``m`` tokens per rank of hidden
    ``n`` in the row's ``dtype`` (its scales added, ``cost.ep.PAYLOAD``), ``topk`` of
    ``experts`` over ``n_devices`` on ``nodes`` nodes (default: ceil over the device's
    ``max_devices``), ``sms`` (0: DeepEP's default), routing limited to ``topk_groups`` of
    ``groups`` node groups (default 1: uniform)."""
    modes = _text(rows, "mode")
    for i, name in enumerate(modes):
        if name not in ("normal", "ll"):
            raise SpecError(f"{where}: row {line[i]}: column mode: expected normal or ll, "
                            f"got {name!r}")
    dtypes = [d or "bf16" for d in _text(rows, "dtype")]
    for i, name in enumerate(dtypes):
        if name not in ep.PAYLOAD:
            raise SpecError(f"{where}: row {line[i]}: column dtype: expected one of "
                            f"{', '.join(ep.PAYLOAD)} for {kind}, got {name!r}")
    n = col("n_devices")
    per_node = hw.interconnect.max_devices if hw is not None else 8
    nodes = _numbers(rows, "nodes", 0.0, where, line)
    nodes = np.where(nodes >= 1, nodes, np.ceil(n / per_node))
    groups = np.maximum(_numbers(rows, "groups", 1.0, where, line), 1.0)
    picked = np.maximum(_numbers(rows, "topk_groups", 1.0, where, line), 1.0)
    phase = kind.removeprefix("ep_")
    code = np.array([ep.kernel_code(m, phase) for m in modes])
    experts, topk = col("experts"), col("topk")
    reach = np.array([ep.reach(e, k, d, max(int(d // m), 1), g, p) for e, k, d, m, g, p
                      in zip(experts, topk, n, nodes, groups, picked, strict=True)])
    elem = np.array([ep.PAYLOAD[d] for d in dtypes])
    moved = ep.traffic(code, col("m"), ep.token_bytes(code, col("n"), elem, topk), topk, n,
                       nodes, reach[:, 0], reach[:, 1])
    units = hw.compute_units if hw is not None else 10**6
    sms = ep.sm_budget(code, _numbers(rows, "sms", 0.0, where, line), experts, col("m"), units)
    return [(AllToAll(payload=moved.sent, devices=n, nodes=nodes, kernel=code,
                      link_bytes=moved.link, network_bytes=moved.network,
                      copies=moved.copies, sms=sms), True)]
