"""The cost of each serving feature (issue 35): the headline case of ``bench_serving.py``
(10,000 requests of mixed lengths on Llama-3-8B on one H100 SXM near saturation) with every
feature off, then once per feature with it on, each feature's case defined in its own file
under ``benchmarks/features/`` (a ``LABEL`` and a ``run(requests, model, hw)`` that
simulates them with the feature on and returns the result, or the number of requests it
served).

    python benchmarks/bench_features.py [--only NAME,...] [-n 10000]

Not a test: prints wall and CPU seconds per case and the factor over the case with every
feature off. On a shared 2-core machine wall times move by 10-30% between runs.
"""

from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import sys
import time
from pathlib import Path

import perfmodel as pm
from perfmodel.serving import traffic
from perfmodel.serving.simulate import simulate

HERE = Path(__file__).resolve().parent


def features() -> list:
    """Every module under ``benchmarks/features/``, by name."""
    sys.path.insert(0, str(HERE))
    names = sorted(m.name for m in pkgutil.iter_modules([str(HERE / "features")]))
    return [importlib.import_module(f"features.{n}") for n in names]


def timed(fn: object) -> tuple[float, float]:
    start, cpu = time.perf_counter(), _cpu()
    fn()
    return time.perf_counter() - start, _cpu() - cpu


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", default="", help="feature module names, comma-separated")
    parser.add_argument("-n", type=int, default=10_000, help="requests")
    args = parser.parse_args()
    reqs = traffic.generate(args.n, rate=34.0, input_len=512, output_len=256,
                            length_dist="lognormal", seed=0)
    model, hw = pm.model("llama-3-8b"), pm.hardware("h100-sxm")
    base, base_cpu = timed(lambda: simulate(model, hw, reqs))
    print(f"{'every feature off':32s} {base:6.2f} s ({base_cpu:6.2f} s CPU)", flush=True)
    only = {x for x in args.only.split(",") if x}
    for mod in features():
        name = mod.__name__.split(".")[-1]
        if only and name not in only:
            continue
        wall, cpu = timed(lambda mod=mod: mod.run(reqs, model, hw))
        print(f"{mod.LABEL:32s} {wall:6.2f} s ({cpu:6.2f} s CPU)  x{wall / base:.2f} of off",
              flush=True)


def _cpu() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


if __name__ == "__main__":
    main()
