"""Benchmark the tool itself: estimates per second and CLI start-up time.

    python benchmarks/bench_core.py

Not a test: prints numbers for the README, which quotes this command.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time

import perfmodel as pm


def estimates_per_second(seconds: float = 3.0) -> tuple[float, int]:
    hw = [pm.hardware(n) for n in ("h100-sxm", "a100-80gb-sxm", "mi300x")]
    models = [pm.model(n) for n in ("llama-3-8b", "mixtral-8x7b", "deepseek-v3", "gemma-2-9b")]
    done, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for h in hw:
            for m in models:
                pm.estimate(h, m, pm.Workload(batch=1 + done % 64, prompt_len=1024, gen_len=256))
                done += 1
    return done / (time.perf_counter() - start), done


def cli_seconds(args: list[str], repeats: int = 5) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "perfmodel.cli", *args], check=True,
                       capture_output=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    rate, n = estimates_per_second()
    print(f"estimate(): {rate:.1f} configurations/s ({n} estimates, gen 256 -> 65 decode "
          "contexts each)")
    print(f"perfmodel estimate (CLI, median of 5): "
          f"{cli_seconds(['estimate', '-m', 'llama-2-13b', '-H', 'h100-sxm']):.3f} s")
    print(f"perfmodel --help (CLI start, median of 5): {cli_seconds(['--help']):.3f} s")


if __name__ == "__main__":
    main()
