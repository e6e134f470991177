"""The error class of an operator instance: the unit in which measured error is reported,
fitted and turned into an uncertainty band.

Kernels err alike within a class and differently across classes, so the kernel corpus's
comparison (``compare``), the calibration's held-out residuals and the estimate's band all
group by this one key:

- ``gemv``: a dense GEMM with fewer than ``GEMV_ROWS`` rows (decode-sized; weight streaming,
  a memory-bound kernel whose fixed cost and split-K matter more than its tiles);
- ``gemm``: any other dense GEMM;
- ``moe``: a GEMM over several weight groups (experts, grouped GEMM);
- ``attention_prefill``: attention with more than one new token per sequence;
- ``attention_decode``: attention with one new token per sequence (the split-KV kernel);
- ``collective``: all-reduce, all-to-all and point-to-point transfers;
- ``memory``: every other kernel (norms, activations, rotary, KV writes, embeddings, scans);
- ``host``: rows that are not kernels (framework overhead, bubbles, draft rows).
"""

from __future__ import annotations

import numpy as np

from perfmodel.cost.ops import Attention, Gemm, OpRecord, Pointwise
from perfmodel.specs.kinds import ERROR_CLASSES, KINDS, POINTWISE

__all__ = ["CODE", "ERROR_CLASSES", "GEMV_ROWS", "error_class", "error_code"]

GEMV_ROWS = 64
CODE = {c: i for i, c in enumerate(ERROR_CLASSES)}     # each class's code (``error_code``)
_RULE = {"collective": CODE["collective"], "host": CODE["host"]}


def error_class(op: OpRecord) -> np.ndarray:
    """The error class of every instance of ``op`` (an array of str, the instance shape)."""
    return np.asarray(ERROR_CLASSES, dtype=object)[error_code(op)]


def error_code(op: OpRecord, shape: tuple[int, ...] | None = None) -> np.ndarray:
    """``error_class`` as codes (int8, positions in ``ERROR_CLASSES``): what a priced step
    carries per operator and row (``cost.band``). ``shape``: the instance shape when the
    caller knows it (``op.shape`` broadcasts every field to find it)."""
    shape = op.shape if shape is None else shape
    if isinstance(op, Gemm):
        grouped = np.broadcast_to(np.asarray(op.groups) > 1, shape)
        narrow = np.broadcast_to(np.asarray(op.m) < GEMV_ROWS, shape)
        return np.where(grouped, CODE["moe"],
                        np.where(narrow, CODE["gemv"], CODE["gemm"])).astype(np.int8)
    if isinstance(op, Attention):
        # a group with batch 0 is padding; an instance decodes when every real group has
        # one new token per sequence
        q = np.where(np.asarray(op.batch) > 0, np.asarray(op.q_len), 1)
        decode = np.broadcast_to(np.all(q <= 1, axis=-1), shape)
        return np.where(decode, CODE["attention_decode"],
                        CODE["attention_prefill"]).astype(np.int8)
    if isinstance(op, Pointwise):     # a kind per code: classify each code once
        return np.broadcast_to(_POINTWISE[np.asarray(op.code, dtype=int)], shape).copy()
    return np.full(shape, _code(op.kind), np.int8)


def _code(kind: str) -> int:
    return _RULE.get(KINDS[kind].rule, CODE["memory"])


_POINTWISE = np.array([_code(k) for k in POINTWISE], np.int8)     # by pointwise code
