"""KV-cache offload tiers below the GPU's paged pool: CPU DRAM and local SSD, as vLLM's
OffloadingConnector, LMCache and SGLang's HiCache keep them.

What the engines do, from their sources:

- Store. vLLM's connector writes each request's newly full blocks to the CPU as they are
  computed (``OffloadingConnectorScheduler``, ``build_connector_meta``: write-through);
  SGLang's HiCache under ``--hicache-write-policy write_through`` backs a radix node up to
  host memory once it has been hit ``hicache_write_through_threshold`` (1) times, i.e. when
  it is inserted, and under ``write_back`` only when the GPU evicts it
  (``HiRadixCache.evict`` -> ``write_backup``); its storage tier (``--hicache-storage-
  backend``) is written from host memory after each host backup (``_finish_write_through_
  ack`` -> ``write_backup_storage``). Here a chain (a shared prefix or a conversation) is
  stored in every lower tier when the GPU caches it (write-through) or when the GPU evicts
  it (write-back), the tiers inclusive.
- Evict. Each tier is LRU over blocks: vLLM's ``LRUOffloadingManager.prepare_store`` evicts
  the least recently stored or touched blocks, and ``touch`` renews a chain's blocks
  last-first, so the tail of the oldest chain goes first; SGLang's ``evict_host`` pops the
  least recently used leaves. Here: the least recently used chain loses its tail blocks.
- Hit. A request's prefix is served by the GPU first, then by the CPU, then the SSD: vLLM's
  ``get_num_new_matched_tokens`` counts offloaded hits after the GPU's hit tokens; SGLang's
  ``match_prefix`` returns the device prefix and the host hit length after it, which
  ``init_load_back`` / ``load_back`` copies back whole ("load it all or not at all").
- Load time. vLLM's connector returns the hit as an asynchronous load: the scheduler
  gives the request its blocks and leaves it waiting (WAITING_FOR_REMOTE_KVS, no token
  budget, no seat) while the copy runs beside the step; once done the request is scheduled
  as any other (``async``). Here its load overlaps the step it was admitted in, which lasts
  at least as long as the copy (vLLM would run further steps meanwhile), and the request
  runs from the next step; when nothing else runs, the load is waited for before the step
  that computes it. SGLang's load-back runs on a separate stream layer by layer
  (``HiCacheController.start_loading`` and ``LayerDoneCounter``: layer i's attention waits
  for layer i's copy), so with L layers, load D and compute C the step takes
  ``max(C, D) + min(C, D) / L`` (``layered``). LMCache under vLLM
  (``LMCacheConnectorV1Impl`` in ``lmcache_integration/vllm_v1_adapter.py``) retrieves a
  step's hits in ``start_load_kv`` before the forward and reports no asynchronous load
  (``get_finished`` returns none), so its load holds the whole step: ``serial`` exactly;
  with ``use_layerwise`` it retrieves layer by layer (``retrieve_layer``,
  ``wait_for_layer_load``): ``layered``. It stores each step's new tokens in
  ``wait_for_save`` (write-through), and its CPU backend evicts LRU
  (``cache_policy/lru.py``). ``--kv-offload-overlap`` picks either rule; the default is the
  engine's own connector's. An SSD hit is first read into host memory
  (``bytes / nvme_bytes_per_s``, before the step) in every case.

Bandwidths are the device's ``host:`` block (``specs.hardware.HostLink``): PCIe per
generation or NVLink-C2C per direction, NVMe read; stores go device -> host, the opposite
direction of a full-duplex link, and are not charged. The tier logic lives here; the pool
(``serving.kvpool``) and the engines call it through hooks only.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field, replace

import numpy as np

from perfmodel.specs.errors import SpecError
from perfmodel.specs.hardware import Hardware
from perfmodel.specs.model import Model

TIERS = ("cpu", "ssd")
POLICIES = ("write_through", "write_back")
DEFAULT_RATIO = 2.0     # SGLang's --hicache-ratio: host pool = 2 x the device pool
ENGINES = {"vllm": "async", "sglang": "layered"}    # each engine's own connector's rule
OVERLAPS = ("async", "serial", "layered")


@dataclass(frozen=True)
class Offload:
    """Offload settings (``--kv-offload``): the lower ``tiers`` in order, their bytes per
    device (``cpu_bytes`` 0: ``DEFAULT_RATIO`` x the GPU pool), the write policy; and once
    resolved against a device and pool (``resolve``): capacities in blocks, load bandwidth
    per tier, bytes per block, the model's layers and how a load overlaps a step."""

    tiers: tuple[str, ...] = ("cpu",)
    cpu_bytes: float = 0.0
    ssd_bytes: float = 0.0
    write_policy: str = "write_through"
    overlap: str = ""           # "serial" or "layered"; "": the engine's (``ENGINES``)
    blocks: tuple[int, ...] = ()
    link_bytes_per_s: float = 0.0
    nvme_bytes_per_s: float = 0.0
    block_bytes: float = 0.0
    layers: int = 1

    def flags(self, engine: str) -> str:
        """The engine's own flags for the CPU tier (SGLang: the storage backend too)."""
        cpu = self.blocks[0] if self.blocks else 0
        if engine == "sglang":
            gb = max(round(cpu * self.block_bytes / 1e9), 1)
            out = f"--enable-hierarchical-cache --hicache-size {gb} " \
                  f"--hicache-write-policy {self.write_policy}"
            return out + (" --hicache-storage-backend file" if "ssd" in self.tiers else "")
        return ("--kv-transfer-config '{\"kv_connector\":\"OffloadingConnector\","
                "\"kv_role\":\"kv_both\",\"kv_connector_extra_config\":"
                f"{{\"num_cpu_blocks\":{cpu}}}}}'")


def parse(tiers: str | None, cpu_gb: float | None, ssd_gb: float | None,
          policy: str = "write_through", overlap: str | None = None) -> Offload | None:
    """``--kv-offload cpu[,ssd]``, ``--cpu-kv-gb``, ``--ssd-kv-gb``, the write policy and
    ``--kv-offload-overlap`` (None: no offload; SpecError naming the option)."""
    if tiers is None:
        for name, value in (("--cpu-kv-gb", cpu_gb), ("--ssd-kv-gb", ssd_gb)):
            if value is not None:
                raise SpecError(f"{name}: applies with --kv-offload cpu[,ssd]; give it too")
        return None
    names = tuple(t.strip() for t in tiers.split(","))
    if names not in (("cpu",), ("cpu", "ssd")):
        raise SpecError(f"--kv-offload: expected cpu or cpu,ssd, got {tiers!r}")
    if overlap not in (None, *OVERLAPS):
        raise SpecError(f"--kv-offload-overlap: expected one of {', '.join(OVERLAPS)}, got "
                        f"{overlap!r}")
    if policy not in POLICIES:
        raise SpecError(f"--kv-offload-write-policy: expected one of {', '.join(POLICIES)}, "
                        f"got {policy!r}")
    for name, value in (("--cpu-kv-gb", cpu_gb), ("--ssd-kv-gb", ssd_gb)):
        if value is not None and not value > 0:
            raise SpecError(f"{name}: expected a positive number of GB, got {value}")
    if "ssd" in names and ssd_gb is None:
        raise SpecError("--ssd-kv-gb: --kv-offload cpu,ssd needs the SSD tier's GB per GPU")
    if "ssd" not in names and ssd_gb is not None:
        raise SpecError("--ssd-kv-gb: applies with --kv-offload cpu,ssd")
    return Offload(names, (cpu_gb or 0.0) * 1e9, (ssd_gb or 0.0) * 1e9, policy,
                   overlap or "")


def resolve(off: Offload, engine: object, model: Model, hw: Hardware, pool: object,
            pp: int) -> Offload:
    """``off`` against the device, the engine and its KV pool (``pricing.KvPoolSize``):
    SpecError where the engine, the plan or the device's ``host:`` block cannot say."""
    if engine.name not in ENGINES:
        raise SpecError(f"--kv-offload: modelled for --engine vllm and sglang, not "
                        f"{engine.name} (TensorRT-LLM's host KV cache is not)")
    if not engine.prefix_caching:
        raise SpecError("--kv-offload: an offloaded block is only read back by the prefix "
                        "cache; turn prefix caching on")
    if pp > 1:
        raise SpecError("--kv-offload: not modelled under pipeline parallelism (--pp 1)")
    if off.overlap == "async" and engine.name != "vllm":
        raise SpecError("--kv-offload-overlap async: vLLM's OffloadingConnector's rule; "
                        f"--engine {engine.name} loads serial or layered")
    host = hw.host
    if host is None:
        raise SpecError(f"--kv-offload: hardware {hw.name} has no host: block "
                        "(host.link_bytes_per_s) to price the loads over")
    if "ssd" in off.tiers and not host.nvme_bytes_per_s:
        raise SpecError(f"--kv-offload cpu,ssd: hardware {hw.name}'s host: block gives no "
                        "nvme_bytes_per_s")
    per = float(pool.bytes_per_block)
    cpu = off.cpu_bytes or DEFAULT_RATIO * pool.blocks * per
    sizes = (cpu, off.ssd_bytes)[:len(off.tiers)]
    return replace(off, cpu_bytes=cpu, blocks=tuple(int(b // per) for b in sizes),
                   link_bytes_per_s=host.link_bytes_per_s,
                   nvme_bytes_per_s=host.nvme_bytes_per_s, block_bytes=per,
                   layers=int(model.n_layers), overlap=off.overlap or ENGINES[engine.name])


@dataclass(eq=False)
class Tiers:
    """The lower tiers' contents as a simulation runs: per tier, chain key -> blocks held
    (a prefix of the chain), least recently used first; what was hit and loaded; and the
    load seconds of the step being formed (``due``). Lives in the pool (``KVPool.tiers``),
    copied with it when the simulator forks the state."""

    spec: Offload
    held: list = field(default_factory=list)        # per tier: OrderedDict key -> blocks
    used: list = field(default_factory=list)        # per tier: blocks held
    hit_tokens: list = field(default_factory=list)  # per tier: prompt tokens it served
    loads: int = 0
    load_s: float = 0.0
    serial_s: float = 0.0       # the step being formed: loads before it
    layered_s: float = 0.0      # loads overlapped with it layer by layer
    apart_s: float = 0.0        # loads it overlaps whole, their requests not in it
    loading: dict = field(default_factory=dict)     # request -> tokens its KV loads give

    def __post_init__(self) -> None:
        k = len(self.spec.tiers)
        self.held = self.held or [OrderedDict() for _ in range(k)]
        self.used = self.used or [0] * k
        self.hit_tokens = self.hit_tokens or [0] * k

    def copy(self) -> Tiers:
        return Tiers(self.spec, [OrderedDict(h) for h in self.held], list(self.used),
                     list(self.hit_tokens), self.loads, self.load_s, self.serial_s,
                     self.layered_s, self.apart_s, dict(self.loading))

    def cached(self, key: tuple, blocks: int) -> None:
        """The GPU caches ``blocks`` of ``key``'s chain (write-through stores them)."""
        if self.spec.write_policy == "write_through" and key[0] == "p":
            self._store(key, blocks)

    def evicted(self, key: tuple, blocks: int) -> None:
        """The GPU evicts ``key``'s chain of ``blocks`` (write-back stores it now)."""
        if self.spec.write_policy == "write_back" and key[0] == "p":
            self._store(key, blocks)

    def _store(self, key: tuple, blocks: int) -> None:
        for t, cap in enumerate(self.spec.blocks):
            held, have = self.held[t], self.held[t].get(key, 0)
            want = min(blocks, cap)
            if want > have:
                self._evict(t, want - have - (cap - self.used[t]), key)
                held[key] = want
                self.used[t] += want - have
            if key in held:
                held.move_to_end(key)

    def _evict(self, t: int, blocks: int, keep: tuple) -> None:
        """Free ``blocks`` of tier ``t``: the least recently used chains' tails."""
        held = self.held[t]
        for key in list(held):
            if blocks <= 0:
                return
            if key == keep:
                continue
            n = min(held[key], blocks)
            held[key] -= n
            self.used[t] -= n
            blocks -= n
            if held[key] == 0:
                del held[key]

    def hits(self, key: tuple, limit: int, gpu: int) -> list[int]:
        """Blocks each tier serves of ``key``'s chain past the GPU's ``gpu``, up to
        ``limit`` blocks in all (the CPU first, then the SSD beyond it)."""
        out, top = [], gpu
        for held in self.held:
            n = max(min(held.get(key, 0), limit) - top, 0)
            out.append(n)
            top += n
        return out

    def load(self, key: tuple, limit: int, gpu: int, block_size: int, first: bool,
             apart: bool = False) -> None:
        """A request admitted with the lower tiers' hits: their load time joins the step
        being formed (``apart``: loaded while the step runs without it), the chains are
        touched, and (``first``: not a recompute) its hit tokens are counted."""
        got = self.hits(key, limit, gpu)
        if not any(got):
            return
        s = self.spec
        link = sum(got) * s.block_bytes / s.link_bytes_per_s
        ssd = got[1] * s.block_bytes / s.nvme_bytes_per_s if len(got) > 1 else 0.0
        if apart:
            self.apart_s += ssd + link
        else:
            self.serial_s += ssd + (link if s.overlap != "layered" else 0.0)
            self.layered_s += link if s.overlap == "layered" else 0.0
        self.load_s += ssd + link
        self.loads += 1
        for t, n in enumerate(got):
            if n and key in self.held[t]:
                self.held[t].move_to_end(key)
            if first:
                self.hit_tokens[t] += n * block_size

    def due(self) -> tuple[float, float, float]:
        """(serial, layered, apart) load seconds of the step just formed, reset."""
        out = (self.serial_s, self.layered_s, self.apart_s)
        self.serial_s = self.layered_s = self.apart_s = 0.0
        return out


def step_seconds(gpu: np.ndarray, loads: list, layers: int) -> np.ndarray:
    """GPU seconds of each step with its loads (``(serial, layered, apart)`` per step):
    serial ones before it; layered ones overlapped layer by layer over ``layers`` layers
    (``max(C, D) + min(C, D) / layers``); apart ones, of requests not in the step, copied
    while it runs: it lasts at least as long as they do (the engine would run further
    steps meanwhile; here the one step is stretched)."""
    serial, layered, apart = (np.array(col) for col in zip(*loads, strict=True))
    lay = np.where(layered > 0, np.maximum(gpu, layered) + np.minimum(gpu, layered) / layers,
                   gpu)
    return serial + np.maximum(lay, apart)


def summary(runs: list, input_tokens: int, total_hits: int) -> dict:
    """Hit tokens and rates by tier (GPU: the prefix cache's hits less the lower tiers'),
    loads and their seconds, over every engine's run."""
    tiers = [r.state.pool.tiers for r in runs]
    spec = tiers[0].spec
    lower = [sum(t.hit_tokens[i] for t in tiers) for i in range(len(spec.tiers))]
    hits = {"gpu": total_hits - sum(lower), **dict(zip(spec.tiers, lower, strict=True))}
    denom = max(input_tokens, 1)
    return {"tiers": ["gpu", *spec.tiers], "write_policy": spec.write_policy,
            "overlap": spec.overlap,
            "capacity_blocks": dict(zip(spec.tiers, spec.blocks, strict=True)),
            "link_bytes_per_s": spec.link_bytes_per_s,
            "hit_tokens": hits, "hit_rate": {k: v / denom for k, v in hits.items()},
            "loads": sum(t.loads for t in tiers),
            "load_s": float(sum(t.load_s for t in tiers))}
