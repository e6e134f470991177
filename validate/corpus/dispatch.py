"""The M buckets of each engine's quantized dense GEMM dispatch (``gemm_dispatch.yaml``):
which bucket a measured linear falls in, so the fit gives each its own kernel constants
(``gemm_kernels`` keys ``<class>@<m_max>``, ``cost.moe.dense_buckets``)."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import numpy as np
import yaml

from perfmodel.cost.moe import DEEPGEMM_K, DEEPGEMM_N, UNALIGNED
from perfmodel.specs.dtypes import MOE_FORMATS

FILE = Path(__file__).with_name("gemm_dispatch.yaml")
ARCH = {"hopper": "sm90", "blackwell": "sm100"}
UNALIGNED_BUCKET = -1.0     # a bucket code: the shapes DeepGEMM cannot run


@lru_cache(maxsize=1)
def table() -> dict:
    return yaml.safe_load(FILE.read_text())


def rule(engine: str, device: str, cls: str) -> dict:
    """The dispatch rule (``edges``, ``eager``, ``source``) of ``cls`` linears under
    ``engine`` on ``device``'s architecture; {} where none is listed (one bucket)."""
    from validate.corpus.calibrate import family_of

    arch = ARCH.get(family_of(device) or "", "")
    return (table().get(engine) or {}).get(arch, {}).get(cls) or {}


def buckets(engine: str, device: str, formats: np.ndarray, m: np.ndarray,
            n: np.ndarray | None = None, k: np.ndarray | None = None) -> np.ndarray:
    """Per row, the largest M of its dispatch bucket (inf: the top bucket), from its
    format class index (``cost.moe.FORMATS``) and M; ``UNALIGNED_BUCKET`` where the rule
    sends shapes DeepGEMM cannot run to another kernel (``unaligned: true``)."""
    out = np.full(len(m), np.inf)
    for i, cls in enumerate(MOE_FORMATS):
        mine = formats == i
        found = rule(engine, device, cls)
        for edge in sorted(found.get("edges", ()), reverse=True):
            out = np.where(mine & (m <= edge), float(edge), out)
        if found.get("unaligned") and n is not None and k is not None:
            off = (np.mod(n, DEEPGEMM_N) != 0) | (np.mod(k, DEEPGEMM_K) != 0)
            out = np.where(mine & off, UNALIGNED_BUCKET, out)
    return out


def key(cls: str, bucket: float) -> str:
    """The ``gemm_kernels`` key of a class's bucket: ``fp8@16``, ``fp8_block@unaligned``,
    or ``fp8`` for the top."""
    if bucket == UNALIGNED_BUCKET:
        return f"{cls}@{UNALIGNED}"
    return cls if not np.isfinite(bucket) else f"{cls}@{int(bucket)}"
