"""The rules of the GEMM kernels that pick their own output tile (``kernel_tiles.yaml``:
DeepGEMM's block sizes, clusters and cost model, each with its source line): data, read by
the hardware reader (the names an engine block's ``gemm_kernel_tiles`` may give) and by
``cost.kernel_tiles`` (the rules it prices with)."""

from __future__ import annotations

import functools
from pathlib import Path

TABLE = Path(__file__).with_name("kernel_tiles.yaml")


@functools.cache
def kernels() -> dict[str, dict]:
    """The shipped kernels' tile rules, by name."""
    import yaml

    data = yaml.safe_load(TABLE.read_text())
    return {k: v for k, v in data.items() if k != "version"}
