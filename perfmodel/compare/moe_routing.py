"""How aiconfigurator's MoE collector routes the tokens of a ``moe_perf`` row, and so which
experts the timed device runs and with how many tokens each.

The collector (ai-dynamo/aiconfigurator ``collector/helper.py``, used by the vLLM, SGLang
and TensorRT-LLM ``collect_moe.py``) builds router logits from an expert-assignment matrix
and times the engine's fused MoE layer on EP rank 0, which holds experts [0, E / ep):

- ``balanced`` (``balanced_logits``): token t's j-th expert is (t + j s) mod E with stride
  s = ceil(E / k) when T >= s, else floor(t s / T + j s) mod E: every expert in turn, so
  min(E, T k) distinct experts, evenly loaded;
- ``power_law_<alpha>`` (``_generate_power_law_distribution``): one count per expert drawn
  independently from a power law of exponent alpha on [1, 0.8 T] (inverse CDF of a uniform;
  [0.01, 2] when T k <= E), scaled to sum T k, rounded, capped at T (the excess given to
  the rank's least-loaded experts), and the EP rank with the largest sum swapped into rank
  0: the timed device is the busiest. The draws are not ranked by expert id (unlike a Zipf
  law over ranks, ``cost.routing``), and at T k > E their floor of 1 (against up to
  0.8 T) keeps most experts above half a token after scaling: the timed device runs
  nearly all of its experts, a few of them with most of its tokens (E 256, k 8, EP 8,
  T 2048, alpha 1.01: 30 of its 32). The collector times five draws and reports their
  mean (``num_iter = 5``).

``rank_counts`` reproduces both with a seeded generator (``DRAWS`` draws), so a row is
priced on the token counts its device ran, not on an expected-value routing model.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

DRAWS = 5          # the collector's num_iter for power-law rows
SEED = 0


def _power_law(rng: np.random.Generator, size: int, alpha: float, lo: float, hi: float
               ) -> np.ndarray:
    """``sample_power_law``: the inverse CDF of a power law of exponent ``alpha`` on
    [lo, hi] at uniform draws."""
    u = rng.random(size)
    a = 1.0 - alpha
    return ((hi ** a - lo ** a) * u + lo ** a) ** (1.0 / a)


def _round_robin(ranks: np.ndarray, remaining: int, step: int, cap: int) -> None:
    """``_round_robin_adjust_per_rank``: ``remaining`` single steps (+1 to the least
    loaded expert below ``cap``, or -1 to the most loaded above 0), one rank after the
    other in order, ties to the lowest index; in place."""
    rows = np.arange(len(ranks))
    while remaining > 0:
        valid = ranks < cap if step > 0 else ranks > 0
        live = valid.any(axis=1)
        if not live.any():
            return
        masked = np.where(valid, ranks, np.iinfo(np.int64).max if step > 0
                          else np.iinfo(np.int64).min)
        pick = np.argmin(masked, axis=1) if step > 0 else np.argmax(masked, axis=1)
        turn = rows[live][:remaining]
        ranks[turn, pick[turn]] += step
        remaining -= len(turn)


def _power_law_counts(rng: np.random.Generator, experts: int, top_k: int, ep: int,
                      tokens: int, alpha: float) -> np.ndarray:
    """One draw of the per-expert token counts of the busiest EP rank (its E / ep experts)."""
    target = tokens * top_k
    lo, hi = (1.0, tokens * 0.8) if target > experts else (0.01, 2.0)
    x = _power_law(rng, experts, alpha, lo, max(hi, lo * (1 + 1e-9)))
    counts = np.round(x / x.sum() * target).astype(np.int64)
    overflow = int(np.maximum(counts - tokens, 0).sum())
    per = max(experts // ep, 1)
    ranks = np.minimum(counts, tokens)[: per * ep].reshape(ep, per)
    _round_robin(ranks, overflow, 1, tokens)
    delta = target - int(ranks.sum())
    _round_robin(ranks, abs(delta), 1 if delta > 0 else -1, tokens)
    return ranks[int(np.argmax(ranks.sum(axis=1)))]


def _balanced_counts(experts: int, top_k: int, ep: int, tokens: int) -> np.ndarray:
    """Per-expert token counts of EP rank 0 under ``balanced_logits``."""
    stride = -(-experts // top_k)
    t = np.arange(tokens)[:, None]
    j = np.arange(top_k)[None, :]
    if tokens >= stride:
        chosen = (t + j * stride) % experts
    else:
        chosen = np.floor((t * stride / tokens + j * stride) % experts).astype(np.int64)
    counts = np.bincount(chosen.reshape(-1), minlength=experts)
    return counts[: max(experts // ep, 1)]


@lru_cache(maxsize=8192)
def rank_counts(experts: int, top_k: int, ep: int, tokens: int, distribution: str
                ) -> tuple[np.ndarray, ...]:
    """The timed device's per-expert token counts, one array per draw (``balanced``: one;
    ``power_law_<alpha>``: ``DRAWS`` seeded draws); None for another distribution."""
    if distribution in ("balanced", "uniform"):
        return (_balanced_counts(experts, top_k, ep, tokens),)
    alpha = float(distribution.removeprefix("power_law_"))
    rng = np.random.default_rng([SEED, experts, top_k, ep, tokens, int(alpha * 1000)])
    return tuple(_power_law_counts(rng, experts, top_k, ep, tokens, alpha)
                 for _ in range(DRAWS))


def is_known(distribution: str) -> bool:
    """Whether ``rank_counts`` reproduces ``distribution``."""
    if distribution in ("balanced", "uniform"):
        return True
    rest = distribution.removeprefix("power_law_")
    return rest != distribution and rest.replace(".", "", 1).isdigit() and float(rest) != 1.0


def routed_load(experts: int, top_k: int, ep: int, tokens: int, distribution: str,
                block: int = 1) -> tuple[float, float, float]:
    """(token-expert pairs, experts touched, rows after padding each expert's tokens to a
    multiple of ``block``) on the timed device, averaged over the draws."""
    draws = rank_counts(experts, top_k, ep, tokens, distribution)
    pairs = np.mean([c.sum() for c in draws])
    touched = np.mean([np.count_nonzero(c) for c in draws])
    padded = np.mean([(np.ceil(c / block) * block).sum() for c in draws])
    return float(pairs), max(float(touched), 1.0), float(padded)
