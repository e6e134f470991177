"""Long work off the request thread: a simulation (in a worker thread, its progress from the
simulator's own callback, cancelled at the next callback) and a plan (``perfmodel plan
--format json`` in a child process: its exact output, killed on cancel). The page polls a
job by id.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from perfmodel.specs.errors import SpecError
from perfmodel.ui.options import Uploads, arguments, line, parse

CDF_POINTS = 200          # points per latency CDF sent to the page
SERIES_POINTS = 400       # points per time series
KEEP_JOBS = 32


class Cancelled(Exception):
    """The page cancelled the job."""


class Job:
    def __init__(self, kind: str) -> None:
        self.id = uuid.uuid4().hex[:12]
        self.kind = kind
        self.state = "running"            # running | done | error | cancelled
        self.done = 0
        self.total = 0
        self.started = time.monotonic()
        self.result: dict | None = None
        self.error: str | None = None
        self.cancel = threading.Event()
        self.proc: subprocess.Popen | None = None

    def view(self) -> dict[str, Any]:
        return {"id": self.id, "kind": self.kind, "state": self.state, "done": self.done,
                "total": self.total, "elapsed_s": time.monotonic() - self.started,
                "result": self.result, "error": self.error}


class Jobs:
    def __init__(self, uploads: Uploads) -> None:
        self.uploads = uploads
        self._jobs: dict[str, Job] = {}
        self._lock = threading.Lock()

    def start(self, kind: str, work: Callable[[Job], dict]) -> Job:
        job = Job(kind)
        with self._lock:
            self._jobs[job.id] = job
            for old in list(self._jobs)[:-KEEP_JOBS]:
                self._jobs.pop(old)

        def run() -> None:
            try:
                job.result = work(job)
                job.state = "cancelled" if job.cancel.is_set() else "done"
            except Cancelled:
                job.state = "cancelled"
            except SpecError as exc:
                job.error, job.state = self.uploads.shown(str(exc)), "error"
            except Exception as exc:   # the server keeps serving whatever a job does
                job.error = f"internal error: {type(exc).__name__}: {exc}".splitlines()[0]
                job.state = "error"

        threading.Thread(target=run, name=f"perfmodel-ui-{kind}", daemon=True).start()
        return job

    def get(self, job_id: str) -> Job:
        with self._lock:
            job = self._jobs.get(job_id)
        if job is None:
            raise SpecError(f"job {job_id}: no such job")
        return job

    def cancel(self, job_id: str) -> Job:
        job = self.get(job_id)
        job.cancel.set()
        if job.proc is not None and job.proc.poll() is None:
            job.proc.terminate()
        return job

    def close(self) -> None:
        with self._lock:
            jobs = list(self._jobs.values())
        for job in jobs:
            job.cancel.set()
            if job.proc is not None and job.proc.poll() is None:
                job.proc.kill()


def simulation(settings: dict[str, Any], uploads: Uploads) -> Callable[[Job], dict]:
    """The work of ``perfmodel simulate --format json`` with the settings (parsed now, so a
    bad setting is answered at once): its summaries (with the 80% band where the device
    has one: two more runs at the band's edges, as the CLI does), latency CDFs and time
    series."""
    from perfmodel.cli.errors import raising
    from perfmodel.cli.simulate import check_slos, inputs

    args, shown, dropped = arguments("simulate", settings, uploads)
    params = parse("simulate", [*args, "--no-progress"], uploads)
    with raising():
        check_slos(params["slo_ttft"], params["slo_tpot"])
        m, hw, wl, layout, engine, streams = inputs(params)
    command = line("simulate", shown, "--format", "json")
    edges = (0, 1) if params["band"] and hw.uncertainty is not None else ()

    def work(job: Job) -> dict:
        from perfmodel.cli.simulate import banded_summaries, edge_pair
        from perfmodel.serving.bands import sample_size
        from perfmodel.serving.simulate import simulate

        job.total = sum(len(reqs) + 2 * sample_size(len(reqs)) * bool(edges)
                        for _, reqs, _ in streams)

        def run(reqs: Any, label: str, edge: int | None) -> Any:
            before = job.done

            def tick(done: int, total: int, *_: float) -> None:
                if job.cancel.is_set():
                    raise Cancelled
                job.done = before + done

            res = simulate(m, hw, reqs, layout, engine, wl, tick, label, edge=edge,
                           router=params["router"], workers=params["workers"])
            job.done = before + len(reqs)
            return res

        runs = [(rate, run(reqs, label, None)) for rate, reqs, label in streams]
        slos = (params["slo_ttft"], params["slo_tpot"])
        pairs = [edge_pair(res, reqs, lambda q, e, label=label: run(q, label, e), *slos)
                 for (_, res), (_, reqs, label) in zip(runs, streams, strict=True)] \
            if edges else None
        summaries = banded_summaries(runs, pairs, hw, params["slo_ttft"], params["slo_tpot"])
        return {"runs": [{"rate": rate, "label": res.label, "summary": _plain(summary),
                          "cdf": {k: _cdf(getattr(res, k))
                                  for k in ("ttft_s", "tpot_s", "itl_s", "e2e_s")},
                          "series": _series(res)}
                         for (rate, res), summary in zip(runs, summaries, strict=True)],
                "command": command, "dropped": dropped,
                "slo_ttft_s": params["slo_ttft"], "slo_tpot_s": params["slo_tpot"]}

    return work


def _plain(summary: dict) -> dict:
    """The summary as ``simulate --format json`` prints it (its JSON, read back)."""
    from perfmodel.report.serving_tables import summary_json

    return json.loads(summary_json(summary))


def _cdf(values: np.ndarray) -> list[list[float]]:
    """[value, share <= value] at ``CDF_POINTS`` evenly spaced quantiles (plotting only)."""
    v = np.sort(np.asarray(values, dtype=float))
    v = v[np.isfinite(v)]
    if not len(v):
        return []
    idx = np.unique(np.linspace(0, len(v) - 1, min(CDF_POINTS, len(v))).round().astype(int))
    return [[float(v[i]), (i + 1) / len(v)] for i in idx]


def _series(res: Any) -> dict[str, list]:
    """The engine over time, every ``n``-th step (plotting only): running, waiting, KV use."""
    s = res.steps
    step = max(1, len(s.start_s) // SERIES_POINTS)
    pick = slice(None, None, step)
    return {"t": s.start_s[pick].tolist(), "running": s.seqs[pick].tolist(),
            "waiting": s.waiting[pick].tolist(),
            "kv_use": (s.kv_blocks[pick] / max(res.kv_blocks_total, 1)).tolist(),
            "step_ms": (s.time_s[pick] * 1e3).tolist()}


def planning(settings: dict[str, Any], uploads: Uploads) -> Callable[[Job], dict]:
    """The work of ``perfmodel plan --format json`` with the settings: the CLI itself in a
    child process (its exact answer; cancel kills it), parsed first here so a bad setting
    is answered at once."""
    args, shown, dropped = arguments("plan", settings, uploads)
    parse("plan", args, uploads)
    root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [root, *filter(None, [os.environ.get("PYTHONPATH")])]))

    def work(job: Job) -> dict:
        job.proc = subprocess.Popen(
            [sys.executable, "-m", "perfmodel.cli", "plan", *args, "--format", "json"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        out, err = job.proc.communicate()
        if job.cancel.is_set():
            raise Cancelled
        if job.proc.returncode != 0:
            last = [x for x in err.splitlines() if x.strip()] or ["plan failed"]
            errors = [x for x in last if x.startswith("error: ")]
            raise SpecError(uploads.shown((errors or last)[-1].removeprefix("error: ")))
        return {"plan": json.loads(out), "command": line("plan", shown),
                "warnings": [x for x in err.splitlines() if x.startswith("warning:")],
                "dropped": dropped}

    return work
