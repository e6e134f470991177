"""Replay measured serving runs through the simulator and report how wrong it is.

The input is the schema of ``../shared/measurements/serving`` (its README): an experiments
CSV (one row per run: engine settings, parallelism, workload, measured TTFT / ITL / TPOT /
E2E in ms, output throughput) and a requests CSV (every request's send time, lengths and
measured latencies). A run with request rows is replayed exactly: the requests' scheduled
send times, through a client that keeps at most the run's cap in flight when its
``arrival`` says it had one (the saturated runs fell behind their schedule because of it),
else their send times; a run without rows is regenerated from its rate and mean lengths.
Each run's engine host time is its engine's shipped profile at the run's
``engine_version`` (``serving.host_time``), behind an HTTP server unless its ``engine``
says it ran in process ("in-process" / "no HTTP"). Error = predicted / measured - 1.
Nothing here is fitted to these runs.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from perfmodel.serving import host_time
from perfmodel.serving.engines.vllm import EngineConfig
from perfmodel.serving.requests import Requests
from perfmodel.specs.errors import SpecError
from perfmodel.specs.workload import Parallelism

NAMES = Path(__file__).with_name("serving_names.yaml")
METRICS = (("ttft", "ttft_s"), ("itl", "itl_s"), ("tpot", "tpot_s"), ("e2e", "e2e_s"))
STATS = ("mean", "p50", "p90", "p99")
NEEDED = ("id", "gpu", "model", "tp", "dp", "max_num_seqs", "max_num_batched_tokens",
          "chunked_prefill", "prefix_caching", "gpu_mem_util", "arrival",
          "rate_or_concurrency", "n_requests", "input_len_mean", "output_len_mean",
          "throughput_output_tok_s")
REQUEST_COLUMNS = ("experiment_id", "arrival_s", "input_tokens", "output_tokens", "status")


@dataclass(eq=False)
class Run:
    """One measured run, ready to replay (``skip``: why it cannot be, else empty)."""

    id: str
    model: str
    hardware: str
    plan: Parallelism
    engine: EngineConfig
    requests: Requests | None
    measured: dict
    skip: str = ""
    notes: list = field(default_factory=list)
    kernels: str = "vllm"       # the engine whose kernels price it (its engine column)
    ttft_floor_s: float = float("nan")  # the run's shortest measured TTFT (its rows')
    regenerated: bool = False    # no request rows: made from the rate and mean lengths


def _names() -> dict:
    import yaml

    return yaml.safe_load(NAMES.read_text())


def _num(row: dict, column: str, kind: type = float) -> Any:
    """``row[column]`` as a number, or a ValueError naming the column."""
    value = row[column]
    try:
        number = float(value)
        if kind is int and number != int(number):
            raise ValueError
        return kind(number)
    except (TypeError, ValueError):
        raise ValueError(f"column {column!r}: {value!r} is not "
                         f"{'a whole number' if kind is int else 'a number'}") from None


def _measured(row: dict) -> dict:
    """The measured statistics in seconds; a metric with no mean (ITL of the in-process
    runs) is left out, one with a mean only keeps the mean."""
    out = {}
    for short, key in METRICS:
        values = {s: _num(row, f"{short}_{s}_ms") for s in STATS if f"{short}_{s}_ms" in row}
        given = {s: v / 1e3 for s, v in values.items() if v == v}
        if "mean" in given:
            out[key] = given if len(given) == len(STATS) else {"mean": given["mean"]}
    out["throughput_tokens_per_s"] = _num(row, "throughput_output_tok_s")
    return out


def _plan(row: dict) -> tuple[Parallelism, list]:
    tp, dp = _num(row, "tp", int), _num(row, "dp", int)
    if "expert_parallel" in str(row.get("workload", "")):
        return (Parallelism(tp=1, ep=tp * dp, attention_dp=True),
                [f"expert parallel over {tp * dp} GPUs with data-parallel attention (vLLM "
                 "--enable-expert-parallel with --data-parallel-size)"])
    return Parallelism(tp=tp, dp=dp), []


def _kernels(row: dict) -> tuple[str, list]:
    """(the engine of the run's ``engine`` column as ``specs.engines`` names it, notes):
    "vLLM (AsyncLLM ...)" is vllm; an engine not known is priced as vLLM, noted."""
    text = str(row.get("engine", "") or "").strip().lower()
    for prefix, name in (("vllm", "vllm"), ("sglang", "sglang"), ("tensorrt", "trtllm"),
                         ("trtllm", "trtllm")):
        if text.startswith(prefix):
            return name, []
    return "vllm", [f"engine {row.get('engine')!r} not known: vLLM's kernels priced"]


def _host(row: dict, kernels: str) -> tuple[host_time.HostTime, list]:
    """The shipped host-time profile of the run's engine at its version, behind its
    frontend; an engine with no profile (or no version) takes the engine's default."""
    text = str(row.get("engine", "") or "").lower()
    frontend = "in-process" if "in-process" in text or "no http" in text else "http"
    version = str(row.get("engine_version", "") or "")
    version = version if version and version != "nan" else None
    try:
        host = host_time.resolve(kernels, version, frontend=frontend)
    except SpecError:
        host = host_time.resolve(kernels, frontend=frontend)
        return host, [f"engine version {version!r} not read: {host.name} host time"]
    return host, []


def _engine(row: dict) -> EngineConfig:
    def flag(v: object) -> bool:      # "True", "True (vLLM V1 default)", 1
        return str(v).strip().lower().split(" ")[0] in ("true", "1", "yes")

    limit = row.get("max_model_len")
    limit = _num(row, "max_model_len", int) if limit == limit and limit else 0
    return EngineConfig(max_num_seqs=_num(row, "max_num_seqs", int),
                        max_model_len=limit,
                        max_num_batched_tokens=_num(row, "max_num_batched_tokens", int),
                        gpu_memory_utilization=_num(row, "gpu_mem_util"),
                        chunked_prefill=flag(row["chunked_prefill"]),
                        prefix_caching=flag(row["prefix_caching"]))


def _column(rows: Any, name: str) -> Any:
    """One numeric column of a run's request rows (a ValueError naming it)."""
    if name not in rows.columns:
        raise ValueError(f"missing column {name!r}")
    try:
        return rows[name].astype(float).to_numpy()
    except (TypeError, ValueError):
        raise ValueError(f"column {name!r}: not all numbers") from None


def _replayed(row: dict, rows: Any) -> tuple[Requests, list]:
    """The run's ``ok`` request rows, at their scheduled send times through the client's
    cap when its ``arrival`` names one, else at their send times."""
    cap = re.search(r"client cap (\d+)", str(row["arrival"]))
    ok = rows[rows["status"].astype(str).str.strip() == "ok"]
    notes = [f"{len(rows) - len(ok)} failed requests left out"] if len(ok) < len(rows) else []
    if not len(ok):
        raise ValueError("no request rows with status 'ok'")
    when = "sched_arrival_s" if cap else "arrival_s"
    ok = ok.iloc[_column(ok, when).argsort(kind="stable")]
    inputs = _column(ok, "input_tokens").astype(np.int64)
    outputs = _column(ok, "output_tokens").astype(np.int64)
    if not cap:
        return Requests.of(_column(ok, when), inputs, outputs), notes
    notes.append(f"replayed at the scheduled send times through a client of at most "
                 f"{cap.group(1)} requests in flight")
    return Requests(_column(ok, when), inputs, outputs, np.full(len(ok), -1),
                    np.zeros(len(ok), np.int64), client_cap=int(cap.group(1))), notes


def _requests(row: dict, rows: Any | None) -> tuple[Requests, list]:
    """The run's requests: its rows when there are any, else a Poisson regeneration."""
    if rows is not None and len(rows):
        return _replayed(row, rows)
    from perfmodel.serving.traffic import generate

    reqs = generate(_num(row, "n_requests", int), rate=_num(row, "rate_or_concurrency"),
                    input_len=round(_num(row, "input_len_mean")),
                    output_len=round(_num(row, "output_len_mean")), seed=0)
    return reqs, ["no request rows: regenerated from the rate and mean lengths (Poisson)"]


def _run(row: dict, names: dict, rows: Any | None, files: tuple) -> Run:
    """One experiment row (and its request rows) as a Run; a bad value is a SpecError
    naming the file, the run and the column."""
    experiments, requests = files
    try:
        plan, notes = _plan(row)
        engine, measured = _engine(row), _measured(row)
    except ValueError as exc:
        raise SpecError(f"{experiments}: run {row['id']!r}: {exc}") from None
    try:
        reqs, more = _requests(row, rows)
    except (ValueError, SpecError) as exc:
        where = requests if rows is not None and len(rows) else experiments
        raise SpecError(f"{where}: run {row['id']!r}: {exc}") from None
    model = names["models"].get(row["model"], "")
    hw = names["hardware"].get(row["gpu"], "")
    skip = "" if model and hw else \
        f"no shipped spec named for {row['model'] if not model else row['gpu']!r}"
    kernels, named = _kernels(row)
    host, why = _host(row, kernels)
    engine = replace(engine, host=host)
    floor = float("nan")
    if rows is not None and "ttft_s" in rows.columns:
        ok = rows[rows["status"].astype(str).str.strip() == "ok"]
        floor = float(np.nanmin(_column(ok, "ttft_s"))) if len(ok) else floor
    return Run(row["id"], model, hw, plan, engine, reqs, measured, skip,
               notes + more + named + why, kernels, floor, rows is None or not len(rows))


def load_runs(experiments: str | Path, requests: str | Path | None = None) -> list[Run]:
    """Every run of ``experiments`` (with its rows from ``requests`` when given)."""
    import pandas as pd

    exp = _read(experiments, pd)
    missing = [c for c in NEEDED if c not in exp.columns]
    if missing:
        raise SpecError(f"{experiments}: missing column {missing[0]!r}")
    if exp.empty:
        raise SpecError(f"{experiments}: no runs, only a header; expected one row per run")
    req = _read(requests, pd, {"request_id": str}) if requests is not None else None
    missing = [c for c in REQUEST_COLUMNS if req is not None and c not in req.columns]
    if missing:
        raise SpecError(f"{requests}: missing column {missing[0]!r}")
    groups = dict(tuple(req.groupby("experiment_id", sort=False))) if req is not None else {}
    names = _names()
    return [_run(row, names, groups.get(row["id"]), (experiments, requests))
            for row in exp.to_dict("records")]


def _read(path: str | Path, pd: object, dtype: dict | None = None) -> object:
    try:
        return pd.read_csv(path, dtype=dtype)
    except (OSError, ValueError) as exc:
        raise SpecError(f"{path}: cannot read: {exc}") from None


def replay(run: Run, progress: object = None, simulate: Callable | None = None) -> dict:
    """The simulated summary of ``run`` on its shipped specs (SpecError if one is absent).
    ``simulate``: the simulator, ``perfmodel.serving.simulate.simulate`` by default (a test
    passes a stand-in with its signature)."""
    import perfmodel as pm

    if simulate is None:
        from perfmodel.serving.simulate import simulate

    model, hw = pm.model(run.model), pm.hardware(run.hardware, engine=run.kernels)
    if hw.engine_warning and hw.engine_warning not in run.notes:
        run.notes.append(hw.engine_warning)
    return simulate(model, hw, run.requests, run.plan, run.engine, progress=progress,
                    label=run.id).summary()


def errors(predicted: dict, measured: dict) -> dict:
    """Signed relative error of every statistic both have: {"ttft_s.mean": -0.04, ...}."""
    out = {}
    for key, stats in measured.items():
        if isinstance(stats, dict):
            for s, m in stats.items():
                if m > 0:
                    out[f"{key}.{s}"] = predicted[key][s] / m - 1
        elif stats > 0:
            out[key] = predicted[key] / stats - 1
    return out


def compare(runs: list[Run], progress: object = None, simulate: Callable | None = None
            ) -> list[dict]:
    """One record per run: its error on every statistic, or why it was not replayed."""
    rows = []
    for run in runs:
        row = {"id": run.id, "model": run.model, "hardware": run.hardware,
               "plan": run.plan.describe() or "one device", "notes": "; ".join(run.notes)}
        if run.skip:
            rows.append(dict(row, skipped=run.skip))
            continue
        try:
            predicted = replay(run, progress, simulate)
        except SpecError as exc:
            rows.append(dict(row, skipped=str(exc).split(" (known:")[0]))
            continue
        row["predicted"], row["measured"] = predicted, run.measured
        row["engine"], row["notes"] = run.kernels, "; ".join(run.notes)
        row.update(errors(predicted, run.measured))
        rows.append(row)
    return rows


HEADLINE = ("e2e_s.mean", "ttft_s.mean", "itl_s.mean", "tpot_s.mean",
            "throughput_tokens_per_s")


def summarize(rows: list[dict]) -> dict:
    """Median absolute error over the replayed runs of each headline statistic, for all
    runs and by source (the id's first part)."""
    out = {}
    groups = {"all": rows}
    for r in rows:
        groups.setdefault(r["id"].split("/")[0], []).append(r)
    for name, group in groups.items():
        done = [r for r in group if "skipped" not in r]
        out[name] = {"runs": len(done), "skipped": len(group) - len(done)}
        for key in HEADLINE:
            values = [abs(r[key]) for r in done if key in r]
            if values:
                out[name][key] = float(np.median(values))
    return out


def _stats(summary: dict, prefix: str, keys: list) -> dict:
    out = {}
    for key in keys:
        name, _, stat = key.partition(".")
        value = summary.get(name)
        out[f"{prefix}{key}"] = value.get(stat) if isinstance(value, dict) else value
    return out


def flat(rows: list[dict]) -> list[dict]:
    """The records of ``compare`` as flat rows for a CSV (one per run): its names, every
    statistic's signed error, then the predicted and measured values (seconds, tokens/s)."""
    out = []
    for r in rows:
        keys = [k for k in r if "." in k or k == "throughput_tokens_per_s"]
        row = {k: r[k] for k in ("id", "model", "hardware", "plan")}
        row["skipped"] = r.get("skipped", "")
        row.update({k: r[k] for k in keys})
        if "predicted" in r:
            row.update(_stats(r["predicted"], "predicted.", keys))
            row.update(_stats(r["measured"], "measured.", keys))
        out.append(dict(row, notes=r["notes"]))
    return out


def set_host(runs: list[Run], profile: str | Path | None = None, on: bool = True) -> None:
    """Every run's host time from ``profile`` (a profile file), or none when not ``on``;
    else each keeps its engine's shipped profile. A SpecError names a bad file."""
    if profile is not None and on:
        host = host_time.load_profile(profile)
    elif not on:
        host = host_time.HostTime()
    else:
        return
    for run in runs:
        run.engine = replace(run.engine, host=host)
