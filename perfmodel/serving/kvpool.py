"""The paged KV pool and its automatic prefix cache, as vLLM v1 keeps them
(``vllm/v1/core/block_pool.py``, ``kv_cache_manager.py``, ``single_type_kv_cache_manager.py``).

The pool is a fixed number of blocks of ``block_size`` tokens. A block whose last user let
go of it keeps its contents (its hash) and joins the tail of the free queue; allocation
takes blocks from the head, evicting what they held: LRU eviction of blocks no running
request holds. A request frees its blocks last-first, so the tail of its chain sits nearest
the head of the queue and is evicted first: what stays cached of a chain is always a
prefix of it. Only full blocks are cached, and a hit is a run of full blocks from the
start of the prompt.

Blocks are tracked in runs, not one by one: the free queue is a list of ``[key, blocks]``
runs, key ``("p", prefix_id)`` for a shared prompt prefix, ``("r", request)`` for the
chain of a preempted request (its recomputation may hit it) and None for contents no
request will ask for again (the unique prompts and outputs of finished requests).
``active`` holds the prefixes some running request references: prefix -> [blocks, refs].
``tiers``: the KV offload tiers below the pool (``serving.kvtiers``), None without them;
the pool tells them what it caches and what it evicts.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(eq=False)
class KVPool:
    total: int
    free: int = -1
    runs: list = field(default_factory=list)      # the free queue, head first: [key, n]
    active: dict = field(default_factory=dict)    # prefix id -> [blocks, refs]
    tiers: object = None                          # ``kvtiers.Tiers``, or None

    def __post_init__(self) -> None:
        if self.free < 0:
            self.free = self.total
            self.runs = [[None, self.total]] if self.total else []

    def copy(self) -> KVPool:
        return KVPool(self.total, self.free, [list(r) for r in self.runs],
                      {k: list(v) for k, v in self.active.items()},
                      None if self.tiers is None else self.tiers.copy())

    @property
    def used(self) -> int:
        return self.total - self.free

    def cached(self, key: tuple) -> int:
        """Blocks of ``key``'s chain still in the free queue (0: evicted or never cached)."""
        for run in self.runs:
            if run[0] == key:
                return run[1]
        return 0

    def take_cached(self, key: tuple, blocks: int) -> None:
        """Reuse ``blocks`` cached blocks of ``key``: out of the free queue, into use."""
        for i, run in enumerate(self.runs):
            if run[0] == key:
                run[1] -= blocks
                if run[1] <= 0:
                    del self.runs[i]
                self.free -= blocks
                return
        raise ValueError(f"no cached run {key}")

    def allocate(self, blocks: int) -> bool:
        """Take ``blocks`` fresh blocks from the head of the free queue (evicting what they
        held); False, and nothing taken, when fewer are free."""
        if blocks > self.free:
            return False
        self.free -= blocks
        while blocks:
            run = self.runs[0]
            if self.tiers is not None and run[0] is not None:
                self.tiers.evicted(run[0], run[1])
            n = min(run[1], blocks)
            run[1] -= n
            blocks -= n
            if run[1] == 0:
                self.runs.pop(0)
        return True

    def release(self, blocks: int, key: tuple | None = None) -> None:
        """Return ``blocks`` to the tail of the free queue, cached under ``key``."""
        if blocks <= 0:
            return
        self.free += blocks
        if self.tiers is not None and key is not None:
            self.tiers.cached(key, blocks)
        if self.runs and self.runs[-1][0] is None and key is None:
            self.runs[-1][1] += blocks
        else:
            self.runs.append([key, blocks])

    def forget(self, key: tuple) -> None:
        """``key``'s cached chain can no longer be hit: its blocks stay free, uncached."""
        for run in self.runs:
            if run[0] == key:
                run[0] = None
                return

    # shared prefixes referenced by running requests
    def prefix_blocks(self, prefix: int) -> int:
        """Blocks of ``prefix`` a new request can share: in use, or cached in the queue."""
        held = self.active.get(prefix)
        return held[0] if held else self.cached(("p", prefix))

    def reference(self, prefix: int, blocks: int) -> None:
        """A request shares the first ``blocks`` blocks of ``prefix``'s chain."""
        held = self.active.get(prefix)
        if held:
            held[1] += 1
            return
        self.take_cached(("p", prefix), blocks)
        if self.cached(("p", prefix)):    # the tail it does not use stays free, uncached:
            self.forget(("p", prefix))      # the chain is now the part in use
        self.active[prefix] = [blocks, 1]

    def publish(self, prefix: int, blocks: int) -> bool:
        """A request computed ``blocks`` full blocks of ``prefix``: they become the cached
        chain others share (False when another request's copy already is)."""
        if prefix in self.active:
            return False
        self.forget(("p", prefix))
        self.active[prefix] = [blocks, 1]
        return True

    def dereference(self, prefix: int) -> None:
        held = self.active[prefix]
        held[1] -= 1
        if held[1] == 0:
            del self.active[prefix]
            self.release(held[0], ("p", prefix))
