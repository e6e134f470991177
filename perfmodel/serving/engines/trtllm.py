"""TensorRT-LLM's in-flight batching (``cpp/tensorrt_llm/batch_manager/capacityScheduler.cpp``
and ``microBatchScheduler.cpp``, which the PyTorch backend's ``PyExecutor`` binds in 1.x),
with ``trtllm-serve``'s flag names and the LLM API's defaults (``BuildConfig``:
max_batch_size 2048, max_num_tokens 8192; ``KvCacheConfig``: tokens_per_block 32,
free_gpu_memory_fraction 0.9, enable_block_reuse on; ``SchedulerConfig``:
GUARANTEED_NO_EVICT; chunked prefill off).

1. The capacity scheduler picks the requests that may run.
   GUARANTEED_NO_EVICT: every request already started (``max_batch_size`` at most), then
   waiting requests in arrival order while the KV blocks each needs to run to completion
   (prompt plus all its output) fit in the free blocks less what the started ones still
   need to complete; the first that does not fit ends the pass. Nothing is ever evicted.
   MAX_UTILIZATION: started and waiting requests in order, each taken while the blocks of
   its next step fit; when one does not, the last started request not yet passed is paused
   (its KV freed, reusable blocks kept for reuse, as vLLM's preemption; it waits again at
   the head of the queue) and the request tried again; with none left to pause the pass ends.
2. The micro-batch scheduler fills the step: in the capacity scheduler's order, a
   generating request costs one token and a context request its uncached prompt tokens;
   the pass stops at the first that overflows ``max_num_tokens`` or at ``max_batch_size``
   requests. With chunked prefill the contexts are cut to the tokens left, first come
   first served, each cut to a multiple of ``tokens_per_block`` unless it is the prompt's
   last chunk.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

import perfmodel.serving.engines.speculation as speculation
from perfmodel.cost.memory import usable_bytes
from perfmodel.serving.engines.state import Batch, EngineState
from perfmodel.serving.host_time import NO_HOST, HostTime
from perfmodel.specs.errors import SpecError
from perfmodel.specs.hardware import Hardware

POLICIES = ("GUARANTEED_NO_EVICT", "MAX_UTILIZATION")


@dataclass(frozen=True)
class TRTLLMConfig:
    """``trtllm-serve`` flags (``--max_batch_size``, ``--max_num_tokens``,
    ``--kv_cache_free_gpu_memory_fraction``) and the LLM API options it reads from
    ``--extra_llm_api_options`` (``scheduler_config.capacity_scheduler_policy``,
    ``enable_chunked_prefill``, ``kv_cache_config.tokens_per_block`` /
    ``enable_block_reuse``)."""

    max_batch_size: int = 2048
    max_num_tokens: int = 8192
    capacity_scheduler_policy: str = "GUARANTEED_NO_EVICT"
    enable_chunked_prefill: bool = False
    tokens_per_block: int = 32
    kv_cache_free_gpu_memory_fraction: float = 0.9
    enable_block_reuse: bool = True
    cuda_graphs: bool = True
    max_seq_len: int = 0
    # attention_dp_config: enable_balance, timeout_iters, batching_wait_iters
    # (serving.adp_balance; TensorRT-LLM's AttentionDpConfig defaults)
    attention_dp_balance: bool = False
    attention_dp_timeout_iters: int = 50
    attention_dp_batching_wait_iters: int = 10
    host: HostTime = NO_HOST        # the engine's time outside the GPU (serving.host_time)
    speculative: object = None      # ``engines.speculation.SpecDecode``; None: off

    name = "trtllm"
    scheduler = "continuous"

    def __post_init__(self) -> None:
        if self.capacity_scheduler_policy not in POLICIES:
            raise SpecError(f"--capacity-scheduler-policy: expected one of "
                            f"{', '.join(POLICIES)}, got {self.capacity_scheduler_policy!r}")
        for flag in ("max_batch_size", "max_num_tokens", "tokens_per_block"):
            if getattr(self, flag) < 1:
                raise SpecError(f"--{flag.replace('_', '-')}: expected >= 1, got "
                                f"{getattr(self, flag)}")
        if not 0 < self.kv_cache_free_gpu_memory_fraction <= 1:
            raise SpecError("--kv-cache-free-gpu-memory-fraction: expected a share in (0, 1], "
                            f"got {self.kv_cache_free_gpu_memory_fraction}")
        if self.attention_dp_timeout_iters < 0 or self.attention_dp_batching_wait_iters < 0:
            raise SpecError("attention_dp_config: timeout_iters and batching_wait_iters: "
                            "expected >= 0")
        if self.max_seq_len < 0:
            raise SpecError(f"--max-seq-len: expected >= 0, got {self.max_seq_len}")

    @property
    def block_size(self) -> int:
        return self.tokens_per_block

    @property
    def chunked_prefill(self) -> bool:
        return self.enable_chunked_prefill

    @property
    def max_num_batched_tokens(self) -> int:
        return self.max_num_tokens

    @property
    def max_num_seqs(self) -> int:
        return self.max_batch_size

    @property
    def prefix_caching(self) -> bool:
        return self.enable_block_reuse

    @property
    def max_model_len(self) -> int:
        return self.max_seq_len

    @property
    def gpu_memory_utilization(self) -> float:
        return 1.0

    def kv_bytes(self, hw: Hardware, weights: float, acts: float) -> float:
        """The KV pool is ``kv_cache_free_gpu_memory_fraction`` of the memory left free
        (after the runtime's reserve) by the weights and the profile run's activations."""
        free = float(usable_bytes(hw, 1.0)) - weights - acts
        return self.kv_cache_free_gpu_memory_fraction * free

    def resolved(self, blocks: int, context_len: int) -> TRTLLMConfig:
        return self

    def state(self, *args: object, **kw: object) -> TRTLLMState:
        return TRTLLMState.new(self, *args, **kw)

    def flags(self) -> str:
        """``trtllm-serve`` flags and, after them, the ``--extra_llm_api_options`` YAML."""
        out = [f"--max_batch_size {self.max_batch_size}",
               f"--max_num_tokens {self.max_num_tokens}",
               f"--kv_cache_free_gpu_memory_fraction {self.kv_cache_free_gpu_memory_fraction:g}"]
        if self.max_seq_len:
            out.append(f"--max_seq_len {self.max_seq_len}")
        yaml = (f"scheduler_config: {{capacity_scheduler_policy: "
                f"{self.capacity_scheduler_policy}}}; enable_chunked_prefill: "
                f"{str(self.enable_chunked_prefill).lower()}; kv_cache_config: "
                f"{{tokens_per_block: {self.tokens_per_block}, enable_block_reuse: "
                f"{str(self.enable_block_reuse).lower()}}}; cuda_graph_config: "
                f"{'{}' if self.cuda_graphs else 'null'}")
        if self.speculative is not None:
            from perfmodel.serving.engines.speculation_flags import engine_flags

            yaml += "; " + engine_flags(self.speculative, self.name)
        return " ".join(out) + f" --extra_llm_api_options <yaml: {yaml}>"


@dataclass(eq=False)
class TRTLLMState(EngineState):
    """``running``: requests started (context in flight or generating), in start order."""

    exhausted: bool = True

    def schedule(self) -> Batch | None:
        self.exhausted = True   # the capacity pass saw the whole queue (a newcomer would
        if self.engine.capacity_scheduler_policy == "GUARANTEED_NO_EVICT":  # be seen too)
            fit, started, preempted = *self._no_evict(), 0
        else:
            fit, started, preempted = self._max_utilization()
        ids, new, admitted_all = self._micro_batch(fit, started)
        if not len(ids):
            return None
        room = len(self.running) < self.engine.max_batch_size and \
            int(new.sum()) < self.engine.max_num_tokens
        batch = Batch(ids, new, self.computed[ids] + new, bool((new > 1).any()),
                      admitted_all and self.exhausted and room, preempted)
        if self.spec is None:
            return batch
        batch.prefill = speculation.has_prompt(self, ids, new)
        return speculation.mark(self, batch)

    def _draft_room(self) -> int:
        """Positions past a request's final length its drafts may take (speculation)."""
        spec = self.spec
        return 0 if spec is None else spec.verify - 1 + spec.lookahead

    def _gen_tokens(self, r: np.ndarray) -> np.ndarray | int:
        """A generating request's tokens this step: 1, or its drafts too (TensorRT-LLM counts
        them toward ``max_num_tokens``)."""
        return 1 if self.spec is None else self.spec.verify

    def _held(self, r: np.ndarray) -> np.ndarray:
        return self.own[r] + self.shared[r]

    def _no_evict(self) -> tuple[np.ndarray, np.ndarray]:
        """(requests the capacity scheduler lets run, which of them had started)."""
        cap = self.engine.max_batch_size
        run = np.array(self.running[:cap], np.int64)
        final = self.blocks_for(self.prompt[run] + self.output[run] + self._draft_room())
        reserve = self.pool.free - int(np.maximum(final - self._held(run), 0).sum())
        new, contributing = [], self._contributing(run)
        for r in self.waiting:
            if len(run) + len(new) >= cap:
                self.exhausted = False
                break
            if self._skip(r, contributing):
                continue
            need = int(self.blocks_for(self.prompt[r] + self.output[r]))
            if need > reserve:
                self.exhausted = False
                break
            reserve -= need
            new.append(r)
        fit = np.concatenate([run, np.array(new, np.int64)])
        return fit, np.arange(len(fit)) < len(run)

    def _contributing(self, run: np.ndarray) -> set:
        """Shared prefixes whose next block a started context is computing now
        (``prefillWithChunkedContextsAlreadyExecuting``)."""
        if not self.sharing or not self.engine.enable_block_reuse:
            return set()
        ctx = run[(self.emitted[run] == 0) & (self.shared[run] == 0) & (self.prefix[run] >= 0)
                  & (self.prefix_full[run] > 0)]
        return set(self.prefix[ctx].tolist())

    def _skip(self, r: int, contributing: set) -> bool:
        """``beneficialToSkip``: a new request whose first uncached block is one an earlier
        scheduled context contributes waits a step, to reuse it."""
        if not self.sharing or not self.engine.enable_block_reuse:
            return False
        p = int(self.prefix[r])
        cap = (int(self.prompt[r] + self.emitted[r]) - 1) // self.engine.block_size
        if p < 0 or self.pool.prefix_blocks(p) >= min(int(self.prefix_full[r]), cap):
            return False
        if p in contributing:
            return True
        contributing.add(p)
        return False

    def _step_blocks(self, r: np.ndarray, started: np.ndarray) -> np.ndarray:
        """Blocks each needs for its next step: a generating request's next token, a
        context its whole prompt (and output so far)."""
        tokens = np.where(started & self._generating(r), self.computed[r] + (
            1 if self.spec is None else self.spec.verify + self.spec.lookahead),
                          self.prompt[r] + self.emitted[r])
        return np.maximum(self.blocks_for(tokens) - self._held(r), 0)

    def _max_utilization(self) -> tuple[np.ndarray, np.ndarray, int]:
        active = np.array(self.running + list(self.waiting), np.int64)
        started = np.arange(len(active)) < len(self.running)
        need = self._step_blocks(active, started)
        cap = self.engine.max_batch_size
        if len(active) <= cap and int(need.sum()) <= self.pool.free:
            return active, started, 0
        fit, spare, preempted, end, i = [], self.pool.free, 0, len(active), 0
        contributing = self._contributing(active[started])
        while i < end:
            if not started[i] and self._skip(int(active[i]), contributing):
                i += 1
                continue
            if len(fit) < cap and int(need[i]) <= spare:
                spare -= int(need[i])
                fit.append(i)
                i += 1
                continue
            last = next((j for j in range(end - 1, i - 1, -1) if started[j]), -1)
            if last < 0:
                self.exhausted = False
                break
            spare += int(self.own[active[last]])
            self.preempt(int(active[last]))
            preempted += 1
            end = last
        idx = np.array(fit, np.int64)
        return active[idx], started[idx], preempted

    def _generating(self, r: np.ndarray) -> np.ndarray:
        return (self.emitted[r] > 0) & (self.computed[r] >= self.prompt[r] + self.emitted[r] - 1)

    def _micro_batch(self, fit: np.ndarray, started: np.ndarray
                     ) -> tuple[np.ndarray, np.ndarray, bool]:
        """``MicroBatchScheduler``: (requests, their tokens, whether every waiting request
        the capacity scheduler let through was taken). In order, a generating request costs
        a token, a context (without chunking) its uncached prompt; the pass stops at the
        first that overflows ``max_num_tokens`` and at ``max_batch_size`` requests."""
        e = self.engine
        gen = started & self._generating(fit)
        done = np.zeros(len(fit), np.int64)
        for i in np.flatnonzero(~gen).tolist():
            done[i] = self._context_done(int(fit[i]), bool(started[i]))
        whole = len(fit)
        one = self._gen_tokens(fit)
        rest = np.where(gen, one, self.prompt[fit] + self.emitted[fit] - done)
        cost = np.where(gen, one, 0 if e.enable_chunked_prefill else rest)
        over = np.flatnonzero(np.cumsum(cost) > e.max_num_tokens)
        stop = min(int(over[0]) if len(over) else len(fit), e.max_batch_size)
        fit, started, gen, done, rest = (a[:stop] for a in (fit, started, gen, done, rest))
        ctx = np.flatnonzero(~gen)
        if e.enable_chunked_prefill:
            capacity = e.max_num_tokens - int(cost[gen].sum())
            if int(rest[ctx].sum()) > capacity:
                rest[ctx] = self._chunk(rest[ctx], capacity)
        admitted = 0
        for i in ctx.tolist():
            r = int(fit[i])
            if rest[i] <= 0:
                continue
            if not started[i]:
                self._admit(r, int(done[i]))
                admitted += 1
            self._allocate(np.array([r]), int(done[i]) + int(rest[i]))
        g = fit[gen]
        self._allocate(g, self.computed[g] + (1 if self.spec is None else
                                                self.spec.verify + self.spec.lookahead))
        keep = rest > 0
        taken = stop == whole and admitted == int((~started).sum())
        return fit[keep], rest[keep], taken

    def _allocate(self, r: np.ndarray, tokens: np.ndarray | int) -> None:
        blocks = np.maximum(self.blocks_for(tokens) - self._held(r), 0)
        if not self.pool.allocate(int(blocks.sum())):
            raise SpecError("simulate: TensorRT-LLM's KV pool ran short under "
                            "MAX_UTILIZATION with chunking (a case not modelled)")
        self.own[r] += blocks

    def _context_done(self, r: int, started: bool) -> int:
        """Prompt tokens already in the KV cache: its computed chunks, or, before its first
        chunk, the reusable blocks (at least one token is computed)."""
        if started:
            return int(self.computed[r])
        tokens = int(self.prompt[r] + self.emitted[r])
        hit_p, hit_own = self._hits(r, tokens)
        done = (hit_p + hit_own) * self.engine.block_size
        if self.prefilled is not None and not self.preemptions[r]:
            done = max(done, int(self.prefilled[r]))
        return done

    def _chunk(self, rest: np.ndarray, capacity: int) -> np.ndarray:
        """``setCtxRequestsChunkSize`` FIRST_COME_FIRST_SERVED: each context in turn takes
        what is left, cut to a multiple of ``tokens_per_block`` unless it is its last."""
        unit, out = self.engine.tokens_per_block, rest.copy()
        for i, n in enumerate(rest.tolist()):
            size = min(n, max(capacity, 0))
            if size < n:
                size = size // unit * unit
            capacity -= size
            out[i] = size
        return out

    def _admit(self, r: int, done: int) -> None:
        self.admit(r)
        tokens = int(self.prompt[r] + self.emitted[r])
        hit_p, hit_own = self._hits(r, tokens)
        self._take_hits(r, hit_p, hit_own)
        self.computed[r] = done
        if not self.preemptions[r]:
            self.hit_tokens[r] = done
        self.waiting.remove(r)
        self.running.append(r)
