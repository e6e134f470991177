"""SGLang's scheduler (``sglang==0.5.14``, ``python/sglang/srt/managers/scheduler.py``
``get_next_batch_to_run``, ``_get_new_batch_prefill_raw``, ``update_running_batch``;
``schedule_policy.py`` ``SchedulePolicy``, ``PrefillAdder``; ``schedule_batch.py``
``retract_decode``; ``mem_cache/radix_cache.py``), with its flag names and defaults
(``server_args.py``).

1. A step is a prefill ("extend") batch whenever one can be formed, else a decode batch of
   every running request: prefill first, and no mixing (``--enable-mixed-chunk`` lets the
   running decodes join the prefill batch, their tokens taken off its budgets).
2. The prefill batch: the request whose prompt is being chunked goes first (``add_chunked_req``:
   a chunk of ``--chunked-prefill-size``, or what the pool has left); then the waiting queue,
   in ``--schedule-policy`` order ("fcfs": arrival; "lpm": longest cached prefix first,
   stable, and fcfs once more than 128 wait; "dfs-weight": by the radix tree, below),
   while fewer than ``--max-running-requests`` run. A request needs its uncached prompt
   plus min(max_new_tokens, 4096) + one page of what is left of the pool (free plus
   evictable, less each running request's remaining output x ``new_token_ratio``): the
   first that does not fit ends the batch ("NO_TOKEN").
   A prompt longer than the chunk budget left is cut to it (page-aligned) and becomes the
   chunked request; the batch ends when ``--max-prefill-tokens`` or the chunk budget is
   spent. Without chunking (``--chunked-prefill-size -1``) a prompt past the prefill budget
   waits unless it is the batch's first.
3. A decode step needs one KV slot per request (one page at a page boundary); when the pool
   (free plus evictable) cannot give them, requests are retracted, fewest output tokens
   first (ties: longest prompt), at least one, until the rest fit: their KV is freed
   unsaved and they rejoin the tail of the waiting queue, to be recomputed, prompt and
   output so far. ``new_token_ratio`` is then re-estimated from the survivors' progress;
   otherwise it decays each decode step from 0.7 x ``--schedule-conservativeness`` to 0.14
   of that over 600 steps.
4. The radix cache holds prompts (after each prefill) and finished conversations' turns, and
   evicts least-recently-used leaves: at this model's granularity (one chain per shared
   prefix or session) the tail of a chain goes first, as the paged pool's LRU does. A hit
   is any prefix of ``--page-size`` tokens (default 1: token granularity), at most the
   prompt less one token.
5. The queue's order under lpm and dfs-weight: ``serving.engines.sglang_policy``.
6. Overlap (default; the profile's ``schedule_ahead``): ``scheduler.py`` ``event_loop_overlap``
   launches batch n+1 before ``process_batch_result`` of n: ``EngineState.lag``. Not priced:
   a request finished in step n still runs a discarded row in a decode batch n+1
   (``process_batch_result_decode``: "should only happen when overlap scheduling").
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

import perfmodel.serving.engines.lora as lora
import perfmodel.serving.engines.speculation as speculation
from perfmodel.serving.engines.sglang_budget import PrefillBudget
from perfmodel.serving.engines.sglang_policy import POLICIES, sorts
from perfmodel.serving.engines.sglang_policy import order as policy_order
from perfmodel.serving.engines.state import Batch, EngineState
from perfmodel.serving.host_time import NO_HOST, HostTime
from perfmodel.specs.errors import SpecError
from perfmodel.specs.hardware import Hardware

CLIP_MAX_NEW_TOKENS = 4096      # schedule_policy.py, SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION
INIT_NEW_TOKEN_RATIO = 0.7      # environ.py SGLANG_INIT_NEW_TOKEN_RATIO
MIN_NEW_TOKEN_RATIO_FACTOR = 0.14
NEW_TOKEN_RATIO_DECAY_STEPS = 600
RETRACT_DECODE_STEPS = 20


@dataclass(frozen=True)
class SGLangConfig:
    """``sglang.launch_server`` flags. ``max_running_requests`` 0 and
    ``mem_fraction_static`` 0: SGLang's own rules (``resolved``)."""

    chunked_prefill_size: int = 8192       # 80-160 GB devices; -1: off
    max_prefill_tokens: int = 16384
    max_running_requests: int = 0
    schedule_policy: str = "fcfs"
    schedule_conservativeness: float = 1.0
    page_size: int = 1
    mem_fraction_static: float = 0.0
    disable_radix_cache: bool = False
    enable_mixed_chunk: bool = False
    disable_cuda_graph: bool = False
    context_length: int = 0
    host: HostTime = NO_HOST        # the engine's time outside the GPU (serving.host_time)
    speculative: object = None      # ``engines.speculation.SpecDecode``; None: off
    lora: lora.LoraSettings | None = None   # LoRA's settings (``engines.lora``)

    name = "sglang"
    scheduler = "continuous"

    def __post_init__(self) -> None:
        if self.schedule_policy not in POLICIES:
            raise SpecError(f"--schedule-policy: expected one of {', '.join(POLICIES)}, got "
                            f"{self.schedule_policy!r}")
        if self.chunked_prefill_size == 0 or self.chunked_prefill_size < -1:
            raise SpecError("--chunked-prefill-size: expected -1 (off) or >= 1, got "
                            f"{self.chunked_prefill_size}")
        for flag in ("max_prefill_tokens", "page_size"):
            if getattr(self, flag) < 1:
                raise SpecError(f"--{flag.replace('_', '-')}: expected >= 1, got "
                                f"{getattr(self, flag)}")
        if self.max_running_requests < 0 or self.context_length < 0:
            raise SpecError("--max-running-requests / --context-length: expected >= 0")
        if not (0 <= self.mem_fraction_static <= 1 and 0 < self.schedule_conservativeness < np.inf):
            raise SpecError(f"--schedule-conservativeness: expected a finite number > 0, got "
                            f"{self.schedule_conservativeness}; --mem-fraction-static: a share "
                            f"in (0, 1] (0: SGLang's rule), got {self.mem_fraction_static}")

    # the names the simulator and the KV-pool rule read
    @property
    def block_size(self) -> int:
        return self.page_size

    @property
    def chunked_prefill(self) -> bool:
        return self.chunked_prefill_size > 0

    @property
    def max_num_batched_tokens(self) -> int:
        return self.chunked_prefill_size if self.chunked_prefill else self.max_prefill_tokens

    @property
    def max_num_seqs(self) -> int:
        return self.max_running_requests or 4096

    @property
    def prefix_caching(self) -> bool:
        return not self.disable_radix_cache

    @property
    def cuda_graphs(self) -> bool:
        return not self.disable_cuda_graph

    @property
    def max_model_len(self) -> int:
        return self.context_length

    @property
    def gpu_memory_utilization(self) -> float:
        return self.mem_fraction_static or 0.9

    def kv_bytes(self, hw: Hardware, weights: float, acts: float) -> float:
        """``mem_fraction_static`` of the device holds the weights and the KV pool
        (activations live outside it). Unset, SGLang's rule (``_handle_gpu_memory_settings``):
        1 - (chunked_prefill_size x 1.5 + 256 x 2) MB / device MB."""
        memory = float(hw.memory_bytes)
        frac = self.mem_fraction_static or \
            1 - (max(self.chunked_prefill_size, 0) * 1.5 + 512) * 2 ** 20 / memory
        return frac * memory - weights

    def resolved(self, blocks: int, context_len: int) -> SGLangConfig:
        """``max_running_requests`` by ``_resolve_max_num_reqs``: pool tokens / context
        length x 512, clamped to [2048, 4096], at most half the pool's tokens."""
        if self.max_running_requests:
            return self
        tokens = blocks * self.page_size
        estimated = max(min(int(tokens / max(context_len, 1) * 512), 4096), 2048)
        return replace(self, max_running_requests=max(1, min(estimated, tokens // 2)))

    def state(self, *args: object, **kw: object) -> SGLangState:
        return SGLangState.new(self, *args, **kw)

    def flags(self) -> str:
        """The same settings as ``python -m sglang.launch_server`` flags."""
        out = [f"--chunked-prefill-size {self.chunked_prefill_size}",
               f"--max-prefill-tokens {self.max_prefill_tokens}",
               f"--schedule-policy {self.schedule_policy}",
               f"--schedule-conservativeness {self.schedule_conservativeness:g}",
               f"--page-size {self.page_size}"]
        if self.max_running_requests:
            out.append(f"--max-running-requests {self.max_running_requests}")
        if self.mem_fraction_static:
            out.append(f"--mem-fraction-static {self.mem_fraction_static:g}")
        for flag in ("disable_radix_cache", "enable_mixed_chunk", "disable_cuda_graph"):
            if getattr(self, flag):
                out.append("--" + flag.replace("_", "-"))
        if self.context_length:
            out.append(f"--context-length {self.context_length}")
        if self.speculative is not None:
            from perfmodel.serving.engines.speculation_flags import engine_flags

            out.append(engine_flags(self.speculative, self.name))
        if self.lora is not None:
            out.append(self.lora.flags())
        return " ".join(out)


@dataclass(eq=False)
class SGLangState(EngineState):
    """``running``: the decode batch (every request holding KV but the chunked one)."""

    chunked: int = -1
    ratio: float = -1.0

    @property
    def _reorders(self) -> bool:
        """Under lpm or dfs-weight an arrival may sort ahead of the queue: every step is
        open to it."""
        return self.engine.schedule_policy != "fcfs"

    @property
    def _init_ratio(self) -> float:
        return min(INIT_NEW_TOKEN_RATIO * self.engine.schedule_conservativeness, 1.0)

    def schedule(self) -> Batch | None:
        if self.ratio < 0:
            self.ratio = self._init_ratio
        batch = self._extend() if self.waiting or self.chunked >= 0 else None
        batch = self._decode() if batch is None else batch
        self.settle()       # overlap: batch n's finishes are processed after n+1 is formed
        return self.lora_step(batch)

    def _live(self) -> np.ndarray:     # the running that decode: not the ``late``
        run = np.array(self.running, np.int64)
        return run[~np.isin(run, self.late)] if self.late else run

    def _extend(self) -> Batch | None:
        e, run = self.engine, np.array(self.running, np.int64)
        cap = e.max_running_requests
        if len(run) >= cap and self.chunked < 0:
            return None
        mixed = len(run) if e.enable_mixed_chunk and len(run) else 0
        left = np.minimum(self.output[run] - self.emitted[run], CLIP_MAX_NEW_TOKENS)
        b = PrefillBudget(float((left * self.ratio).sum()) + mixed,
                          e.max_prefill_tokens - mixed,
                          e.chunked_prefill_size - mixed if e.chunked_prefill else None,
                          e.page_size, cur_offset=mixed)
        ids, new = [], []
        if self.chunked >= 0:
            self._add_chunked(b, ids, new)
        if sorts(e.schedule_policy, len(self.waiting)):
            self._sort()
        adapters, skipped = lora.scheduled(self.lora, [*self.running, *ids]), []
        while self.waiting and len(ids) < cap - len(run):
            if self.lora is not None and not self.lora.admits(self.waiting[0], adapters):
                if not self.lora.skip(self.waiting, adapters, skipped):  # can_run_lora_
                    break                                       # batch false: skipped
                continue
            if not self._add_one(self.waiting[0], b, ids, new):
                break
            if self.lora is not None:
                self.lora.join(ids[-1], adapters)
            if b.state(self.pool.free) != "continue":
                break
        lora.requeue(self.lora, self.waiting, skipped)
        if not ids:
            return None
        ids, new = np.array(ids, np.int64), np.array(new, np.int64)
        if mixed:
            run = self._live()
            more = self._decode_slots(run)
            if more is not None:
                ids, new = np.concatenate([ids, run]), np.concatenate([new, more])
        room = len(self.running) < cap and b.state(self.pool.free) == "continue"
        batch = Batch(ids, new, self.computed[ids] + new, True,
                      (room and lora.open_queue(self.lora, self.waiting) and self.chunked < 0)
                      or self._reorders, 0)
        return batch if self.spec is None else speculation.mark(self, batch)

    def _add_chunked(self, b: PrefillBudget, ids: list, new: list) -> None:
        r = self.chunked
        rest = int(self.prompt[r] + self.emitted[r] - self.computed[r])
        rem = min(b.chunk, int(b.total(self.pool.free)))
        if rem <= 0:
            rem = b.chunk
        n = min(rest, rem)
        b.fresh += self._allocate(r, n)
        ids.append(r)
        new.append(n)
        done = n >= rest
        b.spend(n, min(int(self.output[r]), CLIP_MAX_NEW_TOKENS) if done else 0)
        if done:
            self.chunked = -1
            self.running.append(r)

    def _add_one(self, r: int, b: PrefillBudget, ids: list, new: list) -> bool:
        """``PrefillAdder.add_one_req`` for the head of the queue: False ends the batch."""
        tokens = int(self.prompt[r] + self.emitted[r])
        hit_p, _ = self._hits(r, tokens)
        done = hit_p * self.engine.block_size
        if self.prefilled is not None and not self.preemptions[r]:
            done = max(done, int(self.prefilled[r]))
        extend = tokens - done
        max_new = min(int(self.output[r] - self.emitted[r]), CLIP_MAX_NEW_TOKENS)
        if extend + max_new + b.page >= b.total(self.pool.free):
            b.full = True
            return False
        paged = b.ceil(extend)
        if b.chunk is None and ids and paged >= b.input:
            return False
        chunked = b.chunk is not None and paged > b.chunk
        n = extend
        if chunked:
            n = (b.chunk // b.page * b.page + done) // b.page * b.page - done
            if n <= 0:
                return False
        self.admit(r)
        self._take_hits(r, hit_p, 0)
        fresh = self._allocate(r, n, done)
        if fresh < 0:
            return False
        b.fresh += fresh
        self.waiting.popleft()
        self.computed[r] = done
        if not self.preemptions[r]:
            self.hit_tokens[r] = done
        ids.append(r)
        new.append(n)
        b.spend(b.ceil(n), 0 if chunked else min(int(self.output[r]), CLIP_MAX_NEW_TOKENS))
        if chunked:
            self.chunked = r
        else:
            self.running.append(r)
        return True

    def _allocate(self, r: int, n: int, done: int | None = None) -> int:
        """Blocks taken for ``r``'s next ``n`` tokens (-1: the pool is short)."""
        start = int(self.computed[r]) if done is None else done
        fresh = max(int(self.blocks_for(np.int64(start + n))) - int(self.own[r]
                                                                   + self.shared[r]), 0)
        if not self.pool.allocate(fresh):
            return -1
        self.own[r] += fresh
        return fresh

    def _sort(self) -> None:
        """The waiting queue in ``--schedule-policy`` order (``serving.engines.sglang_policy``)."""
        q = list(self.waiting)
        hits = [self._hits(r, int(self.prompt[r] + self.emitted[r]))[0] for r in q]
        order = policy_order(self.engine.schedule_policy, hits,
                              [int(self.prefix[r]) for r in q])
        self.waiting.clear()
        self.waiting.extend(q[i] for i in order)

    def _decode_slots(self, run: np.ndarray) -> np.ndarray | None:
        new = self._decode_new(run)
        blocks = np.maximum(self.blocks_for(self._decode_upto(run, new)) - self.own[run]
                            - self.shared[run], 0)
        if not self.pool.allocate(int(blocks.sum())):
            return None
        self.own[run] += blocks
        return new

    def _decode_new(self, run: np.ndarray) -> np.ndarray:
        """One token each; with speculation a decode's drafts too (``EAGLEWorker.verify``:
        ``speculative_num_draft_tokens`` a request)."""
        ones = np.ones(len(run), np.int64)
        return ones if self.spec is None else speculation.need(self, run, ones)

    def _decode_upto(self, run: np.ndarray, new: np.ndarray) -> np.ndarray:
        upto = self.computed[run] + new
        return upto if self.spec is None else speculation.slots(self, run, upto)

    def _decode(self) -> Batch | None:
        """``update_running_batch``: one token each, retracting when the pool runs short."""
        run = self._live()
        if not len(run):
            return None
        blocks = np.maximum(self.blocks_for(self._decode_upto(run, self._decode_new(run)))
                            - self.own[run] - self.shared[run], 0)
        retracted = 0
        if int(blocks.sum()) > self.pool.free:      # check_decode_mem
            order = sorted(range(len(run)), key=lambda i: (int(self.emitted[run[i]]),
                                                            -int(self.prompt[run[i]])),
                           reverse=True)
            first = True
            while first or int(blocks[order].sum()) > self.pool.free:
                if len(order) == 1:
                    break
                first = False
                self._retract(int(run[order.pop()]))
                retracted += 1
            keep = np.sort(np.array(order, np.int64))
            run, blocks = run[keep], blocks[keep]
            total = int(self.output[run].sum())
            self.ratio = min(1.0, (int(self.emitted[run].sum()) + RETRACT_DECODE_STEPS
                                   * len(run)) / (total + 1))
            if int(blocks.sum()) > self.pool.free:
                raise SpecError("simulate: the KV pool cannot hold one request's next token "
                                "(SGLang aborts it); give the engine more memory")
        else:
            floor = self._init_ratio * MIN_NEW_TOKEN_RATIO_FACTOR
            self.ratio = max(self.ratio - (self._init_ratio - floor)
                             / NEW_TOKEN_RATIO_DECAY_STEPS, floor)
        self.pool.allocate(int(blocks.sum()))
        self.own[run] += blocks
        ones = self._decode_new(run)
        room = len(self.running) < self.engine.max_running_requests
        batch = Batch(run, ones, self.computed[run] + ones, False,
                      (lora.open_queue(self.lora, self.waiting) and room) or self._reorders,
                      retracted)
        return batch if self.spec is None else speculation.mark(self, batch)

    def _retract(self, r: int) -> None:
        """``release_req``: its KV freed without saving it to the tree (its shared prefix
        stays cached); it rejoins the tail of the queue."""
        self.running.remove(r)
        self.pool.release(int(self.own[r]))
        if self.shared[r]:
            self.pool.dereference(int(self.prefix[r]))
        self.computed[r] = self.own[r] = self.shared[r] = 0
        self.preemptions[r] += 1
        self.waiting.append(r)
