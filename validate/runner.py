"""Run a suite: build each kernel or step, time it, append the row to its CSV at once.

Configurations already in the CSVs are skipped, so an interrupted run resumes where it
stopped. Rows carry the shared schema plus ``timing`` (how launch overhead is included),
``threads`` and ``device_name``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from perfmodel.compare import row_op
from perfmodel.cost.memory import kv_elems_per_token_layer
from perfmodel.cost.params import attention_params, mlp_params
from validate import kernels
from validate.device import DeviceInfo, wait_quiet
from validate.records import (
    KERNEL_COLUMNS,
    KERNEL_KEY,
    STEP_COLUMNS,
    STEP_KEY,
    MeasurementLog,
    contended,
)
from validate.suites import Step, Suite
from validate.timers import Timing, measure, rotation_sets
from validate.tinymodel import TinyLlama

SOURCE = "perfmodel validate (validate/kernels.py, torch {version})"
KERNEL_BUDGET_S = 0.4     # seconds of samples per kernel configuration (after warm-up)
STEP_BUDGET_S = 1.5       # per layer or model step
RETRIES = 2               # re-measurements of a configuration timed on a busy machine


def _stamp(dev: DeviceInfo, label: str, t: Timing, busy: float) -> dict:
    """The measurement columns of a row (``others_busy``: share of the CPUs other processes
    used just before it was timed)."""
    return {"device": label, "source": SOURCE.format(version=torch.__version__),
            "others_busy": round(busy, 3), "tp": 1, "measured_s": t.median_s,
            "measured_std_s": t.std_s,
            "measured_min_s": t.min_s, "measured_max_s": t.max_s, "repeats": t.repeats,
            "inner": t.inner, "timing": dev.timing, "threads": dev.threads,
            "device_name": dev.name}


def measure_kernel(row: dict, dev: DeviceInfo, label: str, seed: int = 0,
                   budget_s: float | None = None) -> dict:
    """Time the kernel a schema row describes; the row with its measurement columns."""
    kernel = kernels.build(row_op(row), dev, seed=seed)
    busy = wait_quiet(dev)
    t = measure(kernel.call, dev, budget_s=budget_s or KERNEL_BUDGET_S)
    return dict(row) | _stamp(dev, label, t, busy)


def _layer_bytes(step: Step) -> float:
    """Weights and KV cache of one decoder layer of the step's model (for rotation)."""
    m, size = step.model, kernels.TORCH_DTYPES[step.dtype].itemsize
    weights = attention_params(m) + mlp_params(m, m.intermediate_size)
    cache = step.batch * step.kv_len * kv_elems_per_token_layer(m)
    return (weights + cache) * size


def step_call(step: Step, dev: DeviceInfo, seed: int = 0):  # -> Callable[[int], object]
    """``call(i)`` running one layer (rotating through copies of its weights so they exceed
    the LLC) or one whole model step, on fresh random tokens."""
    gen = torch.Generator(device=dev.torch_device).manual_seed(seed + 1)
    start = step.kv_len - step.q_len
    if step.scope == "model":
        net = TinyLlama(step.model, step.dtype, dev.torch_device, step.batch, step.kv_len, seed)
        ids = [net.random_ids(step.q_len, gen) for _ in range(4)]
        return lambda i: net.step(ids[i % len(ids)], start)
    copies = rotation_sets(_layer_bytes(step), dev.llc_bytes, max_sets=16)
    net = TinyLlama(replace(step.model, n_layers=copies), step.dtype, dev.torch_device,
                    step.batch, step.kv_len, seed)
    rows = step.batch * step.q_len
    xs = [torch.randn(rows, step.model.d_model, generator=gen, device=dev.torch_device)
          .to(net.dtype) for _ in range(2)]
    return lambda i: net.layer(net.layers[i % copies], xs[i % 2], start, step.q_len)


def measure_step(step: Step, dev: DeviceInfo, label: str, seed: int = 0,
                 budget_s: float | None = None) -> dict:
    with torch.inference_mode():
        call = step_call(step, dev, seed)
        busy = wait_quiet(dev)
        t = measure(call, dev, budget_s=budget_s or STEP_BUDGET_S, min_repeats=5)
    return step.row() | _stamp(dev, label, t, busy)


def measure_quietly(measure: Callable[..., dict], item: object, dev: DeviceInfo, label: str,
                    seed: int) -> dict:
    """``measure(item, dev, label, seed=...)``, repeated up to RETRIES times while other
    processes were busy during the measurement."""
    result = measure(item, dev, label, seed=seed)
    for _ in range(RETRIES):
        if not contended(result):
            break
        result = measure(item, dev, label, seed=seed)
    return result


def default_passes(dev: DeviceInfo) -> int:
    """Passes over a suite when none are asked for: CPU timings on a shared host drift by
    tens of per cent over seconds, GPU timings far less."""
    return 3 if dev.kind == "cpu" else 2


def _passes_log(log: MeasurementLog) -> MeasurementLog:
    """The raw per-pass CSV beside ``log`` (``measurements.passes.csv`` and so on)."""
    path = log.path.with_name(log.path.stem + ".passes" + log.path.suffix)
    return MeasurementLog(path, (*log.columns, "pass"), (*log.key_columns, "pass"))


@dataclass(frozen=True)
class _Job:
    """One list of configurations to measure into ``log``."""

    items: list
    row_of: Callable[[object], dict]
    measure: Callable[..., dict]
    log: MeasurementLog
    desc: str
    unit: str


def _run_jobs(jobs: list[_Job], dev: DeviceInfo, label: str, progress: bool,
              passes: int) -> int:
    """Measure every item whose row is not yet in its job's log; how many were run.

    With ``passes`` > 1 the missing items are measured once per pass, pass after pass and
    job after job within a pass (so that a slow spell of the host falls on one pass of a
    configuration, not on all), into each log's raw per-pass CSV; the log then gets, per
    configuration, the uncontended pass with the lowest median (interference only ever adds
    time), with ``passes`` saying of how many; when every pass was contended, the fastest of
    them, flagged by its ``others_busy`` like a single contended pass.
    """
    from tqdm import tqdm

    threads = {"threads": dev.threads}
    todo = [[it for it in j.items if not j.log.has(j.row_of(it) | threads)] for j in jobs]
    # one pass writes straight to the logs; more go to the raw CSVs, merged below
    raws = [j.log for j in jobs] if passes <= 1 else [_passes_log(j.log) for j in jobs]
    for p in range(passes):
        tag = {"passes": 1} if passes <= 1 else {"pass": p}
        for job, items, raw in zip(jobs, todo, raws, strict=True):
            left = [it for it in items if not raw.has(job.row_of(it) | threads | tag)]
            desc = job.desc if passes <= 1 else f"{job.desc} (pass {p + 1}/{passes})"
            for i, item in enumerate(tqdm(left, disable=not progress, unit=job.unit,
                                          desc=desc)):
                raw.append(measure_quietly(job.measure, item, dev, label, i) | tag)
    if passes <= 1:
        return sum(map(len, todo))
    for job, items, raw in zip(jobs, todo, raws, strict=True):
        by_config: dict[tuple, list[dict]] = {}
        for r in raw.rows:
            by_config.setdefault(job.log.key(r), []).append(r)
        for item in items:
            runs = by_config.get(job.log.key(job.row_of(item) | threads), [])
            # contended passes count only when every pass was (the row then says so, as a
            # single pass's would, and reports leave it out)
            runs = [r for r in runs if not contended(r)] or runs
            if runs:
                best = min(runs, key=lambda r: float(r["measured_s"]))
                job.log.append(best | {"passes": len(runs)})
    return sum(map(len, todo))


def _run(items: list, row_of: Callable[[object], dict], measure: Callable[..., dict],
         dev: DeviceInfo, log: MeasurementLog, label: str, progress: bool, desc: str,
         unit: str, passes: int) -> int:
    """``_run_jobs`` for one list."""
    return _run_jobs([_Job(items, row_of, measure, log, desc, unit)], dev, label, progress,
                     passes)


def run_kernels(rows: list[dict], dev: DeviceInfo, log: MeasurementLog, label: str,
                progress: bool = True, desc: str = "kernels", passes: int = 1) -> int:
    """Measure every row not yet in ``log`` (appending each at once); how many were run."""
    with torch.inference_mode():
        return _run(rows, dict, measure_kernel, dev, log, label, progress, desc, "config",
                    passes)


def run_suite(suite: Suite, dev: DeviceInfo, out: Path, label: str,
              progress: bool = True, passes: int = 1
              ) -> tuple[MeasurementLog, MeasurementLog]:
    """Measure every configuration of ``suite`` not yet in ``out``'s CSVs.

    Kernel rows go to ``out/measurements.csv``, layers and model steps to
    ``out/steps.csv``; each row is written as soon as it is measured (with ``passes`` > 1,
    into the per-pass CSVs beside them: each pass measures the kernels, then the steps).
    """
    kernel_log = MeasurementLog(out / "measurements.csv", KERNEL_COLUMNS, KERNEL_KEY)
    step_log = MeasurementLog(out / "steps.csv", STEP_COLUMNS, STEP_KEY)
    with torch.inference_mode():
        _run_jobs([_Job(list(suite.kernels), dict, measure_kernel, kernel_log,
                        f"{suite.name} suite: kernels", "config"),
                   _Job(list(suite.steps), Step.row, measure_step, step_log,
                        f"{suite.name} suite: layers and steps", "step")],
                  dev, label, progress, passes)
    return kernel_log, step_log


def run_steps(steps: list[Step], dev: DeviceInfo, log: MeasurementLog, label: str,
              progress: bool = True, desc: str = "layers and steps", passes: int = 1) -> int:
    """Measure every step not yet in ``log`` (appending each at once); how many were run."""
    return _run(steps, Step.row, measure_step, dev, log, label, progress, desc, "step", passes)
