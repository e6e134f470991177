"""Where CLI commands write: output folders and files checked before any work, OS errors
while writing as one ``error:`` line, figures saved. ``cli.common`` re-exports these.

Module level: the standard library and ``cli.errors``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from perfmodel.cli.errors import fail


def out_path(text: str) -> Path:
    """Every ``--out`` option's parser: the text as a Path, an empty one refused (it became
    '.', the current folder, which the user did not name)."""
    if not str(text).strip():
        import typer

        raise typer.BadParameter("expected a folder name, got an empty one (it would write "
                                 "into the current folder; give --out . for that)")
    return Path(text)


def out_dir(path: Path, option: str = "--out", shown: Path | None = None) -> Path:
    """Fail early (one line, before any work) unless ``path`` is, or can be made as, a
    folder this process can write in: a file in the way, a read-only parent or a place
    like /proc all fail here (the message names ``shown``, default ``path``). ``writing``
    makes the folder for real."""
    for p in (path, *path.parents):
        if p.exists():
            if not p.is_dir():
                fail(f"{option}: {str(p)!r} is a file, expected a directory")
            break
    try:
        _probe(path)
    except OSError as exc:
        where = "there" if shown is None else f"in {str(path)!r}"
        fail(f"{option}: {str(shown or path)!r}: cannot write {where} ({exc.strerror or exc}), "
             "expected a directory this user can create or write in")
    return path


def _probe(path: Path) -> None:
    """Make the missing folders of ``path`` and a file in it, then remove what was made
    (raises the OSError a real write would meet)."""
    import tempfile

    made: list[Path] = []
    try:
        for p in (*reversed(path.parents), path):
            if not p.exists():
                p.mkdir()
                made.append(p)
        fd, probe = tempfile.mkstemp(prefix=".perfmodel-probe-", dir=path)
        os.close(fd)
        os.unlink(probe)
    finally:
        for p in reversed(made):
            with suppress(OSError):
                p.rmdir()


def out_file(path: Path, option: str = "--out", suffixes: tuple[str, ...] = ()) -> Path:
    """Fail early (one line, before any work) unless ``path`` names a file that can be
    written: the right suffix (when ``suffixes`` are given), not a directory, in a folder
    that ``out_dir`` accepts, and not a read-only file."""
    if suffixes and path.suffix not in suffixes:
        shown = " or ".join([", ".join(suffixes[:-1]), suffixes[-1]] if suffixes[:-1]
                            else suffixes)
        fail(f"{option}: expected a {shown} file name, got {str(path)!r}")
    if path.is_dir():
        fail(f"{option}: {str(path)!r} is a directory, expected a file name")
    out_dir(path.parent, option, shown=path)
    if path.exists() and not os.access(path, os.W_OK):
        fail(f"{option}: {str(path)!r}: read-only, expected a file this user can write")
    return path


@contextmanager
def writing(path: Path, option: str = "--out") -> Iterator[Path]:
    """Make the directory ``path`` and turn an OS error while writing the outputs in it (no
    permission, disk full) into one ``error:`` line. On any exception (Ctrl-C too) the
    folders made here are removed again where they are still empty."""
    made = [p for p in (*reversed(path.parents), path) if not p.exists()]
    try:
        path.mkdir(parents=True, exist_ok=True)
        yield path
    except OSError as exc:
        _remove_empty(made)
        fail(f"{option}: cannot write {exc.filename or path}: {exc.strerror or exc}")
    except BaseException:
        _remove_empty(made)
        raise


def _remove_empty(folders: list[Path]) -> None:
    for p in reversed(folders):
        with suppress(OSError):
            p.rmdir()          # refuses a folder that is not empty


def save(fig: Any, path: Path, dpi: int) -> int:
    """Write ``fig`` to ``path`` (format from the suffix); returns the bytes written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)   # constrained layout keeps legends and labels inside
    return path.stat().st_size
