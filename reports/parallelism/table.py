"""The parallelism tables: Llama-3-70B on 8 x H100 SXM at 2,048 prompt / 256 generated tokens,
batch 1 and 64 (the whole node's concurrent requests), for TP8, TP4 x 2 replicas, PP2 x TP4
and PP8; DeepSeek-V3 (fp8 weights) on 2 x 8 H200 for EP16 with data-parallel attention
against TP8 x PP2, batch 1, 64, 256 and 1,024.

    python reports/parallelism/table.py > reports/parallelism/table.md

A batch is split evenly over the replicas (batch 1 keeps one replica busy and the other
idle); throughput counts the busy replicas and is divided by all 8 GPUs.
"""

from __future__ import annotations

import math

import perfmodel as pm
from perfmodel.report.tables import markdown_table
from perfmodel.specs.units import fmt_bytes

LLAMA = (("TP8", pm.Parallelism(tp=8)), ("TP4 x 2 replicas", pm.Parallelism(tp=4, dp=2)),
         ("PP2 x TP4", pm.Parallelism(tp=4, pp=2)), ("PP8", pm.Parallelism(pp=8)))
DEEPSEEK = (("EP16, DP attention", pm.Parallelism(ep=16, attention_dp=True)),
            ("TP8 x PP2", pm.Parallelism(tp=8, pp=2)),
            ("EP8, DP attention x PP2", pm.Parallelism(ep=8, attention_dp=True, pp=2)))


def row(case: str, name: str, plan: pm.Parallelism, batch: int) -> list[str]:
    hw = pm.hardware("h100-sxm" if case == "llama" else "h200-sxm")
    model = pm.model("llama-3-70b" if case == "llama" else "deepseek-v3")
    gpus = plan.devices
    busy = min(plan.dp, batch)
    per_replica = math.ceil(batch / busy)
    weights = "bf16" if case == "llama" else "fp8"
    e = pm.estimate(hw, model, pm.Workload(batch=per_replica, prompt_len=2048, gen_len=256,
                                           weights_dtype=weights),
                    pm.Parallelism(tp=plan.tp, pp=plan.pp, ep=plan.ep, dp=busy,
                                   attention_dp=plan.attention_dp))
    bubble = sum(o.time_s for o in e.ops if o.name == "pipeline_bubble") / e.e2e_s
    mem = e.memory
    return [name, str(batch), f"{e.ttft_s * 1e3:.0f}", f"{e.tpot_s * 1e3:.2f}",
            f"{e.throughput_tokens_per_s / gpus:.1f}",
            f"{fmt_bytes(mem.weights_bytes)} + {fmt_bytes(mem.kv_cache_bytes)}",
            f"{e.communication_share:.1%}", f"{bubble:.0%}", "yes" if mem.fits else "no"]


def main() -> None:
    header = ("plan", "batch", "TTFT ms", "TPOT ms", "tok/s per GPU",
              "weights + KV per device", "communication", "bubble", "fits")
    print("Llama-3-70B, 8 x H100 SXM, bf16, prompt 2,048, 256 generated\n")
    print(markdown_table(header, [row("llama", n, p, b) for b in (1, 64) for n, p in LLAMA]))
    print("\nDeepSeek-V3, 2 x 8 H200, fp8 weights, prompt 2,048, 256 generated\n")
    print(markdown_table(header, [row("deepseek", n, p, b) for b in (1, 64, 256, 1024)
                                  for n, p in DEEPSEEK]))


if __name__ == "__main__":
    main()
