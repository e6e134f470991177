"""Time the harness's quick suite on this machine (a benchmark, not a test).

    python benchmarks/bench_harness.py [--device cpu|cuda] [--threads N] [--passes P]

Measures the quick validation suite into a temporary folder, as `perfmodel validate` does
(P passes, default the device's: 3 on CPU), and prints the wall time of the kernel rows, of
the layer/model steps, and of the whole run, plus how long `compare` takes on the largest
shared measurement file when it is present (../shared/measurements).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared" / "measurements" / "vidur-a100-layers.csv"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--passes", type=int, default=None)
    args = parser.parse_args()

    from validate.device import open_device
    from validate.records import KERNEL_COLUMNS, KERNEL_KEY, STEP_COLUMNS, STEP_KEY, MeasurementLog
    from validate.runner import default_passes, run_kernels, run_steps
    from validate.suites import validation_suite

    dev = open_device(args.device, args.threads)
    passes = args.passes or default_passes(dev)
    suite = validation_suite("quick", dev.kind)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        t0 = time.perf_counter()
        run_kernels(list(suite.kernels), dev, MeasurementLog(
            out / "m.csv", KERNEL_COLUMNS, KERNEL_KEY), "bench", progress=False, passes=passes)
        t1 = time.perf_counter()
        run_steps(list(suite.steps), dev, MeasurementLog(out / "s.csv", STEP_COLUMNS, STEP_KEY),
                  "bench", progress=False, passes=passes)
        t2 = time.perf_counter()
    print(f"device {dev.name}, {dev.threads} threads, {passes} passes")
    print(f"quick suite: {len(suite.kernels)} kernels {t1 - t0:.1f} s, "
          f"{len(suite.steps)} layer/model steps {t2 - t1:.1f} s, total {t2 - t0:.1f} s")
    if SHARED.is_file():
        import perfmodel as pm
        from perfmodel.compare import predict_rows, read_measurements

        t3 = time.perf_counter()
        rows = read_measurements(SHARED)
        predict_rows(rows, pm.hardware("a100-80gb-sxm"))
        print(f"compare {SHARED.name}: {len(rows)} rows in {time.perf_counter() - t3:.1f} s")


if __name__ == "__main__":
    main()
