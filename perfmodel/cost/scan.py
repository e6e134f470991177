"""Records of the recurrent layers: the chunked scan (Mamba-2's SSD, the gated delta rule,
lightning attention) and the short causal conv1d before it. Like ``ops``, one record type
per byte formula, fields that broadcast, FLOPs and bytes split by source; the scan's state
is what the layer keeps per sequence in place of a KV cache (its bytes are ``kv_read`` /
``kv_write``).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import ClassVar

import numpy as np

from perfmodel.cost.ops import ByteCounts, Grouped, Num, OpRecord

# KDA's intra-chunk scores are built in sub-chunks of 16 tokens (vLLM
# ``vllm/model_executor/layers/fla/ops/kda.py`` ``chunk_kda_scaled_dot_kkt_fwd``:
# BC = min(16, BT)); its activated decay gate is kept at fp32 (``fused_kda_gate``,
# ``fused_kda_gate_chunk_cumsum``: torch.float32 outputs)
KDA_SUB_CHUNK = 16
GATE_BYTES = 4.0


def chunk_flops(q: Num, heads: Num, qk_heads: Num, d_k: Num, d_v: Num,
                delta: Num = False, channel: Num = False) -> Num:
    """FLOPs of one chunk of ``q`` tokens of one sequence (0 for q = 0).

    With H state heads of N = d_k x P = d_v, the q.k (C.B) products over G = ``qk_heads``
    (SSD: Mamba-2, arXiv 2405.21060 section 6, the reference kernels' ``_bmm_chunk_fwd``,
    ``_chunk_state_fwd``, ``_state_passing_fwd``, ``_chunk_scan_fwd``):
      intra-chunk  2 q^2 (N G + P H)   scores C B^T per group, then scores x X per head
                                       (the whole q x q block, as the kernels compute it)
      chunk state  2 q N P H           B^T X into the chunk's state
      output       2 q N P H           C x the state entering the chunk
      passing      2 N P H             decay the running state and add the chunk's
    The gated delta rule (``delta``; Gated DeltaNet, arXiv 2412.06464, the WY form of
    flash-linear-attention's ``chunk_gated_delta_rule``) adds per head: K K^T 2 q^2 N, the
    unit lower-triangular inverse q^3 / 3, W = T K and U = T V 2 q^2 (N + P), and the
    state's correction W S 2 q N P. A decode step is the chunk of q = 1 (the recurrent
    update: O(N P H)); chunk size 1 is Mamba-1's selective scan. KDA (``channel``: a decay
    per key channel) differs by ``kda_flops``."""
    q = np.asarray(q, dtype=float)
    base = 2.0 * q * q * (d_k * qk_heads + d_v * heads) \
        + heads * (4.0 * q * d_k * d_v + 2.0 * d_k * d_v)
    wy = heads * (2.0 * q * q * (2.0 * d_k + d_v) + 2.0 * q * d_k * d_v + q ** 3 / 3.0)
    kda = heads * kda_flops(q, d_k)
    return np.where(q > 0, base + np.where(delta, wy, 0.0) + np.where(channel, kda, 0.0), 0.0)


def kda_flops(q: np.ndarray, d_k: Num) -> np.ndarray:
    """What one head of KDA adds to the gated delta rule's FLOPs over a chunk of ``q``
    tokens (vLLM's ``chunk_kda_with_fused_gate`` and ``fused_recurrent_kda``, from FLA's
    ``fla/ops/kda``). Its per-channel decay exp(g_i - g_j) does not factor out of q k^T and
    k k^T, so the two score blocks are built from sub-chunks of c = min(16, q) tokens: the
    blocks below the diagonal as products of gate-scaled q and k, 2 N per token pair each
    over the (q^2 - q c) / 2 pairs, plus their scalings, 10 c N per block pair; the
    diagonal blocks token by token, 7 N per pair (k exp2(g - g_j): 3; two dot products:
    4) over q c pairs. They replace the whole-block q k^T and k k^T (4 q^2 N). The gate:
    its activation -exp(A_log) softplus(g + dt_bias) / ln 2 (6 N a token) and, in prefill,
    its in-chunk cumsum as a triangular dot (2 q^2 N); w's k beta exp2(g), kg's
    k exp2(g_end - g) and the output's q scale exp2(g) (9 N a token) and the chunk end's
    decay (N). A decode step (q = 1) adds the activation and the decay's exp (7 N)."""
    c = np.minimum(KDA_SUB_CHUNK, q)
    pairs = q * q - q * c
    scores = 2.0 * d_k * pairs + 5.0 * d_k * pairs / np.maximum(c, 1.0) + 7.0 * q * c * d_k
    chunked = scores - 2.0 * q * q * d_k + 15.0 * q * d_k + d_k
    return np.where(q > 1, chunked, 7.0 * q * d_k)


@dataclass(frozen=True, kw_only=True, eq=False)
class Scan(Grouped):
    """The chunked scan of a recurrent layer over groups of sequences (``Grouped``).

    Per group of ``batch`` sequences with T = q_len new tokens, chunks of Q = ``chunk``:
    FLOPs = batch x (floor(T / Q) chunk_flops(Q) + chunk_flops(T mod Q)). Bytes: per token
    it reads X (H P), B and C or q and k (2 G N) and ``gates`` scalars per head (dt,
    decay, beta) and writes Y (H P), at the activation dtype; the state (H N P at
    ``state_bytes``) is written once per sequence and read when the sequence had one before
    the step (kv_len > q_len: every decode step); a chunked kernel (T > 1, Q > 1) writes the
    ceil(T / Q) chunk states and reads them back (SSD's ``states`` tensor).

    ``l2norm_heads`` (Gated DeltaNet's ``use_qk_l2norm_in_kernel``): the q and k rows of
    that many heads of d_k are L2-normalised, 3 FLOPs an element (square, sum, scale). A
    decode step does it inside the recurrent kernel (vLLM ``fla/ops/fused_recurrent.py``:
    ``if USE_QK_L2NORM_IN_KERNEL``, on the q and k it loads anyway): FLOPs only. The chunked
    path (T > 1) runs it as separate passes before the chunk kernels (``fla/ops/chunk.py``
    ``ChunkGatedDeltaRuleFunction.forward``: ``l2norm_fwd(q)``, ``l2norm_fwd(k)``; newer
    vLLM, in its ``fused_gdn_prefill_post_conv`` pass), which read and write them once more
    at the activation dtype.

    ``channel_gates`` (KDA: head_k_dim decay values per head and token): the layer's gate
    kernel reads the raw gate at the activation dtype and writes it activated at fp32
    (``GATE_BYTES``), which the scan reads; their FLOPs are ``kda_flops``'s."""

    kind: ClassVar[str] = "ssm_scan"
    heads: Num
    qk_heads: Num
    d_k: Num
    d_v: Num
    chunk: Num
    delta: Num = False
    gates: Num = 1
    l2norm_heads: Num = 0
    channel_gates: Num = 0
    act_bytes: Num = 2.0
    state_bytes: Num = 4.0

    def group_work(self) -> tuple[np.ndarray, ByteCounts]:
        """(FLOPs, bytes) of each group (the groups axis kept)."""
        return self._per_group

    @cached_property
    def _per_group(self) -> tuple[np.ndarray, ByteCounts]:
        g = self.g
        h, n, p, q = g("heads"), g("d_k"), g("d_v"), np.maximum(g("chunk"), 1)
        t = self.q_len.astype(float)
        dims = (h, g("qk_heads"), n, p, g("delta"), g("channel_gates") > 0)
        normed = self.batch * t * 2 * g("l2norm_heads") * n     # q and k elements
        flops = self.batch * (np.floor(t / q) * chunk_flops(q, *dims)
                              + chunk_flops(np.mod(t, q), *dims)) + 3.0 * normed
        chunked = (t > 1) & (q > 1)
        state = self.batch * h * n * p * g("state_bytes")
        inter = np.where(chunked, np.ceil(t / q) * state + normed * g("act_bytes"), 0.0)
        tokens = self.batch * t * g("act_bytes")
        gate = self.batch * t * h * g("channel_gates") * GATE_BYTES     # the fp32 gate
        return flops, ByteCounts(
            act_read=tokens * (h * p + 2 * g("qk_heads") * n + g("gates") * h
                               + h * g("channel_gates")) + gate + inter,
            act_write=tokens * h * p + gate + inter,
            kv_read=np.where(self.kv_len > self.q_len, state, 0.0), kv_write=state)


@dataclass(frozen=True, kw_only=True, eq=False)
class LinearScan(Scan):
    """The chunked scan of a linear-attention layer (Gated DeltaNet, lightning attention):
    ``Scan``'s formulas, its own kind."""

    kind: ClassVar[str] = "linear_attention"


@dataclass(frozen=True, kw_only=True, eq=False)
class Conv1d(OpRecord):
    """Causal depthwise conv1d of width K over ``rows`` tokens of ``n`` channels (the
    ``causal_conv1d`` kernel, SiLU fused): 2 K FLOPs per output element; reads the n x K
    weights, the input and writes the output at the activation dtype; reads and writes the
    (K - 1) x n conv state of each of the ``seqs`` sequences at ``state_bytes`` (a fresh
    prefill reads none; counted anyway, it is K - 1 tokens' worth)."""

    kind: ClassVar[str] = "conv1d"
    rows: Num
    seqs: Num
    n: Num
    width: Num
    act_bytes: Num = 2.0
    state_bytes: Num = 2.0

    @property
    def flops(self) -> Num:
        return 2.0 * self.width * self.rows * self.n

    @property
    def bytes(self) -> ByteCounts:
        state = self.seqs * (self.width - 1) * self.n * self.state_bytes
        return ByteCounts(weights=self.n * self.width * self.act_bytes,
                          act_read=self.rows * self.n * self.act_bytes,
                          act_write=self.rows * self.n * self.act_bytes,
                          kv_read=state, kv_write=state)
