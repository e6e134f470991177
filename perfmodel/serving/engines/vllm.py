"""vLLM v1: its settings, named as vLLM names them (``vllm serve`` flags) with its
defaults (``vllm/config/scheduler.py``, ``vllm/config/cache.py``), and its scheduler.

A step's schedule, by vLLM v1's rules (``vllm/v1/core/sched/scheduler.py``,
``Scheduler.schedule`` and ``update_from_output``):

1. Running requests first, in the order they were admitted: each asks for the tokens it
   has not computed (1 for a decode, the rest of its prompt for a chunked prefill), capped
   by what is left of the step's token budget (``max_num_batched_tokens``). Its KV blocks
   are allocated; when the pool cannot give them, the last-admitted running request is
   preempted (its blocks freed, its computed tokens reset: it is recomputed later, prompt
   and output so far) and put at the head of the waiting queue, until the allocation fits
   or the request itself is the one preempted.
2. Then, only if nothing was preempted, waiting requests in order while the budget lasts
   and fewer than ``max_num_seqs`` run: the prefix cache gives the full blocks already
   cached (capped one token short of the prompt: the last token is always recomputed), the
   rest is scheduled (a chunk of the budget, or, without chunked prefill, the whole prompt;
   a prompt larger than the budget left is skipped for this step and the next one tried),
   and the queue stops at the first request whose blocks do not fit.
3. After the step, a request whose computed tokens reach its prompt plus output so far
   emits one token; one that has emitted all its output finishes and frees its blocks.

The static baseline admits a batch only when the previous one has finished, reserves each
member's KV at its final length (no preemption), and keeps a finished member in the batch
as padding (a decode row that emits nothing) until the whole batch is done, as a static
``generate`` call runs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

import perfmodel.serving.engines.lora as lora
import perfmodel.serving.engines.speculation as speculation
from perfmodel.cost.memory import STEP_TOKENS, usable_bytes
from perfmodel.serving.engines.state import Batch, EngineState
from perfmodel.serving.host_time import NO_HOST, HostTime
from perfmodel.specs.errors import SpecError
from perfmodel.specs.hardware import Hardware
from perfmodel.specs.model import Model
from perfmodel.specs.workload import MAX_TOKENS

SCHEDULERS = ("continuous", "static")



def context_limit(model: Model, engine: object) -> int:
    """The longest request (input + output) ``engine`` takes: its ``max_model_len`` (vLLM's
    --max-model-len, SGLang's --context-length, TensorRT-LLM's --max-seq-len), else the
    model's ``max_position_embeddings``, else ``MAX_TOKENS``. One past the model's limit is
    refused, as the engines refuse it: vLLM's ``_get_and_verify_max_len``
    (vllm/config/model.py) unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1, SGLang's model config
    unless SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1."""
    asked, known = engine.max_model_len, model.max_position_embeddings
    if asked > MAX_TOKENS:
        raise SpecError(f"--max-model-len: expected at most {MAX_TOKENS:,} tokens, got "
                        f"{asked:,}")
    if asked and known and asked > known:
        raise SpecError(f"--max-model-len: {asked:,} exceeds {model.name}'s context limit "
                        f"{known:,} (max_position_embeddings), which the engine refuses "
                        f"(vLLM unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1); expected at most "
                        f"{known:,}")
    return asked or known or MAX_TOKENS

@dataclass(frozen=True)
class EngineConfig:
    """``max_num_seqs``: sequences in one step; ``max_num_batched_tokens``: tokens in one
    step (the chunked-prefill budget); ``gpu_memory_utilization``: share of device memory
    the engine may fill (weights, activations, KV pool); ``block_size``: tokens per paged
    KV block; ``chunked_prefill`` off: a prompt is scheduled whole or waits;
    ``prefix_caching``: automatic prefix caching of full blocks, LRU-evicted;
    ``scheduler`` "static": the baseline that admits a batch only when the last one has
    finished (no continuous batching); ``cuda_graphs``: pure-decode steps replay a CUDA
    graph (vLLM's default; ``--enforce-eager`` turns it off); ``max_model_len``: 0, the
    model's context limit. ``host``: the engine's time outside the GPU
    (``serving.host_time``; none by default: GPU steps only, as ``perfmodel estimate``)."""

    max_num_seqs: int = 256
    max_num_batched_tokens: int = STEP_TOKENS
    gpu_memory_utilization: float = 0.9
    block_size: int = 16
    chunked_prefill: bool = True
    prefix_caching: bool = True
    scheduler: str = "continuous"
    cuda_graphs: bool = True
    max_model_len: int = 0
    host: HostTime = NO_HOST
    speculative: object = None      # ``engines.speculation.SpecDecode``; None: off
    lora: lora.LoraSettings | None = None   # --enable-lora's settings (``engines.lora``)

    name = "vllm"

    def __post_init__(self) -> None:
        for name in ("max_num_seqs", "max_num_batched_tokens", "block_size"):
            if int(getattr(self, name)) < 1:
                raise SpecError(f"--{name.replace('_', '-')}: expected an integer >= 1, "
                                f"got {getattr(self, name)}")
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise SpecError(f"--max-num-batched-tokens: expected at least --max-num-seqs "
                            f"({self.max_num_seqs}), got {self.max_num_batched_tokens} (vLLM "
                            "refuses a budget smaller than the seats it fills)")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise SpecError("--gpu-memory-utilization: expected a share in (0, 1], got "
                            f"{self.gpu_memory_utilization}")
        if self.scheduler not in SCHEDULERS:
            raise SpecError(f"--scheduler: expected one of {', '.join(SCHEDULERS)}, got "
                            f"{self.scheduler!r}")
        if self.max_model_len < 0:
            raise SpecError(f"--max-model-len: expected >= 0, got {self.max_model_len}")

    def kv_bytes(self, hw: Hardware, weights: float, acts: float) -> float:
        """vLLM's rule: ``gpu_memory_utilization`` x memory, less the runtime's reserve, the
        weights and the profile run's activations."""
        return float(usable_bytes(hw, self.gpu_memory_utilization)) - weights - acts

    def resolved(self, blocks: int, context_len: int) -> EngineConfig:
        """The settings with what the engine derives at start-up filled in (none here)."""
        return self

    def state(self, *args: object, **kw: object) -> VLLMState:
        """The scheduler's state for a stream of requests (``VLLMState``)."""
        return VLLMState.new(self, *args, **kw)

    def flags(self) -> str:
        """The same settings as ``vllm serve`` flags."""
        out = [f"--max-num-seqs {self.max_num_seqs}",
               f"--max-num-batched-tokens {self.max_num_batched_tokens}",
               f"--gpu-memory-utilization {self.gpu_memory_utilization:g}",
               f"--block-size {self.block_size}",
               "--enable-chunked-prefill" if self.chunked_prefill
               else "--no-enable-chunked-prefill",
               "--enable-prefix-caching" if self.prefix_caching
               else "--no-enable-prefix-caching"]
        if not self.cuda_graphs:
            out.append("--enforce-eager")
        if self.max_model_len:
            out.append(f"--max-model-len {self.max_model_len}")
        if self.speculative is not None:
            from perfmodel.serving.engines.speculation_flags import engine_flags

            out.append(engine_flags(self.speculative, self.name))
        if self.lora is not None:
            out.append(self.lora.flags())
        return " ".join(out)


@dataclass(eq=False)
class VLLMState(EngineState):
    """vLLM v1's scheduler (``Scheduler.schedule``) on the shared per-request state, and
    the static baseline."""

    def schedule(self) -> Batch | None:
        """The next step's batch (None: nothing to run)."""
        budget = self.engine.max_num_batched_tokens
        ids, new, preempted = self._running(budget)
        tokens = int(new.sum())
        budget -= tokens
        static = self.engine.scheduler == "static"
        admit = not preempted and (not static or not len(ids))
        context = self.computed[ids] + new
        if admit and self.waiting:
            more, chunks, budget = self._waiting(budget)
            if len(more):
                ids, new = np.concatenate([ids, more]), np.concatenate([new, chunks])
                context = np.concatenate([context, self.computed[more] + chunks])
                tokens += int(chunks.sum())
        room = budget > 0 and len(self.running) < self.engine.max_num_seqs
        self.settle()
        if not len(ids):
            return None
        prefill = tokens > len(ids)     # some request computes more than one token (each
        # computes at least one): not vLLM's uniform-decode batch
        if self.spec is not None and prefill:
            prefill = speculation.has_prompt(self, ids, new)
        batch = self.lora_step(Batch(ids, new, context, prefill, admit and room and
                                     lora.open_queue(self.lora, self.waiting), preempted))
        return batch if self.spec is None else speculation.mark(self, batch)

    def _running(self, budget: int) -> tuple[np.ndarray, np.ndarray, int]:
        run = np.array(self.running, dtype=np.int64)
        if not len(run):
            return run, run, 0
        computed = self.computed[run]
        need = self.prompt[run] + self.emitted[run] - computed
        if self.spec is not None:       # a decode's drafts (``engines.speculation``)
            need = speculation.need(self, run, need)
        if self.late:           # finished, output not yet processed: not scheduled again
            need[np.isin(run, self.late)] = 0
        if self.engine.scheduler == "static":
            need = np.where(self.padded[run], 1, need)
        spent = need.cumsum()
        new = need if spent[-1] <= budget else \
            np.minimum(np.maximum(budget - spent + need, 0), need)
        if self.engine.scheduler == "static":      # KV reserved at admission
            return run[new > 0], new[new > 0], 0
        upto = computed + new if self.spec is None else \
            speculation.slots(self, run, computed + new)
        blocks = np.maximum(-(-upto // self.engine.block_size) - self.own[run]
                            - self.shared[run], 0)
        wanted = int(blocks.sum())
        if wanted <= self.pool.free:
            if wanted:      # most decode steps fill blocks they hold
                self.pool.allocate(wanted)
                self.own[run] += blocks
            if new.all():
                return run, new, 0
            keep = new > 0
            return run[keep], new[keep], 0
        return self._running_preempting(run, new, blocks)

    def _running_preempting(self, run: np.ndarray, new: np.ndarray, blocks: np.ndarray
                            ) -> tuple[np.ndarray, np.ndarray, int]:
        """The running loop one request at a time, preempting from the tail."""
        ids, chunks, preempted, i = [], [], 0, 0
        alive = len(run)
        while i < alive:
            r = int(run[i])
            if new[i] == 0:
                i += 1
                continue
            while not self.pool.allocate(int(blocks[i])):
                alive -= 1
                victim = int(run[alive])
                self.preempt(victim)
                preempted += 1
                if victim == r:
                    break
            if i >= alive:
                break
            self.own[r] += blocks[i]
            ids.append(r)
            chunks.append(int(new[i]))
            i += 1
        return np.array(ids, np.int64), np.array(chunks, np.int64), preempted

    def _waiting(self, budget: int) -> tuple[np.ndarray, np.ndarray, int]:
        ids, chunks = [], []
        static = self.engine.scheduler == "static"
        skipped = []
        adapters = lora.scheduled(self.lora, self.running)
        while self.waiting and budget > 0 and len(self.running) < self.engine.max_num_seqs:
            r = self.waiting[0]
            if self.lora is not None and not self.lora.admits(r, adapters):
                if not self.lora.skip(self.waiting, adapters, skipped):   # max_loras
                    break                                   # in the step: skipped
                continue
            tokens = int(self.prompt[r] + self.emitted[r])
            hit_p, hit_own = self._hits(r, tokens)
            done = (hit_p + hit_own) * self.engine.block_size
            if self.prefilled is not None and not self.preemptions[r]:
                done = max(done, int(self.prefilled[r]))     # its KV came with it
            need = tokens - done
            if not self.engine.chunked_prefill and need > budget:
                skipped.append(self.waiting.popleft())    # vLLM goes on to the next one
                continue
            new = min(need, budget)
            final = tokens + int(self.output[r] - self.emitted[r]) if static else done + new
            fresh = int(self.blocks_for(np.int64(final))) - hit_p - hit_own
            cached = hit_own + (hit_p if int(self.prefix[r]) not in self.pool.active else 0)
            if fresh + cached > self.pool.free:
                break
            self.admit(r)
            self._take_hits(r, hit_p, hit_own)
            self.pool.allocate(fresh)
            self.own[r] += fresh
            self.computed[r] = done
            if not self.preemptions[r]:
                self.hit_tokens[r] = done
            self.waiting.popleft()
            self.running.append(r)
            if self.lora is not None:
                self.lora.join(r, adapters)
            ids.append(r)
            chunks.append(new)
            budget -= new
        lora.requeue(self.lora, self.waiting, skipped)
        return np.array(ids, np.int64), np.array(chunks, np.int64), budget
