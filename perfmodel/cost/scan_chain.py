"""The chunked scan where no fused kernel runs it (``efficiency.scan_kernel: unfused``): the
chain of torch operators of the pure-torch references, each priced by its own roofline rule.

On a GPU a recurrent layer's scan is one fused kernel per step of the algorithm (Mamba's
Triton ``ssd`` kernels, FLA's ``chunk_gated_delta_rule``): ``scan.Scan`` prices that. On a
CPU the same algorithm runs as separate eager operators: HF transformers' Mamba-2
``torch_forward`` and Qwen3-Next ``torch_chunk_gated_delta_rule`` /
``torch_recurrent_gated_delta_rule``, FLA's ``naive_chunk_gated_delta_rule``, and this
repository's references (``validate/recurrent.py``), which write the same algorithm with
einsums (as mamba_ssm's ``ssd_minimal_discrete``, the SSD paper's listing 1) and one
batched triangular solve. Every intermediate is written to memory, the Q x Q decay masks
included, and every operator is dispatched from the host. The chains below are those
references' operators in order, per call on a group of b sequences (one call per group of
same-length sequences; a group with no sequences makes none).

Sizes, in fp32 elements (the references compute in fp32: HF's ``.float()``, FLA's
``.to(torch.float32)``; the upcast of 16-bit inputs, one pass per input, is not priced).
T new tokens in chunks of Q: c = ceil(T / Q) chunks, L = c Q tokens (the references pad T
to a multiple of Q: one copy per input where T mod Q > 0); H heads, G B/C groups, N = d_k,
P = d_v:
  D = b H L      decays          M = b H L Q    the Q x Q masks and scores of all chunks
  X = b L H P    values, output  K = b L H N    B, C, q or k per head  (Kg = b L G N)
  S = b H N P    the state       s = b H Q      one chunk's decays     (sP = s P, sN = s N)
A pass writes ``out`` elements and reads ``in`` (one FLOP per element written for
arithmetic, none for a copy). A matmul [m, k] x [k, n] over ``groups`` runs by the GEMM
rule (``tiling.gemm_plan``; ``ops.Gemm`` counts its bytes). Views (reshape, permute,
select, unsqueeze called from Python) move nothing.

Mamba-2 SSD, chunked (``ssd_chunked``: the four steps of arXiv 2405.21060 section 7):
  cumsum of the log decays, twice (once in segsum)      2 x pass out D, in D
  C B^T per group                                       matmul Q x Q x N, groups b c G
    its operands laid [group, token] when G > 1         2 x copy Kg
  segsum: cum_i - cum_j                                  pass out M, in 2 D
  the causal masks: ones, tril, logical not             3 x pass out Q^2 (bool)
  masked_fill (out of place: a clone, then the fill)    copy M; pass out M, in M
  exp of the segment sums                               pass out M, in M
  repeat_interleave of the scores, G -> H               pass out M, in M G / H
  scores x decays                                       pass out M, in 2 M
  the values laid [head, token] for the einsum          copy X
  (scores x decays) X                                   matmul Q x P x Q, groups b c H
  decay to the chunk's end: cum_Q - cum, exp            2 x pass out D, in D (sub 2 D)
  repeat_interleave of B, G -> H                        pass out K, in Kg
  B x decay to the end (3-operand einsum's first pair)  pass out K, in K + D
  that product and X laid for the matmul                copy K; copy X
  chunk states B^T X                                    matmul N x P x Q, groups b c H
  the zero initial state; exp of the chunk decays       pass out S; pass out b H c, in b H c
  per chunk: state x chunk decay; + chunk state         pass out S, in S; pass out S, in 2 S
  stack of the states entering each chunk               copy c S
  repeat_interleave of C, G -> H; exp(cum)              pass out K, in Kg; pass out D, in D
  C laid for the matmul; C x state; x exp(cum)          copy K; matmul Q x P x N, groups
                                                        b c H; pass out X, in X + D
  y_diag + y_off; reshape of the permuted sum           pass out X, in 2 X; copy X
  views: 11, and 4 per chunk
Gated delta rule, chunked (``delta_chunked``, the WY form of arXiv 2412.06464 as FLA's and
HF's references write it, but T = (I + A)^-1 by one triangular solve where they loop over
the Q rows):
  cumsum, twice; segsum's sub, 3 masks, masked_fill, exp   as Mamba-2's
  k x beta                                              pass out K, in K + D
  the strict causal mask (ones, tril) and its not        3 x pass out Q^2 (bool)
  A = (k beta) k^T: both operands laid for the matmul   2 x copy K; matmul Q x Q x N,
                                                        groups b H c
  x decays; masked_fill                                 pass out M, in 2 M; copy M;
                                                        pass out M, in M
  the identity; I + A                                   pass out Q^2; pass out M, in M
  solve_triangular(I + A, I): the identity broadcast    pass out M, in Q^2; Q^3 FLOPs as
  into the output, then the solve                       a matmul Q x Q x Q / 2, groups b H c
  U = T (v beta): v x beta, laid, matmul                pass out X, in X + D; copy X;
                                                        matmul Q x P x Q
  W = T (k beta exp(cum)): exp, x, laid, matmul         pass out D, in D; pass out K,
                                                        in K + D; copy K; matmul Q x N x Q
  q k^T, both laid; x decays                            2 x copy K; matmul Q x Q x N;
                                                        pass out M, in 2 M
  the zero initial state                                pass out S
  per chunk: W S; U - W S                               matmul Q x P x N, groups b H;
                                                        pass out sP, in 2 sP
             q x exp(cum): exp, x; (q exp(cum)) S       pass out s, in s; pass out sN,
                                                        in sN + s; matmul Q x P x N
             (q k^T) U'; + the inter-chunk output       matmul Q x P x Q; pass out sP, in 2 sP
             decay to the end: sub, exp                 pass out s, in 2 s; pass out s, in s
             chunk decay exp; S x it                    pass out b H, in b H; pass out S,
                                                        in S + b H
             k x decay to the end; k^T U'; S + it       pass out sN, in sN + s; matmul
                                                        N x P x Q; pass out S, in 2 S
  stack of the chunks' outputs; reshape of its permute  copy X; copy X
  views: 22, and 16 per chunk
Decode, one token with a state (the recurrent step: ``ssd_step`` / ``delta_step``,
HF's ``torch_recurrent_gated_delta_rule``): a product of a vector with each head's state
is a pass over the state (in S + b H N, out b H P, 2 S FLOPs): it reduces across the
state's rows (axpy form), so BLAS's per-output dot-product cost (``gemv_k_half``) does not
apply.
  Mamba-2: repeat_interleave of B and C; exp of the decay; S x decay (in place); the outer
  product B x^T; S + it (in place); C S                 8 views, 7 kernels
  gated delta rule: exp of the decay; S x decay; k S; v - k S; beta k; the outer product
  (beta k)(v - k S)^T; S + it; q S                      10 views, 8 kernels
Chunk 1 (Mamba-1's selective scan) is the chunked chain with Q = 1.

Each kernel is timed by its own rule: a matmul by the GEMM rule (fp32), a pass by the
stream rule as the calibrated elementwise kernel (the ``add`` kind's streaming fraction,
per-thread rate, fixed cost and threading grain: the same TensorIterator loop), plus the
host launch per ``timing`` (``launch_overhead_s``, a one-element op called from Python on
a CPU), and each view costs the launch alone. The record's FLOPs and bytes stay the
algorithm's (the fused kernel's traffic); only its time follows the chain.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, NamedTuple

import numpy as np

from perfmodel.cost.ops import ByteCounts, Gemm, Num, OpRecord
from perfmodel.cost.scan import Scan
from perfmodel.cost.timebase import OpTimes, bound_code, divide, peak, per_instance
from perfmodel.specs.dtypes import dtype_code
from perfmodel.specs.hardware import Hardware

FP32 = dtype_code("fp32")
PASS_KIND = "add"          # the calibrated elementwise kernel the chain's passes stream as


@dataclass(frozen=True, kw_only=True, eq=False)
class ChainPass(OpRecord):
    """One elementwise kernel or copy of an unfused scan: a loop over ``rows`` elements (its
    threads follow them) reading ``reads`` and writing ``writes`` elements of ``elem_bytes``,
    ``ops`` FLOPs."""

    kind: ClassVar[str] = PASS_KIND
    rows: Num
    reads: Num
    writes: Num
    ops: Num = 0.0
    elem_bytes: Num = 4.0
    n: Num = 1.0

    @property
    def flops(self) -> Num:
        return self.ops

    @property
    def bytes(self) -> ByteCounts:
        return ByteCounts(act_read=self.reads * self.elem_bytes,
                          act_write=self.writes * self.elem_bytes)


class Row(NamedTuple):
    """One kernel of a chain, run ``runs`` times per call: a pass writing ``out`` and
    reading ``into`` elements, its loop over ``loop`` elements (default ``out``), or a
    matmul (``gemm``: m, n, k, groups)."""

    runs: Num
    out: Num = 0.0
    into: Num = 0.0
    flops: Num = 0.0
    gemm: tuple[Num, Num, Num, Num] | None = None
    elem_bytes: float = 4.0
    loop: Num | None = None
    label: str = "pass"        # what it is: pass, exp, copy or matmul (reports group by it)


def _pass(out: Num, into: Num, runs: Num = 1, arith: bool = True) -> Row:
    return Row(runs, out, into, out if arith else 0.0, label="pass" if arith else "copy")


def _exp(n: Num, runs: Num = 1) -> Row:
    return Row(runs, n, n, n, label="exp")


def _copy(n: Num, runs: Num = 1) -> Row:
    return _pass(n, n, runs, arith=False)


def _mask(runs: Num, q: Num) -> Row:
    return Row(runs, q * q, q * q, 0.0, elem_bytes=1.0)


def _mm(m: Num, n: Num, k: Num, groups: Num, runs: Num = 1) -> Row:
    return Row(runs, gemm=(m, n, k, groups), label="matmul")


class Dims(NamedTuple):
    """Per group of one ``Scan`` instance (a trailing groups axis)."""

    b: np.ndarray
    c: np.ndarray
    q: np.ndarray
    h: np.ndarray
    g: np.ndarray
    n: np.ndarray
    p: np.ndarray
    padded: np.ndarray
    live: np.ndarray

    @property
    def tokens(self) -> np.ndarray:
        return self.c * self.q


def dims(op: Scan) -> Dims:
    """The sizes of every group's call; an empty group (no sequences or no new tokens) is
    sized as one sequence of one chunk, so every record stays finite, and is not ``live``."""
    q = np.maximum(op.g("chunk"), 1).astype(float)
    t = op.q_len.astype(float)
    return Dims(np.maximum(op.batch, 1.0), np.maximum(np.ceil(t / q), 1.0), q, op.g("heads"),
                op.g("qk_heads"), op.g("d_k"), op.g("d_v"), (np.mod(t, q) > 0).astype(float),
                (op.batch > 0) & (t > 0))


def _segsum(d: Dims) -> list[Row]:
    """Both chunked chains' decays: two cumsums, cum_i - cum_j, three masks, masked_fill, exp."""
    bhl = d.b * d.h * d.tokens
    m = bhl * d.q
    return [_pass(bhl, bhl, 2), _pass(m, 2 * bhl), _mask(3, d.q), _copy(m), _pass(m, m),
            _exp(m)]


def ssd_chunked(d: Dims) -> tuple[list[Row], np.ndarray]:
    """(kernels, views) of one call of Mamba-2's chunked SSD (module docstring)."""
    b, c, q, h, g, n, p = d.b, d.c, d.q, d.h, d.g, d.n, d.p
    dd, x, s = b * h * d.tokens, b * d.tokens * h * p, b * h * n * p
    m, k, kg = dd * q, b * d.tokens * h * n, b * d.tokens * g * n
    rows = [*_segsum(d),
            _mm(q, q, n, b * c * g), _copy(kg, 2 * (g > 1)),                # C B^T
            _pass(m, m * g / h, arith=False), _pass(m, 2 * m),               # x decays
            _copy(x), _mm(q, p, q, b * c * h),                               # y_diag
            _pass(dd, 2 * dd), _exp(dd),                                     # to the end
            _pass(k, kg, arith=False), _pass(k, k + dd), _copy(k), _copy(x),
            _mm(n, p, q, b * c * h),                                         # states
            _pass(s, 0.0, arith=False), _exp(b * h * c),
            _pass(s, s + b * h, c), _pass(s, 2 * s, c), _copy(c * s),        # passing
            _pass(k, kg, arith=False), _exp(dd),
            _copy(k), _mm(q, p, n, b * c * h), _pass(x, x + dd),             # y_off
            _pass(x, 2 * x), _copy(x),
            _copy(x, d.padded), _copy(dd, d.padded), _copy(kg, 2 * d.padded)]  # padding
    return rows, 11 + 4 * c + d.padded


def delta_chunked(d: Dims) -> tuple[list[Row], np.ndarray]:
    """(kernels, views) of one call of the chunked gated delta rule (module docstring)."""
    b, c, q, h, n, p = d.b, d.c, d.q, d.h, d.n, d.p
    dd, x, s = b * h * d.tokens, b * d.tokens * h * p, b * h * n * p
    m, k, groups = dd * q, b * d.tokens * h * n, b * h * c
    sl, bh = b * h * q, b * h
    rows = [*_segsum(d), _pass(k, k + dd), _mask(3, q),
            _copy(k, 2), _mm(q, q, n, groups), _pass(m, 2 * m), _copy(m), _pass(m, m),  # A
            _mask(1, q), _pass(m, m), _pass(m, q * q, arith=False),
            _mm(q, q, q / 2, groups),                                        # T = (I + A)^-1
            _pass(x, x + dd), _copy(x), _mm(q, p, q, groups),                # U
            _exp(dd), _pass(k, k + dd), _copy(k), _mm(q, n, q, groups),      # W
            _copy(k, 2), _mm(q, q, n, groups), _pass(m, 2 * m),              # q k^T
            _pass(s, 0.0, arith=False),
            # per chunk
            _mm(q, p, n, bh, c), _pass(sl * p, 2 * sl * p, c),               # U - W S
            _exp(sl, c), _pass(sl * n, sl * n + sl, c), _mm(q, p, n, bh, c),
            _mm(q, p, q, bh, c), _pass(sl * p, 2 * sl * p, c),               # output
            _pass(sl, 2 * sl, c), _exp(sl, c), _exp(bh, c), _pass(s, s + bh, c),
            _pass(sl * n, sl * n + sl, c), _mm(n, p, q, bh, c), _pass(s, 2 * s, c),  # state
            _copy(x), _copy(x),
            _copy(k, 2 * d.padded), _copy(x, d.padded), _copy(dd, 2 * d.padded)]  # padding
    return rows, 22 + 16 * c + d.padded


def _product(d: Dims) -> Row:
    """A vector times each head's state (decode): a pass over the state."""
    s = d.b * d.h * d.n * d.p
    return Row(1, d.b * d.h * d.p, s + d.b * d.h * d.n, 2 * s, loop=s, label="matmul")


def ssd_step(d: Dims) -> tuple[list[Row], np.ndarray]:
    """(kernels, views) of one Mamba-2 recurrent step."""
    b, h, s = d.b, d.h, d.b * d.h * d.n * d.p
    bhn = b * h * d.n
    return [_pass(bhn, b * d.g * d.n, 2, arith=False), _exp(b * h),
            _pass(s, s + b * h), _pass(s, bhn + b * h * d.p), _pass(s, 2 * s),
            _product(d)], np.full(np.shape(s), 8.0)


def delta_step(d: Dims) -> tuple[list[Row], np.ndarray]:
    """(kernels, views) of one gated delta rule recurrent step."""
    b, h, s = d.b, d.h, d.b * d.h * d.n * d.p
    bhn, bhp = b * h * d.n, b * h * d.p
    return [_exp(b * h), _pass(s, s + b * h), _product(d), _pass(bhp, 2 * bhp),
            _pass(bhn, bhn + b * h), _pass(s, bhn + bhp), _pass(s, 2 * s),
            _product(d)], np.full(np.shape(s), 10.0)


class Chain(NamedTuple):
    """The kernels of every group's call (records with a trailing groups axis, ``count`` =
    runs per call, 0 where the group makes no such call), what each is (``Row.label``) and
    the views per group."""

    records: list[OpRecord]
    labels: list[str]
    views: np.ndarray


def chain(op: Scan) -> Chain:
    """The operator chain of every group of ``op``: the recurrent step for a group of one
    new token after a state (decode), else the chunked chain; none for an empty group."""
    d = dims(op)
    live = d.live
    step = live & (op.q_len == 1) & (op.kv_len > op.q_len)
    delta = np.asarray(op.g("delta"), dtype=bool)
    parts = [(ssd_chunked(d), live & ~step & ~delta), (delta_chunked(d), live & ~step & delta),
             (ssd_step(d), step & ~delta), (delta_step(d), step & delta)]
    records: list[OpRecord] = []
    views = np.zeros(np.shape(d.b))
    for (rows, v), on in parts:
        views = views + np.where(on, v, 0.0)
        records += [_record(r, on) for r in rows]
    return Chain(records, [r.label for (rows, _), _ in parts for r in rows], views)


def _record(row: Row, on: np.ndarray) -> OpRecord:
    count = np.where(on, row.runs, 0.0)
    if row.gemm is None:
        loop = row.out if row.loop is None else row.loop
        return ChainPass(rows=loop, reads=row.into, writes=row.out, ops=row.flops,
                         elem_bytes=row.elem_bytes, dtype=FP32, count=count)
    m, n, k, groups = row.gemm
    return Gemm(m=m, n=n, k=k, groups=groups, weight_bytes=4.0, act_bytes=4.0,
                weights_are_activations=True, dtype=FP32, count=count)


def totals(ch: Chain) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(FLOPs, bytes, dispatches: kernels and views) of one call of every group, summed
    over the groups."""
    def total(value) -> np.ndarray:
        return sum(np.sum(value(r) * r.count, axis=-1) for r in ch.records)

    return (total(lambda r: r.flops), total(lambda r: r.bytes.total),
            total(lambda r: 1.0) + np.sum(ch.views, axis=-1))


def chain_times(op: Scan, ch: Chain, parts: list[OpTimes], hw: Hardware,
                timing: np.ndarray | int) -> OpTimes:
    """The chain's kernels (``parts``: each record's ``op_time``) and views one after the
    other, summed over the groups: per-instance terms add up, the views add their launch
    (none under timing ``kernel``), the bound is the sum's, the efficiencies the chain's
    FLOPs and bytes over its compute and memory time; x ``op.count``."""
    def total(name: str) -> np.ndarray:
        return sum(np.sum(getattr(t, name) * r.count, axis=-1)
                   for r, t in zip(ch.records, parts, strict=True))

    views = per_instance(hw, timing, 0.0) * np.sum(ch.views, axis=-1)    # launches alone
    compute, memory, fixed = total("compute_s"), total("memory_s"), total("fixed_s")
    overhead = total("overhead_s") + views
    per = sum(np.sum(t.time_s, axis=-1) for t in parts) + views
    flops, nbytes, _ = totals(ch)
    return OpTimes(compute, memory, fixed, overhead, per * op.count,
                   bound_code(compute, memory, overhead),
                   divide(flops, peak(hw, np.full(np.shape(per), FP32)) * compute),
                   divide(nbytes, hw.memory_bytes_per_s * memory))
