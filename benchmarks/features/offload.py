"""KV offload tiers on (``serving.kvtiers``): a CPU tier of SGLang's default size (2 x the
GPU pool) under vLLM's connector rules. The headline requests share no prefix, so this
times the hooks' cost (every chain release and eviction asks the tiers), not a hit."""

from __future__ import annotations

from perfmodel.serving import kvtiers
from perfmodel.serving.engines.vllm import EngineConfig
from perfmodel.serving.simulate import simulate

LABEL = "kv offload (cpu tier)"


def run(reqs: object, model: object, hw: object) -> object:
    return simulate(model, hw, reqs, engine=EngineConfig(kv_offload=kvtiers.Offload()))
