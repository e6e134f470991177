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
  and ``act_quant`` as for a GEMM (both GEMMs); a row whose ``kernel`` names a non-gated
  expert path (``NON_GATED``) runs an up GEMM of ``k`` columns and a one-operand
  activation (relu2), as a non-gated MLP does (``cost.layers._mlp_block``);
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
from functools import lru_cache

import numpy as np

from perfmodel.compare.moe_routing import is_known, routed_load
from perfmodel.cost import ep
from perfmodel.cost.moe import expert_scan
from perfmodel.cost.ops import AllReduce, AllToAll, Attention, Gemm, KvWrite, OpRecord, pointwise
from perfmodel.cost.quantize import ActQuant, act_scale_bytes
from perfmodel.cost.routing import expected_distinct, zipf_popularity
from perfmodel.cost.scan import Conv1d, LinearScan
from perfmodel.specs.dtypes import BYTES, CODE, narrower_code, weight_bytes
from perfmodel.specs.errors import SpecError
from perfmodel.specs.formats import weight_formats
from perfmodel.specs.hardware import Hardware

Part = tuple[OpRecord, bool]
ACT_QUANT = ("", "tensor", "token")
# kernel names of non-gated expert paths: TensorRT-LLM's relu2 experts (Nemotron), which
# aiconfigurator's collector times with ``is_gated=False`` and records as
# ``moe_torch_flow_nongated`` (collector/trtllm/collect_moe.py, run_moe_torch: Relu2,
# no gate half in w3_w1)
NON_GATED = ("_nongated",)
# kernel names of MoE paths that copy the device's (token, expert) rows into expert order
# and back: TensorRT-LLM's torch-flow MoE backends (CUTLASS, its non-gated path, DeepGEMM;
# aiconfigurator records them as moe_torch_flow* / deepgemm). In cpp/tensorrt_llm/kernels/
# cutlass_kernels/moe_gemm/moe_kernels.cu, expandInputRowsKernel copies each token row to
# every local permuted row (permuted_row < expert_first_token_offset[experts per node])
# before the first GEMM, and finalizeMoeRoutingKernel (DeepGEMM's through
# moe_finalize_scale_op, thop/moeUtilOp.cpp) writes one row per token, skipping each
# top-k slot whose expert is not on the device: it reads the local pairs' rows only.
# Triton fused_moe gathers rows inside its GEMM (sorted_token_ids, no copy) and its
# moe_sum reads all M x topk slots of intermediate_cache3.
LOCAL_COMBINE = ("moe_torch_flow", "deepgemm")
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


def moe_parts(rows: Sequence[dict], col: Callable[[str], np.ndarray], dtype: np.ndarray,
              where: str, line: Sequence[int]) -> list[Part]:
    return moe_layer(**moe_inputs(rows, col, dtype, where, line))


def moe_inputs(rows: Sequence[dict], col: Callable[[str], np.ndarray], dtype: np.ndarray,
               where: str, line: Sequence[int]) -> dict[str, np.ndarray]:
    """``moe_layer``'s arguments for MoE rows (the routing, weight bytes and activation
    quantization each row's columns give)."""
    pairs, groups, padded, local = moe_routing(rows, col, where, line)
    wb, stored = _weights(rows, dtype, where, line)
    kernels = _text(rows, "kernel")
    gated = [not any(k.endswith(s) for s in NON_GATED) for k in kernels]
    combine = [k.startswith(LOCAL_COMBINE) for k in kernels]
    return {"tokens": col("m"), "topk": col("topk"), "hidden": col("n"), "width": col("k"),
            "pairs": pairs, "groups": groups, "wb": wb, "stored": stored, "dtype": dtype,
            "mode": _act_quant(rows, where, line), "gated": np.asarray(gated, dtype=float),
            "padded": padded, "local_combine": np.asarray(combine, dtype=float),
            "local_experts": local}


def moe_routing(rows: Sequence[dict], col: Callable[[str], np.ndarray], where: str,
                line: Sequence[int]) -> tuple[np.ndarray, ...]:
    """(token-expert pairs, experts touched, rows once each expert's are padded to the
    kernel's row block, ``row_block``, experts held) on the timed device of each row: as
    aiconfigurator's collector routes where the row names its distribution
    (``compare.moe_routing``), else under Zipf routing of exponent ``skew``
    (``busiest_rank``)."""
    tokens, experts, topk = col("m"), col("experts"), col("topk")
    ep = np.maximum(_numbers(rows, "ep", 1.0, where, line), 1.0)
    skew = _numbers(rows, "skew", 0.0, where, line)
    routing = _text(rows, "distribution")
    pairs, groups, padded = np.array([
        collector_rank(int(e), int(t), int(d), int(x), r) if is_known(r)
        else busiest_rank(int(e), int(t), x, s, int(d))
        for e, t, x, s, d, r in zip(experts, topk, tokens, skew, ep, routing, strict=True)]
    ).reshape(-1, 3).T
    return pairs, groups, padded, np.maximum(np.floor(experts / ep), 1.0)


def row_block(tokens: float, local_experts: float) -> int:
    """BLOCK_SIZE_M of a fused-MoE launch of ``tokens`` tokens over ``local_experts``
    experts: ``moe_align_block_size`` pads each expert's rows to a multiple of it. vLLM's
    and SGLang's Triton ``fused_moe`` ``get_default_config``: 16 where M <= E, else 64
    (vllm model_executor/layers/fused_moe/fused_moe.py; the shipped per-shape tuned
    configs, ``configs/E=*,N=*,device_name=*.json``, move the same way, 16 at small M
    and 64 or more at prefill sizes)."""
    return 16 if tokens <= local_experts else 64


def moe_layer(tokens: np.ndarray, topk: np.ndarray, hidden: np.ndarray, width: np.ndarray,
              pairs: np.ndarray, groups: np.ndarray, wb: np.ndarray, stored: np.ndarray,
              dtype: np.ndarray, mode: np.ndarray, gated: np.ndarray | float = 1.0,
              padded: np.ndarray | None = None, local_combine: np.ndarray | float = 0.0,
              local_experts: np.ndarray | None = None) -> list[Part]:
    """The kernels of a fused MoE layer on one device: the up/gate grouped GEMM over the
    ``groups`` experts its ``pairs`` (token, expert) pairs touch, the gated activation, the
    down grouped GEMM and, where ``mode`` >= 0, the activations' quantization before each
    GEMM (``_act_quant``). Where ``gated`` is 0 the experts have no gate half: an up GEMM
    of ``width`` columns and a one-operand activation (relu2). Each expert's GEMM rows are
    its tokens padded to the kernel's row block (``padded``, default ``pairs``): the
    padding rows are multiplied as real ones (``moe_align_block_size``). The weighted
    un-permutation (``gather``) reads every token's top-k rows and writes as many; where
    ``local_combine`` is 1 (``LOCAL_COMBINE``) a copy of the ``pairs`` rows into expert
    order (at the GEMM's activation width) comes first, and the un-permutation reads the
    ``pairs`` rows and writes one row per token: (pairs + tokens) / 2 rows of one read
    and one write. The up GEMM carries the layer's tokens x topk (token, top-k) slots,
    which its routing and sort read (``Gemm.slots``, priced at its kernel's ``slot_s``,
    ``cost.moe.fixed_cost``), and its three-step sort's threads over the device's
    ``local_experts`` (``Gemm.scan``, ``cost.moe.expert_scan``; None: not priced)."""
    # mean rows of each expert it touches, padded
    expert_rows = (pairs if padded is None else np.maximum(padded, pairs)) / groups
    ab = BYTES[dtype]
    gate = np.asarray(gated, dtype=float) > 0
    up = Gemm(m=expert_rows, n=np.where(gate, 2, 1) * width, k=hidden, groups=groups,
              weight_bytes=wb, act_bytes=ab, dtype=dtype, weight_dtype=stored, experts=True,
              slots=tokens * topk, scan=0.0 if local_experts is None
              else expert_scan(tokens, topk, local_experts))
    down = Gemm(m=expert_rows, n=hidden, k=width, groups=groups, weight_bytes=wb,
                act_bytes=ab, dtype=dtype, weight_dtype=stored, experts=True)
    local = np.asarray(local_combine, dtype=float) > 0
    parts: list[Part] = [(up, True)]
    if local.any():
        parts.append((pointwise("gather", pairs, hidden, act_bytes=ab, count=local * 1.0),
                      False))
    if gate.any():
        parts.append((pointwise("silu_and_mul", pairs, width, count=gate * 1.0), False))
    if not gate.all():
        parts.append((pointwise("gelu", pairs, width, count=~gate * 1.0), False))
    combined = np.where(local, (pairs + tokens) / 2, tokens * topk)
    parts += [(down, False), (pointwise("gather", combined, hidden), False)]
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
    block = row_block(tokens, max(n_experts // ep, 1))
    return routed_load(n_experts, top_k, ep, tokens, routing, block)


def busiest_rank(n_experts: int, top_k: int, tokens: float, skew: float, ep: int
                 ) -> tuple[float, float, float]:
    """(token-expert pairs, experts touched, padded rows) on the busiest of ``ep`` devices
    holding contiguous experts, the hottest together (aiconfigurator's collector gives EP
    rank 0, the one it times, the most loaded experts): the hottest E / ep experts of Zipf
    routing with exponent ``skew`` (``cost.routing``), T x their popularity, their
    expected distinct count (at least one) and each one's expected rows padded to the
    kernel's row block (``row_block``)."""
    local = max(n_experts // ep, 1)
    p = _popularity(n_experts, top_k, float(skew))[:local]
    touched = float(expected_distinct(p, tokens))
    block = row_block(tokens, local)
    padded = float(np.sum(np.ceil(tokens * p / block) * block * (1 - (1 - p) ** tokens)))
    return tokens * float(p.sum()), max(touched, 1.0), padded


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
