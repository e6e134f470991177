"""A linear-attention scan as a GPU engine's kernels run it (``efficiency.scan_kernels``).

A chunked prefill of the gated delta rule in flash-linear-attention's Triton kernels, as
SGLang, TensorRT-LLM and vLLM's Triton path vendor them (fla ``ops/gated_delta_rule/
chunk.py`` ``chunk_gated_delta_rule_fwd``; sglang ``srt/layers/attention/fla/chunk.py``),
is six kernels, each launched once per call, passing its results through memory:

  1 ``chunk_local_cumsum``        g's cumsum within chunks of 64, written at fp32
  2 ``chunk_scaled_dot_kkt_fwd``  A = beta K K^T per chunk (reads k, beta, g), fp32 out
  3 ``solve_tril``                (I + A)^-1 (reads A fp32, writes it at the input dtype)
  4 ``recompute_w_u_fwd``         w = A (k beta exp(g)), u = A (v beta) (reads k, v, A, g)
  5 ``chunk_gated_delta_rule_fwd_h``  the chunk states h, in order, and v_new (reads k, w,
                                  u, g; writes h per chunk and v_new); its grid is
                                  (cdiv(V, BV), N H): each program carries BV value columns
                                  of one sequence-head's state through every chunk in turn
  6 ``chunk_fwd_o``               the output (reads q, k, v_new, h, g)

with, where the call L2-normalises q and k itself (``use_qk_l2norm_in_kernel``), two
``l2norm_fwd`` launches before them. KDA's chunked kernels (``fla/ops/kda``) run the same
chain with a decay per key channel. ``Scan`` counts the algorithm's own traffic (q, k, v,
the gates and the output once; the chunk states; the state); the chain adds per token and
head, at the activation dtype ``a`` unless said: g's cumsum at fp32 written and read by
kernels 2, 4, 5 and 6 (5 x 4 B per decay channel), A at fp32 written and read (2 Q 4 B)
and at ``a`` written and read (2 Q a), w and u written and read (2 (d_k + d_v) a), v_new
written and read (2 d_v a) and k read again by kernels 4, 5 and 6 (3 d_k a).

A fused kernel (FlashInfer's GDN prefill, vLLM's on SM90 / SM100; FlashKDA) is one launch
with no such traffic. A recurrent step (decode, a speculative verify's tokens one after
the other: ``fused_recurrent_*``) is one launch that streams each sequence-head's state in
and out; a verify also writes the state after each draft token (``checkpoints``).

Each call's time, per group of sequences of one call class (``specs.dtypes.SCAN_CLASSES``):

  max(FLOPs / (peak x gemm_fraction), bytes / (bandwidth x memory_fraction),
      waves x steps x step_s)  +  launches x latency_s

``waves`` = ceil(batch x heads x ceil(d_v / state_columns) / compute units): the state
recurrence's programs, each walking ``steps`` (chunks, or tokens for a recurrent step) in
order, a step's dependent matmuls and loads taking ``step_s``. The class's figures come
from the device's file per engine, fitted on the engine's measured calls
(``validate/corpus/scan.py``); ``launches`` and ``state_columns`` are the kernel's source's.
A class the file lacks takes the device's kernel-wide figures, one launch.
"""

from __future__ import annotations

import numpy as np

from perfmodel.cost.scan import GATE_BYTES, Scan
from perfmodel.cost.timebase import OpTimes, finish, kind_memory_fraction, peak
from perfmodel.specs.dtypes import SCAN_CLASSES
from perfmodel.specs.hardware import Hardware

FIELDS = ("gemm_fraction", "memory_fraction", "latency_s", "step_s", "launches",
          "state_columns")
L2NORM_LAUNCHES = 2                 # l2norm_fwd(q), l2norm_fwd(k)
ACC_BYTES = 4.0                     # fp32: g's cumsum, kkt's A


def table(op: Scan, hw: Hardware) -> np.ndarray:
    """The (class, field) figures of ``hw`` for ``op``'s kind (``FIELDS`` order)."""
    eff = hw.efficiency
    default = (eff.gemm_fraction, kind_memory_fraction(op.kind, hw), eff.latency_for(op.kind),
               0.0, 1.0, 0.0)
    return np.array([eff.scan_kernels.get(c, default) for c in SCAN_CLASSES])


def call_class(op: Scan) -> np.ndarray:
    """Each group's call class: an index into ``SCAN_CLASSES`` (groups axis kept). A
    group of one new token after a state is a recurrent step (decode), and so is any call
    of chunk 1; every other call, a one-token prompt included, runs the chunked kernels."""
    decode = (op.q_len == 1) & (op.kv_len > op.q_len)
    chunked = (op.g("chunk") > 1) & ~decode
    return 2 * (op.g("channel_gates") > 0) + ~chunked


def chain_bytes(op: Scan) -> np.ndarray:
    """What the chunked chain's kernels pass through memory beyond ``Scan``'s bytes, per
    group (module docstring)."""
    g = op.g
    a, q, n, p = g("act_bytes"), np.maximum(g("chunk"), 1), g("d_k"), g("d_v")
    decays = np.maximum(g("channel_gates"), 1)
    per = 5 * decays * GATE_BYTES + 2 * q * (ACC_BYTES + a) + (2 * (n + p) + 2 * p + 3 * n) * a
    return op.batch * op.q_len * g("heads") * per


def checkpoints(op: Scan) -> np.ndarray:
    """The states a recurrent call over several tokens (a speculative verify) writes
    beyond its last, per group: one per token before the last (the engines' chain verify
    keeps each draft token's state to roll back to: vLLM's ``fused_recurrent_*`` with 2-D
    ``ssm_state_indices`` [sequences, draft tokens], SGLang's intermediate state cache)."""
    g = op.g
    state = g("heads") * g("d_k") * g("d_v") * g("state_bytes")
    return op.batch * np.maximum(op.q_len - 1, 0) * state


def scan_kernel_time(op: Scan, hw: Hardware, timing: np.ndarray | int) -> OpTimes:
    """Every instance of ``op`` timed as the engine's scan kernels (module docstring)."""
    cls = call_class(op)
    par = table(op, hw)[cls]                              # (..., groups, field)
    gf, mf, lat, step_s, launches, cols = np.moveaxis(par, -1, 0)
    live = (op.batch > 0) & (op.q_len > 0)
    chunked = cls % 2 == 0
    flops, counts = op.group_work()
    nbytes = counts.total + np.where(chunked & (launches > 1), chain_bytes(op), 0.0) \
        + np.where(~chunked & (op.q_len > 1), checkpoints(op), 0.0)
    compute = flops / (peak(hw, op.dtype)[..., None] * gf)
    memory = nbytes / (hw.memory_bytes_per_s * mf)
    p = op.g("d_v")
    programs = op.batch * op.g("heads") * np.ceil(p / np.where(cols > 0, cols, p))
    steps = np.where(chunked, np.ceil(op.q_len / np.maximum(op.g("chunk"), 1)), op.q_len)
    serial = np.ceil(programs / hw.compute_units) * steps * step_s
    body = np.where(live, np.maximum(np.maximum(compute, memory), serial), 0.0)
    norm = chunked & (op.g("l2norm_heads") > 0)
    calls = np.where(norm, launches + L2NORM_LAUNCHES, launches) * lat
    fixed = sum(np.max(np.where(live & (cls == c), calls, 0.0), axis=-1)
                for c in range(len(SCAN_CLASSES)))
    lead = np.argmax(np.where(live, body, -1.0), axis=-1)[..., None]
    c_eff = np.take_along_axis(gf, lead, -1)[..., 0]
    m_eff = np.take_along_axis(mf, lead, -1)[..., 0]
    return finish(op, hw, timing, np.sum(np.where(live, compute, 0), axis=-1),
                  np.sum(np.where(live, memory, 0), axis=-1), body.sum(axis=-1), fixed,
                  c_eff, m_eff)
