"""CLI command ``plan``: the deployment of a model on a GPU budget that serves the most
tokens per GPU within TTFT and TPOT SLOs (``serving.planner``), why, and how to launch it
with vLLM or SGLang.

Module level: typer and the standard library only (``perfmodel --help`` stays fast). No
``from __future__ import annotations``: typer reads the Annotated option types.
"""

import json
import time
from dataclasses import asdict, replace
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer

from perfmodel.cli import trace_inputs
from perfmodel.cli.atomic import staged
from perfmodel.cli.common import ModelOpt, WeightsFormatOpt, fail, out_dir, out_path, save
from perfmodel.cli.devices import EngineOpt, devices
from perfmodel.cli.energy_opts import EnergyOpt, read_price_file
from perfmodel.cli.host import HostOnOpt, ModeOpt, ProfileOpt, VersionOpt, host_profile
from perfmodel.cli.plan_text import energy_record, explain, text
from perfmodel.cli.speculative import (
    Acceptance,
    AcceptanceMode,
    AcceptanceProfile,
    AcceptanceSeed,
    SpecAlgorithm,
    SpecConfig,
    SpecDraftPath,
    SpecDraftTokens,
    SpecSteps,
    SpecTopk,
    speculative,
)

Opt = typer.Option


class Format(str, Enum):
    text = "text"
    json = "json"


class Objective(str, Enum):
    gpus = "gpus"
    cost = "cost"
    goodput = "goodput"
    energy = "energy"


class Dist(str, Enum):
    fixed = "fixed"
    uniform = "uniform"
    lognormal = "lognormal"


_ASK = "what to serve"
_SEARCH = "how to choose"


def plan_cmd(
    model: ModelOpt,
    hardware: Annotated[str, Opt("--hardware", "-H", help=(
        "candidate devices, comma-separated (shipped names or hardware YAMLs)"))],
    slo_ttft: Annotated[float, Opt(rich_help_panel=_ASK,
                                   help="p90 time to first token, seconds")],
    slo_tpot: Annotated[float, Opt(rich_help_panel=_ASK,
                                   help="p90 time per output token, seconds")],
    rate: Annotated[float | None, Opt(rich_help_panel=_ASK, help=(
        "requests per second to serve (Poisson): the plan uses the fewest replicas that "
        "meet the SLOs at it"))] = None,
    gpus: Annotated[int | None, Opt(rich_help_panel=_SEARCH, help=(
        "GPUs at most (without --rate: the budget filled, for the most goodput)"))] = None,
    input_len: Annotated[int | None, Opt(rich_help_panel=_ASK,
                                         help="mean prompt tokens (or --trace)")] = None,
    output_len: Annotated[int | None, Opt(rich_help_panel=_ASK,
                                          help="mean output tokens (or --trace)")] = None,
    length_dist: Annotated[Dist, Opt(rich_help_panel=_ASK, help=(
        "the lengths the checking simulation draws (as simulate's --length-dist)"))
                           ] = Dist.fixed,
    spread: Annotated[float, Opt(min=0.0, rich_help_panel=_ASK, help=(
        "uniform: +- share of the mean; lognormal: sigma"))] = 0.5,
    trace: Annotated[Path | None, Opt(rich_help_panel=_ASK, help=(
        "CSV trace (arrival_s,input_tokens,output_tokens) or a public one (--trace-format):"
        " its mean lengths and rate; the "
        "check draws its lengths"))] = None,
    objective: Annotated[Objective | None, Opt(rich_help_panel=_SEARCH, help=(
        "fewest GPUs (default with a rate), lowest cost per hour (needs prices), or most "
        "goodput per GPU (default without a rate), or fewest joules per output token "
        "(energy; docs/energy.md)"))] = None,
    prices: Annotated[Path | None, Opt(rich_help_panel=_SEARCH, help=(
        "YAML of usd_per_gpu_hour per device (docs/prices.example.yaml)"))] = None,
    pessimistic: Annotated[bool, Opt(rich_help_panel=_SEARCH, help=(
        "plan to the slow end of the estimate's 80% band where the device has one"))
                           ] = False,
    requests: Annotated[int, Opt(min=100, max=20_000, rich_help_panel=_SEARCH, help=(
        "requests measured per checking simulation (warm-up and drain added)"))] = 1000,
    seed: Annotated[int, Opt(min=0)] = 0,
    fmt: Annotated[Format, Opt("--format", "-f")] = Format.text,
    out: Annotated[Path | None, Opt(parser=out_path, metavar="<path>", help=(
        "folder for plan.csv (every candidate), pareto.png and plan.json"))] = None,
    dpi: Annotated[int, Opt(min=1, max=1200)] = 120,
    progress: Annotated[bool | None, Opt(help=(
        "stages on stderr (default: when stderr is a terminal)"))] = None,
    engine: EngineOpt = "vllm",
    engine_version: VersionOpt = None,
    engine_mode: ModeOpt = None,
    engine_profile: ProfileOpt = None,
    host_time: HostOnOpt = True,
    weights_format_name: WeightsFormatOpt = None,
    speculative_config: SpecConfig = None,
    speculative_algorithm: SpecAlgorithm = None,
    speculative_draft_model_path: SpecDraftPath = None,
    speculative_num_steps: SpecSteps = None,
    speculative_eagle_topk: SpecTopk = None,
    speculative_num_draft_tokens: SpecDraftTokens = None,
    acceptance: Acceptance = None,
    acceptance_profile: AcceptanceProfile = None,
    acceptance_mode: AcceptanceMode = "expected",
    acceptance_seed: AcceptanceSeed = 0,
    energy: EnergyOpt = False,
    trace_format: trace_inputs.FormatOpt = "auto",
    trace_window: trace_inputs.WindowOpt = None,
    trace_speedup: trace_inputs.SpeedupOpt = 1.0,
) -> None:
    """Plan a deployment: device, parallelism (TP in a node, wide EP across nodes),
    precision recipe, max batch, replicas, aggregated or disaggregated prefill/decode,
    meeting the SLOs at --rate with the fewest GPUs (or --objective); estimated for every
    candidate, the best checked in simulation; with a drafter (--speculative-config, or
    SGLang's --speculative-algorithm), every candidate with speculation and without."""
    import sys

    drafting = {k: v for k, v in locals().items() if k.startswith(("speculative_", "accept"))}

    from perfmodel.serving.planner import plans as planner
    from perfmodel.specs import load
    from perfmodel.specs.errors import SpecError
    from perfmodel.specs.formats import with_weights_format

    start = time.perf_counter()
    if out is not None:
        out_dir(out)
    show = sys.stderr.isatty() if progress is None else progress

    def tell(stage: str) -> None:
        if show:
            typer.echo(f"[{time.perf_counter() - start:5.1f} s] {stage}", err=True)

    try:
        m = with_weights_format(load.model(model), weights_format_name)
        hws = devices("--hardware", hardware, engine)
        target = _target(gpus, slo_ttft, slo_tpot, input_len, output_len, trace, rate,
                         length_dist.value, spread,
                         (trace_format, trace_window, trace_speedup))
        flags = " ".join(f"--{k} {v}" for k, v in (
            ("engine-version", engine_version), ("engine-mode", engine_mode),
            ("engine-profile", engine_profile)) if v is not None and host_time)
        target = replace(target, host=host_profile(engine, engine_version, engine_mode,
                                                   engine_profile, on=host_time),
                         host_flags=flags if host_time else "--no-host-time")
        target = replace(target, speculative=speculative(engine, drafting))
        table, kwh = read_price_file(prices)
        result = planner.plan(m, hws, target, requests, seed,
                              objective=objective.value if objective else None,
                              prices=table or None, progress=tell, pessimistic=pessimistic,
                              energy=energy, usd_per_kwh=kwh)
        report = summary(result)
    except SpecError as exc:
        fail(str(exc))
    if fmt is Format.json:
        typer.echo(json.dumps(report, indent=2))
    else:
        typer.echo(text(result, report))
    if out is not None:
        _write(out, result, report, dpi)
    if fmt is Format.text:
        typer.echo(f"planned in {time.perf_counter() - start:.1f} s")


def _target(gpus: int | None, slo_ttft: float, slo_tpot: float, input_len: int | None,
            output_len: int | None, trace: Path | None, rate: float | None = None,
            length_dist: str = "fixed", spread: float = 0.5,
            shape: tuple = ("auto", None, 1.0)) -> Any:
    """The planner's ``Target``: lengths and rate from the options, or a trace's means and
    rate (a trace in any format of ``serving.traces``, its window and speed-up applied)."""
    from perfmodel.serving.planner.plans import Target

    trace_inputs.check(trace, None, shape)
    if trace is None:
        for flag, value in (("--input-len", input_len), ("--output-len", output_len)):
            if value is None:
                fail(f"{flag}: required without --trace (mean tokens per request)")
        return Target(gpus, slo_ttft, slo_tpot, input_len, output_len, rate,
                      length_dist=length_dist, spread=spread)
    if input_len is not None or output_len is not None:
        fail("--input-len / --output-len: the lengths come from --trace; drop them")
    reqs = trace_inputs.requests(trace, shape)
    span = float(reqs.arrival_s.max() - reqs.arrival_s.min())
    if rate is None:
        if len(reqs) < 2 or span <= 0:
            fail(f"--trace: {trace}: expected at least two requests at different arrival "
                 f"times to give a rate, got {len(reqs)} over {span:g} s; or give --rate")
        rate = (len(reqs) - 1) / span
    return Target(gpus, slo_ttft, slo_tpot, float(reqs.input_tokens.mean()),
                  float(reqs.output_tokens.mean()), rate, reqs, trace_path=str(trace) + (
                      f" --trace-format {shape[0]}" if shape[0] != "auto" else ""))


def _without_empty_speculative(plan: dict) -> dict:
    """The plan's record less its ``speculative`` entry when it serves without (the output
    of a plan without speculation stays as it was)."""
    return {k: v for k, v in plan.items() if k != "speculative" or v}


def summary(result: Any) -> dict:
    """The plan as plain data: the ask, the counts, the checks, the winner and its record,
    why, the launch commands, the Pareto front, what was searched and the notes."""

    cols, t = result.candidates, result.target
    plan = _without_empty_speculative(asdict(result.plan)) | {
                                  "precision": result.plan.precision.name,
                                  "weights_dtype": result.plan.precision.weights,
                                  "act_dtype": result.plan.precision.activations,
                                  "kv_dtype": result.plan.precision.kv}
    return {"model": result.model.name, "hardware": list(dict.fromkeys(cols["hardware"].tolist())),
            "gpus": t.gpus, "input_len": t.input_len, "output_len": t.output_len,
            "length_dist": "empirical (the trace's)" if t.trace is not None else t.length_dist,
            "rate_req_s": t.rate, "slo_ttft_s": t.slo_ttft_s, "slo_tpot_s": t.slo_tpot_s,
            "candidates": len(cols["label"]), "feasible": int(cols["feasible"].sum()),
            "objective": result.objective, "first_by": _firsts(result),
            "confirmed": result.confirmed, "winner": result.winner, "plan": plan,
            "simulate_command": result.winner["command"],
            "reasons": explain(result), "commands": commands(result),
            "alternatives": [a | {"gpus": int(cols["gpus"][a["index"]]),
                                  "nodes": int(cols["nodes"][a["index"]]),
                                  "commands": commands(_at(result, a["index"]))}
                             for a in result.alternatives],
            "launch": {e: asdict(run) for e, run in launch_steps(result).items()},
            "pareto": [r for r in result.records() if r["pareto"]],
            "searched": list(result.searched), "notes": list(result.notes)} \
        | _energy(cols, result.winner["index"])


def _energy(cols: dict, i: int) -> dict:
    """The winner's energy block, where the plan was asked for it (``--energy``)."""
    spent = energy_record(cols, i)
    return {} if spent is None else {"energy": spent}


def _at(result: Any, i: int) -> Any:
    """``result`` as if candidate ``i`` had won (for its launch lines)."""
    from types import SimpleNamespace

    return SimpleNamespace(model=result.model, candidates=result.candidates,
                           winner={"index": i}, target=result.target)


def _firsts(result: Any) -> dict[str, str]:
    """The top candidate of each objective the plan can rank by, before the checks."""
    from perfmodel.serving.planner.plans import ranking
    from perfmodel.serving.planner.prices import OBJECTIVES

    cols = result.candidates
    return {r: cols["label"][ranking(cols, result.target, r)[0]]
            for r, (key, _) in OBJECTIVES.items() if key in cols}


# --- launch lines: the winner as a serving.planner.launch.Deployment (kept apart for merging) ---
ENGINE_NAMES = {"vllm": "vLLM", "sglang": "SGLang", "trtllm": "TensorRT-LLM"}


def deployment(result: Any) -> Any:
    """The winner as a ``serving.planner.launch.Deployment``: its checkpoint (the chat one, as a
    plan serves a chat workload), one server's shape (``tp``, optional ``pp``, ``ep``,
    data-parallel attention ranks), the replicas, the prefill/decode split, the batch
    (``max_num_seqs``), the weights and KV dtypes (``kv_dtype`` column, else bf16) and the
    device's GPUs per node (its NVLink domain)."""
    from perfmodel.serving.engines.vllm import EngineConfig
    from perfmodel.serving.planner.launch import Deployment, Server
    from perfmodel.serving.planner.launch_data import checkpoint
    from perfmodel.serving.planner.platforms import platform_of
    from perfmodel.specs import load

    cols, i = result.candidates, result.winner["index"]
    tp, ep, pp = int(cols["tp"][i]), int(cols["ep"][i]), int(cols["pp"][i]) if "pp" in cols else 1
    dp = ep // tp if bool(cols["attention_dp"][i]) else 1
    tokens = EngineConfig().max_num_batched_tokens
    server = Server(tp=tp, pp=pp, dp=dp, ep=ep if ep > 1 else 1,
                    max_num_seqs=int(cols["batch"][i]),
                    max_num_batched_tokens=max(tokens, int(cols["batch"][i])))
    hw = load.hardware(str(cols["hardware"][i])) if "hardware" in cols else None
    per_node = hw.interconnect.host_devices if hw is not None else 8
    where = platform_of(hw.vendor).name if hw is not None else "cuda"
    pre = int(cols["prefill_replicas"][i])
    return Deployment(checkpoint(result.model), server, int(cols["decode_replicas"][i]),
                      pre, replace(server, max_num_seqs=EngineConfig().max_num_seqs)
                      if pre else None, per_node, str(cols["weights_dtype"][i]),
                      str(cols["kv_dtype"][i]) if "kv_dtype" in cols else "bf16",
                      platform=where, speculative=result.target.speculative
                      if "speculative" in cols and cols["speculative"][i] else None)


def launch_steps(result: Any) -> dict[str, Any]:
    """Per engine, the winner's ``serving.planner.launch.Launch`` (steps, files, notes)."""
    from perfmodel.serving.planner.launch import launches

    return launches(deployment(result))


def commands(result: Any) -> dict[str, str]:
    """The winner's launch, per engine, as shell text (``Launch.text``)."""
    return {ENGINE_NAMES[e]: f"# {ENGINE_NAMES[e]} {run.version}\n{run.text()}"
            for e, run in launch_steps(result).items()}


def _write(out: Path, result: Any, report: dict, dpi: int) -> None:
    from perfmodel.report.serving_plots import pareto_front
    from perfmodel.report.tables import columns_csv

    cols, t = result.candidates, result.target
    live = cols["meets_ttft"] & (cols["tpot_s"] <= 2 * t.slo_tpot_s) if t.rate else \
        cols["throughput_per_gpu"] > 0        # with a rate: up to twice the TPOT SLO
    shown = {k: (v[live] if hasattr(v, "shape") else [x for x, f in zip(v, live, strict=True)
                                                       if f]) for k, v in cols.items()}
    shown["tpot_ms"] = shown["tpot_s"] * 1e3
    names = [_short(shown, i) for i in range(len(shown["label"]))]
    won = result.winner["index"]
    mark = int(live[:won].sum()) if live[won] else None
    cost = "usd_per_hour" if "usd_per_hour" in cols else "gpus"
    with staged(out) as folder:     # Ctrl-C leaves no partial file
        (folder / "plan.csv").write_text(columns_csv(cols))
        (folder / "plan.json").write_text(json.dumps(report, indent=2))
        if t.rate:
            fig = pareto_front(shown, "tpot_ms", cost, shown["pareto"], names,
                               f"{report['model']} at {t.rate:g} req/s: cost against TPOT "
                               f"(TTFT p90 met)", x_min=t.slo_tpot_s * 1e3, mark=mark,
                               axis_labels=("TPOT, ms (the SLO: dashed; right of it misses)",
                                            "US dollars per hour" if cost != "gpus"
                                            else "GPUs"), log_y=True)
        else:
            fig = pareto_front(shown, "tokens_per_s_per_user", "throughput_per_gpu",
                               shown["pareto"], names, f"{report['model']}, {t.gpus} GPUs: "
                               "throughput per GPU against speed per user",
                               x_min=1.0 / t.slo_tpot_s, mark=mark,
                               axis_labels=("tokens/s per user (1 / TPOT)",
                                            "output tokens/s per GPU"))
        save(fig, folder / "pareto.png", dpi)
    typer.echo(f"wrote {out}/ (plan.csv, plan.json, pareto.png)")


def _short(cols: dict, i: int) -> str:
    """A front point's label for the figure: 'h200 TP4 x2 fp8+kv8 B64'."""
    prec = str(cols["precision"][i]).replace("W8A8-fp8", "fp8").replace(" + fp8 KV", "+kv8")
    split = f"{cols['prefill_replicas'][i]}P+{cols['decode_replicas'][i]}D" \
        if cols["prefill_replicas"][i] else f"x{cols['decode_replicas'][i]}"
    return f"{str(cols['hardware'][i]).split('-')[0]} {cols['parallel'][i]} {split} {prec} " \
           f"B{cols['batch'][i]}"
