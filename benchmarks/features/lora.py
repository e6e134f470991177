"""LoRA adapters: each request names one of 16 adapters (Zipf popularity, exponent 1), vLLM
with --enable-lora --max-loras 4 --max-lora-rank 16 --max-cpu-loras 16: the adapter kernels
priced on every step, the scheduler's limit on distinct adapters, LRU loads over PCIe."""

from perfmodel.serving.engines.lora import LoraSettings, assign
from perfmodel.serving.engines.vllm import EngineConfig
from perfmodel.serving.simulate import simulate

LABEL = "lora (16 adapters, 4 slots)"


def run(reqs, model, hw):
    engine = EngineConfig(lora=LoraSettings(max_loras=4, max_lora_rank=16, max_cpu_loras=16))
    return simulate(model, hw, assign(reqs, 16, "zipf", 1.0, seed=0), engine=engine)
