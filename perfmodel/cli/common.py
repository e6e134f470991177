"""What every CLI module shares: the one-line user error, the reproducing command line, the
options of estimate-like commands and the records they build.

Command modules import this one; ``cli.app`` imports the command modules to register them,
so nothing imports ``app`` back (no cycle). Module level: typer and the standard library.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterator
from contextlib import contextmanager
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer

from perfmodel.specs.dtypes import DTYPES


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


def workload(batch: int, prompt: int, gen: int, weights_dtype: str, act_dtype: str,
             kv_dtype: str, group_size: int | None = None, cuda_graphs: bool = False,
             memory_fraction: float = 0.9, kv_block: int = 16) -> Any:
    """The ``Workload`` of an estimate-like command's options."""
    from perfmodel.specs.workload import Workload

    return Workload(batch=batch, prompt_len=prompt, gen_len=gen, weights_dtype=weights_dtype,
                    act_dtype=act_dtype, kv_dtype=kv_dtype, weight_group_size=group_size,
                    cuda_graphs=cuda_graphs, usable_memory_fraction=memory_fraction,
                    kv_block_tokens=kv_block)


def plan(tp: int = 1, pp: int = 1, ep: int = 1, dp: int = 1) -> Any:
    """The ``Parallelism`` of the options (degrees not yet modelled raise SpecError)."""
    from perfmodel.specs.workload import Parallelism

    out = Parallelism(tp=tp, pp=pp, ep=ep, dp=dp)
    out.require_modelled()
    return out


def _dtype(value: str) -> str:
    if value not in DTYPES:
        raise typer.BadParameter(f"unknown dtype {value!r}, expected one of {', '.join(DTYPES)}")
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
Pp = Annotated[int, typer.Option(min=1, help="pipeline-parallel degree (not yet modelled)")]
Ep = Annotated[int, typer.Option(min=1, help="expert-parallel degree (not yet modelled)")]
Dp = Annotated[int, typer.Option(min=1, help="data-parallel replicas (not yet modelled)")]
GroupSize = Annotated[int | None, typer.Option(
    min=1, help="weight quantization group size (adds a 16-bit scale per group)")]
Graphs = Annotated[bool, typer.Option(help="decode launched as a CUDA graph")]
MemFrac = Annotated[float, typer.Option(
    min=0.01, max=1.0, help="share of device memory usable by the server")]
KvBlock = Annotated[int, typer.Option(min=1, help="paged-KV block, tokens")]


# --- comma lists and figure files -------------------------------------------------------

def names(option: str, text: str, what: str = "names") -> list[str]:
    """'a, b' -> ['a', 'b']; an empty list or an empty item is a one-line error."""
    out = [t.strip() for t in text.split(",")]
    if not text.strip() or any(not n for n in out):
        fail(f"{option}: expected a comma-separated list of {what}, got {text!r}")
    return out


def ints(option: str, text: str) -> list[int]:
    """'1,16,128' -> [1, 16, 128]; anything else is a one-line error."""
    values = []
    for t in names(option, text, "positive integers"):
        if not t.isdigit() or int(t) < 1:
            fail(f"{option}: expected comma-separated positive integers, got {t!r} in {text!r}")
        values.append(int(t))
    return values


def dtypes(option: str, text: str) -> list[str]:
    """'bf16,fp8' -> ['bf16', 'fp8']; an unknown dtype is a one-line error."""
    out = names(option, text)
    for d in out:
        if d not in DTYPES:
            fail(f"{option}: unknown dtype {d!r}, expected one of {', '.join(DTYPES)}")
    return out


def out_dir(path: Path, option: str = "--out") -> Path:
    """Fail early (one line) when ``path`` or a folder above it is a file, before any work;
    the directory itself is made by ``writing``."""
    for p in (path, *path.parents):
        if p.exists():
            if not p.is_dir():
                fail(f"{option}: {str(p)!r} is a file, expected a directory")
            break
    return path


@contextmanager
def writing(path: Path, option: str = "--out") -> Iterator[Path]:
    """Make the directory ``path`` and turn an OS error while writing the outputs in it (no
    permission, disk full) into one ``error:`` line."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        yield path
    except OSError as exc:
        fail(f"{option}: cannot write {exc.filename or path}: {exc.strerror or exc}")


def save(fig: Any, path: Path, dpi: int) -> int:
    """Write ``fig`` to ``path`` (format from the suffix); returns the bytes written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)   # constrained layout keeps legends and labels inside
    return path.stat().st_size
