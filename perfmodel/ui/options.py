"""The page's settings as the CLI's: a form's values become a command's arguments, parsed by
the command's own click parameters (same bounds, same one-line messages), and the
``perfmodel ...`` line that reproduces the view.

Uploaded files live in one temporary folder, removed when the server stops; the page names
them ``upload:<id>``, the command line by the file's own name.
"""

from __future__ import annotations

import re
import shlex
import tempfile
import threading
import uuid
from functools import cache
from pathlib import Path
from typing import Any

from perfmodel.specs.errors import SpecError
from perfmodel.ui import files

MAX_UPLOAD_BYTES = 4 * 1024 * 1024
MAX_UPLOADS = 64          # kept at once (256 MB at most); a newer one replaces the oldest
UPLOADED = "uploaded"     # the folder an upload is kept in: a Hugging Face config's model name


@cache
def command(name: str) -> Any:
    """The click command of ``perfmodel NAME`` (built once; only that command's module is
    imported)."""
    import typer.main

    from perfmodel.cli.app import build

    return typer.main.get_command(build(only=name)).commands[name]


def _flags(cmd: Any) -> dict[str, Any]:
    """'--batch' -> its click Option, for every long name (and ``--no-`` form)."""
    out = {}
    for p in cmd.params:
        for opt in [*p.opts, *getattr(p, "secondary_opts", [])]:
            if opt.startswith("--"):
                out[opt] = p
    return out


class Uploads:
    """Uploaded files in a private temporary folder (never elsewhere), removed by close();
    ``root``: the folder whose files the page may name too (``perfmodel ui --root``)."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = root
        self._dir: tempfile.TemporaryDirectory | None = None
        self._files: dict[str, tuple[Path, str]] = {}
        self._lock = threading.Lock()

    def add(self, name: str, data: bytes) -> tuple[str, Path]:
        """Keep ``data`` as ``name`` (made a plain file name): its ``upload:<id>`` and path."""
        if len(data) > MAX_UPLOAD_BYTES:
            raise SpecError(f"{name}: {len(data):,} bytes, expected a file under "
                            f"{MAX_UPLOAD_BYTES // 1024 // 1024} MB")
        safe = re.sub(r"[^A-Za-z0-9._-]", "_", Path(name).name)[:80].lstrip(".") or "upload"
        with self._lock:
            oldest = list(self._files)[:max(0, len(self._files) + 1 - MAX_UPLOADS)]
        for key in oldest:
            self.drop(key)
        with self._lock:
            if self._dir is None:
                self._dir = tempfile.TemporaryDirectory(prefix="perfmodel-ui-")
            key = uuid.uuid4().hex[:12]
            folder = Path(self._dir.name) / key / UPLOADED    # a config.json's model name
            folder.mkdir(parents=True)
            path = folder / safe
            path.write_bytes(data)
            self._files[key] = (path, safe)
        return f"upload:{key}", path

    def drop(self, ref: str) -> None:
        with self._lock:
            found = self._files.pop(ref.removeprefix("upload:"), None)
        if found:
            found[0].unlink(missing_ok=True)
            found[0].parent.rmdir()
            found[0].parent.parent.rmdir()

    def resolve(self, value: str) -> tuple[str, str]:
        """(path to parse, name to show) of a setting: an upload's, or the value itself."""
        if isinstance(value, str) and value.startswith("upload:"):
            with self._lock:
                found = self._files.get(value.removeprefix("upload:"))
            if found is None:
                raise SpecError(f"{value}: no such upload (the server restarted?): upload "
                                "the file again")
            return str(found[0]), found[1]
        return value, value

    def shown(self, message: str) -> str:
        """``message`` with every upload's temporary path replaced by its file name."""
        with self._lock:
            files = list(self._files.values())
        for path, name in files:
            message = message.replace(str(path), name)
        return message

    def close(self) -> None:
        with self._lock:
            if self._dir is not None:
                self._dir.cleanup()
                self._dir = None
            self._files.clear()


def arguments(name: str, settings: dict[str, Any], uploads: Uploads,
              ) -> tuple[list[str], list[str], list[str]]:
    """(arguments to parse, arguments to show, settings ``perfmodel NAME`` has no option
    for) of ``settings`` ({'batch': 8, 'weights-dtype': 'fp8', 'cuda-graphs': True, ...}).
    A value equal to the option's default is left out; None and '' mean unset."""
    cmd = command(name)
    flags = _flags(cmd)
    parsed: list[str] = []
    shown: list[str] = []
    dropped: list[str] = []
    for key, value in settings.items():
        flag = "--" + str(key).lstrip("-")
        param = flags.get(flag)
        if param is None:
            if value not in (None, "", False) and not _default_of_estimate(flag, value):
                dropped.append(flag)
            continue
        if value is None or value == "":
            continue
        if isinstance(value, bool):
            if value == param.default:
                continue
            if value:
                parsed.append(param.opts[0])
                shown.append(param.opts[0])
            elif getattr(param, "secondary_opts", None):
                parsed.append(param.secondary_opts[0])
                shown.append(param.secondary_opts[0])
            continue
        default = param.default.value if hasattr(param.default, "value") else param.default
        if not param.required and _same(value, default):
            continue
        real, display = files.setting(flag, str(value), uploads)
        parsed += [flag, real]
        shown += [flag, display]
    return parsed, shown, dropped


def _default_of_estimate(flag: str, value: Any) -> bool:
    """Whether ``value`` is ``perfmodel estimate``'s default for ``flag`` (a page setting
    another command lacks only matters when it is not the default)."""
    param = _flags(command("estimate")).get(flag)
    return param is not None and not isinstance(value, bool) and \
        _same(value, getattr(param.default, "value", param.default))


def _same(value: Any, default: Any) -> bool:
    """'1' and 1.0 are the same setting; so are 'bf16' and 'bf16'."""
    try:
        return float(value) == float(default)
    except (TypeError, ValueError):
        return str(value) == str(default)


def parse(name: str, args: list[str], uploads: Uploads) -> dict[str, Any]:
    """The command's parameters from ``args``, checked by click as the CLI checks them; a
    bad value raises SpecError with the CLI's one-line message (without 'error: ')."""
    try:   # typer >= 0.2x vendors click as typer._click (as cli.app does)
        from typer._click import exceptions as click
    except ImportError:  # pragma: no cover
        import click.exceptions as click

    import typer

    from perfmodel.cli.app import _hint

    try:
        params = dict(command(name).make_context(name, list(args)).params)
    except typer.Exit as exc:      # --help and the like: not a page setting
        raise SpecError(f"{name}: unexpected option") from exc
    except click.ClickException as exc:
        raise SpecError(uploads.shown(_hint(exc))) from exc
    return {k: _typed(v, kinds.get(k)) for k, v in params.items()
            for kinds in [_kinds(name)]}


@cache
def _kinds(name: str) -> dict[str, type]:
    """The Enum and Path parameters of ``perfmodel NAME``'s function: typer turns click's
    strings into these before the call; ``parse`` does the same."""
    import enum
    import importlib
    import typing

    from perfmodel.cli.app import CORE

    module, function = CORE[name]
    hints = typing.get_type_hints(getattr(importlib.import_module(module), function))
    out = {}
    for key, hint in hints.items():
        for t in (hint, *typing.get_args(hint)):
            if isinstance(t, type) and (issubclass(t, enum.Enum) or issubclass(t, Path)):
                out[key] = t
    return out


def _typed(value: Any, kind: type | None) -> Any:
    return value if kind is None or value is None or isinstance(value, kind) else kind(value)


def line(name: str, shown: list[str], *extra: str) -> str:
    """The ``perfmodel NAME ...`` command line (shell-quoted)."""
    return shlex.join(["perfmodel", name, *shown, *extra])
