"""The configurations whose numbers the core v2 rewrite must leave unchanged.

Every shipped model on several devices (NVIDIA, AMD, TPU, the calibrated CPU of
reports/cpu, and the A100 on the append-KV attention path), each with workloads drawn by a
seeded generator over batch 1-64, prompt 5-16,000, generate 1-2,048, TP 1-8, bf16 / fp8 /
fp4 / int4 weights (some group-quantized), bf16 / fp8 KV and CUDA graphs on and off.
Pure data: ``CONFIGS`` is a list of (model, hardware, workload fields) triples.
"""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODELS = sorted(p.stem for p in (ROOT / "perfmodel" / "models").glob("*.yaml"))
# name -> (hardware file or name, whether the A100 append-KV prefill path is switched on)
DEVICES = {
    "h100-sxm": ("h100-sxm", False),
    "a100-80gb-sxm": ("a100-80gb-sxm", False),
    "a100-append-kv": ("a100-80gb-sxm", True),
    "mi300x": ("mi300x", False),
    "tpu-v5e": ("tpu-v5e", False),
    "l4": ("l4", False),
    "b200": ("b200", False),
    "cpu-2t": (str(ROOT / "reports" / "cpu" / "hardware.yaml"), False),
}
PER_PAIR = 5


def device(name: str) -> object:
    """The hardware record of a snapshot device (the same code on the old and new core)."""
    import perfmodel as pm
    from tests.datasheet import datasheet_path

    path, append_kv = DEVICES[name]
    hw = pm.load_hardware(datasheet_path(path)) if not str(path).endswith(".yaml") \
        else pm.hardware(path)
    if append_kv:
        hw = replace(hw, efficiency=replace(hw.efficiency, attention_append_kv=True))
    return hw
SEED = 20261123


def _workload(rng: random.Random, device: str) -> dict:
    cpu = device == "cpu-2t"
    return {
        "batch": rng.choice([1, 1, 2, 3, 8, 16, 17, 32, 64]),
        "prompt_len": rng.choice([5, 31, 128, 500, 1024, 2048, 4096, 8191, 16000]),
        "gen_len": rng.choice([1, 2, 17, 64, 66, 67, 128, 256, 1000, 2048]),
        "weights_dtype": "fp32" if cpu else rng.choice(["bf16", "bf16", "fp8", "fp4", "int4"]),
        "act_dtype": "fp32" if cpu else "bf16",
        "kv_dtype": "fp32" if cpu else rng.choice(["bf16", "fp8"]),
        "weight_group_size": None if cpu else rng.choice([None, None, 64, 128]),
        "tp": 1 if cpu else rng.choice([1, 1, 2, 4, 8]),
        "cuda_graphs": rng.choice([False, True]),
    }


def configs() -> list[tuple[str, str, dict]]:
    rng = random.Random(SEED)
    out = []
    for model in MODELS:
        for device in DEVICES:
            for _ in range(PER_PAIR):
                out.append((model, device, _workload(rng, device)))
    return out


def with_operators(index: int) -> bool:
    """Every third configuration also keeps its per-operator breakdown."""
    return index % 3 == 0


OP_DEVICES = ("h100-sxm", "a100-80gb-sxm", "a100-append-kv", "mi300x", "l4", "cpu-2t")
ELEMENTWISE = ("rms_norm", "layer_norm", "add", "softmax", "silu_and_mul", "gelu_and_mul",
               "gelu", "rotary", "embedding", "kv_cache_write")


def op_rows(count: int = 400) -> list[dict]:
    """Seeded measurement-schema rows (no measurements) of every op kind ``compare`` reads."""
    rng = random.Random(SEED + 1)
    rows = []
    for i in range(count):
        dtype = rng.choice(["bf16", "fp16", "fp8", "fp32"])
        timing = rng.choice(["kernel", "stream", "host"])
        pick = i % 3
        if pick == 0:
            row = {"op": "gemm", "m": rng.choice([1, 2, 7, 16, 64, 100, 512, 2048, 8192]),
                   "n": rng.choice([128, 576, 1024, 4096, 5120, 14336, 128256]),
                   "k": rng.choice([64, 512, 1024, 4096, 8192, 28672])}
        elif pick == 1:
            heads = rng.choice([8, 32, 40, 64, 128])
            q = rng.choice([1, 1, 1, 7, 64, 500, 2048])
            row = {"op": "attention", "batch": rng.choice([1, 2, 5, 16, 64, 256]),
                   "q_len": q, "kv_len": q + rng.choice([0, 1, 100, 1000, 8000]),
                   "n_heads": heads,
                   "n_kv_heads": rng.choice([h for h in (1, 2, 4, 8, heads) if heads % h == 0]),
                   "head_dim": rng.choice([64, 128, 256])}
        else:
            row = {"op": rng.choice(ELEMENTWISE), "m": rng.choice([1, 3, 64, 1000, 16384]),
                   "n": rng.choice([64, 4096, 5120, 14336])}
        rows.append(row | {"dtype": dtype, "timing": timing})
    return rows
