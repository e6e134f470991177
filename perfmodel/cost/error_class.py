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

from perfmodel.cost.ops import Attention, Gemm, OpRecord, kind_names
from perfmodel.specs.kinds import ERROR_CLASSES, KINDS

__all__ = ["ERROR_CLASSES", "GEMV_ROWS", "error_class"]

GEMV_ROWS = 64


def error_class(op: OpRecord) -> np.ndarray:
    """The error class of every instance of ``op`` (an array of str, the instance shape)."""
    shape = op.shape
    if isinstance(op, Gemm):
        grouped = np.broadcast_to(np.asarray(op.groups) > 1, shape)
        narrow = np.broadcast_to(np.asarray(op.m) < GEMV_ROWS, shape)
        return np.where(grouped, "moe", np.where(narrow, "gemv", "gemm")).astype(object)
    if isinstance(op, Attention):
        # a group with batch 0 is padding; an instance decodes when every real group has
        # one new token per sequence
        q = np.where(np.asarray(op.batch) > 0, np.asarray(op.q_len), 1)
        decode = np.broadcast_to(np.all(q <= 1, axis=-1), shape)
        return np.where(decode, "attention_decode", "attention_prefill").astype(object)
    rules = {"collective": "collective", "host": "host"}
    names = np.asarray(kind_names(op), dtype=object)
    return np.vectorize(lambda k: rules.get(KINDS[k].rule, "memory"), otypes=[object])(names)
