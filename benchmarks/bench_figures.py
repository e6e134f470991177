"""Benchmark the figures: render time of each figure and a 1,000-point sweep.

    python benchmarks/bench_figures.py

Not a test: prints numbers (targets: each figure under 2 s, the sweep under 5 s). Render
time is data + drawing + PNG encoding at the CLI's default resolution, median of 3, after
one warm-up render (which pays the matplotlib import, reported separately).
"""

from __future__ import annotations

import io
import statistics
import time
from collections.abc import Callable

import perfmodel as pm
from perfmodel.report import plots, sweep_plots
from perfmodel.schedules import sweep

KV_MODELS = ("llama-2-13b", "llama-3-70b", "falcon-7b", "deepseek-v3", "mistral-7b",
             "gemma-2-9b")


def seconds(fn: Callable[[], object], repeats: int = 3) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def render(build: Callable[[], object], dpi: int = 100) -> Callable[[], int]:
    def run() -> int:
        buf = io.BytesIO()
        build().savefig(buf, format="png", dpi=dpi)
        return buf.tell()
    return run


def figures() -> dict[str, Callable[[], int]]:
    h100, h200 = pm.hardware("h100-sxm"), pm.hardware("h200-sxm")
    llama = pm.model("llama-2-13b")
    kv_models = [pm.model(n) for n in KV_MODELS]
    contexts = sweep.powers_of_two(512, 131072)

    def roofline(devices: list) -> object:
        pts = [p for hw in devices for b in (1, 16, 128)
               for p in plots.roofline_points(llama, hw, pm.Workload(batch=b))]
        return plots.roofline_figure(pts, devices, "bench")

    def batch_rows() -> list[dict]:
        return sweep.rows(sweep.sweep([llama], [h100, h200], sweep.powers_of_two(1, 256),
                                      [512, 4096], weights_dtypes=["bf16", "fp8"]))

    def kv() -> object:
        return sweep_plots.kv_figure(sweep.kv_cache_table(kv_models, contexts),
                               sweep.max_batch_table(kv_models, h100, contexts))

    return {
        "roofline, 1 device, 3 batches": render(lambda: roofline([h100])),
        "roofline, 2 devices, 3 batches": render(lambda: roofline([h100, h200])),
        "latency/throughput vs batch (72 points)": render(
            lambda: sweep_plots.batch_figure(batch_rows())),
        "throughput vs latency (72 points)": render(
            lambda: sweep_plots.tradeoff_figure(batch_rows())),
        "time split vs context (6 contexts)": render(lambda: sweep_plots.time_split_figure(
            sweep.rows(sweep.sweep([llama], [h100], [16],
                                   [256, 1024, 4096, 16384, 65536, 131072])))),
        "KV cache vs context (6 models, 9 contexts)": render(kv),
    }


def sweep_1000() -> tuple[float, int]:
    """2 devices x 10 batches x 10 prompt lengths x 5 weight dtypes = 1,000 points."""
    hws = [pm.hardware("h100-sxm"), pm.hardware("h200-sxm")]
    start = time.perf_counter()
    cols = sweep.sweep([pm.model("llama-2-13b")], hws, sweep.powers_of_two(1, 512),
                       sweep.powers_of_two(128, 65536), pm.Workload(gen_len=256),
                       weights_dtypes=["bf16", "fp16", "fp8", "int8", "int4"])
    return time.perf_counter() - start, len(cols["ttft_s"])


def main() -> None:
    start = time.perf_counter()
    plots.figure_bytes(sweep_plots.kv_figure(sweep.kv_cache_table([pm.model("falcon-7b")], [1024])))
    print(f"warm-up render (imports matplotlib): {time.perf_counter() - start:.2f} s")
    for name, run in figures().items():
        print(f"{name:<45} {seconds(run):6.2f} s   (target < 2 s)")
    took, n = sweep_1000()
    print(f"{'sweep, ' + f'{n:,} points (decode summed exactly)':<45} {took:6.2f} s   "
          f"(target < 5 s; {took / n * 1e3:.3f} ms a point)")


if __name__ == "__main__":
    main()
