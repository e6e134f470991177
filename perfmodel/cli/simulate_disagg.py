"""``simulate --prefill-replicas P --decode-replicas D``: the same traffic served by a
prefill pool and a decode pool (``serving.disagg``), each with its own device, TP/EP and
engine flags, the KV moved over ``--kv-link`` (``serving.kv_links``).

Each pool's settings: simulate's own options (-H, --tp, --ep, --pp, --attention-dp, the
engine's flags), then the pool's overrides: ``--prefill-hardware``/``--decode-hardware``,
``--prefill-tp``/``--decode-tp``, ``--prefill-ep``/``--decode-ep``, and any engine flag as
``--prefill-flag NAME=VALUE`` / ``--decode-flag NAME=VALUE`` (NAME as simulate spells the
option, e.g. ``max-num-batched-tokens=16384``; repeat the option for more), each value
read as that option reads it.

Module level: typer and the standard library only (``perfmodel --help`` stays fast).
"""

from collections.abc import Callable
from dataclasses import replace
from enum import Enum
from pathlib import Path
from typing import Any

import typer

from perfmodel.cli.common import fail, plan
from perfmodel.cli.devices import device
from perfmodel.cli.simulate_inputs import _FLAGS, _engine, inputs

SIDES = ("prefill", "decode")
# simulate options a disaggregated run does not take, and why
_REFUSED = {"dp": "the pools' sizes are --prefill-replicas and --decode-replicas",
            "router": "requests go round-robin to each pool's instances (vLLM's proxy)",
            "workers": "the pools run in this process", "cluster": "the pools run here",
            "concurrency": "closed-loop users are not simulated across two pools",
            **dict.fromkeys(("speculative_config", "speculative_algorithm"),
                            "the decode pool's drafts are not simulated yet")}
_POOL_ONLY = ("decode_replicas", "kv_link", "kv_contention",
              *(f"{s}_{k}" for s in SIDES for k in ("hardware", "tp", "ep", "flag")))
NO_BAND = "no band: not simulated for a disaggregated deployment yet"


def wanted(ctx: typer.Context, p: dict[str, Any]) -> bool:
    """Whether the options ask for a disaggregated run; a pool's option without
    --prefill-replicas is one line."""
    if p["prefill_replicas"]:
        return True
    given = [k for k in _POOL_ONLY if ctx.get_parameter_source(k).name == "COMMANDLINE"]
    if given:
        fail(f"--{given[0].replace('_', '-')}: applies to a disaggregated deployment; give "
             "--prefill-replicas P (and --decode-replicas D)")
    return False


def run(ctx: typer.Context, p: dict[str, Any], folder: Path | None,
        write: Callable[..., None]) -> None:
    """Simulate every stream of the options on the two pools; print, and ``write`` the
    files as simulate does (``simulate._write``)."""
    from perfmodel.serving.disagg import simulate_disaggregated
    from perfmodel.specs.errors import SpecError

    for name, why in _REFUSED.items():
        if ctx.get_parameter_source(name).name == "COMMANDLINE":
            fail(f"--{name.replace('_', '-')}: not with --prefill-replicas: {why}")
    try:
        m, _, wl, _, engine, streams = inputs(p)
        pools = [pool(ctx, p, side, engine.host) for side in SIDES]
        runs = [(r, simulate_disaggregated(m, reqs, *pools, p["kv_link"], engine, wl,
                                           label=label, contention=p["kv_contention"]))
                for r, reqs, label in streams]
    except SpecError as exc:
        fail(str(exc))
    summaries = [dict(res.summary(p["slo_ttft"], p["slo_tpot"]), band=NO_BAND,
                      engine_time=res.info["decode"].engine_time(),   # its steps are logged
                      disaggregated=about(res, p["kv_link"])) for _, res in runs]
    _show(m, runs, summaries, p["fmt"].value == "json")
    if folder is not None:
        write(folder, runs, summaries, p["dpi"], float("nan"))


def pool(ctx: typer.Context, p: dict[str, Any], side: str, host: Any) -> Any:
    """The ``side`` pool of the options: its device, plan and engine (with ``host``)."""
    from perfmodel.serving.disagg import Pool

    hw = device(p[f"{side}_hardware"] or p["hardware"], p["engine_name"])
    layout = plan(p[f"{side}_tp"] or p["tp"], p.get("pp", 1), p[f"{side}_ep"] or p["ep"],
                  p[f"{side}_replicas"], p["attention_dp"], 0)
    flags = dict(p, **engine_flags(ctx, p, side))
    return Pool(hw, layout, replace(_engine(p["engine_name"], flags), host=host))


def engine_flags(ctx: typer.Context, p: dict[str, Any], side: str) -> dict[str, Any]:
    """The ``--{side}-flag NAME=VALUE`` overrides, each read by the option NAME names."""
    name = p["engine_name"]
    allowed = _FLAGS[name]
    params = {x.name: x for x in ctx.command.params}
    out = {}
    for item in p[f"{side}_flag"] or ():
        flag, eq, value = item.partition("=")
        key = flag.strip().lstrip("-").replace("-", "_")
        opt = f"--{side}-flag {item}"
        if not eq or not key:
            fail(f"{opt}: expected NAME=VALUE, an engine flag as simulate names it (e.g. "
                 "max-num-seqs=64)")
        if key not in allowed:
            fail(f"{opt}: {flag.strip()} is not an engine flag of --engine {name}; expected "
                 "one of " + ", ".join(f.replace("_", "-") for f in allowed))
        try:
            got = params[key].type.convert(value.strip(), params[key], ctx)
        except typer.BadParameter as exc:   # typer's own click
            fail(f"{opt}: {exc.message}")
        out[key] = type(p[key])(got) if isinstance(p[key], Enum) else got
    return out


def about(res: Any, link: str) -> dict[str, Any]:
    """The deployment, the link and the transfers' times (seconds) of a disaggregated
    ``res``."""
    import numpy as np

    from perfmodel.serving.kv_links import link as link_of

    info = res.info

    def stats(x: np.ndarray) -> dict[str, float]:
        return {"mean": float(np.mean(x)), "p90": float(np.percentile(x, 90)),
                "max": float(np.max(x))}

    return {"prefill_pool": info["prefill_pool"], "decode_pool": info["decode_pool"],
            "gpus": info["gpus"], "link": info["link"], "link_source": link_of(link).source,
            "contention": info["contention"], "transfer_s": stats(info["transfer_s"]),
            "kv_queued_s": stats(info["kv_queued_s"]),
            "prefill_engine": info["prefill"].info["engine"].flags(),
            "decode_engine": info["decode"].info["engine"].flags()}


def _show(m: Any, runs: list, summaries: list[dict], as_json: bool) -> None:
    from perfmodel.report import serving_tables as tables

    if as_json:
        body = summaries[0] if len(runs) == 1 else \
            {"runs": [dict(s, rate=r) for (r, _), s in zip(runs, summaries, strict=True)]}
        typer.echo(tables.summary_json(body))
        return
    d, res = summaries[0]["disaggregated"], runs[0][1]
    queue = "transfers from one prefill instance queue on its NICs" if d["contention"] \
        else "no contention (each transfer alone on the link)"
    typer.echo(f"{m.name}, disaggregated: {d['prefill_pool']} prefill + {d['decode_pool']} "
               f"decode ({d['gpus']} GPUs)")
    typer.echo(f"prefill engine: {d['prefill_engine']}")
    typer.echo(f"decode engine: {d['decode_engine']}")
    typer.echo(f"KV transfer: {d['link']}; {queue}")
    typer.echo(f"host time: {res.info['decode'].info['engine'].host.describe()}")
    for (_, r), s in zip(runs, summaries, strict=True):
        t, q = s["disaggregated"]["transfer_s"], s["disaggregated"]["kv_queued_s"]
        typer.echo(tables.summary_table(s, r.label))
        typer.echo(f"KV transfer per request: mean {t['mean'] * 1e3:.3f} ms, p90 "
                   f"{t['p90'] * 1e3:.3f} ms; queued for the NICs: mean {q['mean'] * 1e3:.3f}"
                   f" ms, p90 {q['p90'] * 1e3:.3f} ms, max {q['max'] * 1e3:.3f} ms")
    if len(runs) > 1:
        typer.echo(tables.load_table([(r, s) for (r, _), s in zip(runs, summaries,
                                                                  strict=True)]))
