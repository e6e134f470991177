"""Benchmark the deployment planner: wall and CPU seconds of ``perfmodel plan`` in process
(the stages: candidates estimated, then the checking simulations).

    python benchmarks/bench_plan.py [--quick]

Not a test: prints the numbers docs/speed.md quotes. On a shared 2-core machine wall times
move by 10-30% (more under other load); CPU time is the steadier figure.
"""

from __future__ import annotations

import argparse
import time

CASES = (  # label, plan options
    ("70B, 3 devices, --rate 15", ["-m", "llama-3-70b", "-H", "h100-sxm,h200-sxm,b200",
                                   "--rate", "15", "--input-len", "2000", "--output-len", "300",
                                   "--slo-ttft", "1", "--slo-tpot", "0.05"]),
    ("70B, 3 devices, --gpus 8", ["-m", "llama-3-70b", "-H", "h100-sxm,h200-sxm,b200",
                                  "--gpus", "8", "--input-len", "2000", "--output-len", "300",
                                  "--slo-ttft", "1", "--slo-tpot", "0.05"]),
    ("70B, 3 devices, --gpus 64", ["-m", "llama-3-70b", "-H", "h100-sxm,h200-sxm,b200",
                                   "--gpus", "64", "--input-len", "2000", "--output-len",
                                   "300", "--slo-ttft", "1", "--slo-tpot", "0.05"]),
    ("DeepSeek-V3, H100+H200, 32 GPUs, --rate 5",
     ["-m", "deepseek-v3", "-H", "h100-sxm,h200-sxm", "--gpus", "32", "--rate", "5",
      "--input-len", "2000", "--output-len", "300", "--slo-ttft", "1", "--slo-tpot", "0.05"]),
    ("DeepSeek-V3, H100 only, 16 GPUs", ["-m", "deepseek-v3", "-H", "h100-sxm", "--gpus", "16",
                                        "--input-len", "2000", "--output-len", "300",
                                        "--slo-ttft", "1", "--slo-tpot", "0.05"]),
    ("8B, --gpus 1000", ["-m", "llama-3-8b", "-H", "h100-sxm", "--gpus", "1000",
                         "--input-len", "1000", "--output-len", "100", "--slo-ttft", "1",
                         "--slo-tpot", "0.05"]),
)


def run(label: str, args: list[str]) -> None:
    from typer.testing import CliRunner

    from perfmodel.cli.app import full_app

    wall, cpu = time.perf_counter(), time.process_time()
    r = CliRunner().invoke(full_app(), ["plan", *args])
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    chosen = next((line for line in r.stdout.splitlines() if line.startswith("chosen:")),
                  r.output.strip()[-120:])
    print(f"{label:44s} {wall:6.1f} s wall {cpu:6.1f} s CPU  {chosen}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="the first case only")
    args = parser.parse_args()
    for case in CASES[:1] if args.quick else CASES:
        run(*case)


if __name__ == "__main__":
    main()
