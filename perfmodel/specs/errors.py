"""The one exception type for user mistakes, and the guarded reading of a user's file."""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


class SpecError(ValueError):
    """A user mistake in a spec or argument; the message is one line naming file and field."""


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """'; did you mean 'x'?' for the closest of ``choices`` to ``word`` (difflib, ignoring
    case: 'H100' finds 'h100-sxm'), or ""."""
    by_lower = {str(c).lower(): str(c) for c in choices}
    close = difflib.get_close_matches(str(word).lower(), list(by_lower), n=1)
    return f"; did you mean {by_lower[close[0]]!r}?" if close else ""


def read_user_file(path: Path, what: str, parse: Callable[[Path], T],
                   errors: tuple[type[Exception], ...], expected: str = "a file") -> T:
    """``parse(path)``, with a missing, unreadable or directory path or any of ``errors``
    turned into a one-line SpecError: "PATH: no such file", "PATH: cannot read: permission
    denied", "PATH: is a directory, expected EXPECTED" or "PATH: not WHAT: <first line>"."""
    try:
        if path.is_dir():
            raise SpecError(f"{path}: is a directory, expected {expected}")
        if not path.is_file():
            if path.exists():     # a FIFO would block the read; a device never ends
                raise SpecError(f"{path}: not a regular file (a pipe, socket or device), "
                                f"expected {expected}")
            raise SpecError(f"{path}: no such file")
        return parse(path)
    except SpecError:
        raise
    except RecursionError:    # 100k nested brackets: the parser's recursion, not a mistake's
        raise SpecError(f"{path}: not {what}: nested too deeply, expected {expected}") \
            from None
    except PermissionError:
        raise SpecError(f"{path}: cannot read: permission denied") from None
    except OSError as exc:
        raise SpecError(f"{path}: cannot read: {exc.strerror or type(exc).__name__}") from None
    except errors as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise SpecError(f"{path}: not {what}: {first}") from None
