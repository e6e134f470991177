"""CLI command ``plan``: the deployment of a model on a GPU budget that serves the most
tokens per GPU within TTFT and TPOT SLOs (``serving.planner``), why, and how to launch it
with vLLM or SGLang.

Module level: typer and the standard library only (``perfmodel --help`` stays fast). No
``from __future__ import annotations``: typer reads the Annotated option types.
"""

import json
import re
import time
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer

from perfmodel.cli.common import ModelOpt, fail, out_dir, save, writing
from perfmodel.cli.devices import EngineOpt, devices

Opt = typer.Option
NIXL = "'{\"kv_connector\":\"NixlConnector\",\"kv_role\":\"kv_both\"}'"


class Format(str, Enum):
    text = "text"
    json = "json"


class Rank(str, Enum):
    gpu = "gpu"
    cost = "cost"


def plan_cmd(
    model: ModelOpt,
    hardware: Annotated[str, Opt("--hardware", "-H", help=(
        "candidate devices, comma-separated (shipped names or hardware YAMLs)"))],
    gpus: Annotated[int, Opt(help="GPU budget")],
    slo_ttft: Annotated[float, Opt(help="p90 time to first token, seconds")],
    slo_tpot: Annotated[float, Opt(help="p90 time per output token, seconds")],
    input_len: Annotated[int | None, Opt(help="mean prompt tokens (or --trace)")] = None,
    output_len: Annotated[int | None, Opt(help="mean output tokens (or --trace)")] = None,
    trace: Annotated[Path | None, Opt(help=(
        "CSV trace (arrival_s,input_tokens,output_tokens): its mean lengths and arrival "
        "rate, and its requests for the confirming simulations"))] = None,
    requests: Annotated[int, Opt(min=10, help="requests per confirming simulation")] = 300,
    seed: Annotated[int, Opt(min=0)] = 0,
    fmt: Annotated[Format, Opt("--format", "-f")] = Format.text,
    out: Annotated[Path | None, Opt(help=(
        "folder for plan.csv (every candidate), pareto.png and plan.json"))] = None,
    dpi: Annotated[int, Opt(min=1, max=1200)] = 120,
    rank: Annotated[Rank, Opt(help=(
        "pick the winner by output tokens/s per GPU, or per dollar (cost: needs a price: "
        "block in every hardware file)"))] = Rank.gpu,
    engine: EngineOpt = "vllm",
) -> None:
    """Plan a deployment: device, tensor parallelism, weights dtype, max batch, and
    aggregated or disaggregated prefill/decode, for the most output tokens per GPU (or per
    dollar, --rank cost) within the SLOs; estimated for every candidate, the best
    simulated."""
    from perfmodel.serving import planner
    from perfmodel.specs import load
    from perfmodel.specs.errors import SpecError

    start = time.perf_counter()
    if out is not None:
        out_dir(out)
    try:
        m = load.model(model)
        hws = devices("--hardware", hardware, engine)
        target = _target(gpus, slo_ttft, slo_tpot, input_len, output_len, trace)
        result = planner.plan(m, hws, target, requests, seed, rank=rank.value)
    except SpecError as exc:
        fail(str(exc))
    report = summary(result)
    if fmt is Format.json:
        typer.echo(json.dumps(report, indent=2))
    else:
        typer.echo(text(result, report))
    if out is not None:
        _write(out, result, report, dpi)
    if fmt is Format.text:
        typer.echo(f"planned in {time.perf_counter() - start:.1f} s")


def _target(gpus: int, slo_ttft: float, slo_tpot: float, input_len: int | None,
            output_len: int | None, trace: Path | None) -> Any:
    """The planner's ``Target``: lengths from the options, or a trace's means and rate."""
    from perfmodel.serving.planner import Target
    from perfmodel.serving.traffic import read_trace

    if trace is None:
        for flag, value in (("--input-len", input_len), ("--output-len", output_len)):
            if value is None:
                fail(f"{flag}: required without --trace (mean tokens per request)")
        return Target(gpus, slo_ttft, slo_tpot, input_len, output_len)
    if input_len is not None or output_len is not None:
        fail("--input-len / --output-len: the lengths come from --trace; drop them")
    reqs = read_trace(trace)
    span = float(reqs.arrival_s.max())
    return Target(gpus, slo_ttft, slo_tpot, float(reqs.input_tokens.mean()),
                  float(reqs.output_tokens.mean()), len(reqs) / span if span > 0 else None,
                  reqs)


def summary(result: Any) -> dict:
    """The plan as plain data: the ask, the counts, the confirmations, the winner, why,
    the launch commands, the Pareto front and the notes (``--format json``)."""
    cols, t = result.candidates, result.target
    return {"model": result.model.name, "hardware": list(dict.fromkeys(cols["hardware"].tolist())),
            "gpus": t.gpus, "input_len": t.input_len, "output_len": t.output_len,
            "rate_req_s": t.rate, "slo_ttft_s": t.slo_ttft_s, "slo_tpot_s": t.slo_tpot_s,
            "candidates": len(cols["label"]), "feasible": int(cols["feasible"].sum()),
            "ranked_by": result.rank, "first_by": _firsts(result),
            "confirmed": result.confirmed, "winner": result.winner,
            "reasons": explain(result), "commands": commands(result),
            "pareto": [r for r in result.records() if r["pareto"]],
            "notes": list(result.notes)}


def _firsts(result: Any) -> dict[str, str]:
    """The top candidate of each ranking the plan can make (per GPU; per dollar where every
    device has a price), before the confirming simulations."""
    from perfmodel.serving.dollars import RANKS
    from perfmodel.serving.planner import ranking

    cols = result.candidates
    return {r: cols["label"][ranking(cols, result.target, r)[0]] for r, key in RANKS.items()
            if key in cols}


def text(result: Any, report: dict) -> str:
    """The plan for a terminal: the ask, the simulated top candidates, the choice, why,
    the commands and the notes."""
    t = result.target
    head = [f"{report['model']} on {', '.join(report['hardware'])}, {t.gpus} GPUs; prompts "
            f"{t.input_len:.0f}, outputs {t.output_len:.0f} tokens"
            + (f", {t.rate:.2f} req/s" if t.rate else "")
            + f"; SLOs: TTFT p90 <= {t.slo_ttft_s:g} s, TPOT p90 <= {t.slo_tpot_s * 1e3:g} ms",
            f"{report['candidates']} candidates estimated, {report['feasible']} meet both SLOs "
            f"by the estimate, {len(report['pareto'])} on the Pareto front", ""]
    cost = "tokens_per_dollar" in result.candidates
    rows = [("candidate", "tok/s/GPU at SLO", *(("tok/$",) if cost else ()), "req/s",
             "TTFT p90", "TPOT", "sim TTFT p90", "sim TPOT p90", "SLOs")]
    rows += [(c["label"], f"{c['estimated_throughput_per_gpu']:.0f}",
              *((_per_dollar(c["estimated_tokens_per_dollar"]),) if cost else ()),
              f"{c['rate_req_s']:.2f}",
              f"{c['estimated_ttft_p90_s']:.2f} s", f"{c['estimated_tpot_s'] * 1e3:.1f} ms",
              f"{c['simulated_ttft_p90_s']:.2f} s", f"{c['simulated_tpot_p90_s'] * 1e3:.1f} ms",
              "met" if c["meets_slos"] else "missed") for c in result.confirmed]
    w = result.winner
    body = [_aligned(rows), "", f"chosen: {w['label']} ("
            + ("met both SLOs in simulation)" if w["confirmed"] else
               "no simulated candidate met both SLOs: the best estimate)"), "why:"]
    body += [f"  - {line}" for line in report["reasons"]]
    for name, cmd in report["commands"].items():
        body += [f"{name}:", *(f"  {line}" for line in cmd.splitlines())]
    return "\n".join(head + body + ["notes:", *(f"  - {n}" for n in report["notes"])])


def _per_dollar(tokens: float) -> str:
    """Output tokens per US dollar, as '1.23M'."""
    return f"{tokens / 1e6:.2f}M" if tokens >= 1e5 else f"{tokens:.0f}"


def _aligned(rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(r[k]) for r in rows) for k in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
                     for r in rows)


def explain(result: Any) -> list[str]:
    """Why the winner: its estimate, then its TP, batch, load, weights, serving mode and
    device against the best alternatives meeting the SLOs (output tok/s per GPU)."""
    import numpy as np

    cols, i, t = result.candidates, result.winner["index"], result.target
    hw, ok = cols["hardware"] == cols["hardware"][i], cols["feasible"]
    out = [f"{result.winner['label']}: {cols['throughput_per_gpu'][i]:.0f} output tok/s per "
           f"GPU estimated on {cols['gpus'][i]} GPUs at {cols['rate_req_s'][i]:.2f} req/s",
           "parallelism (best tok/s/GPU meeting the SLOs; sequences the KV cache holds): "
           + ", ".join(_best(cols, hw & (cols["parallel"] == p), ok, p, kv=True)
                       for p in dict.fromkeys(cols["parallel"][hw].tolist())),
           _batch_reason(cols, i, t),
           _load_reason(cols, i, t),
           "weights: " + ", ".join(_best(cols, hw & (cols["weights_dtype"] == d), ok, d)
                                   for d in dict.fromkeys(cols["weights_dtype"][hw].tolist())),
           "serving: " + ", ".join(_best(cols, hw & ((cols["prefill_replicas"] > 0) == m), ok,
                                         "disaggregated" if m else "aggregated")
                                   for m in (False, True))
           + ("" if not cols["prefill_replicas"][i] else " (KV moved over the network)"
              if cols["link"][i] == "network" else " (KV moved over the in-node link)"),
           "device: " + ", ".join(_best(cols, cols["hardware"] == h, ok, h)
                                  for h in dict.fromkeys(cols["hardware"].tolist()))]
    if "tokens_per_dollar" in cols:
        out.append(f"per dollar (output tokens per USD; ranked by {result.rank}): " + ", ".join(
            f"{_best(cols, cols['hardware'] == h, ok, h, key='tokens_per_dollar')} at "
            f"${cols['usd_per_gpu_hour'][cols['hardware'] == h][0]:g}/GPU-hour"
            for h in dict.fromkeys(cols["hardware"].tolist()))
            + f"; the winner {_per_dollar(cols['tokens_per_dollar'][i])}")
    if not np.asarray(ok).any():
        out.insert(1, "no candidate meets both SLOs by the estimate: the nearest is shown")
    return out


def _load_reason(cols: dict, i: int, t: Any) -> str:
    """The load planned, and whether the TTFT SLO or the planner's 90% cap set it."""
    share = cols["slo_rate_req_s"][i] / cols["capacity_req_s"][i]
    given = f"the trace's {t.rate:.2f} req/s, {cols['load_share'][i]:.0%} of the estimated " \
        f"capacity ({cols['capacity_req_s'][i]:.2f} req/s); " if t.rate else \
        f"load {cols['capacity_req_s'][i] * share:.2f} req/s, of the estimated capacity " \
        f"{cols['capacity_req_s'][i]:.2f}: "
    if share < 0.9 - 1e-9:
        return given + f"TTFT binds at {share:.0%} of capacity (queueing past the SLO beyond)"
    return given + "TTFT has room up to the planner's cap of 90% of capacity"


def _best(cols: dict, mask: Any, ok: Any, name: str, kv: bool = False,
          key: str = "throughput_per_gpu") -> str:
    """'TP4 1234' (the best ``key`` meeting the SLOs), or why there is none."""
    if not mask.any():
        return f"{name} holds no sequence"
    room = f" (KV {cols['kv_max_batch'][mask].max()})" if kv else ""
    if not (mask & ok).any():
        return f"{name} misses the SLOs{room}"
    best = cols[key][mask & ok].max()
    return f"{name} {_per_dollar(best) if key == 'tokens_per_dollar' else f'{best:.0f}'}{room}"


def _batch_reason(cols: dict, i: int, t: Any) -> str:
    """Which limit set the batch: the TPOT SLO, the KV memory, or nothing gained."""
    import numpy as np

    keys = ("hardware", "parallel", "prefill_replicas", "weights_dtype")
    same = np.logical_and.reduce([cols[k] == cols[k][i] for k in keys])
    b = cols["batch"][i]
    bigger = np.flatnonzero(same & (cols["batch"] > b))
    head = f"batch {b} (max_num_seqs), TPOT {cols['tpot_s'][i] * 1e3:.1f} ms"
    if not len(bigger):
        return head + (": all the KV cache holds" if b >= cols["kv_max_batch"][i]
                       else ": the largest searched")
    j = bigger[np.argmin(cols["batch"][bigger])]
    if not cols["meets_tpot"][j]:
        return head + f": TPOT binds, batch {cols['batch'][j]} would take " \
                      f"{cols['tpot_s'][j] * 1e3:.1f} ms > {t.slo_tpot_s * 1e3:g} ms"
    why = "the prefill pool bounds it" if cols["prefill_replicas"][i] else \
        "TTFT's queueing bounds its load"
    return head + f": batch {cols['batch'][j]} serves no more " \
                  f"({cols['throughput_per_gpu'][j]:.0f} tok/s/GPU: {why}) at a longer TPOT"


def commands(result: Any) -> dict[str, str]:
    """The winner as ``vllm serve`` and ``python -m sglang.launch_server`` command lines
    (disaggregated: one per pool, NIXL KV transfer, and the router to put in front)."""
    from perfmodel.serving.config import EngineConfig
    from perfmodel.specs.workload import Workload

    cols, i, m = result.candidates, result.winner["index"], result.model
    tp, ep, adp = int(cols["tp"][i]), int(cols["ep"][i]), bool(cols["attention_dp"][i])
    pre, dec, b = int(cols["prefill_replicas"][i]), int(cols["decode_replicas"][i]), \
        int(cols["batch"][i])
    fp8 = cols["weights_dtype"][i] == "fp8" and Workload.for_model(m).weights_dtype != "fp8"
    q = " --quantization fp8" if fp8 else ""
    name = _hf_name(m)
    vllm = f"vllm serve {name} --tensor-parallel-size {tp}" + (
        f" --data-parallel-size {ep} --enable-expert-parallel" if adp else
        " --enable-expert-parallel" if ep > 1 else "") + q
    sgl = f"python -m sglang.launch_server --model-path {name} --tp {ep if adp else tp}" + (
        f" --dp {ep} --enable-dp-attention --ep-size {ep}" if adp else
        f" --ep-size {ep}" if ep > 1 else "") + q
    eng = EngineConfig(max_num_seqs=b)
    if not pre:
        dp = f" --data-parallel-size {dec}" if dec > 1 and not adp else ""
        each = f"{dec} replicas, each: " if dec > 1 and adp else ""
        return {"vLLM": f"{each}{vllm}{dp} {eng.flags()}",
                "SGLang": f"{each}{sgl}" + (f" --dp {dec}" if dec > 1 and not adp else "")
                + f" --max-running-requests {b} --chunked-prefill-size "
                  f"{eng.max_num_batched_tokens}"}
    return {"vLLM": f"# {pre} prefill instance(s), each:\n{vllm} {EngineConfig().flags()} "
                    f"--kv-transfer-config {NIXL}\n# {dec} decode instance(s), each:\n{vllm} "
                    f"{eng.flags()} --kv-transfer-config {NIXL}\n# in front: vLLM's "
                    "disaggregated proxy (tests/v1/kv_connector/nixl_integration/"
                    "toy_proxy_server.py --prefiller-hosts ... --decoder-hosts ...)",
            "SGLang": f"# {pre} prefill server(s), each:\n{sgl} --disaggregation-mode prefill "
                      f"--disaggregation-transfer-backend nixl\n# {dec} decode server(s), "
                      f"each:\n{sgl} --disaggregation-mode decode --disaggregation-transfer-"
                      f"backend nixl --max-running-requests {b}\n# in front:\npython -m "
                      "sglang_router.launch_router --pd-disaggregation --prefill "
                      "http://PREFILL:30000 --decode http://DECODE:30000"}


def _hf_name(model: Any) -> str:
    """The Hugging Face repository of the model's config (its ``source``), else its name."""
    found = re.search(r"huggingface\.co/([^/\s]+/[^/\s]+)", model.source or "")
    return found.group(1) if found else model.name


def _write(out: Path, result: Any, report: dict, dpi: int) -> None:
    from perfmodel.report.serving_plots import pareto_front
    from perfmodel.report.tables import columns_csv

    cols = result.candidates
    live = cols["throughput_per_gpu"] > 0
    shown = {k: (v[live] if hasattr(v, "shape") else [x for x, f in zip(v, live, strict=True)
                                                       if f]) for k, v in cols.items()}
    won = result.winner["index"]
    mark = int(live[:won].sum()) if live[won] else None
    with writing(out) as folder:
        (folder / "plan.csv").write_text(columns_csv(cols))
        (folder / "plan.json").write_text(json.dumps(report, indent=2))
        fig = pareto_front(shown, "tokens_per_s_per_user", "throughput_per_gpu",
                           shown["pareto"], shown["label"], f"{report['model']}, "
                           f"{result.target.gpus} GPUs: throughput per GPU against speed "
                           "per user", x_min=1.0 / result.target.slo_tpot_s, mark=mark,
                           axis_labels=("tokens/s per user (1 / TPOT)",
                                        "output tokens/s per GPU"))
        save(fig, folder / "pareto.png", dpi)
    typer.echo(f"wrote {out}/ (plan.csv, plan.json, pareto.png)")
