"""Where a spec given by name (``h100-sxm``, ``llama-2-13b``) is found.

A name is a YAML file's stem, looked up in order in:

1. each folder given with ``perfmodel --specs DIR`` (in the order given);
2. each folder of the ``PERFMODEL_SPECS_PATH`` environment variable (``os.pathsep``-separated,
   in order);
3. the specs shipped with the package: ``perfmodel/hardware/`` and ``perfmodel/models/``,
   package data read through ``importlib.resources``, so a checkout and an installed wheel
   answer the same names.

A user folder is laid out as the package is: a ``hardware/`` and/or a ``models/`` subfolder of
YAML files. The first folder holding the name wins, so a user file can stand in for a shipped
one. ``--specs`` is put in front of ``PERFMODEL_SPECS_PATH`` in this process's environment, so
the child processes a command starts (simulate's workers, the page's jobs) search alike.
"""

from __future__ import annotations

import os
import sys
from importlib.machinery import SourceFileLoader, SourcelessFileLoader
from pathlib import Path

from perfmodel.specs.errors import SpecError

ENV = "PERFMODEL_SPECS_PATH"
# kind (as the CLI names it: --hardware, --model) -> its folder's name
FOLDERS = {"hardware": "hardware", "model": "models"}
SUFFIX = ".yaml"


def package_dir(kind: str) -> Path:
    """The shipped folder of ``kind`` ("hardware" or "model"), package data of ``perfmodel``:
    ``importlib.resources.files("perfmodel") / folder``.

    For a package on the file system (a checkout, any pip install) that is the folder beside
    the package's ``__init__`` (importlib.resources' file reader answers exactly this), taken
    here without importing importlib.resources: it pulls zipfile, tempfile and random into
    every command's start-up. Any other loader goes through importlib.resources itself."""
    spec = sys.modules["perfmodel"].__spec__
    if isinstance(spec.loader, (SourceFileLoader, SourcelessFileLoader)) and spec.origin:
        return Path(spec.origin).parent / FOLDERS[kind]
    from importlib.resources import files

    folder = files("perfmodel").joinpath(FOLDERS[kind])
    # a zipped package gives a Traversable the YAML reader cannot open by path: say so
    if not isinstance(folder, Path):
        raise SpecError(f"perfmodel's shipped specs are not on the file system ({folder}); "
                        f"install the package unzipped")
    return folder


def check_user_dir(value: str | Path, where: str) -> Path:
    """``value`` as a user spec folder, or a one-line SpecError naming ``where`` (the option
    or the environment variable): a folder holding ``hardware/`` or ``models/``."""
    path = Path(value).expanduser()
    if not path.is_dir():
        raise SpecError(f"{where}: {value}: no such folder, expected a folder holding "
                        f"hardware/ or models/ subfolders of YAML specs")
    if not any((path / sub).is_dir() for sub in FOLDERS.values()):
        raise SpecError(f"{where}: {value}: holds neither hardware/ nor models/, expected a "
                        f"folder laid out as the shipped specs (hardware/NAME.yaml, "
                        f"models/NAME.yaml)")
    return path


def user_dirs() -> list[Path]:
    """The folders of ``PERFMODEL_SPECS_PATH``, in order (empty entries skipped)."""
    raw = os.environ.get(ENV, "")
    return [check_user_dir(p, ENV) for p in raw.split(os.pathsep) if p]


def add_user_dirs(dirs: list[Path], where: str = "--specs") -> None:
    """Put ``dirs`` (checked) in front of ``PERFMODEL_SPECS_PATH``, first given first."""
    checked = [str(check_user_dir(d, where).resolve()) for d in dirs]
    rest = os.environ.get(ENV, "")
    os.environ[ENV] = os.pathsep.join([*checked, *([rest] if rest else [])])


def search_dirs(kind: str) -> list[Path]:
    """The folders a ``kind`` name is looked up in, first first (the shipped one last)."""
    sub = FOLDERS[kind]
    return [d / sub for d in user_dirs() if (d / sub).is_dir()] + [package_dir(kind)]


def find(name: str, kind: str) -> Path | None:
    """The file a name stands for (the first folder holding ``NAME.yaml``), or None."""
    for folder in search_dirs(kind):
        candidate = folder / f"{name}{SUFFIX}"
        if candidate.is_file():
            return candidate
    return None


def stems(directory: Path) -> list[str]:
    """Stems of the YAML files in ``directory``, sorted."""
    return sorted(p.stem for p in directory.glob(f"*{SUFFIX}"))


def names(kind: str) -> list[str]:
    """Every name of ``kind`` that resolves, sorted (a name in two folders once)."""
    return sorted({n for d in search_dirs(kind) for n in stems(d)})
