"""The M buckets of each engine's quantized dense GEMM dispatch (``gemm_dispatch.yaml``):
which bucket a measured linear falls in, so the fit gives each its own kernel constants
(``gemm_kernels`` keys ``<class>@<m_max>``, ``cost.moe.dense_buckets``)."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import numpy as np
import yaml

from perfmodel.specs.dtypes import MOE_FORMATS

FILE = Path(__file__).with_name("gemm_dispatch.yaml")
ARCH = {"hopper": "sm90", "blackwell": "sm100"}


@lru_cache(maxsize=1)
def table() -> dict:
    return yaml.safe_load(FILE.read_text())


def rule(engine: str, device: str, cls: str) -> dict:
    """The dispatch rule (``edges``, ``eager``, ``source``) of ``cls`` linears under
    ``engine`` on ``device``'s architecture; {} where none is listed (one bucket)."""
    from validate.corpus.calibrate import family_of

    arch = ARCH.get(family_of(device) or "", "")
    return (table().get(engine) or {}).get(arch, {}).get(cls) or {}


def buckets(engine: str, device: str, formats: np.ndarray, m: np.ndarray) -> np.ndarray:
    """Per row, the largest M of its dispatch bucket (inf: the top bucket), from its
    format class index (``cost.moe.FORMATS``) and M."""
    out = np.full(len(m), np.inf)
    for i, cls in enumerate(MOE_FORMATS):
        mine = formats == i
        for edge in sorted(rule(engine, device, cls).get("edges", ()), reverse=True):
            out = np.where(mine & (m <= edge), float(edge), out)
    return out


def key(cls: str, bucket: float) -> str:
    """The ``gemm_kernels`` key of a class's bucket: ``fp8@16``, or ``fp8`` for the top."""
    return cls if not np.isfinite(bucket) else f"{cls}@{int(bucket)}"
