"""The one exception type for user mistakes, and the guarded reading of a user's file."""

from __future__ import annotations

import difflib
import re
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


def quoted(value: object) -> str:
    """A value read from a file as an error message may show it: a number, a flag, or text
    that reads as a number with a unit ('80 GBs'); any other text only by its length, and a
    list or mapping by its kind (the file's text is never quoted)."""
    if value is None or isinstance(value, (bool, int, float)):
        return repr(value)
    if isinstance(value, str):
        if re.fullmatch(r"[-+]?[0-9][0-9._eE+-]{0,24} ?[A-Za-z/]{0,8}", value.strip()):
            return repr(value)
        return f"text of {len(value)} characters" if value else "empty text"
    return f"a {type(value).__name__}"


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
        raise SpecError(f"{path}: not {what}{where_wrong(exc)}") from None


def where_wrong(exc: Exception) -> str:
    """Where a parser stopped, without the text it stopped at: " (line 3, column 5)" of a
    YAML or JSON error, " (byte 12 is not UTF-8)", or a message of our own parsers
    (``SafeMessage``); "" where nothing safe is known."""
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    line, column = (mark.line + 1, mark.column + 1) if mark is not None else \
        (getattr(exc, "lineno", None), getattr(exc, "colno", None))
    at = f" (line {line}, column {column})" if line is not None else ""
    if isinstance(exc, SafeMessage) or type(exc).__module__ in ("_csv", "pandas.errors"):
        text = getattr(exc, "problem", None) or str(exc) or type(exc).__name__
        return f": {text.splitlines()[0]}{at}"
    if isinstance(exc, UnicodeDecodeError):
        return f" (byte {exc.start} is not UTF-8 text)"
    return at or f" ({type(exc).__name__})"


class SafeMessage(ValueError):
    """A parse error whose message we wrote and which quotes nothing of the file."""
