"""Speculative decoding: a round of K drafted tokens verified by one target step.

A round, for each of N configurations (``batch`` sequences at ``context`` S positions):
- draft: K draft steps, step i (1..K) one new token per sequence at context S + i, on the
  draft's own model, device, plan and dtypes ("model"); or K passes of the target's MTP
  module ("mtp", DeepSeek-V3: one decoder layer of the target's shape + its eh_proj
  [2d -> d] and two input RMSNorms, sharing the embedding and LM head); or one pass of K
  Medusa-style heads on the target's last hidden state ("heads": K residual blocks d x d and
  K LM heads, own or shared); or K passes of an EAGLE head ("eagle": one decoder layer of the
  target's shape fed by fc [2d -> d] over the token embedding and the target's last hidden
  state, sharing the target's LM head, as EAGLE-1/2 checkpoints ship; "eagle3": fc [3d -> d]
  over three of the target's layers' hidden states and a draft vocabulary of
  ``EAGLE3_DRAFT_VOCAB`` tokens, the EAGLE-3 checkpoints' ``draft_vocab_size``);
- verify: one target step of T = K + 1 new tokens per sequence (``tree_tokens`` for a tree
  of candidates) at context S + T, with logits for all T positions (``Step.logits_all``).
Tokens emitted per sequence per round (``expected_tokens``), with a_i the probability that
draft token i is accepted given the ones before it were:
    E = 1 + a1 + a1 a2 + ... + a1...aK   (one rate a: (1 - a^(K+1)) / (1 - a); a = 1: K + 1)
Speculative tokens/s = batch x E / (draft + verify); plain tokens/s = batch / (the target's
decode step at context S + 1); speedup = the ratio. A generation of G tokens after a prompt
P is priced at its mean context S = P + G // 2 (``mean_context``), not summed step by step.
Every step is priced by ``price_step``; the extra MTP and head matmuls are ``Gemm`` records
timed by ``roofline.op_time``, so no operator's cost is re-derived here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from perfmodel.cost.ops import ByteCounts, Gemm, OpRecord, pointwise
from perfmodel.cost.roofline import op_time
from perfmodel.cost.step import Dtypes, Step, StepCost, price_step
from perfmodel.cost.timebase import BOUNDS
from perfmodel.schedules.static import phase_timing
from perfmodel.specs.dtypes import BYTES, compute_codes
from perfmodel.specs.errors import SpecError
from perfmodel.specs.hardware import Hardware
from perfmodel.specs.model import Model
from perfmodel.specs.workload import Parallelism

DRAFTS = ("model", "mtp", "heads", "eagle", "eagle3")
HEAD_DRAFTS = ("mtp", "eagle", "eagle3")     # a one-layer module of the target's shape
EAGLE3_DRAFT_VOCAB = 32000  # config.json draft_vocab_size of yuhuili/EAGLE3-LLaMA3.1-Instruct-8B
Acceptance = float | Sequence[float] | np.ndarray
# (seconds by bound (BOUNDS, N): the time of each bound's operators; FLOPs (N,); bytes (N,))
Cost = tuple[np.ndarray, np.ndarray, ByteCounts]


def _check_k(k: object, name: str = "k") -> int:
    if isinstance(k, (bool, np.bool_)) or not isinstance(k, (int, np.integer)) or k < 1:
        raise SpecError(f"speculative: {name} must be an integer >= 1, got {k!r}")
    return int(k)


def acceptance_rates(acceptance: Acceptance, k: int) -> np.ndarray:
    """Per-position acceptance rates of shape (..., K): a number or an array of one rate
    per configuration (the same at every position), a list or tuple of K per-position
    rates, or an (N, K) array of them."""
    per_position = isinstance(acceptance, (list, tuple)) or np.ndim(acceptance) == 2
    try:
        a = np.asarray(acceptance, dtype=float)
    except (TypeError, ValueError):
        raise SpecError(f"speculative: acceptance must be numbers, got {acceptance!r}") from None
    if not np.all((a >= 0) & (a <= 1)):      # NaN fails too
        raise SpecError(f"speculative: acceptance must be in [0, 1], got {acceptance!r}")
    if not per_position:
        return np.repeat(a[..., None], k, axis=-1)
    if a.ndim not in (1, 2) or a.shape[-1] != k:
        raise SpecError(f"speculative: acceptance has {a.shape[-1] if a.ndim else 0} "
                        f"per-position rates, expected k = {k}")
    return a


def expected_tokens(acceptance: Acceptance, k: int) -> float | np.ndarray:
    """Expected tokens emitted per sequence per round: 1 + a1 + a1 a2 + ... + a1...aK (the
    accepted prefix plus the target's own token; the module docstring). ``acceptance``: see
    ``acceptance_rates``. A float for one configuration, else an array (N,)."""
    out = 1.0 + np.cumprod(acceptance_rates(acceptance, _check_k(k)), axis=-1).sum(axis=-1)
    return float(out) if np.ndim(out) == 0 else out


@dataclass(frozen=True, eq=False)
class Speculation:
    """How a round drafts and verifies. ``k``: drafted tokens per round; ``acceptance``
    (``expected_tokens``); ``draft``: "model" (``draft_model`` on ``draft_hw``, default the
    target's device, ``draft_plan`` default the target's plan, ``draft_dtypes`` default the
    target's), "mtp" (the target's MTP module, once per drafted token; past the model's
    depth the modules are reused, as they have one shape), "eagle" / "eagle3" (an EAGLE
    head, ``eagle_head``, once per drafted token) or "heads" (one pass of K heads;
    ``shared_lm_head``: the heads share the target's LM head instead of owning one each as
    Medusa-1 does). ``tree_tokens``: tokens verified per sequence (a candidate tree, >= K+1;
    None: K+1); the draft is still priced as K chain steps."""

    k: int
    acceptance: Acceptance
    draft: str = "model"
    draft_model: Model | None = None
    draft_hw: Hardware | None = None
    draft_plan: Parallelism | None = None
    draft_dtypes: Dtypes | None = None
    tree_tokens: int | None = None
    shared_lm_head: bool = False

    def __post_init__(self) -> None:
        _check_k(self.k)
        expected_tokens(self.acceptance, self.k)
        if self.draft not in DRAFTS:
            raise SpecError(f"speculative: draft must be one of {', '.join(DRAFTS)}, "
                            f"got {self.draft!r}")
        if self.draft == "model" and not isinstance(self.draft_model, Model):
            raise SpecError("speculative: draft 'model' needs draft_model, a Model record "
                            "like pm.model('llama-3-8b')")
        tree = self.tree_tokens
        if tree is not None and (isinstance(tree, bool) or not isinstance(
                tree, (int, np.integer)) or tree < self.k + 1):
            raise SpecError(f"speculative: tree_tokens must be an integer >= k + 1 = "
                            f"{self.k + 1}, got {tree!r}")

    @property
    def verified(self) -> int:
        """Tokens per sequence in the verify step."""
        return int(self.tree_tokens or self.k + 1)


@dataclass(frozen=True, eq=False)
class RoundCost:
    """One round of N configurations: arrays (N,) in seconds; ``verify`` and ``decode``
    are the target's verify step and plain decode step, every operator."""

    batch: np.ndarray
    context: np.ndarray             # S: positions in the cache before the round
    tokens_per_round: np.ndarray    # expected tokens emitted per sequence
    draft_s: np.ndarray             # the K draft steps (heads: their one pass)
    verify_s: np.ndarray
    decode_step_s: np.ndarray       # the target's plain decode step at context S + 1
    verify: StepCost
    decode: StepCost
    draft_flops: np.ndarray         # the drafting's FLOPs and bytes, (N,)
    draft_bytes: ByteCounts
    draft_bound: np.ndarray         # (N,) bound code (``BOUNDS``) of most of the drafting

    @property
    def round_s(self) -> np.ndarray:
        return self.draft_s + self.verify_s

    @property
    def tokens_per_s(self) -> np.ndarray:
        """Speculative tokens/s: batch x E / round time."""
        return self.batch * self.tokens_per_round / self.round_s

    @property
    def plain_tokens_per_s(self) -> np.ndarray:
        """Plain decode tokens/s at the same context: batch / decode step."""
        return self.batch / self.decode_step_s

    @property
    def speedup(self) -> np.ndarray:
        return self.tokens_per_s / self.plain_tokens_per_s


def mean_context(prompt_len: object, gen_len: object) -> np.ndarray:
    """The context a generation of ``gen_len`` tokens after ``prompt_len`` is priced at:
    P + G // 2 (the middle of the decode span)."""
    return np.asarray(prompt_len) + np.asarray(gen_len) // 2


def _dtype_rows(dtypes: Dtypes, n: int, what: str) -> Dtypes:
    """``dtypes`` with one row per configuration (one row is repeated)."""
    rows = len(np.atleast_1d(dtypes.weights))
    if rows not in (1, n):
        raise SpecError(f"speculative: {what} has {rows} rows, expected 1 or {n}")
    return dtypes.take(np.zeros(n, dtype=int) if rows == 1 else np.arange(n))


def _gemm(rows: np.ndarray, n: int, k: int, d: Dtypes, groups: float = 1.0,
          act: bool | np.ndarray = False) -> Gemm:
    """A [rows, k] x [k, n] matmul (x ``groups`` weights) at the dtypes a template GEMM gets
    (``layers.GemmSpec``): "act" weights where ``act`` (per row or for all), else
    "matmul"."""
    return Gemm(m=rows, n=n, k=k, groups=groups, act_bytes=BYTES[d.acts],
                weight_bytes=np.where(act, BYTES[d.acts], d.weight_bytes),
                dtype=np.where(act, d.acts, compute_codes(d.weights, d.acts)))


def _records_cost(records: list[OpRecord], hw: Hardware, timing: np.ndarray) -> Cost:
    """``Cost`` of a list of extra records (N instances each): seconds by
    ``roofline.op_time``, FLOPs and bytes the records' own x their count."""
    times = [op_time(r, hw, timing) for r in records]
    by_bound = sum(_by_bound(t.time_s[None], t.bound[None]) for t in times)
    flops = sum(r.flops * r.count for r in records)
    nbytes = [r.bytes.scaled(r.count) for r in records]
    return by_bound, flops, sum(nbytes[1:], nbytes[0])


def _by_bound(time_s: np.ndarray, bound: np.ndarray) -> np.ndarray:
    """(BOUNDS, N) seconds of the (operators, N) ``time_s`` whose ``bound`` is each one."""
    return np.stack([np.where(bound == b, time_s, 0.0).sum(axis=0) for b in range(len(BOUNDS))])


def mtp_module(model: Model) -> Model:
    """One MTP module of ``model`` as a one-layer model of its shape (an MoE layer when the
    model has experts), with the shared embedding, final norm and LM head. Cached."""
    if model.mtp_modules < 1:
        raise SpecError(f"speculative: draft 'mtp' needs a model with MTP modules; "
                        f"{model.name} has none (mtp: n_modules)")
    if "mtp_module" not in model.memo:
        moe = replace(model.moe, first_dense_layers=0, layer_step=1) \
            if model.moe is not None else None
        model.memo["mtp_module"] = replace(model, name=f"{model.name}-mtp", n_layers=1,
                                           moe=moe, mtp_modules=0)
    return model.memo["mtp_module"]


def eagle_head(model: Model, kind: str = "eagle") -> Model:
    """The decoder layer of an EAGLE head on ``model`` as a one-layer dense model of its
    shape (EAGLE's layer is a Llama decoder layer with the target's widths; on an MoE target
    a dense one of ``d_ff``), with the target's LM head ("eagle") or one of
    ``EAGLE3_DRAFT_VOCAB`` tokens ("eagle3"). Cached."""
    key = f"{kind}_head"
    if key not in model.memo:
        vocab = EAGLE3_DRAFT_VOCAB if kind == "eagle3" else model.vocab_size
        model.memo[key] = replace(model, name=f"{model.name}-{kind}", n_layers=1, moe=None,
                                  mtp_modules=0, vocab_size=min(vocab, model.vocab_size))
    return model.memo[key]


def head_layer(model: Model, kind: str) -> Model:
    """The one-layer module a "mtp", "eagle" or "eagle3" draft runs once per drafted
    token."""
    return mtp_module(model) if kind == "mtp" else eagle_head(model, kind)


def _chain_steps(model: Model, hw: Hardware, plan: Parallelism, batch: np.ndarray,
                 context: np.ndarray, k: int, dtypes: Dtypes, timing: np.ndarray,
                 skew: np.ndarray) -> Cost:
    """``Cost`` of K one-token steps of ``model``, step i at context S + i, priced in one
    call of K x N rows."""
    n = len(batch)
    ctx = (context[None, :] + np.arange(1, k + 1)[:, None]).ravel()
    rows = np.tile(np.arange(n), k)
    step = Step.uniform(np.tile(batch, k), np.ones(k * n, dtype=np.int64), ctx,
                        expert_skew=skew[rows])
    cost = price_step(model, hw, plan, step, dtypes.take(rows), timing[rows])

    def summed(x: np.ndarray) -> np.ndarray:
        return x.reshape(*x.shape[:-1], k, n).sum(axis=-2)

    return (summed(_by_bound(cost.time_s, cost.bound)), summed(cost.total_flops),
            ByteCounts(*(summed(b) for b in cost.total_bytes.astuple())))


def head_extras(target: Model, batch: np.ndarray, d: Dtypes, kind: str = "mtp"
                ) -> list[OpRecord]:
    """What an MTP module or EAGLE head adds to its decoder layer, per drafted token of
    ``batch`` rows: two input RMSNorms (MTP's enorm and hnorm; EAGLE's input and hidden
    norms), then the fc [rows, 2d] x [2d, d] (MTP's eh_proj, EAGLE's fc; EAGLE-3's fc takes
    three layers' hidden states, [3d, d]), replicated under TP."""
    dm = target.d_model
    norms = pointwise("rms_norm", batch, dm, act_bytes=BYTES[d.acts], dtype=d.acts, count=2.0)
    return [norms, _gemm(batch, dm, (3 if kind == "eagle3" else 2) * dm, d)]


def records_seconds(records: list[OpRecord], hw: Hardware, timing: np.ndarray) -> np.ndarray:
    """Seconds (N,) of extra records (``head_extras``), by ``roofline.op_time``."""
    return _records_cost(records, hw, timing)[0].sum(axis=0)


def _head_records(target: Model, plan: Parallelism, spec: Speculation, batch: np.ndarray,
                  d: Dtypes) -> list[OpRecord]:
    """K heads in one pass: K residual blocks [B, d] x [d, d] (replicated), then K LM heads
    [B, d] x [d, vocab / tp] (one shared head: one GEMM of K x B rows, the target's head,
    quantized where the target's is, ``Dtypes.quantized_head``; heads of their own at the
    activation dtype, as ``draft_memory`` stores them)."""
    dm, k, vocab = target.d_model, spec.k, target.vocab_size // plan.tp
    blocks = _gemm(batch, dm, dm, d, groups=float(k))
    if spec.shared_lm_head:
        return [blocks, _gemm(batch * k, vocab, dm, d, act=~d.quantized_head(target))]
    return [blocks, _gemm(batch, vocab, dm, d, groups=float(k), act=True)]


def _draft_cost(target: Model, hw: Hardware, plan: Parallelism, spec: Speculation,
                batch: np.ndarray, context: np.ndarray, dtypes: Dtypes,
                cuda_graphs: bool | np.ndarray, skew: np.ndarray) -> Cost:
    """``Cost`` of a round's drafting."""
    n, k = len(batch), spec.k
    if spec.draft == "model":
        dhw = spec.draft_hw or hw
        dd = _dtype_rows(spec.draft_dtypes, n, "draft_dtypes") if spec.draft_dtypes \
            else dtypes
        timing = _timing(dhw, cuda_graphs, n)
        return _chain_steps(spec.draft_model, dhw, spec.draft_plan or plan, batch, context,
                            k, dd, timing, skew)
    timing = _timing(hw, cuda_graphs, n)
    if spec.draft in HEAD_DRAFTS:
        layer = _chain_steps(head_layer(target, spec.draft), hw, plan, batch, context, k,
                             dtypes, timing, skew)
        extra = _records_cost(head_extras(target, batch, dtypes, spec.draft), hw, timing)
        return (layer[0] + k * extra[0], layer[1] + k * extra[1],
                layer[2] + extra[2].scaled(k))
    return _records_cost(_head_records(target, plan, spec, batch, dtypes), hw, timing)


def _timing(hw: Hardware, cuda_graphs: bool | np.ndarray, n: int) -> np.ndarray:
    """Every step of a round is timed as a decode step (``static.phase_timing``)."""
    return np.broadcast_to(phase_timing(hw, "decode", cuda_graphs), (n,))


def _configurations(batch: object, context: object, spec: Speculation
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(batch, context, expected tokens), each (N,): the three broadcast together."""
    tokens = np.atleast_1d(expected_tokens(spec.acceptance, spec.k))
    try:
        b, c, e = np.broadcast_arrays(np.atleast_1d(batch), np.atleast_1d(context), tokens)
    except ValueError:
        raise SpecError(f"speculative: batch, context and acceptance have "
                        f"{np.size(batch)}, {np.size(context)} and {len(tokens)} rows; "
                        f"they must broadcast together") from None
    if b.dtype.kind not in "iu" or c.dtype.kind not in "iu":
        raise SpecError("speculative: batch and context must be integers")
    return b.astype(np.int64), c.astype(np.int64), e.copy()


def round_cost(target: Model, hw: Hardware, plan: Parallelism, spec: Speculation,
               batch: object, context: object, dtypes: Dtypes | None = None,
               cuda_graphs: bool | np.ndarray = False,
               expert_skew: float | np.ndarray = 0.0) -> RoundCost:
    """The round of every configuration: ``batch``, ``context`` (S, positions before the
    round) and ``spec.acceptance`` broadcast to N rows; ``dtypes`` one row or N (default
    bf16); every step timed as a decode step (``cuda_graphs``: replayed as graphs, one flag
    or one per row); ``expert_skew``: MoE routing skew (``Step``), one or one per row. See
    the module docstring for the steps; the plain decode step is the target's at S + 1."""
    plan.require_modelled()
    batch, context, tokens = _configurations(batch, context, spec)
    n, t = len(batch), spec.verified
    dtypes = _dtype_rows(dtypes or Dtypes.of(), n, "dtypes")
    timing = _timing(hw, cuda_graphs, n)
    skew = np.broadcast_to(np.asarray(expert_skew, dtype=float), (n,))
    verify = price_step(target, hw, plan, Step.uniform(
        batch, t, context + t, logits_all=True, expert_skew=skew), dtypes, timing)
    decode = price_step(target, hw, plan, Step.uniform(batch, 1, context + 1, expert_skew=skew),
                        dtypes, timing)
    by_bound, flops, nbytes = _draft_cost(target, hw, plan, spec, batch, context, dtypes,
                                          cuda_graphs, skew)
    return RoundCost(batch, context, tokens, by_bound.sum(axis=0), verify.time, decode.time,
                     verify, decode, flops, nbytes, by_bound.argmax(axis=0))


def break_even_batch(target: Model, hw: Hardware, plan: Parallelism, spec: Speculation,
                     context: int, dtypes: Dtypes | None = None, cuda_graphs: bool = False,
                     max_batch: int = 4096, expert_skew: float = 0.0) -> int | None:
    """The smallest batch in [1, max_batch] at which speculation stops paying (speedup below
    1 where a smaller batch had it at 1 or more: the verify step's K+1 tokens per sequence
    turn it compute-bound sooner than plain decode does); 1 if it pays at no batch; None if
    it still pays at ``max_batch``. An MoE target may start below 1 at batch 1 (verifying
    K+1 tokens touches more experts) and cross 1 upwards first: that crossing is skipped.
    Searched on the powers of two (and ``max_batch``), then by bisection between the last
    grid batch that pays and the next (assumes one crossing between them). One
    configuration: a single acceptance (a rate or a per-position list), one ``context``."""
    if np.ndim(spec.acceptance) == 2 or (np.ndim(spec.acceptance) == 1
                                         and not isinstance(spec.acceptance, (list, tuple))):
        raise SpecError("speculative: break_even_batch takes one acceptance (a rate or a "
                        "per-position list), not one per configuration")
    max_batch = _check_k(max_batch, "max_batch")

    def pays(batch: np.ndarray) -> np.ndarray:
        return round_cost(target, hw, plan, spec, batch, context, dtypes, cuda_graphs,
                          expert_skew).speedup >= 1

    grid = np.unique(np.r_[2 ** np.arange(int(np.log2(max_batch)) + 1), max_batch])
    ok = pays(grid)
    if not ok.any():
        return 1
    stops = np.flatnonzero(ok[:-1] & ~ok[1:])
    if not len(stops):
        return None
    lo, hi = int(grid[stops[0]]), int(grid[stops[0] + 1])
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if pays(np.array([mid]))[0] else (lo, mid)
    return hi


__all__ = ["DRAFTS", "HEAD_DRAFTS", "RoundCost", "Speculation", "acceptance_rates",
           "break_even_batch", "eagle_head", "expected_tokens", "head_extras", "head_layer",
           "mean_context", "mtp_module", "records_seconds", "round_cost"]
