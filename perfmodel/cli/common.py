"""What every CLI module shares: the one-line user error and the reproducing command line.

Kept apart from ``perfmodel.cli`` so the command modules can import it at the top without
an import cycle (``cli`` imports them to register their commands)."""

from __future__ import annotations

import shlex
from enum import Enum
from typing import Annotated, Any, NoReturn

import typer

from perfmodel.specs import DTYPES


def fail(message: str) -> NoReturn:
    """Print ``error: <message>`` on stderr and exit with code 2 (a user mistake)."""
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)


def command_line(command: str, **options: Any) -> str:
    """The ``perfmodel COMMAND ...`` line that reproduces a run: options in the order given,
    ``None`` left out, booleans as ``--flag`` / ``--no-flag``, enums by value, shell-quoted."""
    parts = ["perfmodel", command]
    for key, value in options.items():
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            parts.append(flag if value else f"--no-{flag[2:]}")
        elif value is not None:
            parts += [flag, str(value.value if isinstance(value, Enum) else value)]
    return shlex.join(parts)


def _dtype(value: str) -> str:
    if value not in DTYPES:
        raise typer.BadParameter(f"unknown dtype {value!r}, expected one of {', '.join(DTYPES)}")
    return value


def _decode_samples(value: int) -> int:
    if value == 1 or value < 0:
        raise typer.BadParameter(f"expected 0 or at least 2, got {value}")
    return value


# options shared by estimate, roofline, sweep and report: same bounds, same messages
ModelOpt = Annotated[str, typer.Option("--model", "-m",
                     help="shipped model name, model YAML, or HF config.json")]
HardwareOpt = Annotated[str, typer.Option("--hardware", "-H",
                        help="shipped hardware name or hardware YAML")]
Batch = Annotated[int, typer.Option(min=1, help="concurrent sequences")]
Prompt = Annotated[int, typer.Option(min=1, help="prompt tokens per sequence")]
Gen = Annotated[int, typer.Option(min=1, help="generated tokens per sequence")]
DtypeOpt = Annotated[str, typer.Option(callback=_dtype, help=f"one of {', '.join(DTYPES)}")]
Tp = Annotated[int, typer.Option(min=1, help="tensor-parallel degree")]
GroupSize = Annotated[int | None, typer.Option(
    min=1, help="weight quantization group size (adds a 16-bit scale per group)")]
Graphs = Annotated[bool, typer.Option(help="decode launched as a CUDA graph")]
MemFrac = Annotated[float, typer.Option(
    min=0.01, max=1.0, help="share of device memory usable by the server")]
KvBlock = Annotated[int, typer.Option(min=1, help="paged-KV block, tokens")]
DecodeSamples = Annotated[int, typer.Option(
    callback=_decode_samples,
    help="decode contexts integrated per sweep point (trapezoid); 0 = exact estimate()")]
