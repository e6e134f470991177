"""CLI commands for figures and reports: ``roofline``, ``sweep``, ``report``.

Module level imports: typer and the standard library only (heavy imports inside the
command bodies keep ``perfmodel --help`` fast). No ``from __future__ import annotations``:
typer reads the Annotated option types at registration time. Bad input prints one line,
``error: ...``, and exits with code 2.
"""

from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer

from perfmodel.cli_common import (
    Batch,
    DecodeSamples,
    DtypeOpt,
    Gen,
    Graphs,
    GroupSize,
    KvBlock,
    MemFrac,
    Prompt,
    Tp,
    command_line,
    fail,
)

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
Dpi = Annotated[int, typer.Option(help="PNG resolution (dots per inch)")]

def _names(option: str, text: str, what: str = "names") -> list[str]:
    names = [t.strip() for t in text.split(",")]
    if not text.strip() or any(not n for n in names):
        fail(f"{option}: expected a comma-separated list of {what}, got {text!r}")
    return names


def _ints(option: str, text: str) -> list[int]:
    """'1,16,128' -> [1, 16, 128]; anything else is a one-line error."""
    values = []
    for t in _names(option, text, "positive integers"):
        if not t.isdigit() or int(t) < 1:
            fail(f"{option}: expected comma-separated positive integers, got {t!r} in {text!r}")
        values.append(int(t))
    return values


def _dtypes(option: str, text: str) -> list[str]:
    from perfmodel.specs import DTYPES

    out = _names(option, text)
    for d in out:
        if d not in DTYPES:
            fail(f"{option}: unknown dtype {d!r}, expected one of {', '.join(DTYPES)}")
    return out


def _save(fig: Any, path: Path, dpi: int) -> int:
    """Write ``fig`` to ``path`` (format from the suffix); returns the bytes written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)   # constrained layout keeps legends and labels inside
    return path.stat().st_size


def roofline_cmd(
    model: Annotated[str, typer.Option("--model", "-m", help="model name or file")],
    hardware: Devices,
    out: Annotated[Path, typer.Option(help="figure file, .png or .svg")],
    batch: Annotated[str, typer.Option(help="batch sizes, comma list")] = "1,128",
    phase: Annotated[PhaseChoice, typer.Option(help="which steps to plot")] = PhaseChoice.both,
    prompt: Prompt = 512, gen: Gen = 128, weights_dtype: DtypeOpt = "bf16",
    act_dtype: DtypeOpt = "bf16", kv_dtype: DtypeOpt = "bf16", tp: Tp = 1,
    cuda_graphs: Graphs = False, dpi: Dpi = 110,
) -> None:
    """Roofline figure: every operator of a prefill and a decode step on each device."""
    if out.suffix not in (".png", ".svg"):
        fail(f"--out: expected a .png or .svg file name, got {str(out)!r}")
    batches = _ints("--batch", batch)
    devices = _names("--hardware", hardware)
    from perfmodel import load, plots
    from perfmodel.cli import workload
    from perfmodel.specs import SpecError

    phases = ("prefill", "decode") if phase is PhaseChoice.both else (phase.value,)
    try:
        m = load.model(model)
        hws = [load.hardware(h) for h in devices]
        wls = [workload(b, prompt, gen, weights_dtype, act_dtype, kv_dtype, tp,
                        cuda_graphs=cuda_graphs) for b in batches]
        points = [p for hw in hws for wl in wls for p in plots.roofline_points(m, hw, wl, phases)]
    except SpecError as exc:
        fail(str(exc))
    fig = plots.roofline_figure(points, hws, plots.roofline_title(m, wls[0], phases))
    size = _save(fig, out, dpi)
    typer.echo(f"wrote {out} ({size:,} bytes; {sum(p['plotted'] for p in points)} operator "
               f"points, {len(hws)} device(s), batch {batch})")


def sweep_cmd(
    model: Models,
    hardware: Devices,
    out: Annotated[Path, typer.Option(help="output directory (CSV and figures)")],
    batch: Annotated[str, typer.Option(help="batch sizes, comma list")] =
        "1,2,4,8,16,32,64,128,256",
    context: Annotated[str, typer.Option("--context", "--prompt",
                       help="prompt lengths (tokens), comma list")] = "512,2048,8192",
    gen: Gen = 128,
    weights_dtype: Annotated[str, typer.Option(help="weight dtypes, comma list")] = "bf16",
    kv_dtype: Annotated[str, typer.Option(help="KV-cache dtypes, comma list")] = "bf16",
    act_dtype: DtypeOpt = "bf16", tp: Tp = 1, cuda_graphs: Graphs = False,
    memory_fraction: MemFrac = 0.9, kv_block: KvBlock = 16,
    kv_models: Annotated[str, typer.Option(
        help="models compared in the KV-cache figure, comma list")] = DEFAULT_KV_MODELS,
    split_batch: Annotated[int | None, typer.Option(
        help="batch of the time-split figure (default: the first --batch)")] = None,
    decode_samples: DecodeSamples = 9, fmt: Fmt = FigFormat.png, dpi: Dpi = 100,
) -> None:
    """Sweep batch x context x device x dtype: sweep.csv and four figures in --out."""
    batches, prompts = _ints("--batch", batch), _ints("--context", context)
    wdts, kdts = _dtypes("--weights-dtype", weights_dtype), _dtypes("--kv-dtype", kv_dtype)
    if split_batch is not None and split_batch not in batches:
        fail(f"--split-batch: {split_batch} is not one of --batch {batch}")
    import pandas as pd

    from perfmodel import load, sweep, sweep_plots
    from perfmodel.cli import workload
    from perfmodel.specs import SpecError

    samples = decode_samples or None
    try:
        models = [load.model(n) for n in _names("--model", model)]
        hws = [load.hardware(h) for h in _names("--hardware", hardware)]
        kv_list = [load.model(n) for n in _names("--kv-models", kv_models)]
        base = workload(batches[0], prompts[0], gen, wdts[0], act_dtype, kdts[0], tp,
                        cuda_graphs=cuda_graphs, memory_fraction=memory_fraction,
                        kv_block=kv_block)
        rows = sweep.sweep(models, hws, batches, prompts, base, wdts, kdts, samples)
        kv_models_all = list({m.name: m for m in [*models, *kv_list]}.values())
        contexts = sweep.powers_of_two(512, 131072)
        kv_rows = sweep.kv_cache_table(kv_models_all, contexts, base)
        mb_rows = sweep.max_batch_table(kv_models_all, hws[0], contexts, base)
    except SpecError as exc:
        fail(str(exc))
    out.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_csv(out / "sweep.csv", index=False)
    pd.DataFrame(kv_rows).to_csv(out / "kv_cache.csv", index=False)
    pd.DataFrame(mb_rows).to_csv(out / "max_batch.csv", index=False)
    first = rows[0]
    sb = split_batch or batches[0]
    split = [r for r in rows if all(r[k] == first[k] for k in sweep.SERIES_COLUMNS
                                    if k != "workload_prompt_len")
             and r["workload_batch"] == sb]
    ext = fmt.value
    figures = {
        f"latency_throughput_vs_batch.{ext}": sweep_plots.batch_figure(
            rows, "Per-token latency and decode throughput against batch"),
        f"throughput_vs_latency.{ext}": sweep_plots.tradeoff_figure(rows),
        f"time_split_vs_context.{ext}": sweep_plots.time_split_figure(split, (
            f"Time by operator class as the prompt grows: {first['model']} on "
            f"{first['hardware']}, batch {sb}, gen {gen}")),
        f"kv_cache_vs_context.{ext}": sweep_plots.kv_figure(kv_rows, mb_rows, (
            f"KV cache against context; max batch on {hws[0].name} (TP {tp}, weights "
            f"{wdts[0]}, KV {kdts[0]})")),
    }
    for name, fig in figures.items():
        _save(fig, out / name, dpi)
    typer.echo(f"wrote {out}/sweep.csv ({len(rows)} points), kv_cache.csv, max_batch.csv, "
               + ", ".join(figures))


def report_cmd(
    model: Models,
    hardware: Annotated[str, typer.Option("--hardware", "-H", help="hardware name or file")],
    out: Annotated[Path, typer.Option(help="output directory (report.md, report.html, ...)")],
    batch: Batch = 1,
    prompt: Prompt = 512, gen: Gen = 128, weights_dtype: DtypeOpt = "bf16",
    act_dtype: DtypeOpt = "bf16", kv_dtype: DtypeOpt = "bf16", tp: Tp = 1,
    group_size: GroupSize = None,
    cuda_graphs: Graphs = False, memory_fraction: MemFrac = 0.9, kv_block: KvBlock = 16,
    roofline_batch: Annotated[str | None, typer.Option(
        help="batch sizes on the roofline (default: 1 and --batch)")] = None,
    sweep_batch: Annotated[str | None, typer.Option(
        help="batch sizes of the batch figures (default: powers of 2 to the ceiling)")] = None,
    contexts: Annotated[str, typer.Option(
        help="context lengths of the context figures, comma list")] = "512,2048,8192,32768",
    decode_samples: DecodeSamples = 9, fmt: Fmt = FigFormat.png, dpi: Dpi = 90,
) -> None:
    """Markdown + self-contained HTML report; several --model values: a KV-cache comparison."""
    names = _names("--model", model)
    ctx = _ints("--contexts", contexts)
    extra = {k: _ints(f"--{k.replace('_', '-')}", v) for k, v in
             (("roofline_batch", roofline_batch), ("sweep_batch", sweep_batch)) if v}
    from perfmodel import load
    from perfmodel.cli import workload
    from perfmodel.specs import SpecError

    command = command_line("report", model=model, hardware=hardware, batch=batch, prompt=prompt,
                       gen=gen, weights_dtype=weights_dtype, act_dtype=act_dtype,
                       kv_dtype=kv_dtype, tp=tp, group_size=group_size, cuda_graphs=cuda_graphs,
                       memory_fraction=memory_fraction, kv_block=kv_block,
                       roofline_batch=roofline_batch, sweep_batch=sweep_batch, contexts=contexts,
                       decode_samples=decode_samples, format=fmt, dpi=dpi, out=str(out))
    try:
        models = [load.model(n) for n in names]
        hw = load.hardware(hardware)
        wl = workload(batch, prompt, gen, weights_dtype, act_dtype, kv_dtype, tp, group_size,
                      cuda_graphs, memory_fraction, kv_block)
        build = _single_report if len(models) == 1 else _comparison_report
        blocks, figures, files = build(models, hw, wl, ctx, extra, decode_samples or None,
                                       fmt.value, command)
    except SpecError as exc:
        fail(str(exc))
    from perfmodel import report_pages

    out.mkdir(parents=True, exist_ok=True)
    images = {}
    for name, fig in figures.items():
        _save(fig, out / name, dpi)
        images[name] = (out / name).read_bytes()
    for name, text in files.items():
        (out / name).write_text(text)
    (out / "report.md").write_text(report_pages.to_markdown(blocks))
    (out / "report.html").write_text(report_pages.to_html(blocks, images, blocks[0].text))
    typer.echo(f"wrote {out}/report.md, report.html, " + ", ".join([*figures, *files]))


def _batch_grid(ceiling: int, batch: int) -> list[int]:
    """Powers of two up to the batch ceiling, the ceiling itself and the workload batch."""
    from perfmodel.sweep import powers_of_two

    top = max(ceiling, 8)
    return sorted(set(powers_of_two(1, top)) | ({ceiling} if ceiling else set()) | {batch})


def _single_report(models: list, hw: Any, wl: Any, ctx: list[int], extra: dict,
                   samples: int | None, ext: str, command: str) -> tuple:
    from dataclasses import replace

    import pandas as pd

    from perfmodel import plots, report, report_pages, sweep, sweep_plots
    from perfmodel.estimate import estimate

    (m,) = models
    e = estimate(hw, m, wl)
    rb = extra.get("roofline_batch") or sorted({1, wl.batch})
    points = [p for b in rb for p in plots.roofline_points(m, hw, replace(wl, batch=b))]
    batches = extra.get("sweep_batch") or _batch_grid(e.memory.max_batch, wl.batch)
    rows = sweep.sweep([m], [hw], batches, [wl.prompt_len], wl, decode_samples=samples)
    split = sweep.sweep([m], [hw], [wl.batch], ctx, wl, decode_samples=samples)
    kv = sweep.kv_cache_table([m], ctx, wl)
    mb = sweep.max_batch_table([m], hw, ctx, wl)
    scope = f"per device, TP {wl.tp}" if wl.tp > 1 else "one device"
    figures = {
        f"roofline.{ext}": plots.roofline_figure(points, [hw], plots.roofline_title(
            m, wl, ("prefill", "decode"))),
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
    captions = [
        report_pages.roofline_caption(m.name, hw.name, rb, e),
        "Per-token latency (TPOT) and decode throughput against batch; dashed: the memory "
        "ceiling (max batch); hollow: does not fit.",
        "Throughput against per-token latency; each point is a batch size.",
        f"Time per operator class at batch {wl.batch} for prompts of {contexts_text(ctx)} "
        f"tokens: the prefill step (TTFT) and the mean decode step (TPOT) over {wl.gen_len} "
        "generated tokens.",
        f"KV cache per token and per sequence against context ({scope}), and the batch "
        f"ceiling against context (prompt + {wl.gen_len} generated) on {hw.name}.",
    ]
    blocks = report_pages.single_report(e, command, list(zip(figures, captions, strict=True)),
                                        rows, samples)
    files = {"estimate.json": report.to_json(e, with_ops=True) + "\n",
             "sweep.csv": pd.DataFrame(rows + split).to_csv(index=False)}
    return blocks, figures, files


def contexts_text(ctx: list[int]) -> str:
    return ", ".join(f"{c:,}" for c in ctx)


def _comparison_report(models: list, hw: Any, wl: Any, ctx: list[int], extra: dict,
                       samples: int | None, ext: str, command: str) -> tuple:
    from dataclasses import replace

    import pandas as pd

    from perfmodel import report_pages, sweep, sweep_plots
    from perfmodel.estimate import estimate
    from perfmodel.memory import kv_bytes_per_token

    estimates = [estimate(hw, m, wl) for m in models]
    whole = {m.name: kv_bytes_per_token(m, replace(wl, tp=1)) for m in models}
    kv = sweep.kv_cache_table(models, ctx, replace(wl, tp=1))
    mb = sweep.max_batch_table(models, hw, ctx, wl)
    name = f"kv_cache_vs_context.{ext}"
    fig = sweep_plots.kv_figure(kv, mb, (
        f"KV cache per token and per sequence (whole model); max batch on {hw.name} "
        f"(TP {wl.tp}, weights {wl.weights_dtype}, KV {wl.kv_dtype})"), scope="whole model")
    caption = (f"Left: KV bytes per token (all layers, whole model). Middle: KV cache of one "
               f"sequence against its length (whole model; windows applied). Right: sequences "
               f"that fit per device on {hw.name} at TP {wl.tp} against context (prompt + "
               f"{wl.gen_len} generated).")
    at_ceiling = [estimate(hw, e.model, replace(wl, batch=e.memory.max_batch))
                  for e in estimates if e.memory.max_batch > wl.batch]
    blocks = report_pages.comparison_report(estimates, whole, command, [(name, caption)], mb,
                                            samples, at_ceiling)
    files = {"kv_cache.csv": pd.DataFrame(kv).to_csv(index=False),
             "max_batch.csv": pd.DataFrame(mb).to_csv(index=False)}
    return blocks, {name: fig}, files


def register(app: typer.Typer) -> None:
    """Add this module's commands to ``app``."""
    app.command("roofline")(roofline_cmd)
    app.command("sweep")(sweep_cmd)
    app.command("report")(report_cmd)
