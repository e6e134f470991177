"""What ``simulate``'s options describe: the model, device, workload, plan, engine settings
(each engine's own flags, and its host time) and the request streams, shared by the command
and the browser page (``inputs``).

Module level: typer and the standard library only (``perfmodel --help`` stays fast).
"""

import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import typer

from perfmodel.cli import simulate_lora, trace_inputs
from perfmodel.cli.common import fail, numbers, plan, weights_format, workload
from perfmodel.cli.devices import device
from perfmodel.cli.host import host_profile


def inputs(p: dict[str, Any]) -> tuple:
    """(model, device, workload, plan, engine config, [(rate, requests, label)]) of
    ``simulate``'s parsed options ``p`` (keyword names as the command's parameters): what
    the command simulates, and what the browser page simulates for the same options."""
    from perfmodel.serving import traffic
    from perfmodel.specs import load

    traffic.check_lengths(p["input_len"], p["output_len"])   # named as the options
    m, hw = load.model(p["model"]), device(p["hardware"], p["engine_name"])
    dtype, group, fmt = weights_format(p.get("weights_format_name"), p["weights_dtype"], None)
    wl = workload(m, 1, p["input_len"], p["output_len"], dtype, p["act_dtype"],
                  p["kv_dtype"], group, quantize_lm_head=p["quantize_lm_head"], **fmt)
    layout = plan(p["tp"], p.get("pp", 1), p["ep"], p["dp"], p["attention_dp"], 0)
    engine = replace(_engine(p["engine_name"], p), host=host_profile(
        p["engine_name"], p["engine_version"], p["engine_mode"], p["engine_profile"],
        p["frontend"], p["host_time"]), kv_offload=_offload(p, hw))
    from perfmodel.cli.speculative import speculative

    spec = speculative(p["engine_name"], p)
    if spec is not None:
        engine = replace(engine, speculative=spec)
    streams = _traffic(p["trace"], p["rate"], p["concurrency"], p["num_requests"],
                       p["input_len"], p["output_len"], p["arrival"], p["burstiness"],
                       p["length_dist"], p["spread"], p["lengths_from"], p["shared_prefix"],
                       p["seed"], (p["turns"], p["think_time"], p["turn_growth"]),
                       3 if p.get("band", True) else 1, p.get("rate_shape"),
                       trace_inputs.shape(p))
    from perfmodel.serving.engines.vllm import context_limit

    streams = _within_limit(streams, context_limit(m, engine), p["trace"] is None, p["trace"]
                            is not None and not trace_inputs.native(p["trace"],
                                                                    trace_inputs.shape(p)))
    engine = simulate_lora.configure(engine, hw, p)
    streams = simulate_lora.with_adapters(streams, p)
    _warn_idle(streams, layout)
    _warn_turns(streams, layout, p["router"])
    if layout.pp > 1 and engine.host.overlap and engine.name == "vllm":
        typer.echo(f"warning: --pp {layout.pp}: vLLM turns async scheduling off under "
                   "pipeline parallelism (vllm/config/vllm.py), so each micro-batch's host "
                   f"time counts in full, without {engine.host.name}'s overlap", err=True)
    return m, hw, wl, layout, engine, streams


def _offload(p: dict[str, Any], hw: Any) -> Any:
    """The KV offload tiers the options ask for (``serving.kvtiers``), None without; the
    CPU tier's size, when assumed or past the host memory per device, said on stderr."""
    from perfmodel.serving import kvtiers

    off = kvtiers.parse(p.get("kv_offload"), p.get("cpu_kv_gb"), p.get("ssd_kv_gb"),
                        p.get("kv_offload_write_policy") or "write_through",
                        p.get("kv_offload_overlap"))
    if off is None:
        return None
    dram = hw.host.dram_bytes if hw.host is not None else 0.0
    if not off.cpu_bytes:
        typer.echo(f"warning: --kv-offload: no --cpu-kv-gb, so the CPU tier is "
                   f"{kvtiers.DEFAULT_RATIO:g} x the GPU's KV pool per GPU (SGLang's "
                   "--hicache-ratio default)", err=True)
    elif dram and off.cpu_bytes > dram:
        typer.echo(f"warning: --cpu-kv-gb {off.cpu_bytes / 1e9:g}: more than {hw.name}'s "
                   f"reference host memory per GPU ({dram / 1e9:g} GB, its host: block)",
                   err=True)
    return off


def _within_limit(streams: list, limit: int, generated: bool, published: bool = False
                  ) -> list:
    """Generated streams, and a trace in a published format (``serving.traces``: made for
    another model), less their requests past the context limit, each count said on stderr
    (vLLM rejects them with HTTP 400: ``traffic.within_limit``); a native trace's such
    request stays an error (``simulate`` names it)."""
    from perfmodel.serving import traffic

    if not generated and not published:
        return streams
    out = []
    for r, reqs, label in streams:
        kept, dropped = traffic.within_limit(reqs, limit)
        if dropped:
            what = "generated requests" if generated else "requests of the trace"
            typer.echo(f"warning: {label}: {dropped:,} of {len(reqs):,} {what} "
                       f"are longer (input + output) than the context limit {limit:,}: "
                       "rejected, as vLLM rejects them (HTTP 400), and left out of every "
                       "figure", err=True)
        out.append((r, kept, label))
    return out


def _warn_idle(streams: list, layout: Any) -> None:
    engines = layout.dp * layout.attention_ways
    fewest = min(len(reqs) for _, reqs, _ in streams)
    if fewest < engines:
        typer.echo(f"warning: {fewest:,} requests over {engines:,} engines: "
                   f"{engines - fewest:,} stay idle", err=True)


def _warn_turns(streams: list, layout: Any, router: str) -> None:
    """Across replicas dealt other than by session, later turns keep their nominal times
    (``serving.sessions``): said, as it changes the numbers."""
    from perfmodel.serving import sessions

    if layout.dp * layout.attention_ways == 1 or router == "session-affinity":
        return
    later = sum(int(sessions.follows(reqs).sum()) for _, reqs, _ in streams)
    if later:
        typer.echo(f"warning: --router {router}: a session's turns run on different "
                   f"replicas, simulated apart, so {later:,} later turns are sent at their "
                   "nominal times (session start + --think-time per turn, or the trace's), "
                   "not --think-time after the previous answer; --router session-affinity "
                   "keeps them", err=True)


_FLAGS = {"vllm": ("max_num_seqs", "max_num_batched_tokens", "gpu_memory_utilization",
                   "block_size", "chunked_prefill", "prefix_caching", "scheduler",
                   "cuda_graphs", "max_model_len"),
          "sglang": ("chunked_prefill_size", "max_prefill_tokens", "max_running_requests",
                     "schedule_policy", "schedule_conservativeness", "page_size",
                     "mem_fraction_static", "enable_mixed_chunk", "disable_radix_cache"),
          "trtllm": ("max_num_tokens", "max_batch_size", "capacity_scheduler_policy",
                     "enable_chunked_prefill", "tokens_per_block",
                     "kv_cache_free_gpu_memory_fraction")}


def _engine(name: str, values: dict) -> Any:
    """The engine's settings from its own flags; another engine's flag is refused."""
    from perfmodel.serving.engines import engine_config

    for other, flags in _FLAGS.items():
        given = [f for f in flags if other != "vllm" and values[f] is not None]
        if other != name and given:
            fail(f"--{given[0].replace('_', '-')}: applies to --engine {other}, not {name}")
    flags = {f: values[f] for f in _FLAGS[name]}
    if name == "vllm":
        flags["scheduler"] = values["scheduler"].value
    else:
        flags["cuda_graphs" if name == "trtllm" else "disable_cuda_graph"] = \
            values["cuda_graphs"] if name == "trtllm" else not values["cuda_graphs"]
        flags["max_seq_len" if name == "trtllm" else "context_length"] = \
            values["max_model_len"] or None
    return engine_config(name, **flags)


def _traffic(trace: Path | None, rate: str | None, concurrency: int, n: int,
             input_len: int, output_len: int, arrival: str, burstiness: float,
             length_dist: str, spread: float, lengths_from: Path | None,
             shared_prefix: int, seed: int, talk: tuple = (1, None, None),
             copies: int = 1, shape: str | None = None,
             trace_shape: tuple = ("auto", None, 1.0)) -> list:
    """[(offered rate or None, Requests, label)]: one stream, or one per --rate; each
    simulated ``copies`` times (the band's edges), which must fit in memory. A trace
    without arrival times (``trace_inputs.timeless``) takes them from --rate."""
    from perfmodel.serving import traffic
    from perfmodel.serving.requests import check_memory

    trace_inputs.check(trace, lengths_from, trace_shape)
    timeless = trace_inputs.timeless(trace, trace_shape)
    sources = sum(x is not None and x != 0 for x in (trace, None if timeless else rate,
                                                     concurrency or None))
    if trace is not None and rate is not None and not timeless:
        fail(f"--rate: {trace.name} has its own arrival times; drop --rate (--trace-speedup "
             "X sends them X times faster)")
    if sources != 1:
        fail("give one source of traffic: --trace FILE, --rate R or --concurrency C")
    if timeless:
        return trace_inputs.at_rates(trace_inputs.requests(trace, trace_shape), trace, numbers(
            "--rate", rate, float, minimum=0.0) if rate else [], arrival, burstiness, seed)
    if trace is not None:
        reqs = trace_inputs.requests(trace, trace_shape)
        if talk[1] is not None:
            from perfmodel.serving import sessions

            reqs = sessions.after_answers(reqs, talk[1])
            typer.echo(f"warning: --think-time {talk[1]:g}: {trace.name}'s later turns are "
                       "sent that long after the previous turn's answer; their recorded "
                       "arrival times are not used", err=True)
        return [(None, reqs, trace.name)]
    lengths = trace_inputs.requests(lengths_from, trace_shape, "--lengths-from") \
        if lengths_from is not None else None
    common = dict(input_len=input_len, output_len=output_len, length_dist=length_dist,
                  spread=spread, lengths_from=lengths, shared_prefix=shared_prefix, seed=seed)
    if talk != (1, None, None):
        common.update(turns=talk[0], think_time=talk[1] or 0.0, turn_growth=talk[2])
    if shape is not None:
        from perfmodel.serving.rate_shape import parse

        common.update(rate_shape=parse(shape))
    rates = [] if concurrency else numbers("--rate", rate, float, minimum=0.0)
    check_memory(n, output_len, copies * max(len(rates), 1))
    if concurrency:
        return [(None, traffic.generate(n, concurrency=concurrency, **common),
                 f"{concurrency} users")]
    if any(r <= 0 for r in rates):
        fail(f"--rate: expected request rates > 0, got {rate}")
    if any(math.isinf(r) for r in rates):
        typer.echo(f"warning: --rate inf: all {n:,} requests arrive at t=0 (vLLM's "
                   "--request-rate inf)", err=True)
    if math.isinf(burstiness) and arrival == "gamma":
        typer.echo("warning: --burstiness inf: every gap exactly 1/rate (gamma's limit: "
                   "--arrival constant)", err=True)
    return [(r, traffic.generate(n, rate=r, arrival=arrival, burstiness=burstiness, **common),
             f"{r:g} req/s") for r in rates]
