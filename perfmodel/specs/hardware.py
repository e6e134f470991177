"""The accelerator record: peak rates, memory, interconnect and the efficiency model.

Built by ``specs.load`` from a hardware YAML (schema in perfmodel/hardware/README.md) or directly in
Python. Rates are dense FLOP/s and decimal SI bytes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from perfmodel.specs.composition import Composition
from perfmodel.specs.dtypes import DTYPE_BYTES, DTYPES
from perfmodel.specs.efficiency import DequantKernel, Efficiency  # noqa: F401 (their home before)
from perfmodel.specs.errors import SpecError
from perfmodel.specs.uncertainty import Uncertainty


@dataclass(frozen=True)
class Interconnect:
    link_bytes_per_s: float             # per device, per direction
    latency_s: float                    # per hop (one ring step)
    topology: str = "switch"
    max_devices: int = 8
    collective_latency_s: float = 0.0   # fixed cost of one collective (launch, handshakes)
    # between nodes (max_devices per node): per device, per direction, and per hop; 0: no
    # network figure, so a plan spanning nodes is refused rather than guessed
    network_bytes_per_s: float = 0.0
    network_latency_s: float = 0.0
    # the serving engine's own all-reduce for small messages inside an NVLink node (vLLM's
    # and SGLang's custom all-reduce): used below max_bytes (0: none, NCCL always) over
    # 2, 4, 6 or 8 devices; fixed cost and the share of link_bytes_per_s it reaches
    custom_all_reduce_max_bytes: float = 0.0
    custom_all_reduce_latency_s: float = 0.0
    custom_all_reduce_fraction: float = 1.0
    # devices one host (server, VM) holds, where it is fewer than the scale-up domain (a
    # TPU VM's 4 or 8 chips of a pod's torus); 0: max_devices. Launch lines place servers
    # on hosts by it
    devices_per_host: int = 0

    @property
    def host_devices(self) -> int:
        """Devices per host: ``devices_per_host``, else the whole scale-up domain."""
        return self.devices_per_host or self.max_devices


@dataclass(frozen=True)
class HostLink:
    """The device's host side, read from the optional ``host:`` block: what a KV-cache
    offload tier (``serving.kvtiers``) moves blocks over. ``link_bytes_per_s``: host <->
    device per direction (PCIe x16 of its generation, or NVLink-C2C on Grace parts);
    ``link``: which (pcie4, pcie5, pcie6, c2c); ``dram_bytes``: host memory per device on the
    reference system (0: not given); ``nvme_bytes_per_s``: local NVMe read per device (0:
    not given, so no SSD tier)."""

    link_bytes_per_s: float
    link: str = "pcie5"
    dram_bytes: float = 0.0
    nvme_bytes_per_s: float = 0.0


@dataclass(frozen=True)
class Hardware:
    """One accelerator. FLOP/s are dense; bandwidth and capacity are decimal SI."""

    name: str
    peak_flops_per_s: dict[str, float]
    memory_bytes: float                 # total the driver reports (nvidia-smi, rocm-smi, TPU)
    memory_bytes_per_s: float
    compute_units: int
    l2_bytes: float
    interconnect: Interconnect
    efficiency: Efficiency = field(default_factory=Efficiency)
    vendor: str = "other"
    description: str = ""
    sources: dict[str, str] = field(default_factory=dict)
    # how the efficiency figures were measured or fitted (the ``calibration:`` block of the
    # engine priced, ``specs.engines``), None for datasheet and benchmark figures
    calibration: dict | None = None
    # the serving engine whose kernels are priced (vllm, sglang, trtllm) and, when the file
    # has no figures of that engine's own, the one line that says whose were priced instead
    engine: str = "vllm"
    engine_warning: str = ""
    # device memory the serving engine never gets: the CUDA / ROCm context plus library
    # workspaces (cuBLAS, NCCL) that vLLM counts as non-torch memory; 0 where the runtime's
    # own limit already excludes it (TPU bytes_limit). cost.memory.usable_bytes subtracts it
    runtime_reserved_bytes: float = 0.0
    # US dollars per device-hour (the optional ``price:`` block; its ``source`` says whose
    # price and when); None: no price, so the planner ranks per GPU only
    price_per_hour: float | None = None
    # the 80% band on each error class's kernel times (the optional ``uncertainty:`` block,
    # ``specs.uncertainty``); None: no kernel measurements, so estimates carry no band
    uncertainty: Uncertainty | None = None
    # how kernels compose into a CUDA-graph-replayed step (the optional ``composition:``
    # block, ``specs.composition``); absent: the sum of isolated kernels
    composition: Composition = field(default_factory=Composition)
    # the ``power:`` block: rated board power and, where published or measured, idle power
    # (W); None where the file gives none
    tdp_watts: float | None = None
    idle_watts: float | None = None
    # the optional ``host:`` block (``HostLink``): None where the file gives none
    host: HostLink | None = None
    # derived tables the cost model keeps per device (a fresh one for every copy)
    memo: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def provenance(self) -> dict:
        """The engine priced and where the efficiency figures come from: the calibration's
        source, engine and engine version (None: datasheet and benchmark figures)."""
        cal = self.calibration or {}
        kept = {k: cal[k] for k in ("source", "engine", "engine_version") if k in cal}
        return {"engine": self.engine, "calibration": kept or None}

    def peak(self, dtype: str) -> float:
        """Dense peak FLOP/s at ``dtype``: the rate of ``rate_dtype(dtype)``."""
        return self.peak_flops_per_s[self.rate_dtype(dtype)]

    def rate_dtype(self, dtype: str) -> str:
        """The dtype whose listed rate a ``dtype`` operation runs at: itself; else the other
        16-bit float (fp16 <-> bf16 share a datapath); else the nearest wider listed dtype
        (fp8 on Ampere runs as bf16). Anything but itself is an assumption the estimate
        reports (``schedules.assumptions``)."""
        if dtype in self.peak_flops_per_s:
            return dtype
        # fp16 <-> bf16 share a datapath; tf32 is fp32's width, so a part with no TF32 path
        # (CDNA 4) runs it as fp32
        twin = {"fp16": "bf16", "bf16": "fp16", "tf32": "fp32"}.get(dtype)
        if twin in self.peak_flops_per_s:
            return twin
        wider = sorted((d for d in self.peak_flops_per_s if DTYPE_BYTES[d] > DTYPE_BYTES[dtype]),
                       key=lambda d: DTYPE_BYTES[d])
        if wider:
            return wider[0]
        raise SpecError(f"hardware {self.name}: compute.peak_flops_per_s has no rate for {dtype} "
                        f"or any wider dtype (it lists {', '.join(self.peak_flops_per_s)}); "
                        f"choose a narrower --weights-dtype / --act-dtype / --kv-dtype")

    @property
    def has_graphs(self) -> bool:
        """Whether decode can replay as a CUDA (HIP) graph: an NVIDIA or AMD GPU. A TPU runs
        compiled XLA programs and a CPU dispatches eagerly: ``cuda_graphs`` is ignored there."""
        return self.vendor in ("nvidia", "amd")

    def peak_table(self) -> np.ndarray:
        """``peak`` for every dtype code (NaN where there is no rate, wider or not)."""
        if "peak_table" not in self.memo:
            table = np.full(len(DTYPES), np.nan)
            for code, name in enumerate(DTYPES):
                try:
                    table[code] = self.peak(name)
                except SpecError:
                    pass
            self.memo["peak_table"] = table
        return self.memo["peak_table"]

    def ridge_point(self, dtype: str = "bf16") -> float:
        """Arithmetic intensity (FLOP/byte) where the compute and memory roofs meet."""
        return self.peak(dtype) / self.memory_bytes_per_s
