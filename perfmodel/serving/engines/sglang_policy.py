"""SGLang's waiting-queue order by ``--schedule-policy`` (``sglang==0.5.14``,
``python/sglang/srt/managers/schedule_policy.py`` ``SchedulePolicy.calc_priority``), at
this model's granularity: a request's cached hit is a run of its chain (one shared prefix
or one session, ``serving.engines.state``), and the radix tree is one path off the root per
chain.

- "fcfs": arrival order, unsorted.
- "lpm" (``_sort_by_longest_prefix``): longest cached prefix first, a stable sort; with
  more than 128 waiting, ``_determine_active_policy`` turns it into fcfs.
- "dfs-weight" (``_sort_by_dfs_weight``, ``_calc_weight``, ``_get_dfs_priority``): each
  waiting request sits at the tree node where its cached prefix ends (the root: no hit); a
  node weighs its own requests plus its subtree's; the queue becomes a depth-first walk
  from the root, children heaviest first (a stable sort in the order they joined the
  tree), each node's requests after its children's, in queue order. Here: chains with more
  waiting requests first (ties: the lower prefix id, the chain first seen, standing for the
  one cached first), deepest hit first within a chain, requests with no hit last. 0.5.14
  has no fcfs fallback for it: ``_determine_active_policy`` tests ``self.policy ==
  CacheAwarePolicy.LPM`` only (later versions add hrrn).

Not modelled: lpm's in-batch deprioritisation (``IN_BATCH_PREFIX_CACHING_*``, a request
whose prefix another waiting request shares, itself uncached).
"""

from __future__ import annotations

POLICIES = ("fcfs", "lpm", "dfs-weight")
LPM_QUEUE_LIMIT = 128           # _determine_active_policy: lpm falls back to fcfs past it


def sorts(policy: str, waiting: int) -> bool:
    """Whether ``policy`` reorders a queue of ``waiting`` requests."""
    return policy == "dfs-weight" or (policy == "lpm" and waiting <= LPM_QUEUE_LIMIT)


def order(policy: str, hits: list[int], chains: list[int]) -> list[int]:
    """The queue's positions in ``policy`` order, given each waiting request's cached hit
    (blocks) and chain (prefix id, -1 none), in queue order."""
    n = len(hits)
    if policy == "lpm":
        return sorted(range(n), key=lambda i: -hits[i])
    if policy != "dfs-weight":
        return list(range(n))
    chain = [c if h else -1 for c, h in zip(chains, hits, strict=True)]
    weight: dict[int, int] = {}
    for c in chain:
        if c >= 0:
            weight[c] = weight.get(c, 0) + 1
    rank = {c: k for k, c in enumerate(sorted(weight, key=lambda c: (-weight[c], c)))}
    return sorted(range(n), key=lambda i: (rank.get(chain[i], len(rank)), -hits[i]))
