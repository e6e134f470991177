"""The CLI's one-line user error, and the switch that turns it into an exception for a
caller that is not a terminal (the browser page's server answers it as JSON).

Module level: typer and the standard library.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import NoReturn

import typer

_RAISING: ContextVar[bool] = ContextVar("perfmodel_fail_raises", default=False)


def fail(message: str) -> NoReturn:
    """Print ``error: <message>`` on stderr and exit with code 2 (a user mistake); inside
    ``raising()`` (the browser page's server) raise it as a SpecError instead."""
    if _RAISING.get():
        from perfmodel.specs.errors import SpecError

        raise SpecError(message)
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)


@contextmanager
def raising() -> Iterator[None]:
    """In this thread, ``fail`` raises SpecError(message) rather than printing and exiting."""
    token = _RAISING.set(True)
    try:
        yield
    finally:
        _RAISING.reset(token)
