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
