"""CLI command ``report``: a markdown and self-contained HTML report of one model on one
device, or a KV-cache comparison of several models.

Module level: typer and the standard library only. No ``from __future__ import
annotations``: typer reads the Annotated option types at registration time.
"""

from pathlib import Path
from typing import Annotated, Any

import typer

from perfmodel.cli.atomic import staged
from perfmodel.cli.common import (
    AcceptanceOpt,
    AttentionDp,
    Batch,
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
    HitRate,
    KvBlock,
    KvGroupSize,
    KvScaleBytes,
    MemFrac,
    MtpDepth,
    OutlierFraction,
    Pp,
    Prompt,
    QuantizeHead,
    SharedPrefix,
    Tp,
    WeightsFormatOpt,
    WeightsOpt,
    command_line,
    fail,
    ints,
    load_models,
    names,
    out_dir,
    out_path,
    plan,
    save,
    speculation,
    weights_format,
    workload,
)
from perfmodel.cli.devices import EngineOpt
from perfmodel.cli.figures import Dpi, FigFormat, Fmt, Models


def report_cmd(
    model: Models,
    hardware: Annotated[str, typer.Option("--hardware", "-H", help="hardware name or file")],
    out: Annotated[Path, typer.Option(parser=out_path, metavar="<path>",
                                      help="output directory (report.md, report.html, ...)")],
    engine: EngineOpt = "vllm",
    batch: Batch = 1,
    prompt: Prompt = 512, gen: Gen = 128, weights_dtype: WeightsOpt = None,
    weights_format_name: WeightsFormatOpt = None,
    act_dtype: DtypeOpt = "bf16", kv_dtype: DtypeOpt = "bf16", tp: Tp = 1,
    pp: Pp = 1, ep: Ep = 1, dp: Dp = 1, attention_dp: AttentionDp = False,
    expert_replicas: ExpertReplicas = 0,
    group_size: GroupSize = None, outlier_fraction: OutlierFraction = 0.0,
    quantize_lm_head: QuantizeHead = None,
    kv_group_size: KvGroupSize = None, kv_scale_bytes: KvScaleBytes = 4.0,
    cuda_graphs: Graphs = False, memory_fraction: MemFrac = 0.9, kv_block: KvBlock = 16,
    shared_prefix: SharedPrefix = 0, prefix_hit_rate: HitRate = 1.0,
    expert_skew: ExpertSkew = 0.0, draft: DraftOpt = None, draft_k: DraftK = None,
    acceptance: AcceptanceOpt = None, mtp_depth: MtpDepth = None,
    draft_heads: DraftHeads = None,
    roofline_batch: Annotated[str | None, typer.Option(
        help="batch sizes on the roofline (default: 1 and --batch)")] = None,
    sweep_batch: Annotated[str | None, typer.Option(
        help="batch sizes of the batch figures (default: powers of 2 to the ceiling)")] = None,
    contexts: Annotated[str, typer.Option(
        help="context lengths of the context figures, comma list")] = "512,2048,8192,32768",
    fmt: Fmt = FigFormat.png, dpi: Dpi = 90,
) -> None:
    """Markdown + self-contained HTML report; several --model values: a KV-cache comparison.
    The serving levers are estimate's options, shown in the report's assumptions."""
    names("--model", model)                  # a bad list fails before any work
    ctx = ints("--contexts", contexts)
    extra = {k: ints(f"--{k.replace('_', '-')}", v) for k, v in
             (("roofline_batch", roofline_batch), ("sweep_batch", sweep_batch)) if v is not None}
    out_dir(out)
    from perfmodel.specs import load
    from perfmodel.specs.errors import SpecError

    levers = {"shared_prefix": shared_prefix, "prefix_hit_rate": prefix_hit_rate,
              "expert_skew": expert_skew, "outlier_fraction": outlier_fraction,
              "quantize_lm_head": quantize_lm_head, "kv_group_size": kv_group_size,
              "kv_scale_bytes": kv_scale_bytes}
    layout = {"tp": tp, "pp": pp, "ep": ep, "dp": dp, "attention_dp": attention_dp,
              "expert_replicas": expert_replicas}
    drafting = {"draft": draft, "draft_k": draft_k, "acceptance": acceptance,
                "mtp_depth": mtp_depth, "draft_heads": draft_heads}
    command = command_line(
        "report", model=model, hardware=hardware,
        engine=None if engine == "vllm" else engine, batch=batch, prompt=prompt, gen=gen,
        weights_dtype=weights_dtype, weights_format=weights_format_name, act_dtype=act_dtype,
        kv_dtype=kv_dtype, **layout, group_size=group_size, cuda_graphs=cuda_graphs,
        memory_fraction=memory_fraction, kv_block=kv_block, **levers, **drafting,
        roofline_batch=roofline_batch, sweep_batch=sweep_batch, contexts=contexts,
        format=fmt, dpi=dpi, out=str(out))
    ctx = _past_prefix(ctx, shared_prefix)
    try:
        spec = speculation(**drafting)
        weights_dtype, group_size, fmt_fields = weights_format(weights_format_name,
                                                               weights_dtype, group_size)
        models = load_models("--model", model)
        if spec is not None and len(models) > 1:
            fail("--draft / --mtp-depth / --draft-heads: speculative decoding is shown in a "
                 "single-model report; expected one --model")
        hw = load.hardware(hardware, engine)
        wl = workload(models[0], batch, prompt, gen, weights_dtype, act_dtype, kv_dtype, group_size,
                      cuda_graphs, memory_fraction, kv_block, **levers, **fmt_fields)
        par = plan(**layout)
        if len(models) == 1:
            blocks, figures, files = _single_report(models, hw, wl, par, ctx, extra,
                                                    fmt.value, command, spec)
        else:
            blocks, figures, files = _comparison_report(models, hw, wl, par, ctx, extra,
                                                        fmt.value, command)
    except SpecError as exc:
        fail(str(exc))
    from perfmodel.report import pages as report_pages

    with staged(out) as folder:   # Ctrl-C leaves no partial file
        images = {}
        for name, fig in figures.items():
            save(fig, folder / name, dpi)
            images[name] = (folder / name).read_bytes()
        for name, text in files.items():
            (folder / name).write_text(text)
        (folder / "report.md").write_text(report_pages.to_markdown(blocks))
        (folder / "report.html").write_text(report_pages.to_html(blocks, images,
                                                                 blocks[0].text))
    typer.echo(f"wrote {out}/report.md, report.html, " + ", ".join([*figures, *files]))


def _past_prefix(ctx: list[int], shared_prefix: int) -> list[int]:
    """The context figures' prompt lengths longer than the shared prefix (a prompt must
    hold its prefix and at least one token more); a warning names those dropped."""
    kept = [c for c in ctx if c > shared_prefix]
    if not kept:
        fail(f"--contexts: every context is at most --shared-prefix {shared_prefix}; expected "
             f"at least one longer than the shared prefix")
    if len(kept) < len(ctx):
        typer.echo(f"warning: --contexts: {', '.join(str(c) for c in ctx if c not in kept)} "
                   f"left out of the context figures: not longer than --shared-prefix "
                   f"{shared_prefix}", err=True)
    return kept


def _batch_grid(ceiling: int, batch: int) -> list[int]:
    """Powers of two up to the batch ceiling, the ceiling itself and the workload batch."""
    from perfmodel.schedules.sweep import powers_of_two

    top = max(ceiling, 8)
    return sorted(set(powers_of_two(1, top)) | ({ceiling} if ceiling else set()) | {batch})


def _single_report(models: list, hw: Any, wl: Any, par: Any, ctx: list[int], extra: dict,
                   ext: str, command: str, spec: Any = None) -> tuple:
    """(blocks, figures, files) of the report of one model on one device (``spec``: its
    speculative decoding, in the estimate and the sweeps)."""
    from perfmodel.report import pages as report_pages
    from perfmodel.report import tables as report
    from perfmodel.schedules import sweep
    from perfmodel.schedules.estimates import estimate

    (m,) = models
    e = estimate(hw, m, wl, par, spec)
    rb = extra.get("roofline_batch") or sorted({1, wl.batch})
    batches = extra.get("sweep_batch") or _batch_grid(e.memory.max_batch, wl.batch)
    by_batch = sweep.sweep([m], [hw], batches, [wl.prompt_len], wl, plan=par,
                           speculations=[spec])
    by_context = sweep.sweep([m], [hw], [wl.batch], ctx, wl, plan=par, speculations=[spec])
    rows = sweep.rows(by_batch)
    figures = _single_figures(m, hw, wl, par, ctx, rb, rows, sweep.rows(by_context), ext)
    captions = _single_captions(e, ctx, rb)
    blocks = report_pages.single_report(e, command, list(zip(figures, captions, strict=True)),
                                        rows)
    files = {"estimate.json": report.to_json(e, with_ops=True) + "\n",
             "sweep.csv": _csv({k: _join(by_batch[k], by_context[k]) for k in by_batch})}
    return blocks, figures, files


def _scope(tp: int) -> str:
    return f"per device, TP {tp}" if tp > 1 else "one device"


def _single_figures(m: Any, hw: Any, wl: Any, par: Any, ctx: list[int], rb: list[int],
                    rows: list[dict], split: list[dict], ext: str) -> dict:
    """The five figures of the single-model report, by file name."""
    from dataclasses import replace

    from perfmodel.report import plots, sweep_plots
    from perfmodel.schedules import sweep

    points = [p for b in rb for p in plots.roofline_points(m, hw, replace(wl, batch=b),
                                                            plan=par)]
    kv = sweep.kv_cache_table([m], ctx, wl, par.tp)
    mb = sweep.max_batch_table([m], hw, ctx, wl, par)
    scope = _scope(par.tp)
    return {
        f"roofline.{ext}": plots.roofline_figure(points, [hw], plots.roofline_title(
            m, wl, ("prefill", "decode"), par)),
        f"latency_throughput_vs_batch.{ext}": sweep_plots.batch_figure(rows, (
            f"{m.name} on {hw.name}: TPOT and decode throughput against batch "
            f"(prompt {wl.prompt_len}, gen {wl.gen_len})")),
        f"throughput_vs_latency.{ext}": sweep_plots.tradeoff_figure(rows, (
            f"{m.name} on {hw.name}: throughput against latency (each point a batch size)")),
        f"time_split_vs_context.{ext}": sweep_plots.time_split_figure(split, (
            f"{m.name} on {hw.name}, batch {wl.batch}: time by operator class as the prompt "
            "grows")),
        f"kv_cache_vs_context.{ext}": sweep_plots.kv_figure(kv, mb, (
            f"{m.name}: KV cache ({scope}) and batch ceiling on {hw.name}"), scope=scope),
    }


def _single_captions(e: Any, ctx: list[int], rb: list[int]) -> list[str]:
    """The captions of ``_single_figures``, in its order."""
    from perfmodel.report import pages as report_pages

    wl, hw = e.workload, e.hardware
    return [
        report_pages.roofline_caption(e.model.name, hw.name, rb, e),
        "Per-token latency (TPOT) and decode throughput against batch; dashed: the memory "
        "ceiling (max batch); hollow: does not fit.",
        "Throughput against per-token latency; each point is a batch size.",
        f"Time per operator class at batch {wl.batch} for prompts of {contexts_text(ctx)} "
        f"tokens: the prefill step (TTFT) and the mean decode step (TPOT) over {wl.gen_len} "
        "generated tokens.",
        f"KV cache per token and per sequence against context ({_scope(e.plan.tp)}), and the "
        f"batch ceiling against context (prompt + {wl.gen_len} generated) on {hw.name}.",
    ]


def contexts_text(ctx: list[int]) -> str:
    """'512, 2,048, 8,192'."""
    return ", ".join(f"{c:,}" for c in ctx)


def _comparison_report(models: list, hw: Any, wl: Any, par: Any, ctx: list[int],
                       extra: dict, ext: str, command: str) -> tuple:
    from dataclasses import replace

    from perfmodel.cost.memory import kv_bytes_of, kv_bytes_per_token
    from perfmodel.report import pages as report_pages
    from perfmodel.report import sweep_plots
    from perfmodel.schedules import crossover, sweep
    from perfmodel.schedules.estimates import estimate
    from perfmodel.specs.workload import Workloads

    estimates = [estimate(hw, m, wl, par) for m in models]
    wls = Workloads.from_list([wl])
    whole = {m.name: float(kv_bytes_per_token(m, 1, kv_bytes_of(m, wls))[0]) for m in models}
    kv = sweep.kv_cache_table(models, ctx, wl, tp=1)
    mb = sweep.max_batch_table(models, hw, ctx, wl, par)
    name = f"kv_cache_vs_context.{ext}"
    fig = sweep_plots.kv_figure(kv, mb, (
        f"KV cache per token and per sequence (whole model); max batch on {hw.name} "
        f"(TP {par.tp}, weights {wl.weights_dtype}, KV {wl.kv_dtype})"), scope="whole model")
    caption = (f"Left: KV bytes per token (all layers, whole model). Middle: KV cache of one "
               f"sequence against its length (whole model; windows applied). Right: sequences "
               f"that fit per device on {hw.name} at TP {par.tp} against context (prompt + "
               f"{wl.gen_len} generated).")
    at_ceiling = [estimate(hw, e.model, replace(wl, batch=e.memory.max_batch), par)
                  for e in estimates if e.memory.max_batch > wl.batch]
    cross, cross_fig, cross_rows = _crossover(models, hw, wl, par, ctx, ext)
    blocks = report_pages.comparison_report(estimates, whole, command, [(name, caption),
                                                                        cross], mb, at_ceiling)
    files = {"kv_cache.csv": _csv(_columns(kv)), "max_batch.csv": _csv(_columns(mb)),
             "crossover.csv": _csv(_columns(cross_rows, crossover.CROSSOVER_COLUMNS))}
    return blocks, {name: fig, cross[0]: cross_fig}, files


def _crossover(models: list, hw: Any, wl: Any, par: Any, ctx: list[int], ext: str) -> tuple:
    """((file, caption), figure, crossing rows) of the KV and decode-step crossover figure."""
    import numpy as np

    from perfmodel.report import sweep_plots
    from perfmodel.schedules import crossover

    lo, hi = min(ctx), max(ctx)
    grid = np.unique(np.geomspace(lo, hi, 48).round().astype(int)).tolist()
    rows = crossover.context_curves(models, hw, grid, wl, par)
    found = crossover.crossovers(models, hw, wl, par, lo, hi)
    fig = sweep_plots.crossover_figure(rows, found, (
        f"against {models[0].name}: KV cache per sequence and the decode step (batch "
        f"{wl.batch}, {hw.name}, TP {par.tp}) as the context grows"))
    said = "; ".join(f"{c['model']} {'drops below' if c['below_after'] else 'rises above'} "
                     f"{c['reference']} in {c['quantity'].replace('_', ' ')} from "
                     f"{c['context']:,} tokens" for c in found) or "no curve crosses it"
    caption = (f"Left: KV cache of one sequence (whole model; windows, chunks and paging "
               f"applied); right: one decode step of {wl.batch} sequences at that context on "
               f"{hw.name}; circles: where a model's curve crosses {models[0].name}'s between "
               f"{lo:,} and {hi:,} tokens ({said}).")
    return (f"context_crossover.{ext}", caption), fig, found


def _columns(rows: list[dict], names: tuple[str, ...] = ()) -> dict:
    """Records as columns; no record: ``names`` as empty columns (a CSV of a header only:
    no crossing still says what a crossing would hold)."""
    return {k: [r[k] for r in rows] for k in rows[0]} if rows else {k: [] for k in names}


def _join(a: Any, b: Any) -> Any:
    import numpy as np

    return [*a, *b] if isinstance(a, list) else np.concatenate([a, b])


def _csv(columns: dict) -> str:
    from perfmodel.report.tables import columns_csv

    return columns_csv(columns)
