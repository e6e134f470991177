"""A planned server's scheduler settings in each engine's own names, as the planner's
simulated check ran them (``serving.planner.check``: vLLM's scheduler, first come first
served, chunked prefill under the token budget), for ``serving.planner.launch`` to emit:

- vLLM 0.24.0 (``vllm/engine/arg_utils.py``): ``--max-num-seqs`` (per data-parallel rank),
  ``--max-num-batched-tokens``, ``--enable-chunked-prefill``, ``--scheduling-policy fcfs``;
- SGLang 0.5.14 (``server_args.py``): ``--max-running-requests`` (the server's total),
  ``--chunked-prefill-size``, ``--schedule-policy fcfs`` (its default);
- TensorRT-LLM (``tensorrt_llm/llmapi/llm_args.py``, the ``--extra_llm_api_options``
  YAML): ``max_batch_size`` (per rank), ``max_num_tokens``, ``enable_chunked_prefill:
  true`` (off by default there) and ``scheduler_config.capacity_scheduler_policy:
  GUARANTEED_NO_EVICT`` (``SchedulerConfig``'s default: each request's KV reserved to
  completion, so no eviction, as the check's pool never preempts at the planned load).
"""

from __future__ import annotations

from typing import Any


def scheduler(engine: str, s: Any) -> list[tuple[str, str | None]]:
    """Server ``s``'s (``serving.planner.launch.Server``) scheduler settings as ``engine`` takes
    them: (flag, value; None a switch), TensorRT-LLM's (YAML key, value), nested keys
    dotted."""
    if engine == "vllm":
        return [("--max-num-seqs", str(s.per_rank(s.max_num_seqs))),
                ("--max-num-batched-tokens", str(s.max_num_batched_tokens)),
                ("--enable-chunked-prefill", None), ("--scheduling-policy", "fcfs")]
    if engine == "sglang":
        return [("--max-running-requests", str(s.max_num_seqs)),
                ("--chunked-prefill-size", str(s.max_num_batched_tokens)),
                ("--schedule-policy", "fcfs")]
    return [("max_batch_size", str(s.per_rank(s.max_num_seqs))),
            ("max_num_tokens", str(s.max_num_batched_tokens)),
            ("enable_chunked_prefill", "true"),
            ("scheduler_config.capacity_scheduler_policy", "GUARANTEED_NO_EVICT")]


def said(settings: list[tuple[str, str | None]], engine: str) -> str:
    """The settings on one line, as the engine takes them."""
    if engine == "trtllm":
        return ", ".join(f"{k}: {v}" for k, v in settings)
    return " ".join(k if v is None else f"{k} {v}" for k, v in settings)


def as_flags(settings: list[tuple[str, str | None]]) -> list[str]:
    """Command-line tokens of flag settings."""
    return [t for k, v in settings for t in ((k,) if v is None else (k, v))]


def as_yaml(settings: list[tuple[str, str | None]]) -> list[str]:
    """YAML lines of key settings (a dotted key nested one level)."""
    out = []
    for k, v in settings:
        parent, _, child = k.partition(".")
        out += [f"{k}: {v}"] if not child else [f"{parent}:", f"  {child}: {v}"]
    return out
