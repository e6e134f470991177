"""The serving engines the simulator knows, one module each, behind one interface
(``engines.protocol``: ``Engine``, the settings, makes a ``Scheduler``, the state the event
loop drives with ``schedule`` and ``commit``; its docstring states the contract):
``engines.vllm`` (vLLM v1), ``engines.sglang`` (SGLang), ``engines.trtllm``
(TensorRT-LLM), on the per-request state and rules they share (``engines.state``). Each
engine's host time is a profile beside them (``profiles/<engine>.yaml``, read by
``serving.host_time``), and each version's accepted flags a list (``flags/``, read by the
planner's launch lines). A new engine is a new module and a line below.
"""

from __future__ import annotations

from perfmodel.serving.engines.protocol import Engine
from perfmodel.serving.engines.sglang import SGLangConfig
from perfmodel.serving.engines.trtllm import TRTLLMConfig
from perfmodel.serving.engines.vllm import EngineConfig
from perfmodel.specs.errors import SpecError

ENGINES = {"vllm": EngineConfig, "sglang": SGLangConfig, "trtllm": TRTLLMConfig}


def engine_config(name: str, **flags: object) -> Engine:
    """``name``'s settings from its flags (None: the engine's default)."""
    if name not in ENGINES:
        raise SpecError(f"--engine: expected one of {', '.join(ENGINES)}, got {name!r}")
    return ENGINES[name](**{k: v for k, v in flags.items() if v is not None})
