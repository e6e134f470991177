"""Benchmark the serving simulator: simulated requests and engine steps per second of wall
time, and what priced them (steps priced ahead per ``price_step`` call, steps priced but not
kept).

    python benchmarks/bench_serving.py [--quick]

Not a test: prints the numbers the README quotes. The headline case is the issue's: 10,000
requests of mixed lengths (log-normal, mean 512 prompt / 256 output tokens, sigma 0.5) on
Llama-3-8B on one H100 SXM, Poisson arrivals near saturation (the simulated engine serves
about 34 requests/s). On a shared 2-core machine wall times move by 10-30% between runs.
"""

from __future__ import annotations

import argparse
import time

import perfmodel as pm
from perfmodel.serving import traffic
from perfmodel.serving.config import EngineConfig
from perfmodel.serving.simulate import simulate

CASES = (  # label, model, requests, rate, input, output, dist, engine
    ("10k mixed, near saturation", "llama-3-8b", 10_000, 34.0, 512, 256, "lognormal", {}),
    ("10k mixed, half load", "llama-3-8b", 10_000, 17.0, 512, 256, "lognormal", {}),
    ("10k mixed, overload x1.5", "llama-3-8b", 10_000, 51.0, 512, 256, "lognormal", {}),
    ("2k static batching", "llama-3-8b", 2_000, 20.0, 512, 256, "lognormal",
     {"scheduler": "static", "max_num_seqs": 64}),
)


def run(label: str, name: str, n: int, rate: float, inp: int, out: int, dist: str,
        engine: dict) -> None:
    reqs = traffic.generate(n, rate=rate, input_len=inp, output_len=out, length_dist=dist,
                            seed=0)
    model, hw = pm.model(name), pm.hardware("h100-sxm")
    start = time.perf_counter()
    res = simulate(model, hw, reqs, engine=EngineConfig(**engine))
    wall = time.perf_counter() - start
    steps = len(res.steps.start_s)
    priced, calls = res.info["steps_priced"], res.info["price_calls"]
    print(f"{label:28s} {wall:6.2f} s  {n / wall:8.0f} requests/s  {steps / wall:8.0f} steps/s"
          f"  ({steps:,} steps; {priced / calls:.1f} priced per call, "
          f"{(priced - steps) / priced * 100:.0f}% discarded)")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="the headline case only")
    args = parser.parse_args()
    for case in CASES[:1] if args.quick else CASES:
        run(*case)


if __name__ == "__main__":
    main()
