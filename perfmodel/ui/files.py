"""What a page setting may name: a shipped model or device, an upload (``upload:<id>``), or
a file under the folder the user gave ``perfmodel ui --root`` (none by default); never any
other path, so a web page cannot make the server read the user's files. Settings that would
write files (``--out``) or start processes (``--cluster``, ``--workers`` above 1) are
refused: the page's answers come back in the response, and its command line does the rest.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from perfmodel.specs.errors import SpecError

WRITES = ("--out",)
MODELS = ("--model", "--draft", "--kv-models")
DEVICES = ("--hardware",)
PATHS = ("--trace", "--lengths-from", "--prices", "--engine-profile")
MAX_WORKERS = 1      # one process per simulation: a request cannot fork a pool
MAX_NUMBER = 10**18  # no setting of the page needs more; an int64 overflows past 9.2e18


def setting(flag: str, value: str, uploads: Any) -> tuple[str, str]:
    """(value to parse, value to show) of one page setting, or a one-line SpecError."""
    if flag in WRITES:
        raise SpecError(f"{flag}: the page writes no files (its answers come back to the "
                        "page); run its command line to write them")
    if flag == "--cluster":
        raise SpecError("--cluster: the page simulates in its own process; run its command "
                        "line to use a Dask cluster")
    if re.fullmatch(r"\s*[-+]?\d{19,}\s*", value) or (
            re.fullmatch(r"\s*[-+]?\d+(\.\d*)?[eE]\+?\d+\s*", value)
            and _over(value, MAX_NUMBER)):
        raise SpecError(f"{flag}: {value.strip()[:30]} is too large for the page (expected at "
                        f"most 10^18)")
    if flag == "--workers" and _over(value, MAX_WORKERS):
        raise SpecError(f"--workers: at most {MAX_WORKERS} on the page (a simulation runs in "
                        "one process); run its command line for more")
    if flag in MODELS or flag in DEVICES:
        from perfmodel.specs import load

        directory, kind = (load.MODELS_DIR, "model") if flag in MODELS else \
            (load.HARDWARE_DIR, "hardware")
        pairs = [_spec(flag, v, directory, kind, uploads) for v in value.split(",")]
        return ",".join(p[0] for p in pairs), ",".join(p[1] for p in pairs)
    if flag in PATHS:
        return _path(flag, value, uploads)
    return value, value


def _over(value: str, limit: int) -> bool:
    try:
        return float(value) > limit
    except ValueError:
        return False       # click's own check answers a word


def _spec(flag: str, value: str, directory: Path, kind: str, uploads: Any
          ) -> tuple[str, str]:
    """A shipped name, an upload or a file under the root; an unknown bare name gets the
    CLI's "unknown model 'x'; did you mean" line."""
    if value.startswith("upload:"):
        return uploads.resolve(value)
    bare = "/" not in value and "\\" not in value
    if bare and _shipped(directory, value):
        return value, value
    under = _under_root(value, uploads.root)
    if under is not None:
        return str(under), str(under)
    if bare and not re.search(r"\.(ya?ml|json)$", value, re.IGNORECASE) and value.strip():
        from perfmodel.specs.load import unknown_name

        raise unknown_name(value, kind)
    raise SpecError(f"{flag}: {value!r} is not a shipped {kind}, an upload or a file under "
                    f"--root{_root_hint(uploads.root)}")


def _shipped(directory: Path, name: str) -> bool:
    try:
        return (directory / f"{name}.yaml").is_file()
    except OSError:        # a name too long for the file system
        return False


def _path(flag: str, value: str, uploads: Any) -> tuple[str, str]:
    if value.startswith("upload:"):
        return uploads.resolve(value)
    under = _under_root(value, uploads.root)
    if under is None:
        raise SpecError(f"{flag}: {value!r} is not an upload or a file under --root"
                        f"{_root_hint(uploads.root)}; upload the file instead")
    return str(under), str(under)


def _under_root(value: str, root: Path | None) -> Path | None:
    """The file ``value`` names under ``root`` (relative to it, or absolute within it, after
    every symbolic link and '..' is followed), or None."""
    if root is None or not value or "\0" in value:
        return None
    try:
        path = (root / value).resolve()
        return path if path.is_relative_to(root) and path.is_file() else None
    except (OSError, ValueError, RuntimeError):
        return None


def _root_hint(root: Path | None) -> str:
    return f" ({root})" if root is not None else \
        " (perfmodel ui was started without --root)"


def check_root(root: Path | None) -> Path | None:
    """The ``--root`` folder, resolved; a missing one is a one-line SpecError."""
    if root is None:
        return None
    path = Path(root).expanduser()
    if not path.is_dir():
        raise SpecError(f"--root: {root}: expected an existing folder")
    return path.resolve()


def check_base(data: dict, name: str) -> None:
    """An uploaded hardware YAML's ``base:`` names a shipped device only (a path would read
    a file the page cannot otherwise name)."""
    from perfmodel.specs import load

    base = data.get("base")
    if base is None:
        return
    if not (isinstance(base, str) and "/" not in base and "\\" not in base
            and _shipped(load.HARDWARE_DIR, base)):
        names = load.shipped(load.HARDWARE_DIR)
        raise SpecError(f"{name}: base: an uploaded hardware YAML's base must be a shipped "
                        f"device ({', '.join(names)})")
