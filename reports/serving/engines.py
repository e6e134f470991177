"""Writes reports/serving/engines.md: the three engines' schedulers where their rules differ,
conversations against single-shot requests, and routers across replicas.

    python reports/serving/engines.py

Shipped specs and each engine's defaults; nothing fitted. The scheduler goldens (which
requests run in which step, derived by hand from each engine's source) are tests:
``pytest tests/test_serving_engines.py``.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import perfmodel as pm
from perfmodel.serving import sessions, traffic
from perfmodel.serving.engines import engine_config
from perfmodel.serving.simulate import simulate
from perfmodel.specs.workload import Parallelism

HERE = Path(__file__).parent
MODEL = pm.model("llama-3-8b")
ENGINES = (("vLLM 0.24 (v1)", "vllm", {}), ("SGLang 0.5.14", "sglang", {}),
           ("TensorRT-LLM GUARANTEED_NO_EVICT", "trtllm", {}),
           ("TensorRT-LLM MAX_UTILIZATION", "trtllm",
            {"capacity_scheduler_policy": "MAX_UTILIZATION"}))


def _table(head: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head),
            *("| " + " | ".join(r) + " |" for r in rows), ""]


def _ms(x: float) -> str:
    return f"{x * 1e3:.1f}"


def engines_overloaded() -> list[str]:
    hw = pm.hardware("l40s")
    reqs = traffic.generate(1500, rate=12, input_len=1024, output_len=512,
                            length_dist="lognormal", seed=0)
    rows = []
    for label, name, flags in ENGINES:
        res = simulate(MODEL, hw, reqs, engine=engine_config(name, **flags))
        s = res.summary()
        rows.append([label, f"{res.kv_blocks_total * res.info['engine'].block_size:,}",
                     str(s["preemptions"]), str(s["peak_running"]),
                     f"{s['ttft_s']['p50']:.2f}", f"{s['ttft_s']['p99']:.2f}",
                     _ms(s["tpot_s"]["p50"]), f"{s['throughput_tokens_per_s']:,.0f}"])
    return ["## An overloaded trace: preemption", "",
            "Llama-3-8B on one L40S (48 GB: a small KV pool), 1,500 requests at 12/s, "
            "log-normal lengths (mean 1,024 prompt / 512 output). Each engine with its own "
            "defaults, pool rule included.", "",
            *_table(["engine", "KV tokens", "preemptions", "peak running", "p50 TTFT s",
                     "p99 TTFT s", "p50 TPOT ms", "output tok/s"], rows),
            "vLLM admits while blocks are free and preempts (recomputes) the newest request "
            "when a decode needs a block; TensorRT-LLM's GUARANTEED_NO_EVICT admits only what "
            "can run to completion (prompt plus every output token), so it never preempts "
            "and runs fewer at once; MAX_UTILIZATION admits on the next step's blocks and "
            "pauses the last started; SGLang reserves each running request's remaining "
            "output x new_token_ratio (0.7, decaying) at admission and retracts the request "
            "with fewest outputs when a decode runs short.", ""]


def engines_prefix() -> list[str]:
    hw = pm.hardware("h100-sxm")
    reqs = traffic.generate(800, rate=8, input_len=300, output_len=64, shared_prefix=2000,
                            seed=1)
    rows = []
    for label, name, flags in ENGINES[:3]:
        s = simulate(MODEL, hw, reqs, engine=engine_config(name, **flags)).summary()
        rows.append([label, f"{s['prefix_hit_rate']:.1%}", _ms(s["ttft_s"]["mean"]),
                     _ms(s["ttft_s"]["p99"])])
    return ["## A shared-prefix trace", "",
            "Llama-3-8B on one H100 SXM, 800 requests at 8/s, a 2,000-token system prompt "
            "shared by all and 300 tokens of each one's own, 64 output tokens.", "",
            *_table(["engine", "prefix hit rate", "mean TTFT ms", "p99 TTFT ms"], rows),
            "The cache's granularity decides the hit: SGLang's radix tree matches tokens "
            "(page size 1: all 2,000), vLLM full 16-token blocks (all 2,000: 125 blocks), "
            "TensorRT-LLM full 32-token blocks (1,984); TensorRT-LLM also holds a new request "
            "back a step when an earlier one in the batch is computing the block it would "
            "reuse.", ""]


def conversations() -> list[str]:
    hw = pm.hardware("h100-sxm")
    reqs = traffic.generate(2000, rate=8, input_len=512, output_len=128, turns=5,
                            think_time=20.0, turn_growth=128, length_dist="lognormal",
                            seed=2)
    talk = simulate(MODEL, hw, reqs)
    multi = talk.summary()
    single = simulate(MODEL, hw, sessions.single_shot(reqs, talk.arrival_s)).summary()
    later = reqs.turn > 1
    share = float(reqs.prefix_tokens[later].sum() / reqs.input_tokens[later].sum())
    rows = [[name, f"{s['prefix_hit_rate']:.1%}", _ms(s["ttft_s"]["mean"]),
             _ms(s["ttft_s"]["p50"]), _ms(s["ttft_s"]["p99"])]
            for name, s in (("5-turn conversations", multi), ("single-shot, same lengths",
                                                              single))]
    return ["## Conversations against single-shot requests", "",
            "Llama-3-8B on one H100 SXM (vLLM), 400 conversations of 5 turns starting at "
            "1.6/s, each later turn sent 20 s after the client has the previous answer's "
            "last token; the first prompt log-normal around "
            "512 tokens, each later turn adding the last answer (log-normal around 128) and "
            f"a new message of about 128 tokens. A later turn's prompt is {share:.0%} "
            "conversation so far. The single-shot trace has the same lengths, sent at the "
            "times the conversations' turns were, with no sessions.", "",
            *_table(["trace", "prefix hit rate", "mean TTFT ms", "p50 TTFT ms",
                     "p99 TTFT ms"], rows),
            f"TTFT falls {single['ttft_s']['mean'] / multi['ttft_s']['mean']:.2f}x on the "
            "mean: a later turn's prefill computes only its new message (and the previous "
            "answer's last partial block), since the finished turn's KV stays cached as the "
            "session's chain and nothing evicts it at this load; the first turns (a fifth of "
            "the requests) save nothing.", ""]


def routers() -> list[str]:
    hw = pm.hardware("h100-sxm")
    plan = Parallelism(dp=4)
    bursty = traffic.generate(3000, rate=100, input_len=512, output_len=256,
                              arrival="gamma", burstiness=0.2, length_dist="lognormal",
                              seed=3)
    rows = []
    for router in ("round-robin", "least-requests", "least-tokens", "power-of-two",
                   "queue-kv"):
        start = time.time()
        s = simulate(MODEL, hw, bursty, plan, router=router).summary()
        rows.append([router, f"{s['ttft_s']['p50']:.3f}", f"{s['ttft_s']['p99']:.3f}",
                     _ms(s["tpot_s"]["p99"]), f"{time.time() - start:.0f}"])
    talk = traffic.generate(2000, rate=8, input_len=512, output_len=128, turns=5,
                            think_time=20.0, turn_growth=128, seed=4)
    hits = []
    for router in ("round-robin", "session-affinity"):
        s = simulate(MODEL, hw, talk, plan, router=router).summary()
        hits.append([router, f"{s['prefix_hit_rate']:.1%}", _ms(s["ttft_s"]["mean"])])
    return ["## Routers across replicas", "",
            "Llama-3-8B, 4 replicas of one H100 SXM each (vLLM). A bursty trace: 3,000 "
            "requests at 100/s (about 75% of the four replicas' capacity), gamma gaps of "
            "burstiness 0.2, log-normal lengths (mean 512 / 256).", "",
            *_table(["router", "p50 TTFT s", "p99 TTFT s", "p99 TPOT ms", "wall s"], rows),
            "Round-robin deals a burst evenly by count, whatever each replica still holds; "
            "least-outstanding sends each arrival where the fewest requests (or tokens) are "
            "unfinished at that instant, which the simulator knows exactly by running the "
            "replicas in lockstep (every replica advanced to the arrival before the router "
            "reads them). At this load TTFT is set by the prompts waiting on a replica, and "
            "those counts are dominated by requests decoding: the replica with the fewest "
            "takes a burst's prompts one after another. power-of-two (sgl-router's and "
            "vLLM's router's, on in-flight requests) compares two replicas drawn at random, "
            "a noisier least-requests over four replicas; queue-kv (llm-d's default queue "
            "and KV-utilisation scorers) reads the waiting queue as each engine published it "
            "after its last step, so every arrival within one step sees the same queues and "
            "a burst lands on one replica (nothing counts what was routed since; SGLang's "
            "DP controller adds each dispatch to its snapshot for that reason).", "",
            "Conversations (400 of 5 turns, as above) over the 4 replicas:", "",
            *_table(["router", "prefix hit rate", "mean TTFT ms"], hits),
            "Round-robin sends a conversation's next turn to another replica three times in "
            "four, where its chain is not cached; session affinity keeps every turn where "
            "the last one left its KV. Under round-robin the replicas run apart, so a later "
            "turn is sent at its nominal time (20 s after the previous turn was sent, not "
            "after its answer: the command warns); under session affinity it follows its "
            "answer.", ""]


def main() -> None:
    start = time.time()
    parts = ["# Serving engines, conversations and routers", "",
             "Written by `python reports/serving/engines.py` (shipped specs, each engine's "
             "defaults, nothing fitted). Scheduler goldens derived by hand from each "
             "engine's source: `pytest tests/test_serving_engines.py`.", ""]
    for section in (engines_overloaded, engines_prefix, conversations, routers):
        parts += section()
        print(f"{section.__name__}: {time.time() - start:.0f} s", file=sys.stderr)
    (HERE / "engines.md").write_text("\n".join(parts))


if __name__ == "__main__":
    main()
