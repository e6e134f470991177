"""Diffusion language models (LLaDA, Mercury): the output block refined in N steps.

A masked-diffusion LM writes G tokens after a prompt of P by N refinement steps, each a
forward pass with bidirectional attention (``Step(causal=False)``: every token attends
every position of the sequence) that predicts every masked position; no KV cache grows
token by token. Two ways to run a step:

- no cache (LLaDA's reference ``generate``): each step runs the whole P + G sequence,
  new tokens = context = P + G, logits for all of it; semi-autoregressive blocks of B tokens
  change which positions get unmasked, not the cost, so the phase is N x that step.
- ``prompt_cache`` (Fast-dLLM's prefix cache): the prompt's K/V are computed once, a
  bidirectional "prefill" step over the P prompt tokens, and reused; in block k of
  G / B (k = 0, 1, ...) each of its N / (G / B) steps runs the G - k B tokens from the
  block on (the finished blocks' K/V reused like the prompt's) attending all P + G.

The steps form one "denoise" phase (``PhaseCost``, so the estimate's table, JSON and
breakdown follow): TTFT = the time to the whole block (every phase), TPOT = denoise / G
(``estimate.diffusion_latency``). Every formula is the step's (``cost.step.price_step``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from perfmodel.cost.ops import ByteCounts
from perfmodel.cost.step import Dtypes, Step, StepCost, price_step
from perfmodel.schedules.phases import PhaseCost, single_step_phase
from perfmodel.specs.errors import SpecError
from perfmodel.specs.hardware import Hardware
from perfmodel.specs.model import Model
from perfmodel.specs.workload import Parallelism, Workloads

DENOISE = "denoise"


@dataclass(frozen=True)
class Diffusion:
    """N refinement ``steps`` over the output; ``block``: tokens per semi-autoregressive
    block (None: the whole output is one block); ``prompt_cache``: the prompt's (and the
    finished blocks') K/V computed once and reused."""

    steps: int
    block: int | None = None
    prompt_cache: bool = False

    def __post_init__(self) -> None:
        if int(self.steps) < 1 or (self.block is not None and int(self.block) < 1):
            raise SpecError(f"diffusion: steps ({self.steps}) and block ({self.block}) "
                            f"must be >= 1")

    def blocks(self, gen_len: np.ndarray) -> np.ndarray:
        """Blocks of each output (G / B, 1 without blocks); SpecError unless B divides G and
        the blocks divide the steps (LLaDA's own conditions)."""
        g = np.asarray(gen_len, dtype=np.int64)
        b = g if self.block is None else np.full_like(g, self.block)
        if np.any(g % b) or np.any(self.steps % (g // np.maximum(b, 1))):
            raise SpecError(f"diffusion: the block ({self.block}) must divide the generated "
                            f"length ({sorted(set(g.tolist()))}) and the blocks must divide "
                            f"the steps ({self.steps})")
        return g // b


def denoise_step(batch: object, prompt: object, gen: object, new_tokens: object | None = None,
                 expert_skew: np.ndarray | float = 0.0) -> Step:
    """One denoising step per row: ``new_tokens`` (default P + G, no cache) bidirectional
    tokens per sequence on a context of P + G, logits for every new token."""
    context = np.asarray(prompt) + np.asarray(gen)
    new = context if new_tokens is None else new_tokens
    return Step.uniform(batch, new, context, logits_all=True, expert_skew=expert_skew,
                        causal=False)


def diffusion_request(model: Model, hw: Hardware, plan: Parallelism, w: Workloads,
                      d: Diffusion) -> tuple[PhaseCost, ...]:
    """The phases of every configuration of ``w`` under ``d`` (module docstring): ("denoise",)
    or, with the prompt cache, ("prefill", "denoise")."""
    if plan.pp > 1:
        raise SpecError("diffusion: pipeline parallelism (pp > 1) is not modelled for "
                        "denoising steps; use tp")
    blocks = d.blocks(w.gen_len)
    dtypes = Dtypes.of_workloads(w)
    if not d.prompt_cache:
        cost = price_step(model, hw, plan, denoise_step(w.batch, w.prompt_len, w.gen_len,
                                                        expert_skew=w.expert_skew), dtypes)
        owner = np.arange(len(w))
        return (_summed(cost, owner, np.full(len(w), float(d.steps))),)
    owner = np.repeat(np.arange(len(w)), blocks)                    # one row per block
    k = np.arange(len(owner)) - np.repeat(np.cumsum(blocks) - blocks, blocks)
    gen = w.gen_len[owner]
    new = gen - k * (gen // blocks[owner])                          # G - k B
    step = denoise_step(w.batch[owner], w.prompt_len[owner], gen, new,
                        w.expert_skew[owner])
    cost = price_step(model, hw, plan, step, dtypes.take(owner))
    prompt = Step.uniform(w.batch, w.prompt_len, w.prompt_len, expert_skew=w.expert_skew,
                          causal=False)
    prefill = single_step_phase("prefill", price_step(model, hw, plan, prompt, dtypes))
    return prefill, _summed(cost, owner, d.steps / blocks[owner])


def _summed(cost: StepCost, owner: np.ndarray, repeats: np.ndarray) -> PhaseCost:
    """The "denoise" phase of rows of ``cost`` (one step each, repeated ``repeats`` times)
    belonging to configuration ``owner`` (sorted): per operator, the sum over a
    configuration's rows; count and bound are its first step's."""
    starts = np.flatnonzero(np.r_[True, owner[1:] != owner[:-1]])
    ends = np.r_[starts[1:], len(owner)] - 1
    def total(x: np.ndarray) -> np.ndarray:         # (operators, rows) -> (operators, N)
        return np.add.reduceat(x * repeats, starts, axis=1)

    steps = np.add.reduceat(repeats, starts).astype(np.int64)
    row = cost.time
    return PhaseCost(DENOISE, steps, cost.names, cost.kinds, cost.classes, cost.positions,
                     cost.count[:, starts], total(cost.time_s), total(cost.flops),
                     ByteCounts(*(total(b) for b in cost.bytes.astuple())),
                     cost.bound[:, starts], row[starts], row[ends], cost.time_s[:, starts],
                     total(cost.dequant_s), cost.error_codes[:, starts])


def diffusion_assumptions(w: Workloads, d: Diffusion) -> list[tuple[np.ndarray, str]]:
    """What the diffusion estimate assumes, one line (a mask over every configuration)."""
    blocks = "one block" if d.block is None else f"blocks of {d.block} tokens"
    cache = ("the prompt's and finished blocks' K/V computed once and reused (Fast-dLLM's "
             "prefix cache, never refreshed)" if d.prompt_cache else
             "every step recomputes the whole prompt + output, logits for all of it "
             "(LLaDA's reference generate)")
    line = (f"diffusion LM: {d.steps} refinement steps over the output ({blocks}), "
            f"bidirectional attention; {cache}; TTFT is the whole output, TPOT denoise / "
            f"gen; memory counted as an autoregressive KV cache")
    return [(np.ones(len(w), dtype=bool), line)]


__all__ = ["DENOISE", "Diffusion", "denoise_step", "diffusion_assumptions",
           "diffusion_request"]
