"""CLI command ``simulate``: serve a stream of requests on one engine (or dp replicas) and
report the latency users see, as vLLM's benchmark tool measures it.

Module level: typer and the standard library only (``perfmodel --help`` stays fast). No
``from __future__ import annotations``: typer reads the Annotated option types.
"""

from dataclasses import replace
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer

from perfmodel.cli.common import (
    AttentionDp,
    Dp,
    DtypeOpt,
    Ep,
    HardwareOpt,
    ModelOpt,
    Pp,
    QuantizeHead,
    Tp,
    WeightsOpt,
    fail,
    numbers,
    out_dir,
    plan,
    save,
    workload,
    writing,
)
from perfmodel.cli.devices import EngineOpt, device
from perfmodel.cli.host import FrontendOpt, HostOnOpt, ModeOpt, ProfileOpt, VersionOpt, host_profile

_TRAFFIC = "traffic (one source: --trace, --rate, or --concurrency)"
_ENGINE = "engine (vLLM's flag names and defaults)"
_SGL = "--engine sglang (SGLang's flag names; unset: its defaults)"
_TRT = "--engine trtllm (TensorRT-LLM's option names; unset: its defaults)"
_FLEET = "replicas and conversations"
Opt = typer.Option


class Format(str, Enum):
    table = "table"
    json = "json"


class Scheduler(str, Enum):
    continuous = "continuous"
    static = "static"


def simulate_cmd(
    model: ModelOpt,
    hardware: HardwareOpt,
    engine_name: EngineOpt = "vllm",       # --engine (``engine`` is the EngineConfig)
    engine_version: VersionOpt = None,
    engine_mode: ModeOpt = None,
    engine_profile: ProfileOpt = None,
    frontend: FrontendOpt = "http",
    host_time: HostOnOpt = True,
    trace: Annotated[Path | None, Opt(rich_help_panel=_TRAFFIC, help=(
        "CSV of arrival_s,input_tokens,output_tokens[,prefix_id,prefix_tokens]"
        "[,session_id,turn]"))] = None,
    rate: Annotated[str | None, Opt(rich_help_panel=_TRAFFIC, help=(
        "requests per second; several, comma-separated, draw latency against load"))] = None,
    concurrency: Annotated[int, Opt(min=0, rich_help_panel=_TRAFFIC, help=(
        "closed loop: C users, each sending its next request when the last finishes"))] = 0,
    num_requests: Annotated[int, Opt(min=1, rich_help_panel=_TRAFFIC)] = 1000,
    input_len: Annotated[int, Opt(min=1, rich_help_panel=_TRAFFIC,
                                  help="mean prompt tokens")] = 1024,
    output_len: Annotated[int, Opt(min=1, rich_help_panel=_TRAFFIC,
                                   help="mean output tokens")] = 128,
    arrival: Annotated[str, Opt(rich_help_panel=_TRAFFIC,
                                help="poisson | constant | gamma")] = "poisson",
    burstiness: Annotated[float, Opt(rich_help_panel=_TRAFFIC, help=(
        "gamma shape of the gaps (vLLM's --burstiness): < 1 burstier than Poisson"))] = 1.0,
    length_dist: Annotated[str, Opt(rich_help_panel=_TRAFFIC, help=(
        "fixed | uniform | lognormal | empirical (with --lengths-from)"))] = "fixed",
    spread: Annotated[float, Opt(rich_help_panel=_TRAFFIC, help=(
        "uniform: +- share of the mean; lognormal: sigma"))] = 0.5,
    lengths_from: Annotated[Path | None, Opt(rich_help_panel=_TRAFFIC, help=(
        "a trace whose (input, output) pairs the empirical lengths are drawn from"))] = None,
    shared_prefix: Annotated[int, Opt(min=0, rich_help_panel=_TRAFFIC, help=(
        "a system prompt of S tokens before every request's own input"))] = 0,
    seed: Annotated[int, Opt(rich_help_panel=_TRAFFIC)] = 0,
    max_num_seqs: Annotated[int, Opt(min=1, rich_help_panel=_ENGINE)] = 256,
    max_num_batched_tokens: Annotated[int, Opt(min=1, rich_help_panel=_ENGINE)] = 8192,
    gpu_memory_utilization: Annotated[float, Opt(min=0.01, max=1.0,
                                                 rich_help_panel=_ENGINE)] = 0.9,
    block_size: Annotated[int, Opt(min=1, rich_help_panel=_ENGINE)] = 16,
    chunked_prefill: Annotated[bool, Opt(rich_help_panel=_ENGINE)] = True,
    prefix_caching: Annotated[bool, Opt(rich_help_panel=_ENGINE)] = True,
    scheduler: Annotated[Scheduler, Opt(rich_help_panel=_ENGINE, help=(
        "continuous batching, or the static baseline (a batch runs until its last "
        "request finishes)"))] = Scheduler.continuous,
    cuda_graphs: Annotated[bool, Opt(rich_help_panel=_ENGINE, help=(
        "pure-decode steps replay a CUDA graph (vLLM's default; off: --enforce-eager)"))
                           ] = True,
    max_model_len: Annotated[int, Opt(min=0, rich_help_panel=_ENGINE,
                                      help="0: the model's context limit")] = 0,
    chunked_prefill_size: Annotated[int | None, Opt(rich_help_panel=_SGL,
                                                    help="-1: off (default 8192)")] = None,
    max_prefill_tokens: Annotated[int | None, Opt(rich_help_panel=_SGL)] = None,
    max_running_requests: Annotated[int | None, Opt(rich_help_panel=_SGL, help=(
        "unset: SGLang's rule from the KV pool"))] = None,
    schedule_policy: Annotated[str | None, Opt(rich_help_panel=_SGL, help="fcfs | lpm")
                               ] = None,
    schedule_conservativeness: Annotated[float | None, Opt(rich_help_panel=_SGL)] = None,
    page_size: Annotated[int | None, Opt(rich_help_panel=_SGL)] = None,
    mem_fraction_static: Annotated[float | None, Opt(rich_help_panel=_SGL)] = None,
    enable_mixed_chunk: Annotated[bool | None, Opt(rich_help_panel=_SGL)] = None,
    disable_radix_cache: Annotated[bool | None, Opt(rich_help_panel=_SGL)] = None,
    max_num_tokens: Annotated[int | None, Opt(rich_help_panel=_TRT, help="default 8192")
                              ] = None,
    max_batch_size: Annotated[int | None, Opt(rich_help_panel=_TRT, help="default 2048")
                              ] = None,
    capacity_scheduler_policy: Annotated[str | None, Opt(rich_help_panel=_TRT, help=(
        "GUARANTEED_NO_EVICT (default) | MAX_UTILIZATION"))] = None,
    enable_chunked_prefill: Annotated[bool | None, Opt(rich_help_panel=_TRT)] = None,
    tokens_per_block: Annotated[int | None, Opt(rich_help_panel=_TRT)] = None,
    kv_cache_free_gpu_memory_fraction: Annotated[float | None, Opt(rich_help_panel=_TRT)
                                                 ] = None,
    router: Annotated[str, Opt(rich_help_panel=_FLEET, help=(
        "round-robin | least-requests | least-tokens | session-affinity | prefix-affinity"
        " (across --dp replicas)"))] = "round-robin",
    workers: Annotated[int, Opt(rich_help_panel=_FLEET, help=(
        "processes simulating replicas at once (routers that read only the request)"))
                       ] = 1,
    turns: Annotated[int, Opt(rich_help_panel=_FLEET, help=(
        "turns per conversation (--rate): each turn's prompt extends the last"))] = 1,
    think_time: Annotated[float, Opt(rich_help_panel=_FLEET, help=(
        "seconds between a conversation's turns"))] = 0.0,
    turn_growth: Annotated[int | None, Opt(rich_help_panel=_FLEET, help=(
        "mean new tokens a later turn adds (default --input-len)"))] = None,
    weights_dtype: WeightsOpt = None,
    quantize_lm_head: QuantizeHead = None,
    act_dtype: DtypeOpt = "bf16",
    kv_dtype: DtypeOpt = "bf16",
    tp: Tp = 1,
    pp: Pp = 1,
    ep: Ep = 1,
    dp: Dp = 1,
    attention_dp: AttentionDp = False,
    slo_ttft: Annotated[float | None, Opt(help="TTFT SLO, seconds (goodput)")] = None,
    slo_tpot: Annotated[float | None, Opt(help="TPOT SLO, seconds (goodput)")] = None,
    fmt: Annotated[Format, Opt("--format", "-f")] = Format.table,
    out: Annotated[Path | None, Opt(help=(
        "folder for requests.csv, steps.csv, summary.json and the figures"))] = None,
    progress: Annotated[bool, Opt(help="a progress bar on stderr")] = True,
    dpi: Annotated[int, Opt(min=1, max=1200)] = 120,
) -> None:
    """Simulate a serving engine under a stream of requests: queueing, TTFT, TPOT, ITL,
    end-to-end latency, throughput and goodput, per request and in percentiles."""
    from perfmodel.specs import load
    from perfmodel.specs.errors import SpecError

    for name, value in (("--slo-ttft", slo_ttft), ("--slo-tpot", slo_tpot)):
        if value is not None and not value > 0:
            fail(f"{name}: expected a positive number of seconds, got {value}")
    if out is not None:
        out_dir(out)
    try:
        m, hw = load.model(model), device(hardware, engine_name)
        wl = workload(m, 1, input_len, output_len, weights_dtype, act_dtype, kv_dtype,
                      quantize_lm_head=quantize_lm_head)
        layout = plan(tp, pp, ep, dp, attention_dp, 0)
        values = locals()
        engine = _engine(engine_name, values)
        engine = replace(engine, host=host_profile(engine_name, engine_version, engine_mode,
                                                   engine_profile, frontend, host_time))
        streams = _traffic(trace, rate, concurrency, num_requests, input_len, output_len,
                           arrival, burstiness, length_dist, spread, lengths_from,
                           shared_prefix, seed, (turns, think_time, turn_growth))
        runs = [(r, _run(m, hw, reqs, layout, engine, wl, progress, label,
                         (router, workers)))
                for r, reqs, label in streams]
    except SpecError as exc:
        fail(str(exc))
    _show(runs, fmt, slo_ttft, slo_tpot, m, hw, layout, wl, engine)
    if out is not None:
        _write(out, runs, slo_ttft, slo_tpot, dpi, _capacity(m, hw, layout, wl, engine))


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
             shared_prefix: int, seed: int, talk: tuple = (1, 0.0, None)) -> list:
    """[(offered rate or None, Requests, label)]: one stream, or one per --rate."""
    from perfmodel.serving import traffic

    sources = sum(x is not None and x != 0 for x in (trace, rate, concurrency or None))
    if sources != 1:
        fail("give one source of traffic: --trace FILE, --rate R or --concurrency C")
    if trace is not None:
        return [(None, traffic.read_trace(trace), trace.name)]
    lengths = traffic.read_trace(lengths_from) if lengths_from is not None else None
    common = dict(input_len=input_len, output_len=output_len, length_dist=length_dist,
                  spread=spread, lengths_from=lengths, shared_prefix=shared_prefix, seed=seed)
    if talk != (1, 0.0, None):
        common.update(turns=talk[0], think_time=talk[1], turn_growth=talk[2])
    if concurrency:
        return [(None, traffic.generate(n, concurrency=concurrency, **common),
                 f"{concurrency} users")]
    rates = numbers("--rate", rate, float, minimum=0.0)
    if any(r <= 0 for r in rates):
        fail(f"--rate: expected request rates > 0, got {rate}")
    extra = {"burstiness": burstiness} if arrival == "gamma" else {}
    return [(r, traffic.generate(n, rate=r, arrival=arrival, **extra, **common),
             f"{r:g} req/s") for r in rates]


def _run(m: Any, hw: Any, reqs: Any, layout: Any, engine: Any, wl: Any, progress: bool,
         label: str, fleet: tuple = ("round-robin", 1)) -> Any:
    from perfmodel.serving.simulate import simulate

    extra = {"router": fleet[0], "workers": fleet[1]}
    if not progress:
        return simulate(m, hw, reqs, layout, engine, wl, label=label, **extra)
    from tqdm import tqdm

    with tqdm(total=len(reqs), desc=label, unit="req", leave=False, mininterval=0.5,
              disable=None) as bar:
        def tick(done: int, total: int) -> None:
            bar.update(done - bar.n)
        return simulate(m, hw, reqs, layout, engine, wl, tick, label, **extra)


def _show(runs: list, fmt: Format, slo_ttft: float | None, slo_tpot: float | None,
          m: Any, hw: Any, layout: Any, wl: Any, engine: Any) -> None:
    from perfmodel.report import serving_tables as tables

    points = [(r, res.summary(slo_ttft, slo_tpot)) for r, res in runs]
    if fmt is Format.json:
        if len(points) == 1:
            typer.echo(tables.summary_json(points[0][1]))
        else:
            typer.echo(tables.summary_json({"runs": [dict(s, rate=r) for r, s in points]}))
        return
    pool = runs[0][1].info["kv_pool"]
    engine = runs[0][1].info["engine"]          # with what the engine derives at start-up
    typer.echo(f"{m.name} on {hw.name}, {layout.describe() or 'one device'}; {engine.flags()}")
    typer.echo(f"KV pool {pool.blocks} blocks of {engine.block_size} tokens "
               f"({pool.blocks * engine.block_size:,} tokens) after {pool.weights_bytes / 1e9:.2f}"
               f" GB weights and {pool.activation_bytes / 1e9:.2f} GB activations (and any"
               " recurrent state)")
    typer.echo(f"host time: {engine.host.describe()}")
    for (_, s), (_, res) in zip(points, runs, strict=True):
        typer.echo(tables.summary_table(s, res.label))
    if len(points) > 1:
        typer.echo(tables.load_table(points))
        cap = _capacity(m, hw, layout, wl, engine)
        typer.echo(f"estimated capacity {cap:.2f} req/s (perfmodel estimate at the largest "
                   "batch that fits): queueing grows without bound past it")


def _capacity(m: Any, hw: Any, layout: Any, wl: Any, engine: Any) -> float:
    from perfmodel.serving.engine import capacity_rps

    return capacity_rps(m, hw, layout, wl, engine)


def _write(out: Path, runs: list, slo_ttft: float | None, slo_tpot: float | None,
           dpi: int, capacity: float) -> None:
    from perfmodel.report import serving_plots as plots
    from perfmodel.report import serving_tables as tables

    with writing(out) as folder:
        for i, (_, res) in enumerate(runs):
            tag = "" if len(runs) == 1 else f"-{i}"
            (folder / f"requests{tag}.csv").write_text(tables.requests_csv(res))
            (folder / f"steps{tag}.csv").write_text(tables.steps_csv(res))
            (folder / f"summary{tag}.json").write_text(
                tables.summary_json(res.summary(slo_ttft, slo_tpot)))
            save(plots.time_series(res), folder / f"timeseries{tag}.png", dpi)
        results = [res for _, res in runs]
        save(plots.latency_cdfs(results, [r.label for r in results]),
             folder / "latency_cdf.png", dpi)
        if len(runs) > 1:
            points = [(r, res.summary(slo_ttft, slo_tpot)) for r, res in runs]
            save(plots.load_curve(points, capacity), folder / "load.png", dpi)
            (folder / "load.txt").write_text(tables.load_table(points))
    typer.echo(f"wrote {out}/")
