"""SGLang's ``--schedule-policy dfs-weight`` (``schedule_policy.py``
``_sort_by_dfs_weight`` in sglang 0.5.14): goldens derived by hand from that source."""

import numpy as np

from perfmodel.serving.engines.sglang import SGLangConfig
from perfmodel.serving.engines.sglang_policy import LPM_QUEUE_LIMIT, order


def _after_warmup(policy, prompt, output, prefix, ptok, warm, rest, chunk=64, blocks=4000):
    """Run requests ``warm`` to completion (caching their prefixes), then queue ``rest``
    at once: the state, ready for the next prefill batch."""
    engine = SGLangConfig(chunked_prefill_size=chunk, schedule_policy=policy).resolved(
        blocks, 4096)
    st = engine.state(np.array(prompt, np.int64), np.array(output, np.int64),
                      np.array(prefix, np.int64), np.array(ptok, np.int64), blocks)
    st.waiting.extend(warm)
    while st.running or st.waiting or st.chunked >= 0:
        st.commit(st.schedule())
    st.waiting.extend(rest)
    return st


# r0 caches chain A (prefix 0, 20 tokens), r1 chain B (prefix 1, 40 tokens); then r2 (no
# prefix), r3 (B), r4 (A), r5 (A) wait, prompts of 60 tokens.
KW = dict(prompt=[60] * 6, output=[2] * 6, prefix=[0, 1, -1, 1, 0, 0],
          ptok=[20, 40, 0, 40, 20, 20], warm=[0, 1], rest=[2, 3, 4, 5])


def test_dfs_weight_golden():
    """Cached hits: r2 0, r3 40 (B), r4 and r5 20 (A). The tree: root -> A (r4, r5: weight
    2), root -> B (r3: weight 1), r2 at the root. Depth-first, heaviest child first, a
    node's own requests after its children: r4, r5, r3, r2. With a 64-token chunk budget
    the batch is r4's 40 uncached tokens, then r5 cut to the 24 left (it becomes the
    chunked request). lpm instead puts the longest hit first: r3 (20 uncached), r4 (40),
    r5 cut to 4; fcfs takes r2 whole and cuts r3 to 4."""
    got = {}
    for policy in ("dfs-weight", "lpm", "fcfs"):
        st = _after_warmup(policy, **KW)
        b = st.schedule()
        got[policy] = (b.ids.tolist(), b.new.tolist())
        if policy == "dfs-weight":
            assert list(st.waiting) == [3, 2] and st.chunked == 5
    assert got["dfs-weight"] == ([4, 5], [40, 24])
    assert got["lpm"] == ([3, 4, 5], [20, 40, 4])
    assert got["fcfs"] == ([2, 3], [60, 4])


def test_dfs_weight_ties_go_to_the_chain_cached_first():
    """One waiting request per chain: equal weights keep the children's order (chain A,
    cached first, has the lower id), whatever the queue order; no hit last."""
    st = _after_warmup("dfs-weight", **{**KW, "rest": [2, 3, 4]})
    st._sort()
    assert list(st.waiting) == [4, 3, 2]


def test_dfs_weight_keeps_sorting_a_long_queue():
    """0.5.14 falls back to fcfs past 128 waiting for lpm only (``_determine_active_policy``):
    with 129 waiting, lpm takes the queue's head, dfs-weight still the cached chain's."""
    n = LPM_QUEUE_LIMIT + 2
    prefix = [0] + [-1] * (n - 2) + [0]
    ptok = [40] + [0] * (n - 2) + [40]
    kw = dict(prompt=[60] * n, output=[2] * n, prefix=prefix, ptok=ptok, warm=[0],
              rest=list(range(1, n)))
    assert _after_warmup("lpm", **kw).schedule().ids[0] == 1
    assert _after_warmup("dfs-weight", **kw).schedule().ids[0] == n - 1
    assert _after_warmup("lpm", **{**kw, "rest": list(range(2, n))}).schedule().ids[0] == n - 1


def test_order_by_hand():
    """hits/chains of five waiting requests: chain 7 has two (hits 3 and 5), chain 2 one,
    one has no hit though its chain is 7 (it sits at the root)."""
    hits, chains = [0, 3, 4, 5, 0], [-1, 7, 2, 7, 7]
    assert order("dfs-weight", hits, chains) == [3, 1, 2, 0, 4]
    assert order("lpm", hits, chains) == [3, 2, 1, 0, 4]
    assert order("fcfs", hits, chains) == [0, 1, 2, 3, 4]
