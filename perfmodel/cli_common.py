"""What every CLI module shares: the one-line user error and the reproducing command line.

Kept apart from ``perfmodel.cli`` so the command modules can import it at the top without
an import cycle (``cli`` imports them to register their commands)."""

from __future__ import annotations

import shlex
from enum import Enum
from typing import Any, NoReturn

import typer


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
