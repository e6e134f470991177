"""CLI commands ``estimate`` (one configuration) and ``list`` (the shipped specs).

Module level: typer and the standard library only; the model is imported inside the
commands, so ``perfmodel --help`` stays fast. No ``from __future__ import annotations``:
typer reads the Annotated option types at registration time.
"""

from enum import Enum
from typing import Annotated, Any

import typer

from perfmodel.cli.common import (
    AcceptanceOpt,
    AttentionDp,
    Batch,
    DiffusionBlock,
    DiffusionCache,
    DiffusionSteps,
    Dp,
    DraftHeads,
    DraftK,
    DraftOpt,
    DtypeOpt,
    Ep,
    ExpertReplicas,
    ExpertSkew,
    Gen,
    Graphs,
    GroupSize,
    HardwareOpt,
    HitRate,
    KvBlock,
    KvGroupSize,
    KvScaleBytes,
    MemFrac,
    ModelOpt,
    MtpDepth,
    OutlierFraction,
    Pp,
    Prompt,
    QuantizeHead,
    SharedPrefix,
    Tp,
    WeightsFormatOpt,
    WeightsOpt,
    diffusion,
    fail,
    plan,
    speculation,
    weights_format,
    workload,
)
from perfmodel.cli.devices import EngineOpt
from perfmodel.cli.energy_opts import EnergyOpt, EstimatePricesOpt


class Format(str, Enum):
    table = "table"
    json = "json"
    csv = "csv"
    markdown = "markdown"


def estimate(
    model: ModelOpt,
    hardware: HardwareOpt,
    engine: EngineOpt = "vllm",
    batch: Batch = 1,
    prompt: Prompt = 512,
    gen: Gen = 128,
    weights_dtype: WeightsOpt = None,
    weights_format_name: WeightsFormatOpt = None,
    act_dtype: DtypeOpt = "bf16",
    kv_dtype: DtypeOpt = "bf16",
    tp: Tp = 1,
    pp: Pp = 1,
    ep: Ep = 1,
    dp: Dp = 1,
    attention_dp: AttentionDp = False,
    expert_replicas: ExpertReplicas = 0,
    group_size: GroupSize = None,
    outlier_fraction: OutlierFraction = 0.0,
    quantize_lm_head: QuantizeHead = None,
    kv_group_size: KvGroupSize = None,
    kv_scale_bytes: KvScaleBytes = 4.0,
    cuda_graphs: Graphs = False,
    memory_fraction: MemFrac = 0.9,
    kv_block: KvBlock = 16,
    shared_prefix: SharedPrefix = 0,
    prefix_hit_rate: HitRate = 1.0,
    expert_skew: ExpertSkew = 0.0,
    draft: DraftOpt = None,
    draft_k: DraftK = None,
    acceptance: AcceptanceOpt = None,
    mtp_depth: MtpDepth = None,
    draft_heads: DraftHeads = None,
    diffusion_steps: DiffusionSteps = None,
    diffusion_block: DiffusionBlock = None,
    diffusion_prompt_cache: DiffusionCache = False,
    fmt: Annotated[Format, typer.Option("--format", "-f")] = Format.table,
    breakdown: Annotated[bool, typer.Option(help="list every operator")] = False,
    energy: EnergyOpt = False,
    prices: EstimatePricesOpt = None,
) -> None:
    """Estimate TTFT, per-token latency, throughput and memory for one configuration."""
    options = {k: v for k, v in locals().items()
               if k not in ("fmt", "breakdown", "energy", "prices")}
    from perfmodel.report import tables
    from perfmodel.specs.errors import SpecError

    try:
        result = compute(**options)
        spent = _energy(result, prices) if energy or prices is not None else None
    except SpecError as exc:
        fail(str(exc))
    if spent is not None and fmt is not Format.json:
        _echo_energy(result, spent, fmt, breakdown)
    elif spent is not None:
        typer.echo(tables.to_json(result, with_ops=breakdown, energy=spent[0]))
    elif fmt is Format.json:
        typer.echo(tables.to_json(result, with_ops=breakdown))
    elif fmt is Format.csv:
        typer.echo(tables.to_csv(result, with_ops=breakdown), nl=False)
    elif fmt is Format.markdown:
        typer.echo(tables.markdown(result))
        if breakdown:
            typer.echo("")
            typer.echo(tables.breakdown_markdown(result))
    else:
        typer.echo(tables.table(result))
        if breakdown:
            typer.echo("")
            typer.echo(tables.breakdown(result))


def _energy(result: Any, prices: Any) -> tuple:
    """(the estimate's ``EnergySummary`` or None, the line saying why there is none)."""
    from perfmodel.cli.energy_opts import estimate_energy_of, no_power

    summary = estimate_energy_of(result, prices)
    return summary, None if summary is not None else no_power(result.hardware.name)


def _echo_energy(result: Any, spent: tuple, fmt: Format, breakdown: bool) -> None:
    """The table (markdown, CSV) output with the energy block (or the line saying why
    there is none) after it: the CSV gains the energy columns."""
    from perfmodel.report import tables
    from perfmodel.report.energy_text import energy_lines

    summary, why = spent
    if fmt is Format.csv:
        typer.echo(tables.to_csv(result, with_ops=breakdown, energy=summary), nl=False)
        return
    typer.echo(tables.markdown(result) if fmt is Format.markdown else tables.table(result))
    if breakdown:
        typer.echo("")
        typer.echo(tables.breakdown_markdown(result) if fmt is Format.markdown
                   else tables.breakdown(result))
    typer.echo("")
    typer.echo("\n".join(energy_lines(summary)) if summary is not None else why)


def compute(model: str, hardware: str, engine: str = "vllm", batch: int = 1,
            prompt: int = 512, gen: int = 128, weights_dtype: str | None = None,
            weights_format_name: str | None = None, act_dtype: str = "bf16",
            kv_dtype: str = "bf16", tp: int = 1, pp: int = 1, ep: int = 1, dp: int = 1,
            attention_dp: bool = False, expert_replicas: int = 0,
            group_size: int | None = None, outlier_fraction: float = 0.0,
            quantize_lm_head: bool | None = None, kv_group_size: int | None = None,
            kv_scale_bytes: float = 4.0, cuda_graphs: bool = False,
            memory_fraction: float = 0.9, kv_block: int = 16, shared_prefix: int = 0,
            prefix_hit_rate: float = 1.0, expert_skew: float = 0.0, draft: str | None = None,
            draft_k: int | None = None, acceptance: str | None = None,
            mtp_depth: int | None = None, draft_heads: int | None = None,
            diffusion_steps: int | None = None, diffusion_block: int | None = None,
            diffusion_prompt_cache: bool = False) -> Any:
    """The ``Estimate`` of ``perfmodel estimate``'s options (parsed values, keyword names as
    the command's parameters): what the command prints, and what the browser page shows.
    A user mistake raises SpecError (or, outside ``raising()``, exits via ``fail``)."""
    from perfmodel.schedules.estimates import estimate as run
    from perfmodel.specs import load

    spec = speculation(draft, draft_k, acceptance, mtp_depth, draft_heads)
    diffuse = diffusion(diffusion_steps, diffusion_block, diffusion_prompt_cache)
    weights_dtype, group_size, fmt_fields = weights_format(weights_format_name,
                                                           weights_dtype, group_size)
    m = load.model(model)
    wl = workload(m, batch, prompt, gen, weights_dtype, act_dtype, kv_dtype, group_size,
                  cuda_graphs, memory_fraction, kv_block, shared_prefix=shared_prefix,
                  prefix_hit_rate=prefix_hit_rate, expert_skew=expert_skew,
                  outlier_fraction=outlier_fraction, quantize_lm_head=quantize_lm_head,
                  kv_group_size=kv_group_size, kv_scale_bytes=kv_scale_bytes, **fmt_fields)
    layout = plan(tp, pp, ep, dp, attention_dp, expert_replicas)
    return run(load.hardware(hardware, engine), m, wl, layout, spec, diffuse)


def list_specs() -> None:
    """List the hardware and models known by name, one line each: the shipped ones and
    those of your spec folders (--specs, PERFMODEL_SPECS_PATH), marked with their folder."""
    from perfmodel.cost.params import param_counts
    from perfmodel.specs import load
    from perfmodel.specs.units import fmt_bytes, fmt_count, fmt_rate

    typer.echo("hardware:")
    for name in load.known("hardware"):
        hw = load.hardware(name)
        bf16 = hw.peak_flops_per_s.get("bf16")
        rate = fmt_rate(bf16, "FLOP/s") if bf16 else "n/a"
        typer.echo(f"  {name:<16} {fmt_bytes(hw.memory_bytes):>9}  "
                   f"{fmt_rate(hw.memory_bytes_per_s):>11}  bf16 {rate:>13}  {hw.description}"
                   + _origin(name, "hardware"))
    typer.echo("models:")
    for name in load.known("model"):
        m = load.model(name)
        counts = param_counts(m)
        typer.echo(f"  {name:<16} {fmt_count(counts.total):>7} params "
                   f"({fmt_count(counts.active(m))} active)  {m.n_layers} layers, "
                   f"d={m.d_model}, {m.attention_kind}"
                   + (f", MoE {m.moe.n_experts}x top-{m.moe.top_k}" if m.moe else "")
                   + (f", window {m.sliding_window}" if m.sliding_window else "")
                   + _origin(name, "model"))


def _origin(name: str, kind: str) -> str:
    """"  [from FOLDER]" for a name a user spec folder supplies; "" for a shipped one."""
    from perfmodel.specs import places

    path = places.find(name, kind)
    shipped = path is None or path.parent == places.package_dir(kind)
    return "" if shipped else f"  [from {path.parent}]"
