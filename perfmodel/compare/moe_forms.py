"""MoE row forms: a measured fused-MoE layer priced as the kernels it ran (``compare.forms``
holds the other ops' forms and the row-reading helpers).

A ``moe`` row is a MoE layer of ``m`` tokens, hidden size ``n``, expert width ``k`` per
device, ``experts`` experts picked ``topk`` at a time, ``ep`` devices of expert parallelism
and Zipf routing skew ``skew`` (``cost.routing``), on the busiest device (``busiest_rank``),
or routed as aiconfigurator's collector routed it where the row names its distribution
(``compare.moe_routing``): the up/gate grouped GEMM over the experts it touches, the gated
activation, the down grouped GEMM and the un-permutation (``moe_layer``), as
``cost.layers`` prices a MoE block; ``weight_dtype``, ``weight_format`` and ``act_quant`` as
for a GEMM (both GEMMs); a row whose ``kernel`` names a non-gated expert path
(``NON_GATED``) runs an up GEMM of ``k`` columns and a one-operand activation (relu2), as a
non-gated MLP does (``cost.layers._mlp_block``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import lru_cache

import numpy as np

from perfmodel.compare.forms import Part, _act_quant, _numbers, _quant_pass, _text, _weights
from perfmodel.compare.moe_routing import is_known, routed_load
from perfmodel.cost.moe import expert_scan
from perfmodel.cost.ops import Gemm, pointwise
from perfmodel.cost.routing import expected_distinct, zipf_popularity
from perfmodel.specs.dtypes import BYTES

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
