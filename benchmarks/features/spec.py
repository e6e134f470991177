"""Speculative decoding's cost in the simulator: the headline 10,000 requests served with
vLLM's EAGLE (``--speculative-config '{"method": "eagle", "num_speculative_tokens": 3}'``)
at acceptance 0.7 a position: every step verifies 4 tokens a decoding request and prices
the head's draft passes beside it (``serving.engines.speculation``)."""

from perfmodel.serving.engines.speculation_flags import from_vllm
from perfmodel.serving.engines.vllm import EngineConfig
from perfmodel.serving.simulate import simulate

LABEL = "speculative decoding (EAGLE k=3)"


def run(reqs: object, model: object, hw: object) -> object:
    spec = from_vllm('{"method": "eagle", "num_speculative_tokens": 3, '
                     '"model": "yuhuili/EAGLE-LLaMA3-Instruct-8B"}', ("0.7", None))
    return simulate(model, hw, reqs, engine=EngineConfig(speculative=spec))
