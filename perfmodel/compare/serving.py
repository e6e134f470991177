"""Replay measured serving runs through the simulator and report how wrong it is.

The input is the schema of ``../shared/measurements/serving`` (its README): an experiments
CSV (one row per run: engine settings, parallelism, workload, measured TTFT / ITL / TPOT /
E2E in ms, output throughput) and a requests CSV (every request's send time, lengths and
measured latencies). A run with request rows is replayed exactly: the requests' scheduled
send times, through a client that keeps at most the run's cap in flight when its
``arrival`` says it had one (the saturated runs fell behind their schedule because of it),
else their send times; a run without rows is regenerated from its rate and mean lengths.
Error = predicted / measured - 1. Nothing here is fitted to these runs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from perfmodel.serving.config import EngineConfig
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


def _names() -> dict:
    import yaml

    return yaml.safe_load(NAMES.read_text())


def _measured(row: dict) -> dict:
    out = {}
    for short, key in METRICS:
        values = {s: row.get(f"{short}_{s}_ms") for s in STATS}
        if all(v is not None and v == v for v in values.values()):
            out[key] = {s: float(v) / 1e3 for s, v in values.items()}
        elif values["mean"] is not None and values["mean"] == values["mean"]:
            out[key] = {"mean": float(values["mean"]) / 1e3}
    out["throughput_tokens_per_s"] = float(row["throughput_output_tok_s"])
    return out


def _plan(row: dict) -> tuple[Parallelism, list]:
    tp, dp = int(row["tp"]), int(row["dp"])
    if "expert_parallel" in str(row.get("workload", "")):
        return (Parallelism(tp=1, ep=tp * dp, attention_dp=True),
                [f"expert parallel over {tp * dp} GPUs with data-parallel attention (vLLM "
                 "--enable-expert-parallel with --data-parallel-size)"])
    return Parallelism(tp=tp, dp=dp), []


def _engine(row: dict) -> EngineConfig:
    def flag(v: object) -> bool:      # "True", "True (vLLM V1 default)", 1
        return str(v).strip().lower().split(" ")[0] in ("true", "1", "yes")

    limit = row.get("max_model_len")
    return EngineConfig(max_num_seqs=int(row["max_num_seqs"]),
                        max_model_len=int(limit) if limit == limit and limit else 0,
                        max_num_batched_tokens=int(row["max_num_batched_tokens"]),
                        gpu_memory_utilization=float(row["gpu_mem_util"]),
                        chunked_prefill=flag(row["chunked_prefill"]),
                        prefix_caching=flag(row["prefix_caching"]))


def _requests(row: dict, rows: object | None) -> tuple[Requests, list]:
    """The run's requests: its rows when there are any, else a Poisson regeneration."""
    cap = re.search(r"client cap (\d+)", str(row["arrival"]))
    if rows is not None and len(rows):
        ok = rows[rows["status"] == "ok"]
        notes = [f"{len(rows) - len(ok)} failed requests left out"] if len(ok) < len(rows) \
            else []
        if cap:
            ok = ok.sort_values("sched_arrival_s", kind="stable")
            notes.append(f"replayed at the scheduled send times through a client of at most"
                         f" {cap.group(1)} requests in flight")
            return Requests(ok["sched_arrival_s"].to_numpy(float),
                            ok["input_tokens"].to_numpy(np.int64),
                            ok["output_tokens"].to_numpy(np.int64),
                            np.full(len(ok), -1), np.zeros(len(ok), np.int64),
                            client_cap=int(cap.group(1))), notes
        ok = ok.sort_values("arrival_s", kind="stable")
        return Requests.of(ok["arrival_s"], ok["input_tokens"], ok["output_tokens"]), notes
    from perfmodel.serving.traffic import generate

    reqs = generate(int(row["n_requests"]), rate=float(row["rate_or_concurrency"]),
                    input_len=round(float(row["input_len_mean"])),
                    output_len=round(float(row["output_len_mean"])), seed=0)
    return reqs, ["no request rows: regenerated from the rate and mean lengths (Poisson)"]


def load_runs(experiments: str | Path, requests: str | Path | None = None) -> list[Run]:
    """Every run of ``experiments`` (with its rows from ``requests`` when given)."""
    import pandas as pd

    exp = _read(experiments, pd)
    missing = [c for c in NEEDED if c not in exp.columns]
    if missing:
        raise SpecError(f"{experiments}: missing column {missing[0]!r}")
    req = _read(requests, pd, {"request_id": str}) if requests is not None else None
    if req is not None and "experiment_id" not in req.columns:
        raise SpecError(f"{requests}: missing column 'experiment_id'")
    groups = dict(tuple(req.groupby("experiment_id", sort=False))) if req is not None else {}
    names = _names()
    runs = []
    for row in exp.to_dict("records"):
        model = names["models"].get(row["model"], "")
        hw = names["hardware"].get(row["gpu"], "")
        plan, notes = _plan(row)
        reqs, more = _requests(row, groups.get(row["id"]))
        skip = "" if model and hw else \
            f"no shipped spec named for {row['model'] if not model else row['gpu']!r}"
        runs.append(Run(row["id"], model, hw, plan, _engine(row), reqs, _measured(row),
                        skip, notes + more))
    return runs


def _read(path: str | Path, pd: object, dtype: dict | None = None) -> object:
    try:
        return pd.read_csv(path, dtype=dtype)
    except (OSError, ValueError) as exc:
        raise SpecError(f"{path}: cannot read: {exc}") from None


def replay(run: Run, progress: object = None) -> dict:
    """The simulated summary of ``run`` on its shipped specs (SpecError if one is absent)."""
    import perfmodel as pm
    from perfmodel.serving.simulate import simulate

    model, hw = pm.model(run.model), pm.hardware(run.hardware)
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


def compare(runs: list[Run], progress: object = None) -> list[dict]:
    """One record per run: its error on every statistic, or why it was not replayed."""
    rows = []
    for run in runs:
        row = {"id": run.id, "model": run.model, "hardware": run.hardware,
               "plan": run.plan.describe() or "one device", "notes": "; ".join(run.notes)}
        if run.skip:
            rows.append(dict(row, skipped=run.skip))
            continue
        try:
            predicted = replay(run, progress)
        except SpecError as exc:
            rows.append(dict(row, skipped=str(exc).split(" (shipped:")[0]))
            continue
        row["predicted"], row["measured"] = predicted, run.measured
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
