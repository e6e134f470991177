"""Where PyTorch's CPU kernels start using a second thread (Efficiency.parallel_grain_elements).

Times the harness's own kernels (validate.kernels, rotated inputs, validate.timers) on all
of the torch threads and on one, at sizes around 32768 elements, and prints both. A kernel
that PyTorch's at::parallel_for gives a single chunk (at most at::internal::GRAIN_SIZE =
32768 elements) takes the same time either way; one element past that, the
all-thread time drops.

    python reports/cpu/parallel_grain.py > reports/cpu/parallel_grain.txt
"""

from __future__ import annotations

import torch

from perfmodel import ops
from validate.device import open_device
from validate.kernels import build
from validate.timers import measure

SIZES = (8192, 16384, 32768, 33792, 65536, 262144)
KINDS = ("add", "silu_and_mul", "kv_cache_write", "rms_norm")
WIDTH = 512


def _op(kind: str, elements: int) -> ops.Op:
    rows = elements // WIDTH
    if kind == "kv_cache_write":
        return ops.kv_cache_write(kind, rows, WIDTH, act_bytes=4, kv_bytes=4, dtype="fp32")
    return ops.elementwise(kind, kind, rows, WIDTH, act_bytes=4, dtype="fp32")


def seconds(kind: str, elements: int, threads: int) -> float:
    """Fastest of three medians of the kernel on ``threads`` threads."""
    dev = open_device("cpu", threads)
    torch.set_num_threads(threads)
    kernel = build(_op(kind, elements), dev)
    return min(measure(kernel.call, dev).median_s for _ in range(3))


def main() -> None:
    most = torch.get_num_threads()
    print(f"torch {torch.__version__}, {most} threads; fp32, rows of {WIDTH}; "
          "us per call (fastest of 3 medians)")
    print(f"{'kernel':<15} {'elements':>9} {f'{most} threads':>11} {'1 thread':>9} "
          f"{'ratio':>6}")
    # every size on all the threads first, then on one: switching the thread count back and
    # forth between measurements leaves OpenMP threads sharing a core (2.5x slower)
    configs = [(kind, elements) for kind in KINDS for elements in SIZES]
    times = {threads: [seconds(kind, elements, threads) for kind, elements in configs]
             for threads in (most, 1)}
    for (kind, elements), full, one in zip(configs, times[most], times[1], strict=True):
        print(f"{kind:<15} {elements:>9} {full * 1e6:>11.2f} {one * 1e6:>9.2f} "
              f"{full / one:>6.2f}")


if __name__ == "__main__":
    main()
