"""CLI command ``simulate``: serve a stream of requests on one engine (or dp replicas) and
report the latency users see, as vLLM's benchmark tool measures it.

Module level: typer and the standard library only (``perfmodel --help`` stays fast). No
``from __future__ import annotations``: typer reads the Annotated option types.
"""

import time
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer

from perfmodel.cli import simulate_autoscale as sa
from perfmodel.cli import simulate_disagg_opts as pd_opts
from perfmodel.cli import simulate_lora as sl
from perfmodel.cli import simulate_offload_opts as kv_opts
from perfmodel.cli import speculative as sp
from perfmodel.cli import trace_inputs
from perfmodel.cli.common import (
    AttentionDp,
    DtypeOpt,
    Ep,
    HardwareOpt,
    ModelOpt,
    Pp,
    QuantizeHead,
    Tp,
    WeightsFormatOpt,
    WeightsOpt,
    fail,
    out_dir,
    out_path,
)
from perfmodel.cli.devices import EngineOpt
from perfmodel.cli.energy_opts import EnergyOpt, EstimatePricesOpt, with_energy
from perfmodel.cli.host import FrontendOpt, HostOnOpt, ModeOpt, ProfileOpt, VersionOpt
from perfmodel.cli.simulate_bands import banded_summaries, edge_pair
from perfmodel.cli.simulate_files import write as _write
from perfmodel.cli.simulate_inputs import inputs

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


# generated-traffic options a trace replaces: given with --trace they would be ignored
# (--think-time is not one: it re-sends a trace's later turns after their answers)
_GENERATED = ("num_requests", "input_len", "output_len", "arrival", "burstiness",
              "length_dist", "spread", "lengths_from", "shared_prefix", "seed", "turns",
              "turn_growth", "loras", "lora_dist", "lora_skew", "rate_shape")
_ANNOUNCE_AFTER_S = 2.0    # a run still going after this long says how long it will take


def simulate_cmd(
    ctx: typer.Context,
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
        "[,session_id,turn]; or a public trace (--trace-format)"))] = None,
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
    schedule_policy: Annotated[str | None, Opt(rich_help_panel=_SGL, help="fcfs | lpm | dfs-weight")
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
        "round-robin | least-requests | least-tokens | power-of-two | queue-kv | "
        "session-affinity | prefix-affinity (across --dp replicas)"))] = "round-robin",
    workers: Annotated[int, Opt(rich_help_panel=_FLEET, help=(
        "processes simulating replicas at once (routers that read only the request)"))
                       ] = 1,
    cluster: Annotated[str | None, Opt(rich_help_panel=_FLEET, help=(
        "run those replicas on Dask: local (--workers processes) or a scheduler's address,"
        " tcp://host:8786 (pip install 'perfmodel[fleet]')"))] = None,
    turns: Annotated[int, Opt(rich_help_panel=_FLEET, help=(
        "turns per conversation (--rate): each turn's prompt extends the last"))] = 1,
    think_time: Annotated[float | None, Opt(rich_help_panel=_FLEET, help=(
        "seconds from a turn's answer to the next turn (default 0); with --trace: re-send "
        "its later turns so, not at their recorded times"))] = None,
    turn_growth: Annotated[int | None, Opt(rich_help_panel=_FLEET, help=(
        "mean new tokens a later turn adds (default --input-len)"))] = None,
    weights_dtype: WeightsOpt = None,
    weights_format_name: WeightsFormatOpt = None,
    quantize_lm_head: QuantizeHead = None,
    act_dtype: DtypeOpt = "bf16",
    kv_dtype: DtypeOpt = "bf16",
    tp: Tp = 1,
    pp: Pp = 1,
    ep: Ep = 1,
    dp: Annotated[int, Opt(min=1, help=(
        "data-parallel replicas, each serving every dp-th request"))] = 1,
    attention_dp: AttentionDp = False,
    slo_ttft: Annotated[float | None, Opt(help="TTFT SLO, seconds (goodput)")] = None,
    slo_tpot: Annotated[float | None, Opt(help="TPOT SLO, seconds (goodput)")] = None,
    fmt: Annotated[Format, Opt("--format", "-f")] = Format.table,
    out: Annotated[Path | None, Opt(parser=out_path, metavar="<path>", help=(
        "folder for requests.csv, steps.csv, summary.json and the figures"))] = None,
    progress: Annotated[bool, Opt(help="a progress bar on stderr")] = True,
    dpi: Annotated[int, Opt(min=1, max=1200)] = 120,
    band: Annotated[bool, Opt(help=(
        "the 80% band: simulate again with every step at the low and the high edge of its "
        "kernels' band, on a twelfth of a run of over 800 requests (a device with an "
        "uncertainty: block; about a fifth to a third more time)"))] = True,
    prefill_replicas: pd_opts.Replicas = 0,
    decode_replicas: pd_opts.DecodeReplicas = 1,
    prefill_hardware: pd_opts.Hardware = None,
    decode_hardware: pd_opts.Hardware = None,
    prefill_tp: pd_opts.Tp = None,
    decode_tp: pd_opts.Tp = None,
    prefill_ep: pd_opts.Ep = None,
    decode_ep: pd_opts.Ep = None,
    prefill_flag: pd_opts.Flag = None,
    decode_flag: pd_opts.Flag = None,
    kv_link: pd_opts.Link = "nixl",
    kv_contention: pd_opts.Contention = True,
    energy: EnergyOpt = False,
    prices: EstimatePricesOpt = None,
    speculative_config: sp.SpecConfig = None,
    speculative_algorithm: sp.SpecAlgorithm = None,
    speculative_draft_model_path: sp.SpecDraftPath = None,
    speculative_num_steps: sp.SpecSteps = None,
    speculative_eagle_topk: sp.SpecTopk = None,
    speculative_num_draft_tokens: sp.SpecDraftTokens = None,
    acceptance: sp.Acceptance = None,
    acceptance_profile: sp.AcceptanceProfile = None,
    acceptance_mode: sp.AcceptanceMode = "expected",
    acceptance_seed: sp.AcceptanceSeed = 0,
    enable_lora: sl.EnableLora = False,
    max_loras: sl.MaxLoras = None,
    max_lora_rank: sl.MaxLoraRank = None,
    max_cpu_loras: sl.MaxCpuLoras = None,
    max_loras_per_batch: sl.MaxLorasPerBatch = None,
    lora_paths: sl.LoraPaths = None,
    lora_target_modules: sl.LoraModules = None,
    loras: sl.Loras = 0,
    lora_dist: sl.LoraDist = "zipf",
    lora_skew: sl.LoraSkew = 1.0,
    rate_shape: sa.RateShapeOpt = None,
    autoscale: sa.AutoscaleOpt = None,
    autoscale_target: sa.TargetOpt = None,
    min_replicas: sa.MinReplicasOpt = 1,
    max_replicas: sa.MaxReplicasOpt = 4,
    scale_interval: sa.IntervalOpt = 15.0,
    scale_down_window: sa.DownWindowOpt = 300.0,
    startup_s: sa.StartupOpt = None,
    kv_offload: kv_opts.Tiers = None,
    cpu_kv_gb: kv_opts.CpuGb = None,
    ssd_kv_gb: kv_opts.SsdGb = None,
    kv_offload_write_policy: kv_opts.WritePolicy = "write_through",
    kv_offload_overlap: kv_opts.Overlap = None,
    trace_format: trace_inputs.FormatOpt = "auto",
    trace_window: trace_inputs.WindowOpt = None,
    trace_speedup: trace_inputs.SpeedupOpt = 1.0,
) -> None:
    """Simulate a serving engine under a stream of requests: queueing, TTFT, TPOT, ITL,
    end-to-end latency, throughput and goodput, per request and in percentiles."""
    options = {k: v for k, v in locals().items() if k not in ("energy", "prices")}
    from perfmodel.specs.errors import SpecError

    check_slos(slo_ttft, slo_tpot)
    from perfmodel.cli import simulate_disagg

    pd = simulate_disagg.wanted(ctx, options)
    folder = None if out is None else out_dir(Path(out))
    if trace is not None:
        trace_inputs.refuse(ctx, trace, (trace_format, trace_window, trace_speedup), _GENERATED)
    if pd:
        if energy or prices is not None:
            fail("--energy / --prices: not priced for a disaggregated deployment yet; drop "
                 "them with --prefill-replicas")
        return simulate_disagg.run(ctx, options, folder, _write)
    try:
        m, hw, wl, layout, engine, streams = inputs(options)
        if autoscale is not None:
            return sa.main(dict(options, prices=prices), m, hw, wl, layout, engine, streams,
                           folder, dpi)
        fleet = (router, workers, cluster)
        runs = [(r, _run(m, hw, reqs, layout, engine, wl, progress, label, fleet=fleet,
                         band=band and hw.uncertainty is not None))
                for r, reqs, label in streams]
        edges = [edge_pair(res, reqs, lambda q, e, label=label: _run(
            m, hw, q, layout, engine, wl, False, label, e, fleet, quiet=True),
            slo_ttft, slo_tpot)
                 for (_, res), (_, reqs, label) in zip(runs, streams, strict=True)] \
            if band and hw.uncertainty is not None else None
    except SpecError as exc:
        fail(str(exc))
    summaries = banded_summaries(runs, edges, hw, slo_ttft, slo_tpot)
    if energy or prices is not None:
        try:
            summaries = with_energy(runs, summaries, m, hw, layout, wl, prices)
        except SpecError as exc:
            fail(str(exc))
    _show(runs, summaries, fmt, m, hw, layout, wl, engine)
    if folder is not None:
        _write(folder, runs, summaries, dpi, _capacity(m, hw, layout, wl, engine))


def _run(m: Any, hw: Any, reqs: Any, layout: Any, engine: Any, wl: Any, progress: bool,
         label: str, edge: int | None = None, fleet: tuple = ("round-robin", 1),
         band: bool = False, quiet: bool = False) -> Any:
    """One simulation at the centre or at a band's ``edge``; ``quiet``: a band's run, no
    progress line or time estimate; ``band``: the time estimate counts the band's runs to
    come (``serving.bands.sample_size``: two of the sample, or two whole runs)."""
    from perfmodel.serving.bands import sample_size
    from perfmodel.serving.simulate import simulate

    extra = dict(zip(("router", "workers", "cluster"), fleet, strict=False))
    closed = bool(reqs.closed_loop)
    k = sample_size(len(reqs))
    runs = 1.0 + 2.0 * k / len(reqs) * band
    announce = _Eta(len(reqs), 0.0 if closed else float(reqs.arrival_s[-1]), label, runs)
    if quiet:
        return simulate(m, hw, reqs, layout, engine, wl, label=label, edge=edge, **extra)
    if not progress:
        return simulate(m, hw, reqs, layout, engine, wl, announce, label, **extra)
    from tqdm import tqdm

    with tqdm(total=len(reqs), desc=label, unit="req", leave=False, mininterval=0.5,
              disable=None) as bar:
        def tick(done: int, total: int, clock: float) -> None:
            bar.update(max(done - bar.n, 0))
            announce(done, total, clock)
        return simulate(m, hw, reqs, layout, engine, wl, tick, label, **extra)


class _Eta:
    """``simulate``'s progress callback: ``_ANNOUNCE_AFTER_S`` seconds after the first
    call (the set-up before it is not the pace), says once on stderr how long the whole
    will take at the pace since, if that is over twice as long. The share done is the
    larger of the requests finished and the simulated clock over the last arrival (the
    first requests finish late in a long run); dp engines run one after another, each
    ``total`` of the ``n``."""

    def __init__(self, n: int, last_arrival_s: float, label: str, runs: float = 1.0) -> None:
        self.n, self.last, self.label, self.runs = n, last_arrival_s, label, runs
        self.said, self.start, self.first = False, time.perf_counter(), None
        self.before, self.seen = 0, (0, 0, 0.0)     # requests of the engines already run

    def __call__(self, done: int, total: int, clock: float) -> None:
        if done < self.seen[0] or clock < self.seen[2]:      # the next engine began
            self.before += self.seen[1]
        self.seen = (done, total, clock)
        share = max(done / max(total, 1), min(clock / self.last, 1.0) if self.last > 0 else 0)
        part, now = (self.before + share * total) / self.n, time.perf_counter()
        if self.first is None:
            self.first = (now, part)
        since, gained = now - self.first[0], part - self.first[1]
        if self.said or gained <= 0 or since < _ANNOUNCE_AFTER_S:
            return
        self.said = True
        whole = (now - self.start + since / gained * (1.0 - part)) * self.runs
        if whole > 2 * _ANNOUNCE_AFTER_S:
            typer.echo(f"note: {self.label}: {part:.2%} of {self.n:,} requests simulated in "
                       f"{now - self.start:.0f} s: about {_duration(whole)} in all", err=True)


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 172_800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86_400:,.0f} days"


def _show(runs: list, summaries: list[dict], fmt: Format, m: Any, hw: Any, layout: Any,
          wl: Any, engine: Any) -> None:
    from perfmodel.report import serving_tables as tables

    points = [(r, s) for (r, _), s in zip(runs, summaries, strict=True)]
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
        kv_opts.show(s)
    if len(points) > 1:
        typer.echo(tables.load_table(points))
        cap = _capacity(m, hw, layout, wl, engine)
        typer.echo(f"estimated capacity {cap:.2f} req/s (perfmodel estimate at the largest "
                   "batch that fits): queueing grows without bound past it")


def _capacity(m: Any, hw: Any, layout: Any, wl: Any, engine: Any) -> float:
    from perfmodel.serving.pricing import capacity_rps

    return capacity_rps(m, hw, layout, wl, engine)


def check_slos(slo_ttft: float | None, slo_tpot: float | None) -> None:
    """A one-line error for an SLO that is not a positive number of seconds."""
    for name, value in (("--slo-ttft", slo_ttft), ("--slo-tpot", slo_tpot)):
        if value is not None and not value > 0:
            fail(f"{name}: expected a positive number of seconds, got {value}")
