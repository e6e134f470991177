"""Outputs that appear whole or not at all: a command writes its files into a hidden
folder inside ``--out`` and they move into place (one rename each) only once every one is
written, so Ctrl-C or an error mid-way leaves ``--out`` as it was, with no partial file.

Module level: the standard library only (imported by the command modules).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from perfmodel.cli.common import writing


@contextmanager
def staged(path: Path, option: str = "--out") -> Iterator[Path]:
    """``writing(path)``, yielding the hidden folder to write in instead of ``path``: its
    files replace those of the same names in ``path`` when the block ends without an
    exception; on any exception (KeyboardInterrupt too) the folder is removed."""
    with writing(path, option):
        stage = Path(tempfile.mkdtemp(prefix=".partial-", dir=path))
        try:
            yield stage
            for file in sorted(stage.iterdir()):
                os.replace(file, path / file.name)
        finally:
            shutil.rmtree(stage, ignore_errors=True)
