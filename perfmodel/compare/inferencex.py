"""Replay InferenceX's DeepSeek-R1 rows (``../shared/measurements/inferencex``, its README)
through the simulator: each row's engine, parallelism and launch flags
(``inferencex_launch.yaml``, read from InferenceX's launch scripts) and its client, vLLM's
``benchmark_serving.py``: a closed loop of ``concurrency`` users sending
``num_prompts`` = 10 x concurrency requests whose input and output lengths are drawn
independently and uniformly from the integers [int(0.8 L), L] (``--random-range-ratio
0.8``), every output exactly its length (``--ignore-eos``).

Predicted against measured, per row: throughput per GPU (prompt + output tokens over the
run's duration, divided by ``tp``), TTFT and TPOT (per request (latency - TTFT) / (output -
1)), as means where the row has them (the "mean+median+p99" rows) and as medians on every
row. Error = predicted / measured - 1. Rows with MTP speculative decoding are counted and
not replayed. Nothing here is fitted to these rows: they are for evaluation.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from perfmodel.specs.errors import SpecError

LAUNCH = Path(__file__).with_name("inferencex_launch.yaml")
NEEDED = ("id", "date", "gpu", "framework", "framework_version", "tp", "ep", "dp_attention",
          "isl", "osl", "random_range_ratio", "concurrency", "num_prompts",
          "tput_per_gpu_tok_s", "ttft_mean_ms", "ttft_median_ms", "tpot_mean_ms",
          "tpot_median_ms", "spec_decoding", "notes")
METRICS = ("tput_per_gpu", "ttft_mean", "tpot_mean", "ttft_median", "tpot_median")


@dataclass(eq=False)
class Point:
    """One InferenceX row, ready to replay (``skip``: why it is not, else empty)."""

    id: str
    group: str                 # "h200/sglang": the launch script's key
    row: dict
    measured: dict
    skip: str = ""
    notes: list = field(default_factory=list)


def _launch() -> dict:
    import yaml

    return yaml.safe_load(LAUNCH.read_text())


def load(path: str | Path) -> list[Point]:
    """Every row of the InferenceX CSV ``path`` as a Point; a bad file is a SpecError
    naming it and the column."""
    import pandas as pd

    try:
        frame = pd.read_csv(path)
    except (OSError, ValueError) as exc:
        raise SpecError(f"{path}: cannot read: {exc}") from None
    missing = [c for c in NEEDED if c not in frame.columns]
    if missing:
        raise SpecError(f"{path}: missing column {missing[0]!r}")
    if frame.empty:
        raise SpecError(f"{path}: no rows, only a header")
    launch = _launch()
    return [_point(row, launch, path) for row in frame.to_dict("records")]


def _number(row: dict, column: str, path: str | Path) -> float:
    try:
        value = float(row[column])
    except (TypeError, ValueError):
        raise SpecError(f"{path}: row {row['id']!r}: column {column!r}: expected a number"
                        ) from None
    return value


def _point(row: dict, launch: dict, path: str | Path) -> Point:
    for column in ("tp", "ep", "isl", "osl", "concurrency", "num_prompts"):
        value = _number(row, column, path)
        if value < 1 or value != int(value):
            raise SpecError(f"{path}: row {row['id']!r}: column {column!r}: expected a whole "
                            "number >= 1")
    group = f"{row['gpu']}/{row['framework']}"
    measured = {"tput_per_gpu": _number(row, "tput_per_gpu_tok_s", path)}
    for metric in ("ttft", "tpot"):
        for stat in ("mean", "median"):
            value = _number(row, f"{metric}_{stat}_ms", path)
            if value == value:
                measured[f"{metric}_{stat}"] = value / 1e3
    point = Point(str(row["id"]), group, row, measured)
    if group not in launch["launch"]:
        point.skip = f"no launch script read for {group}"
    elif str(row["spec_decoding"]).strip().lower() not in ("none", "nan", ""):
        point.skip = f"speculative decoding ({row['spec_decoding']}): not replayed"
    if "may not be what ran" in str(row["notes"]):
        point.notes.append("pre-2025-11-22: the recorded tp/ep/dp attention may not be what ran")
    return point


def requests(point: Point, seed: int = 0) -> object:
    """The client's requests: ``num_prompts`` prompts in a closed loop of ``concurrency``
    users, lengths uniform over the integers [int(r L), L] (vLLM's random dataset)."""
    from perfmodel.serving.requests import Requests

    row = point.row
    n, users = int(row["num_prompts"]), int(row["concurrency"])
    ratio = float(row["random_range_ratio"])
    rng = np.random.default_rng(seed)

    def lengths(mean: int) -> np.ndarray:
        return rng.integers(int(mean * ratio), mean + 1, n)

    inputs, outputs = lengths(int(row["isl"])), lengths(int(row["osl"]))
    return Requests.of(np.zeros(n), inputs, outputs, closed_loop=users)


def _flags(point: Point, launch: dict) -> tuple[dict, str]:
    """(the engine's flags, the KV dtype) of the row's launch script at its date."""
    spec = launch["launch"][point.group]
    flags, kv = dict(spec["flags"]), spec["kv_dtype"]
    shape = f"{int(point.row['isl'])}x{int(point.row['osl'])}"
    flags.update(spec.get("shapes", {}).get(shape, {}))
    for since, change in sorted(spec.get("since", {}).items()):
        if str(point.row["date"]) >= since:
            flags.update(change.get("flags", {}))
            kv = change.get("kv_dtype", kv)
    if point.group.endswith("/trt"):
        flags.update(trtllm_max_num_tokens(point.row))
    return flags, kv


def trtllm_max_num_tokens(row: dict) -> dict:
    """dsr1_fp8_h200_trt.sh's rule: ``max_num_tokens`` the concurrency + ISL + 64 rounded up
    to 64, at least 8192; ``max_seq_len`` at least 8192 (here: ISL + OSL, the longest
    request, when longer)."""
    conc, isl, osl = (int(row[k]) for k in ("concurrency", "isl", "osl"))
    tokens = max(8192, -(-(conc + isl + 64) // 64) * 64)
    return {"max_num_tokens": tokens, "max_seq_len": max(8192, isl + osl)}


def plan(point: Point) -> object:
    """The row's parallelism: TP with EP inside it, or (DP attention) EP over the GPUs
    with data-parallel attention."""
    from perfmodel.specs.workload import Parallelism

    row = point.row
    tp, ep = int(row["tp"]), int(row["ep"])
    if str(row["dp_attention"]).strip().lower() == "true":
        return Parallelism(tp=1, ep=tp, attention_dp=True)
    return Parallelism(tp=tp, ep=ep if ep == tp else 1)


def setup(point: Point, launch: dict | None = None) -> tuple:
    """(model, hardware, workload, plan, engine config) of ``point``, notes added to it."""
    import perfmodel as pm
    from perfmodel.serving import host_time
    from perfmodel.serving.engines import engine_config
    from perfmodel.specs.workload import Workload

    launch = launch or _launch()
    gpu, framework = point.group.split("/")
    engine = launch["engines"][framework]
    model = pm.model(launch["model"])
    hw = pm.hardware(launch["hardware"][gpu], engine=engine)
    if hw.engine_warning and hw.engine_warning not in point.notes:
        point.notes.append(hw.engine_warning)
    flags, kv = _flags(point, launch)
    weights = {} if model.quantization is not None else dict(launch["weights"])
    if weights:
        point.notes.append("fp8 block weights from inferencex_launch.yaml (the model YAML has "
                           "no quantization)")
    wl = Workload.for_model(model, kv_dtype=kv, act_dtype=launch["activations"], **weights)
    version = row_version(point, launch)
    try:
        host = host_time.resolve(engine, version, frontend="http")
    except SpecError:
        host = host_time.resolve(engine, frontend="http")
    config = engine_config(engine, host=host, **flags)
    point.notes += [f"not modelled: {f}" for f in launch["unmodelled"].get(point.group, [])]
    return model, hw, wl, plan(point), config


def row_version(point: Point, launch: dict) -> str | None:
    """The engine version of ``point``: its ``framework_version``, else the image its launch
    config ran from the row's date (``images:``), else None (the profile's default)."""
    version = str(point.row["framework_version"] or "").split(" ")[-1]
    if version and version != "nan":
        return version
    ran = [v for since, v in sorted(launch["launch"][point.group].get("images", {}).items())
           if str(point.row["date"]) >= since]
    return str(ran[-1]) if ran else None


def replay(point: Point, seed: int = 0) -> dict:
    """The predicted figures of ``point`` (seconds, tokens/s per GPU)."""
    from perfmodel.serving.simulate import simulate

    model, hw, wl, layout, config = setup(point)
    reqs = requests(point, seed)
    res = simulate(model, hw, reqs, layout, config, wl, label=point.id)
    tokens = float(reqs.input_tokens.sum() + reqs.output_tokens.sum())
    ttft, tpot = res.ttft_s, res.tpot_s
    return {"tput_per_gpu": tokens / res.duration_s / int(point.row["tp"]),
            "ttft_mean": float(ttft.mean()), "ttft_median": float(np.median(ttft)),
            "tpot_mean": float(tpot.mean()), "tpot_median": float(np.median(tpot))}


def compare(points: list[Point], progress: object = None) -> list[dict]:
    """One record per point: predicted, measured and the signed error of each metric both
    have, or why it was not replayed."""
    out = []
    for point in points:
        record = {"id": point.id, "group": point.group, "date": point.row["date"],
                  "isl": int(point.row["isl"]), "osl": int(point.row["osl"]),
                  "concurrency": int(point.row["concurrency"]),
                  "plan": plan(point).describe()}
        if point.skip:
            out.append(dict(record, skipped=point.skip, notes="; ".join(point.notes)))
            continue
        if progress is not None:
            progress(point)
        try:
            predicted = replay(point)
        except SpecError as exc:        # a refusal of the simulator is counted, said
            out.append(dict(record, skipped=f"refused: {exc}", notes="; ".join(point.notes)))
            continue
        record.update({f"predicted.{k}": v for k, v in predicted.items()})
        record.update({f"measured.{k}": v for k, v in point.measured.items()})
        record.update({f"error.{k}": predicted[k] / v - 1
                       for k, v in point.measured.items() if v > 0})
        out.append(dict(record, notes="; ".join(dict.fromkeys(point.notes))))
    return out


def sample(points: list[Point], every: int) -> list[Point]:
    """Every ``every``-th point of each group (in file order), for a short run."""
    if every < 1:
        raise SpecError(f"--every: expected >= 1, got {every}")
    seen: dict = {}
    kept = []
    for point in points:
        k = seen[point.group] = seen.get(point.group, -1) + 1
        if k % every == 0:
            kept.append(point)
    return kept


def summarize(records: list[dict]) -> dict:
    """Per group (GPU x engine) and per engine kind of plan: rows replayed and skipped, and
    for each metric its rows, median |error| and median signed error (the bias)."""
    groups: dict = {}
    for r in records:
        groups.setdefault(r["group"], []).append(r)
    out = {}
    for name, rows in sorted(groups.items()):
        done = [r for r in rows if "skipped" not in r]
        entry = {"replayed": len(done), "skipped": len(rows) - len(done)}
        for metric in METRICS:
            errs = np.array([r[f"error.{metric}"] for r in done if f"error.{metric}" in r])
            if len(errs):
                entry[metric] = {"rows": len(errs), "median_abs": float(np.median(abs(errs))),
                                 "bias": float(np.median(errs))}
        out[name] = entry
    return out
