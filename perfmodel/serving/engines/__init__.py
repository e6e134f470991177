"""The serving engines the simulator knows, one module each, behind one interface:
``serving.engines.vllm`` (vLLM v1), ``serving.engines.sglang`` (SGLang), ``serving.engines.trtllm``
(TensorRT-LLM). An engine's settings are a frozen record named with its own flags, and
give the simulator:

- ``state(prompt, output, prefix_id, prefix_tokens, blocks, prefilled, grows)``: its
  scheduler's state (an ``serving.engines.state.EngineState``) whose ``schedule()`` forms the
  next step's ``Batch`` and ``commit(batch)`` applies it;
- ``kv_bytes(hw, weights, acts)``: its rule for the KV pool's size;
- ``resolved(blocks, context_len)``: itself with what the engine derives at start-up;
- ``flags()``: its command line; ``name``; and the common names the pricing and the
  pool read (``block_size``, ``max_num_seqs``, ``max_num_batched_tokens``,
  ``chunked_prefill``, ``prefix_caching``, ``cuda_graphs``, ``max_model_len``,
  ``gpu_memory_utilization``, ``scheduler``).

A host-time rule per engine (its CPU time per step and per request) plugs in here as a
further method of the same record. A new engine is a new module and a line below.
"""

from __future__ import annotations

from perfmodel.serving.engines.sglang import SGLangConfig
from perfmodel.serving.engines.trtllm import TRTLLMConfig
from perfmodel.serving.engines.vllm import EngineConfig
from perfmodel.specs.errors import SpecError

ENGINES = {"vllm": EngineConfig, "sglang": SGLangConfig, "trtllm": TRTLLMConfig}


def engine_config(name: str, **flags: object) -> object:
    """``name``'s settings from its flags (None: the engine's default)."""
    if name not in ENGINES:
        raise SpecError(f"--engine: expected one of {', '.join(ENGINES)}, got {name!r}")
    return ENGINES[name](**{k: v for k, v in flags.items() if v is not None})
