"""The one exception type for user mistakes, and the guarded reading of a user's file."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


class SpecError(ValueError):
    """A user mistake in a spec or argument; the message is one line naming file and field."""


def read_user_file(path: Path, what: str, parse: Callable[[Path], T],
                   errors: tuple[type[Exception], ...]) -> T:
    """``parse(path)``, with a missing file or any of ``errors`` turned into a one-line
    SpecError: "PATH: no such file" or "PATH: not WHAT: <first line of the error>"."""
    if not path.is_file():
        raise SpecError(f"{path}: no such file")
    try:
        return parse(path)
    except errors as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise SpecError(f"{path}: not {what}: {first}") from None
