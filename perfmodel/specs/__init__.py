"""Specs: what the cost model reads. Frozen records (hardware, model, workload, parallelism),
dtypes and units, the registry of operator kinds, and loading them from YAML / HF configs."""

from perfmodel.specs.dtypes import DTYPE_BYTES, DTYPES, compute_dtype, dtype_bytes
from perfmodel.specs.errors import SpecError
from perfmodel.specs.hardware import Efficiency, Hardware, Interconnect
from perfmodel.specs.model import MLA, Model, MoE
from perfmodel.specs.workload import Parallelism, Workload, Workloads

__all__ = [
           "DTYPES",
           "DTYPE_BYTES",
           "MLA",
           "Efficiency",
           "Hardware",
           "Interconnect",
           "MoE",
           "Model",
           "Parallelism",
           "SpecError",
           "Workload",
           "Workloads",
           "compute_dtype",
           "dtype_bytes",
]
