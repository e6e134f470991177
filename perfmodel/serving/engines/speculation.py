"""Speculative decoding in the serving simulator: what a verify step schedules, reserves,
accepts and costs, as hooks the engines' schedulers (``engines.vllm``, ``engines.sglang``,
``engines.trtllm``), the shared ``commit`` (``engines.state``) and the pricer
(``serving.pricing.StepPricer``) call when ``engine.speculative`` is set; with it unset no
hook runs and every number is as before.

The engines' rules, from their source:

- A decoding request asks for 1 + k tokens (its last token and the k drafted after it),
  counted in the step's token budget: vLLM v1 ``Scheduler.schedule``
  (``vllm/v1/core/sched/scheduler.py``: ``num_new_tokens = num_tokens_with_spec -
  num_computed_tokens``, capped by ``token_budget``, so a budget running short trims the
  drafts); TensorRT-LLM's micro-batch scheduler counts a generation request's draft tokens
  toward ``max_num_tokens`` (``tensorrt_llm/_torch/pyexecutor/scheduler.py``,
  ``BindMicroBatchScheduler``; "draft tokens take up extra KV cache pages and count towards
  the executor's max_num_tokens limit", TensorRT-LLM's speculative-decoding docs); SGLang's
  decode batch verifies ``speculative_num_draft_tokens`` per request
  (``sglang/srt/speculative/eagle_worker.py``, ``EAGLEWorker.verify``).
- KV room: the step's KV blocks cover its context plus ``lookahead`` slots, the draft
  positions the drafter writes after it: vLLM passes ``num_lookahead_tokens`` =
  ``num_speculative_tokens`` to ``KVCacheManager.allocate_slots`` for EAGLE and draft
  models and 0 for n-gram / suffix (``Scheduler.__init__``); a fresh prompt reserves none.
  The drafter's own layers (an EAGLE head or MTP module: one layer; a draft model: its
  layers) keep their KV in the same pool, so each block costs their bytes too, and their
  weights come off the memory first (``pool_terms``; vLLM's KV-cache spec has the draft's
  attention layers beside the target's).
- Accepted: the longest prefix of the drafts the target agrees with, then one token of the
  target's own; rejected positions' KV is dropped (vLLM lowers ``num_computed_tokens`` by
  the rejected count in ``update_from_output``), the blocks stay held.
- The draft runs on the same GPU in the same step, after the target's forward: a first pass
  over the step's tokens (the verified ones and any prompt chunk: the drafter's KV must
  follow the target's), then k - 1 passes of one token (SGLang's ``--speculative-eagle-topk``
  tokens) per drafting request (vLLM ``EagleProposer.propose``,
  ``vllm/v1/spec_decode/eagle.py``). N-gram lookup runs on the host (``NgramProposer``,
  numba on CPU): no GPU time.

Acceptance per step is deterministic: ``expected`` mode (the default) gives a request whose
decode has emitted e tokens ``floor((j + 1) E) - e`` tokens at its next verify, j the verify
steps so far, E the expected tokens per verify (``schedules.speculative.expected_tokens``):
every request emits E per step on average exactly as the estimate does, with no sampling
noise between runs or engines. ``sampled`` mode draws every position from a seeded table
keyed by (request, tokens emitted), so a request's acceptances do not depend on which steps
it shared or on the simulator's look-ahead forks.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from perfmodel.cost.step import Dtypes, Step, price_step
from perfmodel.schedules.speculative import (
    Speculation,
    expected_tokens,
    head_extras,
    head_layer,
    records_seconds,
)
from perfmodel.specs.errors import SpecError
from perfmodel.specs.model import Model
from perfmodel.specs.workload import Parallelism

METHODS = ("eagle", "eagle3", "mtp", "draft_model", "ngram")
MODES = ("expected", "sampled")
_KIND = {"eagle": "eagle", "eagle3": "eagle3", "mtp": "mtp", "draft_model": "model"}


@dataclass(frozen=True, eq=False)
class SpecDecode:
    """Speculative decoding as an engine runs it. ``method``: ``METHODS``; ``k``: tokens
    drafted per request per step (vLLM ``num_speculative_tokens``, SGLang
    ``--speculative-num-steps``, TensorRT-LLM ``max_draft_len``); ``rates``: acceptance per
    drafted position, each given the ones before it were accepted; ``verify``: tokens
    verified per request (k + 1; SGLang's ``--speculative-num-draft-tokens`` for a tree);
    ``topk``: tokens per request in each draft pass after the first (SGLang's
    ``--speculative-eagle-topk``); ``draft``: the draft model (``draft_model``), None
    otherwise; ``checkpoint``: the drafter as the engine names it; ``lookahead``: KV slots
    reserved past a step's context; ``mode`` / ``seed``: how acceptance is drawn (module
    docstring); ``source``: where the rates came from."""

    method: str
    k: int
    rates: tuple[float, ...]
    verify: int
    topk: int = 1
    draft: Model | None = None
    checkpoint: str = ""
    lookahead: int = 0
    mode: str = "expected"
    seed: int = 0
    source: str = "given"

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise SpecError(f"speculative method: expected one of {', '.join(METHODS)}, "
                            f"got {self.method!r}")
        if self.mode not in MODES:
            raise SpecError(f"--acceptance-mode: expected one of "
                            f"{', '.join(MODES)}, got {self.mode!r}")
        if len(self.rates) != self.k or not all(0 <= a <= 1 for a in self.rates):
            raise SpecError(f"--acceptance: expected {self.k} rates in [0, 1] (one per "
                            f"drafted token), got {list(self.rates)}")
        if self.verify < self.k + 1:
            raise SpecError(f"speculative: {self.verify} tokens verified cannot hold "
                            f"{self.k} drafted plus the target's own; expected >= {self.k + 1}")
        if self.method == "draft_model" and self.draft is None:
            raise SpecError("--speculative-config: method draft_model needs its model")

    @cached_property
    def tokens_per_verify(self) -> float:
        """Expected tokens a request emits per verify step, E = 1 + a1 + a1 a2 + ..."""
        return float(expected_tokens(list(self.rates), self.k))

    def speculation(self) -> Speculation | None:
        """The estimate's record of the same drafting (None for n-gram lookup, which the
        estimate does not price)."""
        if self.method not in _KIND:
            return None
        return Speculation(self.k, list(self.rates), _KIND[self.method],
                           draft_model=self.draft,
                           tree_tokens=self.verify if self.verify > self.k + 1 else None)

    def describe(self) -> str:
        return (f"{self.method} k={self.k} (verify {self.verify}), acceptance "
                f"{', '.join(f'{a:g}' for a in self.rates)} ({self.source}), "
                f"{self.mode} acceptance, E = {self.tokens_per_verify:.3f} tokens/verify")


@dataclass(eq=False)
class Counters:
    """Per-request verify counts the state keeps (forked with it): steps that verified
    drafts, drafted tokens verified, and those accepted."""

    steps: np.ndarray
    drafted: np.ndarray
    accepted: np.ndarray
    table: np.ndarray | None        # sampled mode: accepted drafts by (request, emitted)
    offsets: np.ndarray | None

    FIELDS = ("spec_steps", "spec_drafted", "spec_accepted")


def attach(state: object, spec: SpecDecode) -> None:
    """Give an engine's state (``engines.state.EngineState``) the arrays the hooks write;
    they join the state's ``MUTABLE`` so look-ahead forks save and restore them."""
    n = len(state.prompt)
    state.spec_steps, state.spec_drafted, state.spec_accepted = (
        np.zeros(n, np.int64) for _ in range(3))
    state.MUTABLE = (*type(state).MUTABLE, *Counters.FIELDS)
    state.spec_table = state.spec_offsets = None
    if spec.mode == "sampled":
        offsets = np.concatenate([[0], np.cumsum(state.output)])
        u = np.random.default_rng(spec.seed).random((int(offsets[-1]), spec.k))
        ok = u < np.asarray(spec.rates)
        state.spec_table = np.where(ok.all(axis=1), spec.k, ok.argmin(axis=1)).astype(np.int64)
        state.spec_offsets = offsets


def decoding(state: object, r: np.ndarray) -> np.ndarray:
    """Requests of ``r`` whose next step is a decode: they have emitted and computed all
    but their last token (after a preemption's reset they recompute instead)."""
    return (state.emitted[r] > 0) & (state.computed[r] >= state.prompt[r] + state.emitted[r] - 1)


def need(state: object, r: np.ndarray, need: np.ndarray) -> np.ndarray:
    """The running requests' tokens asked for this step: a decoding one's last token and
    its drafts (``verify`` in all); others unchanged."""
    return np.where(decoding(state, r) & (need == 1), state.engine.speculative.verify, need)


def slots(state: object, r: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """The KV positions ``r`` needs reserved after a step to ``tokens``: the drafter's
    ``lookahead`` slots past it for a decoding request (module docstring)."""
    return tokens + np.where(decoding(state, r), state.engine.speculative.lookahead, 0)


def drafts(state: object, batch: object) -> np.ndarray:
    """Drafted tokens each row of ``batch`` verifies (before ``commit``): its new tokens less
    one for a decoding request, 0 for a prompt chunk."""
    old = batch.context - batch.new
    was = (state.emitted[batch.ids] > 0) & \
        (old >= state.prompt[batch.ids] + state.emitted[batch.ids] - 1)
    return np.where(was, batch.new - 1, 0)


def mark(state: object, batch: object) -> object:
    """``batch`` with the drafts each row verifies (``drafts``), read by the pricer and
    ``commit``."""
    batch.drafts = drafts(state, batch)
    return batch


def accepted(state: object, ids: np.ndarray, drafted: np.ndarray) -> np.ndarray:
    """Drafts accepted per row (module docstring: expected or sampled mode), at most
    ``drafted``."""
    spec = state.engine.speculative
    e = state.emitted[ids] - 1                      # tokens the decode has emitted
    if spec.mode == "sampled":
        got = state.spec_table[state.spec_offsets[ids] + np.maximum(e, 0)]
    else:
        big = spec.tokens_per_verify
        j = state.spec_steps[ids]
        got = np.floor((j + 1) * big + 1e-9).astype(np.int64) - e - 1
    return np.clip(got, 0, drafted)


def commit(state: object, batch: object) -> tuple[np.ndarray, np.ndarray]:
    """``EngineState.commit`` with drafts: a row that verified d drafts and had a accepted
    emits a + 1 tokens (at most its output left) and keeps the KV of its last token and the
    a accepted (computed = its context less d - a); ``commit``'s other rules hold."""
    ids = batch.ids
    d = batch.drafts if batch.drafts is not None else drafts(state, batch)
    a = accepted(state, ids, d)
    state.computed[ids] = batch.context - (d - a)
    out = batch.context >= state.prompt[ids] + state.emitted[ids]
    emit = ids[out]
    state.emitted[emit] = np.minimum(state.emitted[emit] + 1 + a[out], state.output[emit])
    spec = d > 0
    state.spec_steps[ids[spec]] += 1
    state.spec_drafted[ids[spec]] += d[spec]
    state.spec_accepted[ids[spec]] += a[spec]
    return state.finish_step(ids, emit)


class DraftPricer:
    """Seconds of each step's drafting on the target's device, priced by ``price_step`` on
    the drafter's shape: pass 1 over the step's rows as the target ran them, passes 2..k of
    ``topk`` tokens per drafting row, priced once at their mean context and counted k - 1
    times (they differ only in context, which their cost follows linearly: the estimate's
    rule of pricing a span at its middle, ``schedules.speculative.mean_context``); an EAGLE
    head's or MTP module's norms and fc (``schedules.speculative.head_extras``) per pass.
    N-gram lookup: zero. A run at its band's edge (``serving.bands``) moves the target's
    verify; the drafter's passes stay at their centre (a smaller share of the step)."""

    def __init__(self, spec: SpecDecode, target: Model, hw: object, plan: Parallelism,
                 dtypes: Dtypes, decode_timing: int) -> None:
        self.spec, self.target, self.hw, self.plan = spec, target, hw, plan
        self.dtypes, self.decode_timing = dtypes, decode_timing
        kind = _KIND.get(spec.method)
        self.kind = kind
        self.model = spec.draft if kind == "model" else \
            head_layer(target, kind) if kind is not None else None

    def seconds(self, count: np.ndarray, new: np.ndarray, ctx: np.ndarray,
                drafted: np.ndarray, timing: np.ndarray, skew: float) -> np.ndarray:
        """(N,) draft seconds of N steps given as the target's (N, G) arrays; ``drafted``
        (N, G) the drafts each row verified (> 0: it drafts again). Pass 1 of every step
        and passes 2..k of those that draft are priced in one ``price_step`` call."""
        n = len(count)
        if self.model is None:
            return np.zeros(n)
        rows = np.flatnonzero((drafted > 0).any(axis=1)) if self.spec.k > 1 else \
            np.zeros(0, np.int64)
        c = (drafted[rows] > 0).astype(np.int64)
        t = np.full_like(c, self.spec.topk)
        x = ctx[rows] + (self.spec.k * self.spec.topk) // 2    # passes 2..k's middle
        step = Step(np.concatenate([count, c]), np.concatenate([new, t]),
                    np.concatenate([ctx, x]), expert_skew=skew)
        times = np.concatenate([timing, np.full(len(rows), self.decode_timing)])
        tokens = (step.count * step.new_tokens).sum(axis=1)
        each = price_step(self.model, self.hw, self.plan, step,
                          self.dtypes.take(np.zeros(len(times), np.int64)), times).time + \
            self._extras(tokens, times)
        out = each[:n]
        out[rows] += (self.spec.k - 1) * each[n:]
        return out

    def _extras(self, tokens: np.ndarray, timing: np.ndarray) -> np.ndarray:
        if self.kind not in ("mtp", "eagle", "eagle3"):
            return np.zeros(len(tokens))
        d = self.dtypes.take(np.zeros(len(tokens), np.int64))
        return records_seconds(head_extras(self.target, tokens.astype(float), d, self.kind),
                               self.hw, np.asarray(timing))


def draft_logits(count: np.ndarray, drafted: np.ndarray) -> np.ndarray:
    """(N,) logit rows each step adds past one a sequence: one per verified draft (the
    target scores every position it verifies)."""
    return (count * drafted).sum(axis=1).astype(float)


def summary(states: list) -> dict:
    """The run's speculation figures over every engine's state: verify steps, acceptance
    length (mean tokens a request emits per verify step: accepted drafts + 1, as vLLM's
    ``mean_acceptance_length``) and the drafts' acceptance rate."""
    steps = sum(int(s.spec_steps.sum()) for s in states)
    drafted = sum(int(s.spec_drafted.sum()) for s in states)
    acc = sum(int(s.spec_accepted.sum()) for s in states)
    spec = states[0].engine.speculative
    return {"method": spec.method, "num_speculative_tokens": spec.k,
            "verify_tokens": spec.verify, "acceptance": list(spec.rates),
            "acceptance_source": spec.source, "acceptance_mode": spec.mode,
            "expected_tokens_per_verify": spec.tokens_per_verify,
            "verify_steps": steps,
            "acceptance_length": 1.0 + acc / steps if steps else None,
            "draft_acceptance_rate": acc / drafted if drafted else None}


def has_prompt(state: object, ids: np.ndarray, new: np.ndarray) -> bool:
    """Whether a step (before ``commit``) holds a prompt chunk: a row of more than one
    token that is not a decode's verify (a verify-only step is a uniform decode batch,
    which vLLM replays as a CUDA graph of ``1 + num_speculative_tokens`` tokens a row)."""
    return bool(((new > 1) & ~decoding(state, ids)).any())


def pool_terms(spec: SpecDecode, target: Model, hw: object, plan: Parallelism,
               ws: object, kvb: np.ndarray) -> tuple[float, float]:
    """(weight bytes, KV bytes per cached token) the drafter adds on one device: a draft
    model's weights and its layers' KV, an EAGLE head's or MTP module's weights and one
    layer's KV (``schedules.draft_memory.draft_bytes``, the estimate's count); n-gram
    lookup nothing."""
    from perfmodel.cost.memory import kv_bytes_per_token
    from perfmodel.schedules.draft_memory import draft_bytes

    record = spec.speculation()
    if record is None:
        return 0.0, 0.0
    weights = float(np.atleast_1d(draft_bytes(target, hw, plan, ws, record)[0])[0])
    layer = spec.draft if spec.method == "draft_model" else head_layer(target, _KIND[spec.method])
    return weights, float(kv_bytes_per_token(layer, plan.tp, kvb)[0])


def check(engine: object, plan: Parallelism, target: Model) -> None:
    """SpecError for what the simulator does not run with speculation: the static
    baseline, pipeline parallelism (``schedules.assumptions.check_speculation``'s reason),
    a draft model of another vocabulary, MTP on a model without MTP modules."""
    spec = engine.speculative
    if getattr(engine, "scheduler", "continuous") == "static":
        raise SpecError("--speculative-config: the static baseline does not speculate; "
                        "use --scheduler continuous")
    record = spec.speculation()
    if record is not None:
        from perfmodel.schedules.assumptions import check_speculation

        check_speculation(target, plan, record)
