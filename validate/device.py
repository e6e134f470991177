"""Where a measurement runs: device selection, thread count, cache size, provenance.

The only module besides ``kernels``/``timers``/``tinymodel`` that touches torch; everything
it returns is plain Python so callers can write it into CSVs and YAML.
"""

from __future__ import annotations

import datetime
import os
import platform
import socket
import time
from dataclasses import dataclass
from pathlib import Path

import torch

_DEFAULT_LLC_BYTES = 32 * 2**20


@dataclass(frozen=True)
class DeviceInfo:
    """What the CSV's ``device``, ``device_name``, ``threads`` and ``timing`` columns say."""

    kind: str            # cpu | cuda
    name: str            # human-readable model name (CPU model or GPU name)
    threads: int         # torch intra-op threads (CPU) or 0 (CUDA)
    llc_bytes: float     # last-level cache: L3 on CPU, L2 on GPU
    compute_units: int   # cores in use (CPU) or SMs (CUDA)
    timing: str          # how launch overhead enters a measurement: host | stream

    @property
    def torch_device(self) -> torch.device:
        return torch.device("cuda" if self.kind == "cuda" else "cpu")


def cpu_model() -> str:
    """CPU model name from /proc/cpuinfo (``platform.processor()`` as a fallback)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown cpu"


def cpu_llc_bytes() -> float:
    """Largest cache level from sysfs (e.g. L3), in bytes; 32 MiB if sysfs says nothing."""
    best = 0.0
    for entry in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        text = entry.read_text().strip()
        scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
        digits = text.rstrip("KMG")
        if digits.isdigit():
            best = max(best, float(digits) * scale)
    return best or float(_DEFAULT_LLC_BYTES)


def open_device(kind: str, threads: int | None = None) -> DeviceInfo:
    """Select ``cpu`` or ``cuda``, set the torch thread count, and describe the device.

    CPU kernels run synchronously, so a wall-clock call includes the dispatch cost: timing
    ``host``. CUDA calls are timed with events around back-to-back launches: ``stream``.
    """
    if kind == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("--device cuda: torch sees no CUDA device")
        props = torch.cuda.get_device_properties(0)
        return DeviceInfo("cuda", props.name, 0, float(props.L2_cache_size),
                          props.multi_processor_count, "stream")
    if kind != "cpu":
        raise ValueError(f"--device: expected cpu or cuda, got {kind!r}")
    torch.set_num_threads(threads or os.cpu_count() or 1)
    n = torch.get_num_threads()
    return DeviceInfo("cpu", cpu_model(), n, cpu_llc_bytes(), n, "host")


def synchronize(dev: DeviceInfo) -> None:
    if dev.kind == "cuda":
        torch.cuda.synchronize()


def provenance(dev: DeviceInfo) -> dict:
    """Where and when: for the ``calibration:`` block of a hardware YAML and report headers."""
    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    return {
        "hostname": socket.gethostname(), "device": dev.kind, "device_name": dev.name,
        "cpu_model": cpu_model(), "threads": dev.threads, "torch_version": str(torch.__version__),
        "python_version": platform.python_version(),
        "measured_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "load_average_1min": round(load[0], 2),
    }


def _busy_ticks() -> tuple[int, int, int]:
    """(busy ticks of all CPUs, total ticks, this process's ticks) from /proc."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    total = sum(fields[:8])
    mine = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
    return total - idle, total, int(mine[11]) + int(mine[12])


def others_busy(interval_s: float = 0.2) -> float:
    """Fraction of all CPUs that other processes kept busy over ``interval_s`` (0..1);
    NaN where /proc is unavailable. A busy machine makes CPU timings slow and noisy."""
    try:
        b0, t0, m0 = _busy_ticks()
        time.sleep(interval_s)
        b1, t1, m1 = _busy_ticks()
    except (OSError, ValueError, IndexError):
        return float("nan")
    return max(0.0, (b1 - b0) - (m1 - m0)) / max(t1 - t0, 1)


def wait_quiet(dev: DeviceInfo, threshold: float = 0.1, max_wait_s: float = 20.0) -> float:
    """On CPU, wait (up to ``max_wait_s``) until other processes use under ``threshold`` of
    the machine; returns the last busy fraction seen (0 on CUDA)."""
    if dev.kind != "cpu":
        return 0.0
    deadline = time.monotonic() + max_wait_s
    busy = others_busy()
    while busy > threshold and time.monotonic() < deadline:
        busy = others_busy(0.5)
    return busy
