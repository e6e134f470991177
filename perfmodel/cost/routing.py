"""MoE routing: how popular each expert is, how many distinct experts a step reads, and the
load of the busiest expert and expert-parallel device.

Everything starts from the popularity ``p`` (length E, sum top_k): ``p_i`` is the probability
that expert i is among one token's top-k. Two sources:

- a Zipf exponent s (``zipf_popularity``): weights w_r = 1 / r^s for ranks r = 1..E (hottest
  first), turned into inclusion probabilities p_r = min(1, c w_r) with c set so that
  sum p = k ("water filling": an expert every token picks is capped at 1 and its excess is
  spread over the others in proportion to their weights). This is an approximation of top-k
  selection without replacement (exact for k = 1, where p = w / sum w); s = 0 gives exactly
  k/E for every expert, uniform routing;
- a measured histogram (``histogram_popularity``): token-to-expert counts per expert,
  normalised to sum k (and capped the same way), in the histogram's expert order.

With tokens routed independently, expert i is untouched by T tokens with probability
(1 - p_i)^T, so the expected number of distinct experts a step reads is, exactly,
sum_i (1 - (1 - p_i)^T) (``expected_distinct``); for uniform routing it is
E (1 - (1 - k/E)^T). Skew only lowers it: reads concentrate on fewer, hotter experts.

The busiest expert expects T max(p) of the T k (token, expert) pairs. Under expert
parallelism the experts (and ``replicas`` extra copies of the hottest, EPLB-style, ``place``)
sit on ``ep`` devices and a step waits for the busiest device: ``busiest_device_load`` is
T x its share, ``imbalance`` its ratio to the mean (1 for balanced routing). These are the
expected loads (max over devices of the mean load); at small T random fluctuations make the
real busiest device busier still.

DeepSeek-V3 (E = 256, k = 8), busiest device / mean (``tests/test_routing.py`` prints it):
static = contiguous ids with the hottest ranks together (no balancer, the worst case),
eplb+r = ``place`` with r redundant experts.

    ep  s    static eplb+0 eplb+16 eplb+32    ep  s    static eplb+0 eplb+16 eplb+32
    16  0.0   1.000  1.000  1.000  1.000      32  0.0   1.000  1.000  1.000  1.000
    16  0.5   3.488  1.119  1.000  1.000      32  0.5   4.576  1.508  1.032  1.002
    16  1.0   8.504  2.165  1.000  1.000      32  1.0  13.387  4.151  1.005  1.002
    16  1.5  12.097  2.045  1.000  1.000      32  1.5  20.087  4.039  1.040  1.040

Where a token's experts sit (``token_reach``): the all-to-all sends a token once per remote
node its experts sit on (DeepEP), so its network bytes follow the distinct nodes one
token's top-k reach. With group-limited routing (DeepSeek-V3: 256 experts in 8 groups of
consecutive ids, each token's 8 from at most 4 groups; arXiv 2412.19437 section 2.1.2, a
token reaches at most M = 4 nodes where each group is a node) a token first picks
``topk_groups`` groups, then its k experts among theirs. Under expert parallelism expert e
sits on device e // ceil(E / ep) (contiguous ranges, as ``place`` without a balancer and
vLLM's default expert map), device d on node d // per_node, so a group can be a node, part
of one, or span several (EP16 on 2 x 8: 4 groups per node; EP256: each group on 4 nodes),
and the count below follows whichever it is.
"""

from __future__ import annotations

import itertools
from functools import lru_cache
from typing import NamedTuple

import numpy as np

from perfmodel.specs.errors import SpecError

# (token values x distinct popularities) per block of ``expected_distinct``'s sum
_BLOCK = 1 << 22


def _water_fill(weights: np.ndarray, top_k: int) -> np.ndarray:
    """p = min(1, c w) with sum p = top_k (weights >= 0, at least top_k of them > 0)."""
    w = np.asarray(weights, dtype=float)
    if np.count_nonzero(w) < top_k:
        raise SpecError(f"routing: {np.count_nonzero(w)} experts have load, fewer than "
                        f"top_k = {top_k}")
    order = np.argsort(-w, kind="stable")
    ws = w[order]
    rest = np.cumsum(ws[::-1])[::-1]        # sum of the weights from rank j on
    capped = 0
    while capped < top_k and (top_k - capped) * ws[capped] > rest[capped]:
        capped += 1                          # this expert alone would exceed 1: cap it
    p = np.ones(len(w))
    p[order[capped:]] = (top_k - capped) * ws[capped:] / rest[capped]
    return p


@lru_cache(maxsize=256)
def zipf_popularity(n_experts: int, top_k: int, skew: float) -> np.ndarray:
    """Popularity (E,) of Zipf routing, hottest first: weights 1 / rank^skew water-filled to
    sum top_k (see the module docstring). skew 0: top_k / n_experts each, exactly."""
    if not 1 <= top_k <= n_experts:
        raise SpecError(f"routing: need 1 <= top_k <= n_experts, got {top_k} of {n_experts}")
    if not (np.isfinite(skew) and skew >= 0):
        raise SpecError(f"routing: the Zipf exponent must be >= 0, got {skew}")
    p = _water_fill(np.arange(1, n_experts + 1, dtype=float) ** -float(skew), top_k)
    p.flags.writeable = False
    return p


def histogram_popularity(counts: np.ndarray, top_k: int) -> np.ndarray:
    """Popularity (E,) from a measured histogram of tokens routed to each expert (any scale;
    the order is the experts' ids), normalised to sum ``top_k`` and capped at 1."""
    c = np.asarray(counts, dtype=float)
    if c.ndim != 1 or not np.all(np.isfinite(c)) or np.any(c < 0) or top_k > len(c):
        raise SpecError("routing: an expert-load histogram is one non-negative count per "
                        f"expert, at least top_k = {top_k} of them")
    return _water_fill(c, top_k)


def expected_distinct(p: np.ndarray, tokens: np.ndarray | float) -> np.ndarray:
    """E[distinct experts touched by ``tokens`` independent tokens] = sum_i (1 - (1 - p_i)^T)
    for popularity ``p`` (E,); same shape as ``tokens``. Experts of equal popularity are
    summed as one term (m experts: m (1 - (1 - p)^T)), so uniform routing is the closed
    form E (1 - (1 - k/E)^T) to the last bit."""
    q, m = np.unique(np.asarray(p, dtype=float), return_counts=True)
    t = np.asarray(tokens, dtype=float)
    flat = t.reshape(-1)
    if len(q) * flat.size > _BLOCK:          # price each distinct token count once
        flat, back = np.unique(flat, return_inverse=True)
    else:
        back = None
    out = np.empty(flat.size)
    step = max(1, _BLOCK // len(q))
    for a in range(0, flat.size, step):
        out[a:a + step] = (m * (1.0 - (1.0 - q) ** flat[a:a + step, None])).sum(axis=-1)
    return (out if back is None else out[back]).reshape(t.shape)[()]


def zipf_distinct(n_experts: int, top_k: int, tokens: np.ndarray | float,
                  skew: np.ndarray | float = 0.0, replicas: int = 0) -> np.ndarray:
    """``expected_distinct`` under Zipf routing with exponent ``skew`` per element of
    ``tokens`` (broadcast against it); with ``replicas``, of the E + replicas expert copies
    (``copy_popularity``)."""
    t, s = np.broadcast_arrays(np.asarray(tokens, dtype=float), np.asarray(skew, dtype=float))
    if not s.any():
        return expected_distinct(copy_popularity(zipf_popularity(n_experts, top_k, 0.0),
                                                 replicas), t)
    out = np.empty(t.shape)
    for value in np.unique(s):
        at = s == value
        p = copy_popularity(zipf_popularity(n_experts, top_k, float(value)), replicas)
        out[at] = expected_distinct(p, t[at])
    return out[()]


def busiest_expert_load(p: np.ndarray, tokens: np.ndarray | float) -> np.ndarray:
    """Expected (token, expert) pairs of the hottest expert in a step of T tokens: T max p."""
    return np.asarray(tokens, dtype=float) * np.max(p, axis=-1)


def replicate(p: np.ndarray, replicas: int) -> np.ndarray:
    """Copies of each expert (rows x E ints) after adding ``replicas`` redundant copies the
    way EPLB does (deepseek-ai/EPLB ``replicate_experts``): each one goes to the expert whose
    load per copy is then the highest. A hot expert can get several copies."""
    p = np.atleast_2d(np.asarray(p, dtype=float))
    copies = np.ones(p.shape, dtype=np.int64)
    rows = np.arange(len(p))
    for _ in range(replicas):
        copies[rows, np.argmax(p / copies, axis=-1)] += 1
    return copies


def copy_popularity(p: np.ndarray, replicas: int) -> np.ndarray:
    """Popularity (E + replicas,) of each expert copy after ``replicate``: a token bound for
    expert i goes to one of its c_i copies evenly, so each copy has p_i / c_i. With no
    replicas, ``p`` itself."""
    if not replicas:
        return p
    copies = replicate(p, replicas)[0]
    return np.repeat(np.asarray(p, dtype=float) / copies, copies)


def place(p: np.ndarray, ep: int, replicas: int = 0, balance: bool = True) -> np.ndarray:
    """Expected share of the (token, expert) pairs on each of ``ep`` devices (rows x ep; each
    row sums to sum p = top_k) for popularity ``p`` (E,) or (rows, E).

    ``balance`` (EPLB's global policy): ``replicate`` the hottest experts, split each
    expert's load evenly over its copies, then place the copies heaviest first, each on the
    least-loaded device that has a free slot (every device holds (E + replicas) / ep copies,
    rounded down or up when ep does not divide them).
    Without: expert i of ``p``'s order on device i // ceil(E / ep), contiguous id ranges as
    an engine without a balancer places them (no replicas). Zipf popularity is ordered
    hottest first, so that is its worst case: the hottest experts share a device.

    The greedy packing alone does not promise that copies help: when a few experts take
    every token (s = 3, E = 256, ep = 8, 8 replicas: 1.018 against 1.0015 without) the
    fixed slot counts strand light devices. A row whose busiest device comes out busier
    than with no replicas keeps that placement, its redundant copies beside their
    originals (which moves no load): replicas never raise the busiest device's load."""
    p = np.atleast_2d(np.asarray(p, dtype=float))
    n_rows, n_experts = p.shape
    if ep < 1 or replicas < 0:
        raise SpecError(f"routing: need ep >= 1 and replicas >= 0, got {ep} and {replicas}")
    if not balance:
        if replicas:
            raise SpecError("routing: replicas need a balanced placement")
        device = np.arange(n_experts) // -(-n_experts // ep)
        return np.stack([p[:, device == d].sum(axis=-1) for d in range(ep)], axis=-1)
    copies = replicate(p, replicas)
    most = int(copies.max())
    # every copy's load, padded with -1 where an expert has fewer copies, heaviest first
    each = np.where(np.arange(most) < copies[..., None], (p / copies)[..., None], -1.0)
    items = -np.sort(-each.reshape(n_rows, -1), axis=-1)[:, :n_experts + replicas]
    slots, extra = divmod(n_experts + replicas, ep)    # each device: slots, or one more
    load = np.zeros((n_rows, ep))
    held = np.zeros((n_rows, ep), dtype=np.int64)
    rows = np.arange(n_rows)
    for j in range(items.shape[1]):
        more = (held > slots).sum(axis=-1, keepdims=True) < extra
        free = (held < slots) | ((held == slots) & more)
        to = np.argmin(np.where(free, load, np.inf), axis=-1)
        load[rows, to] += items[:, j]
        held[rows, to] += 1
    if replicas:
        plain = place(p, ep)
        worse = load.max(axis=-1) > plain.max(axis=-1)
        load[worse] = plain[worse]
    return load


def imbalance(load: np.ndarray) -> np.ndarray:
    """Busiest device's load over the mean device load (1: balanced), per row."""
    load = np.asarray(load, dtype=float)
    return load.max(axis=-1) / load.mean(axis=-1)


def busiest_device_load(p: np.ndarray, tokens: np.ndarray | float, ep: int,
                        replicas: int = 0, balance: bool = True) -> np.ndarray:
    """Expected (token, expert) pairs on the busiest of ``ep`` devices in a step of
    ``tokens``: T x the largest share of ``place``. Under expert parallelism each device
    runs the grouped GEMMs of its own experts, so the MoE layer waits for this device,
    not the mean T k / ep."""
    share = place(p, ep, replicas, balance).max(axis=-1)
    t = np.asarray(tokens, dtype=float)
    return (t * (share[0] if share.shape == (1,) else share))[()]


def expected_max_touched(local: int, q: np.ndarray, devices: int) -> np.ndarray:
    """E[most experts touched on one device] when each of ``devices`` holds ``local``
    experts and each expert is touched with probability ``q`` (per row): the mean of the
    largest of ``devices`` independent Binomial(local, q), sum_j 1 - F(j - 1)^devices. At
    small batch a step touches few experts, unevenly spread, and the expert-parallel step
    waits for the device that drew the most."""
    q = np.clip(np.asarray(q, dtype=float), 0.0, 1.0)
    sure = q >= 1.0
    odds = np.where(sure, 0.0, q / np.where(sure, 1.0, 1.0 - q))
    pmf = np.where(sure, 0.0, (1.0 - q) ** local)
    cdf, out = pmf.copy(), np.zeros_like(q)
    for j in range(local):
        out += 1.0 - cdf ** devices                       # P(max >= j + 1)
        pmf = pmf * (local - j) / (j + 1) * odds
        cdf = np.minimum(cdf + pmf, 1.0)
    return np.where(sure, float(local), out)


def device_imbalance(n_experts: int, top_k: int, skew: np.ndarray | float, devices: int,
                     replicas: int = 0) -> np.ndarray:
    """Busiest device's share of the (token, expert) pairs over the mean, per row, for Zipf
    routing with exponent ``skew``; 1 for uniform routing. With ``replicas`` redundant
    copies of the hottest (EPLB), their balanced placement (``place``); without, the
    engine's own expert map (``unbalanced_imbalance``): no balancer moves a hot expert
    off a device, so skew can only load the busiest device more."""
    skew = np.asarray(skew, dtype=float)
    out = np.ones_like(skew)
    for s in np.unique(skew[skew > 0]).tolist():
        if replicas:
            p = zipf_popularity(n_experts, top_k, s)
            out[skew == s] = float(imbalance(place(p, devices, replicas)).reshape(-1)[0])
        else:
            out[skew == s] = unbalanced_imbalance(n_experts, top_k, s, devices)
    return out


PLACEMENTS = 1024   # seeded assignments of the popularity ranks to devices, averaged
EXACT_UP_TO = 8     # experts: every distinct assignment (8! / (8/ep)!^ep at most 40,320)


@lru_cache(maxsize=256)
def unbalanced_imbalance(n_experts: int, top_k: int, skew: float, devices: int) -> float:
    """Expected busiest-device share over the mean with vLLM's default expert map (expert
    e on device e // ceil(E / ep), no EPLB) when which experts are hot has nothing to do
    with their ids: the mean over every assignment of the Zipf ranks to the devices' slots
    (up to ``EXACT_UP_TO`` experts: Mixtral's 8), else over ``PLACEMENTS`` seeded random
    ones (deterministic; within about 1% of the exact mean). Between the balanced
    placement's (``place``, what EPLB reaches) and the hottest-together worst case
    (``place(balance=False)``); the exact mean is Schur-convex in the popularity, so it
    grows with ``skew``. The balanced placement had stood here with no balancer
    configured: the table said 'busiest device 1.0x' where the engine's map leaves the
    hot experts wherever they are."""
    p = zipf_popularity(n_experts, top_k, skew)
    where = _assignments(n_experts, devices)
    rows = len(where)
    flat = (np.arange(rows)[:, None] * devices + where).reshape(-1)
    load = np.bincount(flat, weights=np.tile(p, rows), minlength=rows * devices)
    return float(imbalance(load.reshape(rows, devices)).mean())


@lru_cache(maxsize=32)
def _assignments(n_experts: int, devices: int) -> np.ndarray:
    """The device of each popularity rank, one row per assignment (``unbalanced_imbalance``)."""
    slots = np.arange(n_experts) // -(-n_experts // devices)    # device of each id
    if n_experts <= EXACT_UP_TO:
        return np.array(sorted(set(itertools.permutations(slots.tolist()))))
    rng = np.random.default_rng(0)
    return slots[np.argsort(rng.random((PLACEMENTS, n_experts)), axis=-1)]


class Reach(NamedTuple):
    """Expected distinct nodes and devices, other than its sender's, one token's experts sit
    on (``token_reach``)."""

    nodes: float
    devices: float


def _missed(counts: np.ndarray, pool: int, top_k: int) -> np.ndarray:
    """C(pool - c, k) / C(pool, k) per count c: k distinct uniform picks from ``pool``
    experts all avoid c given ones (the product of (pool - c - i) / (pool - i), i < k)."""
    c = np.asarray(counts, dtype=float)[..., None]
    i = np.arange(top_k)
    return np.prod(np.clip((pool - c - i) / (pool - i), 0.0, None), axis=-1)


def _sum_ways(held: tuple[int, ...], picked: int) -> np.ndarray:
    """ways[c] (up to a common scale): how many of the ``picked``-subsets of the groups hold
    c of a unit's experts (``held``: its experts in each group); subset-sum counting, one
    group at a time."""
    total = sum(held)
    ways = np.zeros((picked + 1, total + 1))
    ways[0, 0] = 1.0
    for x in held:
        grown = ways.copy()
        grown[1:, x:] += ways[:-1, :total + 1 - x]
        ways = grown / grown.max()           # only the ratios matter: no overflow
    return ways[picked]


def _reached(held: np.ndarray, pool: int, top_k: int, topk_groups: int) -> np.ndarray:
    """P(a token's experts include one of each unit's), per row of ``held`` (units x groups:
    each unit's experts in each group). The token picks ``topk_groups`` of the groups
    uniformly, then ``top_k`` distinct experts uniformly among the ``pool`` experts of those
    groups; a unit holding c of them is missed with probability ``_missed(c)``, averaged
    over the group sets (``_sum_ways``). No limit (every group picked): C(E - |U|, k) /
    C(E, k), the hypergeometric. Units with the same counts (in any order) are priced once."""
    out = np.empty(len(held))
    memo: dict[tuple[int, ...], float] = {}
    for j, row in enumerate(held.astype(int).tolist()):
        key = tuple(sorted(row))
        if key not in memo:
            ways = _sum_ways(key, topk_groups)
            missed = ways @ _missed(np.arange(len(ways)), pool, top_k) / ways.sum()
            memo[key] = 1.0 - float(missed)
        out[j] = memo[key]
    return out


@lru_cache(maxsize=256)
def token_reach(n_experts: int, top_k: int, ep: int, per_node: int, groups: int = 1,
                topk_groups: int = 1) -> Reach:
    """Expected distinct nodes and devices, besides its sender's, holding one token's
    ``top_k`` experts when ``ep`` devices of ``per_node`` per node hold the ``n_experts``
    in contiguous ranges, under uniform routing limited to ``topk_groups`` of ``groups``
    groups (module docstring). Every device sends alike (data-parallel attention), so
    remote nodes = sum_j (1 - n_j / ep) P(node j reached) over the nodes (n_j devices
    each), other devices = (1 - 1 / ep) sum_d P(device d reached). Exact for uniform
    routing; the limit never adds nodes, and topk_groups >= groups is no limit."""
    if not (1 <= top_k <= n_experts and ep >= 1 and per_node >= 1 and groups >= 1
            and n_experts % groups == 0):
        raise SpecError(f"routing: need 1 <= top_k <= n_experts, ep, per_node >= 1 and "
                        f"groups dividing n_experts, got top_k {top_k}, {n_experts} experts, "
                        f"ep {ep}, {per_node} per node, {groups} groups")
    picked = min(max(topk_groups, 1), groups)
    size = n_experts // groups
    if top_k > picked * size:
        raise SpecError(f"routing: top_k {top_k} exceeds the {picked * size} experts of "
                        f"{picked} groups")
    experts = np.arange(n_experts)
    device = experts // -(-n_experts // ep)
    node = device // per_node
    group = experts // size
    on_device = np.zeros((ep, groups))
    np.add.at(on_device, (device, group), 1.0)
    n_nodes = -(-ep // per_node)
    on_node = np.zeros((n_nodes, groups))
    np.add.at(on_node, (node, group), 1.0)
    pool = picked * size
    senders = np.bincount(np.arange(ep) // per_node, minlength=n_nodes)
    nodes = float(((1.0 - senders / ep) * _reached(on_node, pool, top_k, picked)).sum())
    devices = float((1.0 - 1.0 / ep) * _reached(on_device, pool, top_k, picked).sum())
    return Reach(nodes, devices)
