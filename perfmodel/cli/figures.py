"""CLI commands for figures and grids: ``roofline``, ``sweep``.

Module level imports: typer and the standard library only (heavy imports inside the
command bodies keep ``perfmodel --help`` fast). No ``from __future__ import annotations``:
typer reads the Annotated option types at registration time. Bad input prints one line,
``error: ...``, and exits with code 2.
"""

from collections.abc import Iterable, Iterator
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from perfmodel.cli.atomic import staged
from perfmodel.cli.common import (
    AttentionDp,
    DraftHeads,
    DraftK,
    DraftOpt,
    DtypeOpt,
    Gen,
    Graphs,
    KvBlock,
    MemFrac,
    MtpDepth,
    Prompt,
    Tp,
    WeightsOpt,
    dtypes,
    fail,
    flags,
    ints,
    load_models,
    names,
    numbers,
    out_dir,
    out_file,
    plan,
    save,
    speculation,
    weights_format,
    workload,
    writing,
)
from perfmodel.cli.devices import EngineOpt, devices
from perfmodel.specs.formats import format_names

MAX_DPI = 1200   # a 12 x 8 inch figure at 1200 dpi is already 138 megapixels
DEFAULT_KV_MODELS = "llama-2-13b,llama-3-70b,falcon-7b,deepseek-v3,mistral-7b,gemma-2-9b"


class PhaseChoice(str, Enum):
    prefill = "prefill"
    decode = "decode"
    both = "both"


class FigFormat(str, Enum):
    png = "png"
    svg = "svg"


Models = Annotated[str, typer.Option("--model", "-m", help="model name(s) or file(s), comma list")]
Devices = Annotated[str, typer.Option("--hardware", "-H",
                    help="hardware name(s) or YAML file(s), comma list")]
Fmt = Annotated[FigFormat, typer.Option("--format", help="figure format")]
Dpi = Annotated[int, typer.Option(min=1, max=MAX_DPI,
                 help="PNG resolution (dots per inch)")]

def roofline_cmd(
    model: Annotated[str, typer.Option("--model", "-m", help="model name or file")],
    hardware: Devices,
    out: Annotated[Path, typer.Option(help="figure file, .png or .svg")],
    engine: EngineOpt = "vllm",
    batch: Annotated[str, typer.Option(help="batch sizes, comma list")] = "1,128",
    phase: Annotated[PhaseChoice, typer.Option(help="which steps to plot")] = PhaseChoice.both,
    prompt: Prompt = 512, gen: Gen = 128, weights_dtype: WeightsOpt = None,
    act_dtype: DtypeOpt = "bf16", kv_dtype: DtypeOpt = "bf16", tp: Tp = 1,
    cuda_graphs: Graphs = False, dpi: Dpi = 110,
) -> None:
    """Roofline figure: every operator of a prefill and a decode step on each device."""
    out_file(out, "--out", (".png", ".svg"))
    batches = ints("--batch", batch)
    names("--hardware", hardware)             # a bad list fails before any work
    from perfmodel.report import plots
    from perfmodel.specs import load
    from perfmodel.specs.errors import SpecError

    phases = ("prefill", "decode") if phase is PhaseChoice.both else (phase.value,)
    try:
        m = load.model(model)
        hws = devices("--hardware", hardware, engine)
        wls = [workload(m, b, prompt, gen, weights_dtype, act_dtype, kv_dtype,
                        cuda_graphs=cuda_graphs) for b in batches]
        par = plan(tp)
        points = [p for hw in hws for wl in wls
                  for p in plots.roofline_points(m, hw, wl, phases, par)]
    except SpecError as exc:
        fail(str(exc))
    fig = plots.roofline_figure(points, hws, plots.roofline_title(m, wls[0], phases, par))
    with writing(out.parent):
        size = save(fig, out, dpi)
    typer.echo(f"wrote {out} ({size:,} bytes; {sum(p['plotted'] for p in points)} operator "
               f"points, {len(hws)} device(s), batch {','.join(map(str, batches))})")


def sweep_cmd(
    model: Models,
    hardware: Devices,
    out: Annotated[Path, typer.Option(help="output directory (CSV and figures)")],
    engine: EngineOpt = "vllm",
    batch: Annotated[str, typer.Option(help="batch sizes, comma list")] =
        "1,2,4,8,16,32,64,128,256",
    context: Annotated[str, typer.Option("--context", "--prompt",
                       help="prompt lengths (tokens), comma list")] = "512,2048,8192",
    gen: Gen = 128,
    weights_dtype: Annotated[str | None, typer.Option(
        show_default="bf16", help="weight dtypes, comma list")] = None,
    weights_formats: Annotated[str | None, typer.Option(
        "--weights-format", help="weights formats, comma list, each one of "
             f"{', '.join(format_names())}: sets the dtype, group size and scale bytes "
             "(instead of --weights-dtype / --group-size)")] = None,
    group_size: Annotated[str | None, typer.Option(
        help="weight quantization group sizes, comma list")] = None,
    outlier_fraction: Annotated[str, typer.Option(
        help="shares of the quantized weights' input channels kept in 16 bits, comma "
             "list")] = "0",
    quantize_lm_head: Annotated[str | None, typer.Option(
        show_default="false", help="LM head at the weights' dtype, group size and scales: "
             "true, false or both, comma list (the kv_cache and max_batch tables keep it at "
             "16 bits)")] = None,
    kv_dtype: Annotated[str, typer.Option(help="KV-cache dtypes, comma list")] = "bf16",
    kv_group_size: Annotated[str | None, typer.Option(
        show_default="a scale per (token, head) for int8/int4, none otherwise",
        help="KV-cache elements per scale (0: none), comma list")] = None,
    kv_scale_bytes: Annotated[str, typer.Option(
        help="bytes of scale per KV-cache group, comma list")] = "4",
    act_dtype: DtypeOpt = "bf16", tp: Tp = 1, cuda_graphs: Graphs = False,
    memory_fraction: MemFrac = 0.9, kv_block: KvBlock = 16,
    pp: Annotated[str, typer.Option(help="pipeline stages, comma list")] = "1",
    dp: Annotated[str, typer.Option(help="replicas, comma list")] = "1",
    ep: Annotated[str, typer.Option(
        help="expert-parallel degrees, comma list (= --tp, or with --attention-dp)")] = "1",
    attention_dp: AttentionDp = False,
    expert_replicas: Annotated[str, typer.Option(
        help="redundant hot-expert copies over the --ep devices, comma list")] = "0",
    draft: DraftOpt = None, draft_k: DraftK = None, mtp_depth: MtpDepth = None,
    draft_heads: DraftHeads = None,
    acceptances: Annotated[str | None, typer.Option(
        help="speculative decoding: acceptance rates, one sweep value each, comma list "
             "(with --draft, --mtp-depth or --draft-heads)")] = None,
    shared_prefix: Annotated[str, typer.Option(
        help="shared prompt prefix tokens, comma list")] = "0",
    expert_skew: Annotated[str, typer.Option(help="MoE routing skews, comma list")] = "0",
    kv_models: Annotated[str, typer.Option(
        help="models compared in the KV-cache figure, comma list")] = DEFAULT_KV_MODELS,
    split_batch: Annotated[int | None, typer.Option(
        help="batch of the time-split figure (default: the first --batch)")] = None,
    figures: Annotated[bool, typer.Option(
        help="draw the four figures (--no-figures: the CSVs only, for large grids)")] = True,
    fmt: Fmt = FigFormat.png, dpi: Dpi = 100,
) -> None:
    """Sweep batch x context x device x dtype x plan x lever: sweep.csv (and four figures)
    in --out."""
    batches, prompts = ints("--batch", batch), ints("--context", context)
    stages, replicas, experts = ints("--pp", pp), ints("--dp", dp), ints("--ep", ep)
    copies = numbers("--expert-replicas", expert_replicas, int, 0)
    levers = {"shared_prefix": numbers("--shared-prefix", shared_prefix, int, 0),
              "expert_skew": numbers("--expert-skew", expert_skew, float, 0.0),
              **_scale_levers(group_size, outlier_fraction, kv_group_size, kv_scale_bytes)}
    if quantize_lm_head is not None:
        levers["quantize_lm_head"] = flags("--quantize-lm-head", quantize_lm_head)
    formats = _formats(weights_formats, weights_dtype, group_size)
    wdts = dtypes("--weights-dtype", "bf16" if weights_dtype is None else weights_dtype)
    kdts = dtypes("--kv-dtype", kv_dtype)
    if split_batch is not None and split_batch not in batches:
        fail(f"--split-batch: {split_batch} is not one of --batch {batch}")
    out_dir(out)
    from perfmodel.schedules import sweep
    from perfmodel.specs import load
    from perfmodel.specs.errors import SpecError

    try:
        models = load_models("--model", model)
        hws = devices("--hardware", hardware, engine)
        kv_list, left_out = _splittable([load.model(n) for n in names("--kv-models", kv_models)
                                         if n not in {m.name for m in models}], tp)
        # the KV and max-batch tables: the first weights and KV-cache choice of each axis
        first_wdt, first_group, fmt_fields = weights_format(formats[0], None, None) \
            if formats else (wdts[0], None, {})
        base = workload(models[0], batches[0], prompts[0], gen, first_wdt, act_dtype, kdts[0],
                        first_group, cuda_graphs=cuda_graphs, memory_fraction=memory_fraction,
                        kv_block=kv_block, **fmt_fields,
                        **{k: v[0] for k, v in levers.items() if k in _SCALES})
        par = plan(tp)
        plans = [plan(tp, s, e, r, attention_dp, c) for s in stages for r in replicas
                 for e in experts for c in copies]
        if acceptances is None and any(v is not None for v in (draft, mtp_depth,
                                                               draft_heads)):
            fail("--acceptances: a sweep with --draft, --mtp-depth or --draft-heads needs "
                 "its acceptance rates, a comma list (one sweep value each)")
        rates = [None] if acceptances is None else [
            str(a) for a in numbers("--acceptances", acceptances, float, 0.0)]
        speculations = [speculation(draft, draft_k, a, mtp_depth, draft_heads) for a in rates]
        blocks = sweep.sweep_blocks(models, hws, batches, prompts, base,
                                    None if formats else wdts, kdts, plans=plans,
                                    levers=levers, speculations=speculations,
                                    weights_formats=formats or None,
                                    block=0 if figures else sweep.BLOCK_POINTS)
        first = next(blocks)            # a mistake the first point meets: before any file
        kv_models_all = list({m.name: m for m in [*models, *kv_list]}.values())
        contexts = sweep.powers_of_two(512, 131072)
        kv_rows = sweep.kv_cache_table(kv_models_all, contexts, base, tp)
        mb_rows = sweep.max_batch_table(kv_models_all, hws[0], contexts, base, par)
    except SpecError as exc:
        fail(str(exc))
    with staged(out) as folder:   # Ctrl-C leaves no partial file
        if figures:
            parts = [first, *_evaluated(blocks)]
            columns = {k: sweep.concat([p[k] for p in parts]) for k in first}
            _write_csv(folder / "sweep.csv", columns)
        else:
            columns = None
            points = _write_csv(folder / "sweep.csv", first, _evaluated(blocks))
        for name, rows in (("kv_cache.csv", kv_rows), ("max_batch.csv", mb_rows)):
            _write_csv(folder / name, {k: [r[k] for r in rows] for k in rows[0]} if rows
                       else {})
        drawn = _sweep_figures(folder, sweep.rows(columns), kv_rows, mb_rows,
                               split_batch or batches[0],
                               f"TP {tp}, weights {(formats or wdts)[0]}, KV {kdts[0]}",
                               fmt.value, dpi) \
            if columns is not None else []
        if columns is not None:
            points = len(columns["ttft_s"])
    typer.echo(f"wrote {out}/sweep.csv ({points} points), kv_cache.csv, "
               "max_batch.csv" + "".join(f", {f}" for f in drawn))
    for reason in left_out:
        typer.echo(f"note: --kv-models: left out {reason}")


# workload fields of the quantization options that are sweep levers
_SCALES = ("weight_group_size", "outlier_fraction", "kv_group_size", "kv_scale_bytes")


def _scale_levers(group_size: str | None, outlier_fraction: str, kv_group_size: str | None,
                  kv_scale_bytes: str) -> dict[str, list]:
    """The quantization options' comma lists as sweep levers (the group sizes only when
    given: unset, the checkpoint's or the KV dtype's default applies)."""
    levers: dict[str, list] = {
        "outlier_fraction": _bounded("--outlier-fraction", outlier_fraction, 0.0, 0.5),
        "kv_scale_bytes": _bounded("--kv-scale-bytes", kv_scale_bytes, 0.01, 16.0)}
    if group_size is not None:
        levers["weight_group_size"] = ints("--group-size", group_size)
    if kv_group_size is not None:
        levers["kv_group_size"] = numbers("--kv-group-size", kv_group_size, int, 0)
    return levers


def _bounded(option: str, text: str, low: float, high: float) -> list[float]:
    """'0,0.01' -> [0.0, 0.01], each in [low, high]; anything else a one-line error."""
    values = numbers(option, text, float, low)
    above = [v for v in values if v > high]
    if above:
        fail(f"{option}: expected comma-separated floats in [{low:g}, {high:g}], got "
             f"{above[0]:g} in {text!r}")
    return values


def _formats(text: str | None, weights_dtype: str | None, group_size: str | None
             ) -> list[str]:
    """The --weights-format list ([] when unset); a one-line error for an unknown format
    (with the closest name) or for one beside --weights-dtype or --group-size."""
    if text is None:
        return []
    from perfmodel.specs.errors import did_you_mean

    out = names("--weights-format", text)
    known = format_names()
    for f in out:
        if f not in known:
            fail(f"--weights-format: unknown format {f!r}, expected one of "
                 f"{', '.join(known)}{did_you_mean(f, known)}")
    given = [o for o, v in (("--weights-dtype", weights_dtype), ("--group-size", group_size))
             if v is not None]
    if given:
        fail(f"--weights-format sets the weights' dtype, group size and scale bytes; drop "
             f"{' and '.join(given)}")
    return out


def _splittable(models: list, tp: int) -> tuple[list, list[str]]:
    """The KV-comparison models that split over ``tp`` devices, and why the others do not
    (they are only context for the figure: a sweep at --tp 2 still runs)."""
    from perfmodel.cost.params import check_tp
    from perfmodel.specs.errors import SpecError

    keep, reasons = [], []
    for m in models:
        try:
            check_tp(m, tp)
            keep.append(m)
        except SpecError as exc:
            reasons.append(f"{m.name} ({str(exc).removeprefix('workload: ')})")
    return keep, reasons


def _write_csv(path: Path, columns: dict, more: Iterable[dict] = ()) -> int:
    """Write ``columns`` then each block of ``more`` (the same columns) as one CSV, a block
    of rows at a time (10^6 rows in bounded memory); returns the rows written."""
    import itertools

    from perfmodel.report.tables import write_columns

    rows = 0
    with path.open("w", newline="") as f:
        for i, block in enumerate(itertools.chain([columns], more)):
            write_columns(f, block, header=i == 0)
            rows += len(next(iter(block.values()))) if block else 0
    return rows


def _evaluated(blocks: Iterator[dict]) -> Iterator[dict]:
    """``blocks``, a SpecError a later block meets turned into the one-line error."""
    from perfmodel.specs.errors import SpecError

    try:
        yield from blocks
    except SpecError as exc:
        fail(str(exc))


def _sweep_figures(out: Path, rows: list[dict], kv_rows: list[dict], mb_rows: list[dict],
                   split_batch: int, setting: str, ext: str, dpi: int) -> list[str]:
    from perfmodel.report import sweep_plots
    from perfmodel.schedules.sweep import SERIES_COLUMNS

    first = rows[0]
    split = [r for r in rows if all(r.get(k) == first.get(k) for k in SERIES_COLUMNS
                                    if k != "workload_prompt_len")
             and r["workload_batch"] == split_batch]
    figures = {
        f"latency_throughput_vs_batch.{ext}": sweep_plots.batch_figure(
            rows, "Per-token latency and decode throughput against batch"),
        f"throughput_vs_latency.{ext}": sweep_plots.tradeoff_figure(rows),
        f"time_split_vs_context.{ext}": sweep_plots.time_split_figure(split, (
            f"Time by operator class as the prompt grows: {first['model']} on "
            f"{first['hardware']}, batch {split_batch}, gen {first['workload_gen_len']}")),
        f"kv_cache_vs_context.{ext}": sweep_plots.kv_figure(kv_rows, mb_rows, (
            f"KV cache against context; max batch on {first['hardware']} ({setting})")),
    }
    for name, fig in figures.items():
        save(fig, out / name, dpi)
    return list(figures)
