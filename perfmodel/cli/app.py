"""The command-line interface: the only place that touches argv, stdout and files.

A user mistake (bad file, unknown name, impossible workload) prints one line naming the
file and field and exits with code 2; never a traceback.
"""

from __future__ import annotations

import os
import sys
from enum import Enum
from typing import Annotated

import typer

from perfmodel import load
from perfmodel.cli_common import (
    Batch,
    DtypeOpt,
    Gen,
    Graphs,
    GroupSize,
    HardwareOpt,
    KvBlock,
    MemFrac,
    ModelOpt,
    Prompt,
    Tp,
    fail,
)
from perfmodel.specs import SpecError, Workload

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Predict LLM inference speed on an accelerator, and say why.")


class Format(str, Enum):
    table = "table"
    json = "json"
    csv = "csv"
    markdown = "markdown"


def workload(batch: int, prompt: int, gen: int, weights_dtype: str, act_dtype: str,
             kv_dtype: str, tp: int = 1, group_size: int | None = None,
             cuda_graphs: bool = False, memory_fraction: float = 0.9,
             kv_block: int = 16) -> Workload:
    return Workload(batch=batch, prompt_len=prompt, gen_len=gen, weights_dtype=weights_dtype,
                    act_dtype=act_dtype, kv_dtype=kv_dtype, tp=tp,
                    weight_group_size=group_size, cuda_graphs=cuda_graphs,
                    usable_memory_fraction=memory_fraction, kv_block_tokens=kv_block)


@app.command()
def estimate(
    model: ModelOpt,
    hardware: HardwareOpt,
    batch: Batch = 1,
    prompt: Prompt = 512,
    gen: Gen = 128,
    weights_dtype: DtypeOpt = "bf16",
    act_dtype: DtypeOpt = "bf16",
    kv_dtype: DtypeOpt = "bf16",
    tp: Tp = 1,
    group_size: GroupSize = None,
    cuda_graphs: Graphs = False,
    memory_fraction: MemFrac = 0.9,
    kv_block: KvBlock = 16,
    fmt: Annotated[Format, typer.Option("--format", "-f")] = Format.table,
    breakdown: Annotated[bool, typer.Option(help="list every operator")] = False,
) -> None:
    """Estimate TTFT, per-token latency, throughput and memory for one configuration."""
    from perfmodel import report
    from perfmodel.estimate import estimate as run

    try:
        wl = workload(batch, prompt, gen, weights_dtype, act_dtype, kv_dtype, tp, group_size,
                      cuda_graphs, memory_fraction, kv_block)
        result = run(load.hardware(hardware), load.model(model), wl)
    except SpecError as exc:
        fail(str(exc))
    if fmt is Format.json:
        typer.echo(report.to_json(result, with_ops=breakdown))
    elif fmt is Format.csv:
        typer.echo(report.to_csv(result, with_ops=breakdown), nl=False)
    elif fmt is Format.markdown:
        typer.echo(report.markdown(result))
        if breakdown:
            typer.echo("")
            typer.echo(report.breakdown_markdown(result))
    else:
        typer.echo(report.table(result))
        if breakdown:
            typer.echo("")
            typer.echo(report.breakdown(result))


@app.command("list")
def list_specs() -> None:
    """List shipped hardware and models, one line each."""
    from perfmodel.params import param_counts
    from perfmodel.units import fmt_bytes, fmt_count, fmt_rate

    typer.echo("hardware:")
    for name in load.shipped(load.HARDWARE_DIR):
        hw = load.hardware(name)
        bf16 = hw.peak_flops_per_s.get("bf16")
        rate = fmt_rate(bf16, "FLOP/s") if bf16 else "n/a"
        typer.echo(f"  {name:<16} {fmt_bytes(hw.memory_bytes):>9}  "
                   f"{fmt_rate(hw.memory_bytes_per_s):>11}  bf16 {rate:>13}  {hw.description}")
    typer.echo("models:")
    for name in load.shipped(load.MODELS_DIR):
        m = load.model(name)
        counts = param_counts(m)
        typer.echo(f"  {name:<16} {fmt_count(counts.total):>7} params "
                   f"({fmt_count(counts.active(m))} active)  {m.n_layers} layers, "
                   f"d={m.d_model}, {m.attention_kind}"
                   + (f", MoE {m.moe.n_experts}x top-{m.moe.top_k}" if m.moe else "")
                   + (f", window {m.sliding_window}" if m.sliding_window else ""))


from perfmodel import cli_figures, cli_harness  # noqa: E402  (they add commands to app)

cli_harness.register(app)
cli_figures.register(app)


def main() -> None:
    """Console entry point: every user mistake is one ``error:`` line and exit code 2."""
    try:   # typer >= 0.2x vendors click as typer._click; older releases use click itself
        from typer._click import exceptions as click
    except ImportError:  # pragma: no cover
        import click.exceptions as click

    try:
        code = app(standalone_mode=False)
    except click.NoArgsIsHelpError as exc:
        typer.echo(exc.ctx.get_help() if exc.ctx else str(exc))
        code = 0
    except click.UsageError as exc:
        typer.echo(f"error: {exc.format_message()}", err=True)
        code = 2
    except SpecError as exc:   # a spec error raised outside a command's own handler
        typer.echo(f"error: {exc}", err=True)
        code = 2
    except (typer.Abort, KeyboardInterrupt):
        typer.echo("error: aborted", err=True)
        code = 1
    except BrokenPipeError:   # output piped into a reader that closed early (| head)
        sys.stderr = open(os.devnull, "w")
        code = 0
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
