"""The engine flags of the serving features an engine's settings carry, appended by vLLM's
and SGLang's ``flags()`` after their own: speculative decoding
(``engines.speculation_flags``), LoRA (``engines.lora``) and KV offload tiers
(``serving.kvtiers``), each in the engine's own spelling."""

from __future__ import annotations


def feature_flags(engine: object) -> list[str]:
    """``engine``'s flags for the features it has on, in that order (none: empty)."""
    out = []
    if getattr(engine, "speculative", None) is not None:
        from perfmodel.serving.engines.speculation_flags import engine_flags

        out.append(engine_flags(engine.speculative, engine.name))
    if getattr(engine, "lora", None) is not None:
        out.append(engine.lora.flags())
    off = getattr(engine, "kv_offload", None)
    if off is not None and off.blocks:
        out.append(off.flags(engine.name))
    return out
