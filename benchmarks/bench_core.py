"""Benchmark the tool itself: configurations per second, one estimate, CLI answers.

    python benchmarks/bench_core.py [--quick]
    python benchmarks/bench_core.py --sweep-memory     # the 10^6-point sweep's peak memory
    python benchmarks/bench_core.py --moe              # the MoE cases only

Not a test: prints the numbers docs/speed.md quotes. Every measurement is Llama-3-70B on an
H100 SXM, 2,048-token prompts and 256 generated tokens (255 decode steps summed exactly),
unless said otherwise. Times are medians of repeats; on a shared 2-core machine they move
by 10-30% between runs.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import perfmodel as pm

ROOT = Path(__file__).resolve().parents[1]


def _median(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def grid_rate(n_batch: int, repeats: int) -> tuple[float, int]:
    """Configurations per second of one vectorised ``estimate_many`` call."""
    hw, model = pm.hardware("h100-sxm"), pm.model("llama-3-70b")
    grid = pm.Workloads.grid(weights_dtype=["bf16", "fp8"], kv_dtype=["bf16", "fp8"],
                             cuda_graphs=[False, True], batch=list(range(1, n_batch + 1)),
                             prompt_len=2048, gen_len=256)
    seconds = _median(lambda: pm.estimate_many(hw, model, grid), repeats)
    return len(grid) / seconds, len(grid)


def single_estimate(seconds: float = 3.0) -> float:
    """Seconds per ``estimate()`` call, the batch cycling over 1..64 (steady state)."""
    hw, model = pm.hardware("h100-sxm"), pm.model("llama-3-70b")
    for b in range(1, 65):          # warm: per-device tables and per-shape caches filled
        pm.estimate(hw, model, pm.Workload(batch=b, prompt_len=2048, gen_len=256))
    done, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        pm.estimate(hw, model, pm.Workload(batch=1 + done % 64, prompt_len=2048, gen_len=256))
        done += 1
    return (time.perf_counter() - start) / done


MOE_CASES = (  # label, model, device, tensor parallel
    ("DeepSeek-V3, 8x H200 (TP8)", "deepseek-v3", "h200-sxm", 8),
    ("Qwen3-30B-A3B, 1x H100", "qwen3-30b-a3b", "h100-sxm", 1),
)


def moe_estimate(name: str, device: str, tp: int, seconds: float) -> float:
    """Seconds per ``estimate()`` call of an MoE model (the checkpoint's own dtypes), the
    batch cycling over 1..64, 2048/256, as ``single_estimate``."""
    from perfmodel.specs.workload import Parallelism

    hw, model, plan = pm.hardware(device), pm.model(name), Parallelism(tp=tp)

    def one(b: int) -> None:
        pm.estimate(hw, model, pm.Workload(batch=b, prompt_len=2048, gen_len=256), plan)

    for b in range(1, 65):
        one(b)
    done, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        one(1 + done % 64)
        done += 1
    return (time.perf_counter() - start) / done


def moe_grid_rate(repeats: int) -> tuple[float, int]:
    """Configurations per second of ``estimate_many`` on Qwen3-30B-A3B (one H100), 2,000
    batches x bf16/fp8 weights and KV."""
    hw, model = pm.hardware("h100-sxm"), pm.model("qwen3-30b-a3b")
    grid = pm.Workloads.grid(weights_dtype=["bf16", "fp8"], kv_dtype=["bf16", "fp8"],
                             batch=list(range(1, 2001)), prompt_len=2048, gen_len=256)
    seconds = _median(lambda: pm.estimate_many(hw, model, grid), repeats)
    return len(grid) / seconds, len(grid)


def moe(quick: bool) -> None:
    """The MoE cases (issue 32: MoE estimates no slower than twice the tree before it)."""
    for label, name, device, tp in MOE_CASES:
        ms = moe_estimate(name, device, tp, 1.0 if quick else 3.0) * 1e3
        print(f"estimate() MoE, {label}: {ms:.2f} ms per configuration")
    rate, n = moe_grid_rate(3 if quick else 5)
    print(f"estimate_many MoE, Qwen3-30B-A3B 1x H100: {rate:,.0f} configurations/s "
          f"({n:,} per call)")


def cli_seconds(args: list[str], repeats: int) -> float:
    """Median wall time of ``perfmodel ARGS`` (the installed console script)."""
    command = [str(Path(sys.executable).with_name("perfmodel")), *args]
    return _median(lambda: subprocess.run(command, check=True, capture_output=True, cwd=ROOT),
                   repeats)


def startup_ratio(repeats: int) -> tuple[float, float, float, float]:
    """Median wall times, then CPU times (user + system: steadier on a shared machine), of
    ``python -m perfmodel.cli estimate -m llama-2-13b -H h100-sxm`` and of ``python -c
    "import numpy"``, run alternately (the machine's load moves both alike). Both read
    bytecode, as after a ``pip install``: a private pycache (one warm-up run each fills it),
    whatever PYTHONDONTWRITEBYTECODE says."""
    estimate = [sys.executable, "-m", "perfmodel.cli", "estimate", "-m", "llama-2-13b",
                "-H", "h100-sxm"]
    numpy = [sys.executable, "-c", "import numpy"]
    with tempfile.TemporaryDirectory() as cache:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        env |= {"PYTHONPYCACHEPREFIX": cache, "PYTHONPATH": str(ROOT)}
        wall: dict[int, list[float]] = {0: [], 1: []}
        cpu: dict[int, list[float]] = {0: [], 1: []}
        for i in range(repeats + 1):
            for j, command in enumerate((estimate, numpy)):
                before, start = _child_cpu(), time.perf_counter()
                subprocess.run(command, check=True, capture_output=True, cwd=ROOT, env=env)
                if i:                     # the first round fills the cache
                    wall[j].append(time.perf_counter() - start)
                    cpu[j].append(_child_cpu() - before)
    return (statistics.median(wall[0]), statistics.median(wall[1]),
            statistics.median(cpu[0]), statistics.median(cpu[1]))


def _child_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def sweep_args(out: str) -> list[str]:
    """100,000 configurations: 500 batches x 25 prompts x 2 weight x 2 KV dtypes x 2 GPUs."""
    batches = ",".join(str(b) for b in range(1, 501))
    prompts = ",".join(str(128 * i) for i in range(1, 26))
    return ["sweep", "-m", "llama-3-70b", "-H", "h100-sxm,h200-sxm", "--batch", batches,
            "--context", prompts, "--weights-dtype", "bf16,fp8", "--kv-dtype", "bf16,fp8",
            "--gen", "256", "--no-figures", "--out", out]


def million_sweep_args(out: str) -> list[str]:
    """10^6 configurations: 1,000 batches x 125 prompts x 2 weight x 2 KV dtypes x 2 GPUs."""
    batches = ",".join(str(b) for b in range(1, 1001))
    prompts = ",".join(str(128 * i) for i in range(1, 126))
    return ["sweep", "-m", "llama-3-70b", "-H", "h100-sxm,h200-sxm", "--batch", batches,
            "--context", prompts, "--weights-dtype", "bf16,fp8", "--kv-dtype", "bf16,fp8",
            "--gen", "256", "--no-figures", "--out", out]


def million_sweep() -> tuple[float, float, float]:
    """(peak resident GB, CPU s, wall s) of ``python -m perfmodel.cli sweep`` over 10^6
    configurations, in a child process of its own (its peak is the children's maximum:
    the only child so far)."""
    with tempfile.TemporaryDirectory() as out:
        before, start = _child_cpu(), time.perf_counter()
        subprocess.run([sys.executable, "-m", "perfmodel.cli", *million_sweep_args(out)],
                       check=True, capture_output=True, cwd=ROOT,
                       env=os.environ | {"PYTHONPATH": str(ROOT)})
        wall = time.perf_counter() - start
    peak_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return peak_kb / 1e6, _child_cpu() - before, wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats")
    parser.add_argument("--moe", action="store_true", help="only the MoE cases")
    parser.add_argument("--sweep-memory", action="store_true", help=(
        "only the 10^6-point sweep's peak memory (minutes; run it alone: the peak is the "
        "largest child process's)"))
    args = parser.parse_args()
    if args.sweep_memory:
        peak, cpu, wall = million_sweep()
        print(f"perfmodel sweep --no-figures, 10^6 configurations: peak {peak:.2f} GB "
              f"resident, {cpu:.0f} s CPU, {wall:.0f} s wall")
        return
    quick = args.quick
    if args.moe:
        moe(quick)
        return
    reps = 3 if quick else 5
    rate, n = grid_rate(12_500, 3 if quick else 5)
    print(f"estimate_many: {rate:,.0f} configurations/s ({n:,} configurations per call, "
          f"2048/256, every decode step summed exactly)")
    print(f"estimate(): {single_estimate(1.0 if quick else 3.0) * 1e3:.2f} ms per "
          "configuration (in process, batch cycling 1..64)")
    estimate = ["estimate", "-m", "llama-3-70b", "-H", "h100-sxm", "--prompt", "2048",
                "--gen", "256"]
    print(f"perfmodel estimate (CLI wall, median of {reps}): "
          f"{cli_seconds(estimate, reps):.3f} s")
    est, numpy, est_cpu, numpy_cpu = startup_ratio(5 if quick else 15)
    print(f"estimate CLI against python -c 'import numpy' (median of {5 if quick else 15}): "
          f"wall {est:.3f} s / {numpy:.3f} s = {est / numpy:.2f}x, CPU {est_cpu:.3f} s / "
          f"{numpy_cpu:.3f} s = {est_cpu / numpy_cpu:.2f}x (target < 2x)")
    print(f"perfmodel --help (CLI start, median of {reps}): {cli_seconds(['--help'], reps):.3f} s")
    with tempfile.TemporaryDirectory() as out:
        wall = cli_seconds(sweep_args(out), 1 if quick else 3)
        rows = sum(1 for _ in (Path(out) / "sweep.csv").open()) - 1
    print(f"perfmodel sweep --no-figures: {rows:,} configurations, CSV written in {wall:.1f} s")


if __name__ == "__main__":
    main()
