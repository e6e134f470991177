"""Benchmark the serving simulator: simulated requests and engine steps per second of wall
time, and what priced them (steps priced ahead per ``price_step`` call, steps priced but not
kept).

    python benchmarks/bench_serving.py [--quick] [--fleet N] [--scale N,N,...] [--band] [--moe]

Not a test: prints the numbers docs/speed.md quotes. The headline case is the issue's: 10,000
requests of mixed lengths (log-normal, mean 512 prompt / 256 output tokens, sigma 0.5) on
Llama-3-8B on one H100 SXM, Poisson arrivals near saturation (the simulated engine serves
about 34 requests/s). The same 10,000 requests under SGLang's and TensorRT-LLM's schedulers
follow. ``--fleet N``: N requests (10^6 in docs/speed.md) over 16 round-robin replicas at half
their capacity, timed with one worker process and with every local core. ``--scale``:
one replica at half load for each trace length, the CPU time per request (flat: a
look-ahead's cost follows the requests in flight, not the trace's length). ``--band``: each
case also with its 80% band as ``simulate`` draws it (``serving.bands.edge_summaries``: the
edges on a twelfth of the run) and as it did before (two more whole runs). On a shared
2-core machine wall times move by 10-30% between runs, CPU times less. ``--moe``: the MoE
cases only (``MOE_CASES``: Qwen3-30B-A3B on one H100, Qwen3-235B-A22B and DeepSeek-V3 on
8 H200s at TP8).
"""

from __future__ import annotations

import argparse
import os
import time

import perfmodel as pm
from perfmodel.serving import traffic
from perfmodel.serving.engines import engine_config
from perfmodel.serving.simulate import simulate
from perfmodel.specs.workload import Parallelism

CASES = (  # label, model, requests, rate, input, output, dist, engine
    ("10k mixed, near saturation", "llama-3-8b", 10_000, 34.0, 512, 256, "lognormal", {}),
    ("10k mixed, half load", "llama-3-8b", 10_000, 17.0, 512, 256, "lognormal", {}),
    ("10k mixed, overload x1.5", "llama-3-8b", 10_000, 51.0, 512, 256, "lognormal", {}),
    ("2k static batching", "llama-3-8b", 2_000, 20.0, 512, 256, "lognormal",
     {"scheduler": "static", "max_num_seqs": 64}),
    ("10k mixed, sglang", "llama-3-8b", 10_000, 34.0, 512, 256, "lognormal",
     {"name": "sglang"}),
    ("10k mixed, trtllm", "llama-3-8b", 10_000, 34.0, 512, 256, "lognormal",
     {"name": "trtllm"}),
)

MOE_CASES = (  # label, model, requests, rate, input, output, dist, engine, device, tp
    ("5k mixed, Qwen3-30B-A3B", "qwen3-30b-a3b", 5_000, 20.0, 512, 256, "lognormal", {},
     "h100-sxm", 1),
    ("2k mixed, Qwen3-235B-A22B TP8", "qwen3-235b-a22b", 2_000, 8.0, 1024, 256, "lognormal",
     {}, "h200-sxm", 8),
    ("2k mixed, DeepSeek-V3 TP8", "deepseek-v3", 2_000, 8.0, 1024, 256, "lognormal", {},
     "h200-sxm", 8),
)


def run(label: str, name: str, n: int, rate: float, inp: int, out: int, dist: str,
        engine: dict, device: str = "h100-sxm", tp: int = 1) -> object:
    reqs = traffic.generate(n, rate=rate, input_len=inp, output_len=out, length_dist=dist,
                            seed=0)
    model, hw = pm.model(name), pm.hardware(device)
    start, cpu = time.perf_counter(), _cpu()
    flags = dict(engine)
    res = simulate(model, hw, reqs, Parallelism(tp=tp),
                   engine=engine_config(flags.pop("name", "vllm"), **flags))
    wall, cpu = time.perf_counter() - start, _cpu() - cpu
    steps = len(res.steps.start_s)
    priced, calls = res.info["steps_priced"], res.info["price_calls"]
    print(f"{label:28s} {wall:6.2f} s ({cpu:6.2f} s CPU)  {n / wall:8.0f} requests/s  "
          f"{steps / wall:8.0f} steps/s  ({steps:,} steps; {priced / calls:.1f} priced per "
          f"call, {(priced - steps) / priced * 100:.0f}% discarded)", flush=True)
    return res


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="the headline case only")
    parser.add_argument("--fleet", type=int, default=0, help="requests over 16 replicas")
    parser.add_argument("--scale", default="", help="trace lengths, one replica at half load")
    parser.add_argument("--band", action="store_true", help="also time the 80%% band")
    parser.add_argument("--moe", action="store_true", help="the MoE cases only")
    args = parser.parse_args()
    if args.fleet:
        fleet(args.fleet)
        return
    if args.scale:
        for n in (int(x) for x in args.scale.split(",")):
            scale(n)
        return
    for case in MOE_CASES if args.moe else CASES[:1] if args.quick else CASES:
        res = run(*case)
        if args.band:
            band(case, res)


def band(case: tuple, res: object) -> None:
    """The band of ``case`` (already run at the centre as ``res``): on the sample, then
    the two whole edge runs the band took before."""
    from perfmodel.serving.bands import edge_summaries

    _, name, n, rate, inp, out, dist, engine, *where = case
    device, tp = where or ("h100-sxm", 1)
    reqs = traffic.generate(n, rate=rate, input_len=inp, output_len=out, length_dist=dist,
                            seed=0)
    model, hw = pm.model(name), pm.hardware(device)
    flags = dict(engine)
    cfg = engine_config(flags.pop("name", "vllm"), **flags)

    def at(q: object, edge: int) -> object:
        return simulate(model, hw, q, Parallelism(tp=tp), engine=cfg, edge=edge)

    for how, fn in (("sample", lambda: edge_summaries(reqs, res, at)),
                    ("two whole runs", lambda: (at(reqs, 0).summary(),
                                                at(reqs, 1).summary()))):
        start, cpu = time.perf_counter(), _cpu()
        low, high = fn()
        wall, cpu = time.perf_counter() - start, _cpu() - cpu
        print(f"{'  + band, ' + how:28s} {wall:6.2f} s ({cpu:6.2f} s CPU) more; E2E median "
              f"{low['e2e_s']['p50']:.2f}-{high['e2e_s']['p50']:.2f} s, TTFT median "
              f"{low['ttft_s']['p50'] * 1e3:.0f}-{high['ttft_s']['p50'] * 1e3:.0f} ms",
              flush=True)


def fleet(n: int, replicas: int = 16) -> None:
    """``n`` requests over ``replicas`` round-robin replicas at 17 req/s each, timed with one
    worker and with every core (replicas share no state: ``serving.simulate.run_replicas``)."""
    reqs = traffic.generate(n, rate=17.0 * replicas, input_len=512, output_len=256,
                            length_dist="lognormal", seed=0)
    model, hw = pm.model("llama-3-8b"), pm.hardware("h100-sxm")
    for workers in sorted({1, os.cpu_count() or 1}):
        start, cpu = time.perf_counter(), _cpu()
        res = simulate(model, hw, reqs, Parallelism(dp=replicas), workers=workers)
        wall, cpu = time.perf_counter() - start, _cpu() - cpu
        print(f"{n:,} requests, {replicas} replicas, {workers} worker(s): {wall:7.1f} s "
              f"({n / wall:,.0f} requests/s, {n / wall / replicas:,.0f} per replica; "
              f"{cpu:,.0f} s CPU, {cpu / n * 1e3:.2f} ms per request; "
              f"{res.info['steps_priced']:,} steps priced "
              f"in {res.info['price_calls']:,} calls; simulated {res.duration_s:,.0f} s)",
              flush=True)


def scale(n: int) -> None:
    """``n`` requests on one replica at half load (17 req/s): CPU seconds per request."""
    reqs = traffic.generate(n, rate=17.0, input_len=512, output_len=256,
                            length_dist="lognormal", seed=0)
    model, hw = pm.model("llama-3-8b"), pm.hardware("h100-sxm")
    start, cpu = time.perf_counter(), _cpu()
    res = simulate(model, hw, reqs)
    wall, cpu = time.perf_counter() - start, _cpu() - cpu
    steps, priced = len(res.steps.start_s), res.info["steps_priced"]
    print(f"{n:>9,} requests, one replica at half load: {wall:7.1f} s wall, {cpu:7.1f} s CPU, "
          f"{cpu / n * 1e3:.3f} ms CPU per request ({steps:,} steps, "
          f"{(priced - steps) / priced * 100:.0f}% of those priced discarded)", flush=True)


def _cpu() -> float:
    """CPU seconds of this process and its finished worker processes."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


if __name__ == "__main__":
    main()
