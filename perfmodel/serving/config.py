"""The serving engine's settings, named as vLLM names them (``vllm serve`` flags) with its
defaults (vLLM v1, ``vllm/config/scheduler.py``, ``vllm/config/cache.py``)."""

from __future__ import annotations

from dataclasses import dataclass

from perfmodel.cost.memory import STEP_TOKENS, usable_bytes
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

    def state(self, *args: object, **kw: object) -> object:
        """The scheduler's state for a stream of requests (``serving.scheduler``)."""
        from perfmodel.serving.scheduler import EngineState

        return EngineState.new(self, *args, **kw)

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
        return " ".join(out)
