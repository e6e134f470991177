"""LoRA adapters in the serving engines: the settings as the engines name them, the GPU
slots an engine holds adapters in and the CPU cache behind them, the scheduler's limit on
distinct adapters per step, and the time a step spends on its adapters (its LoRA kernels,
``cost.lora``, and the loads of adapters not resident). The engines call in here through
hooks only (``admits`` in their waiting loops, ``EngineState.lora_step`` on each step).

The engines' rules:

- Slots: vLLM holds ``--max-loras`` adapters on the GPU (``vllm/lora/models.py``
  ``LRUCacheLoRAModelManager``: ``activate_adapter`` of one not active with every slot taken
  evicts the least recently used one, ``_active_adapters.remove_oldest()``; a batch's
  adapters are activated, and so touched, each step by ``LRUCacheWorkerLoRAManager.
  _apply_adapters``) and ``--max-cpu-loras`` (default ``--max-loras``) in host memory, LRU
  as well; an adapter in neither is read from disk first (counted, not priced). SGLang
  holds ``--max-loras-per-batch`` in its GPU memory pool (``sglang/srt/lora/mem_pool.py``,
  ``--lora-eviction-policy lru``) and every ``--lora-paths`` adapter in host memory from
  start-up.
- A load copies the adapter's A and B (``cost.lora.adapter_bytes`` at ``--max-lora-rank``)
  from pinned host memory over the host link (the hardware's ``host:`` block), synchronously
  before the step's forward (vLLM's ``set_active_adapters`` in the model runner's input
  preparation; SGLang's ``prepare_lora_batch``): the step takes that much longer.
- Scheduling: a waiting request whose adapter is not among the step's adapters when there
  are already ``max_loras`` of them is skipped, and the next one tried (vLLM
  ``vllm/v1/core/sched/scheduler.py`` ``Scheduler.schedule``: ``len(scheduled_loras) ==
  max_loras`` and its ``lora_int_id`` not in them moves it to ``skipped_waiting``; SGLang
  ``get_new_batch_prefill``: ``can_run_lora_batch`` false skips a LoRA request). The running
  requests' adapters count first.
- Memory: the slots' buffers (``max_loras`` x one adapter at ``max_lora_rank``) are made when
  the model is loaded, before the KV cache is sized, so they come out of the KV pool.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass

import numpy as np

from perfmodel.cost import lora as kernels
from perfmodel.specs.errors import SpecError
from perfmodel.specs.hardware import Hardware
from perfmodel.specs.model import Model

# a device with no ``host:`` block: PCIe Gen4 x16, 16 GT/s x 16 lanes = 32 GB/s per direction
# (PCI-SIG PCIe 4.0 base specification), the slowest link a data-centre GPU of these years has
FALLBACK_LINK_BYTES_PER_S = 32e9
ENGINES = ("vllm", "sglang")
# the ranks vLLM's LoRAConfig accepts (``LoRAConfig.__post_init__``: possible_max_ranks)
VLLM_RANKS = (8, 16, 32, 64, 128, 256, 320, 512)


@dataclass(frozen=True)
class LoraSettings:
    """``max_loras``: adapters the GPU holds, and so the most one step runs (vLLM
    ``--max-loras``, default 1; SGLang ``--max-loras-per-batch``, default 8);
    ``max_lora_rank`` (both ``--max-lora-rank``; vLLM's default 16); ``max_cpu_loras``
    adapters in host memory (vLLM ``--max-cpu-loras``, 0: ``max_loras``; SGLang: every
    adapter, 0 here too); ``modules``: the target modules (``cost.lora.MODULES``, default
    all); ``paths``: SGLang's ``--lora-paths`` names (the adapters a request may name; empty:
    any); ``host_bytes_per_s``: the host link a load crosses (0: the device's, from its
    ``host:`` block)."""

    max_loras: int = 1
    max_lora_rank: int = 16
    max_cpu_loras: int = 0
    modules: tuple[str, ...] = kernels.MODULES
    paths: tuple[str, ...] = ()
    host_bytes_per_s: float = 0.0
    engine: str = "vllm"

    def __post_init__(self) -> None:
        slots = "--max-loras-per-batch" if self.engine == "sglang" else "--max-loras"
        if self.engine not in ENGINES:
            raise SpecError(f"--enable-lora: LoRA is modelled for --engine "
                            f"{' and '.join(ENGINES)}, not {self.engine}")
        if self.max_loras < 1:
            raise SpecError(f"{slots}: expected an integer >= 1, got {self.max_loras}")
        if self.max_lora_rank < 1:
            raise SpecError(f"--max-lora-rank: expected an integer >= 1, got "
                            f"{self.max_lora_rank}")
        if self.engine == "vllm" and self.max_lora_rank not in VLLM_RANKS:
            raise SpecError(f"--max-lora-rank: vLLM takes one of "
                            f"{', '.join(map(str, VLLM_RANKS))}, got {self.max_lora_rank}")
        if self.max_cpu_loras and self.max_cpu_loras < self.max_loras:
            raise SpecError(f"--max-cpu-loras: expected at least {slots} "
                            f"({self.max_loras}), got {self.max_cpu_loras} (vLLM refuses it)")
        kernels.check_modules(self.modules)

    @property
    def cpu_slots(self) -> int:
        """Adapters host memory holds (0: unbounded, SGLang's every ``--lora-paths``)."""
        if self.engine == "sglang":
            return 0
        return self.max_cpu_loras or self.max_loras

    def flags(self) -> str:
        """The same settings as the engine's flags."""
        if self.engine == "sglang":
            out = [f"--max-loras-per-batch {self.max_loras}",
                   f"--max-lora-rank {self.max_lora_rank}"]
            if self.paths:
                out.append("--lora-paths " + " ".join(self.paths))
        else:
            out = ["--enable-lora", f"--max-loras {self.max_loras}",
                   f"--max-lora-rank {self.max_lora_rank}"]
            if self.max_cpu_loras:
                out.append(f"--max-cpu-loras {self.max_cpu_loras}")
        if self.modules != kernels.MODULES:
            out.append("--lora-target-modules " + " ".join(self.modules))
        return " ".join(out)


def host_link(hw: Hardware) -> tuple[float, str]:
    """(bytes per second of ``hw``'s host-to-device link, a warning or ""): the hardware's
    ``host:`` block (``specs.hardware.HostLink``), else PCIe Gen4, said in the warning."""
    if hw.host is not None:
        return hw.host.link_bytes_per_s, ""
    return FALLBACK_LINK_BYTES_PER_S, (
        f"warning: LoRA loads: hardware {hw.name} has no host: block; adapters load at PCIe "
        f"Gen4's {FALLBACK_LINK_BYTES_PER_S / 1e9:g} GB/s per direction")


def check_requests(requests: object, settings: LoraSettings | None, where: str) -> None:
    """SpecError for requests naming adapters with LoRA off, or more adapters than SGLang's
    ``--lora-paths`` names."""
    count = used(requests)
    if not count:
        return
    if settings is None:
        raise SpecError(f"{where}: {count} LoRA adapter(s) named by the requests, but LoRA is "
                        "off; expected --enable-lora (vLLM) or --max-loras-per-batch "
                        "(SGLang)")
    if settings.paths and count > len(settings.paths):
        raise SpecError(f"--lora-paths: {len(settings.paths)} adapter(s) loaded, but the "
                        f"requests name {count}; expected at least {count}")


class LoraSlots:
    """An engine's adapters: which are in its GPU slots and in host memory, least recently
    used first, and what it has loaded; ``adapter``: each request's adapter (-1: none)."""

    def __init__(self, settings: LoraSettings, adapter: np.ndarray) -> None:
        self.settings, self.adapter = settings, adapter
        self.count = int(adapter.max(initial=-1)) + 1     # adapter ids 0 .. count - 1
        self.gpu: OrderedDict[int, None] = OrderedDict()
        self.cpu: OrderedDict[int, None] = OrderedDict()
        self.loads = self.disk_loads = self.evictions = 0
        self.blocked = False    # the last schedule skipped a request for its adapter
        self.scan: tuple | None = None  # the queue as ``skip`` found it (``requeue``)

    def copy(self) -> LoraSlots:
        new = LoraSlots.__new__(LoraSlots)
        new.__dict__.update(self.__dict__)
        new.gpu, new.cpu = OrderedDict(self.gpu), OrderedDict(self.cpu)
        return new

    def admits(self, r: int, chosen: set[int]) -> bool:
        """Whether request ``r`` may join a step whose adapters so far are ``chosen``."""
        a = int(self.adapter[r])
        return a < 0 or a in chosen or len(chosen) < self.settings.max_loras

    def skip(self, waiting: deque, chosen: set[int], skipped: list) -> bool:
        """The head of ``waiting`` cannot join a step whose adapters are ``chosen`` (all
        ``max_loras`` of them, so they stay as they are for the rest of the schedule):
        ``waiting`` keeps only the requests the step can take, in order, the queue as it was
        saved for ``requeue``. False when it can take none."""
        self.blocked = True
        ids = np.fromiter(waiting, np.int64, len(waiting))
        member = np.zeros(self.count + 1, dtype=bool)   # by adapter id; the last: none
        member[-1] = True
        member[list(chosen)] = True
        ok = member[self.adapter[ids]]
        self.scan = (ids, ok, len(skipped))
        waiting.clear()
        waiting.extend(ids[ok].tolist())
        return bool(waiting)

    def join(self, r: int, chosen: set[int]) -> None:
        """Request ``r`` was scheduled: its adapter is among the step's."""
        if self.adapter[r] >= 0:
            chosen.add(int(self.adapter[r]))

    def step(self, ids: np.ndarray) -> tuple[int, int]:
        """Activate the adapters of a step of requests ``ids``: (distinct adapters, loads
        into a GPU slot). Evicts the least recently used adapter not in the step."""
        used = np.unique(self.adapter[ids])
        used = used[used >= 0].tolist()
        loads = 0
        for a in used:
            if a in self.gpu:
                self.gpu.move_to_end(a)
                continue
            if len(self.gpu) >= self.settings.max_loras:
                self.gpu.popitem(last=False)
                self.evictions += 1
            self.gpu[a] = None
            loads += 1
            self._from_host(a)
        self.loads += loads
        return len(used), loads

    def _from_host(self, a: int) -> None:
        """``a`` is copied from host memory, read from disk first where it is not there."""
        if a in self.cpu:
            self.cpu.move_to_end(a)
            return
        cap = self.settings.cpu_slots
        if cap:
            if len(self.cpu) >= cap:
                self.cpu.popitem(last=False)
            self.disk_loads += 1
        self.cpu[a] = None


def scheduled(slots: LoraSlots | None, running: list) -> set[int]:
    """The adapters of the running requests: those a step's waiting requests join (a
    schedule begins: nothing skipped yet)."""
    if slots is None:
        return set()
    slots.blocked, slots.scan = False, None
    a = slots.adapter[np.asarray(running, np.int64)] if running else np.zeros(0, np.int64)
    return set(a[a >= 0].tolist())


@dataclass(frozen=True)
class LoraPricer:
    """The seconds a step spends on its adapters on one device: its LoRA kernels
    (``cost.lora.step_cost`` at ``max_lora_rank``) and its loads over the host link."""

    model: Model
    hw: Hardware
    tp: int
    settings: LoraSettings
    load_s: float           # one adapter's load

    @classmethod
    def of(cls, model: Model, hw: Hardware, tp: int, settings: LoraSettings) -> LoraPricer:
        rate = settings.host_bytes_per_s or host_link(hw)[0]
        size = kernels.adapter_bytes(model, tp, settings.modules, settings.max_lora_rank)
        return cls(model, hw, tp, settings, size / rate)

    def seconds(self, batches: list, timing: np.ndarray) -> np.ndarray:
        """(N,) seconds each batch adds: kernels, then loads."""
        info = np.array([b.lora or (0, 0, 0) for b in batches], dtype=float).reshape(-1, 3)
        tokens, adapters, loads = info.T
        if not np.any(tokens):
            return loads * self.load_s
        cost = kernels.step_cost(self.model, self.hw, self.tp, self.settings.modules,
                                 self.settings.max_lora_rank, tokens, adapters, timing)
        return cost.time + loads * self.load_s


def requeue(slots: LoraSlots | None, waiting: deque, skipped: list) -> None:
    """The waiting queue after a schedule, as the engine leaves it: the requests it skipped
    (``skipped``, and those ``skip`` set aside for their adapters) ahead of the rest, in
    the order they were tried (vLLM's ``prepend_requests(skipped_waiting)``)."""
    scan = None if slots is None else slots.scan
    if scan is None:
        waiting.extendleft(reversed(skipped))
        return
    ids, ok, before = scan
    taken = np.flatnonzero(ok)
    stop = taken[len(taken) - len(waiting)] if waiting else len(ids)   # the first not tried
    keep = ~ok
    if len(skipped) > before:       # tried and skipped for the token budget
        keep |= np.isin(ids, np.asarray(skipped[before:], np.int64))
    keep[stop:] = True
    waiting.clear()
    waiting.extend(skipped[:before])
    waiting.extend(ids[keep].tolist())
    slots.scan = None


def open_queue(slots: LoraSlots | None, waiting: deque) -> bool:
    """Whether a schedule left the queue open to an arrival: empty, or holding only requests
    skipped for their adapters (an arrival naming one of the step's would join it)."""
    return not waiting or (slots is not None and slots.blocked)


def batch_info(slots: LoraSlots, ids: np.ndarray, new: np.ndarray) -> tuple[int, int, int]:
    """(tokens carrying an adapter, distinct adapters, loads) of a step, its adapters
    activated."""
    tokens = int(new[slots.adapter[ids] >= 0].sum())
    adapters, loads = slots.step(ids)
    return tokens, adapters, loads


def reserved_bytes(model: Model, tp: int, settings: LoraSettings | None) -> float:
    """The slots' bytes on one device, taken before the KV pool (0 with LoRA off)."""
    if settings is None:
        return 0.0
    return settings.max_loras * kernels.adapter_bytes(model, tp, settings.modules,
                                                      settings.max_lora_rank)


def summary(runs: list, settings: LoraSettings, adapters: int, load_s: float) -> dict:
    """What a run's engines did with adapters: loads into GPU slots (and from disk into
    host memory, vLLM), evictions, and the seconds the loads took."""
    slots = [r.state.lora for r in runs if r.state.lora is not None]
    loads = sum(s.loads for s in slots)
    return {"adapters": adapters, "max_loras": settings.max_loras,
            "max_lora_rank": settings.max_lora_rank, "loads": loads,
            "disk_loads": sum(s.disk_loads for s in slots),
            "evictions": sum(s.evictions for s in slots), "load_s": loads * load_s,
            "load_s_each": load_s}


def slots(engine: object, requests: object) -> LoraSlots | None:
    """An engine's adapter slots for ``requests`` (None with LoRA off)."""
    settings = getattr(engine, "lora", None)
    if settings is None:
        return None
    adapter = requests.adapter if requests.adapter is not None else \
        np.full(len(requests), -1, np.int64)
    return LoraSlots(settings, adapter)


def pricer(model: Model, hw: Hardware, plan: object, engine: object) -> LoraPricer | None:
    """The step pricer's LoRA part (None with LoRA off)."""
    settings = getattr(engine, "lora", None)
    return None if settings is None else LoraPricer.of(model, hw, plan.tp, settings)


DISTRIBUTIONS = ("uniform", "zipf", "round-robin")


def assign(requests: object, count: int, dist: str = "zipf", skew: float = 1.0,
           seed: int = 0) -> object:
    """``requests`` with each one's adapter drawn from ``count`` adapters: "uniform",
    "zipf" (adapter i, 0-based, with weight 1 / (i + 1)^``skew``: S-LoRA's power-law
    popularity, Sheng et al. 2023 section 7) or "round-robin" (request j: adapter j mod
    ``count``)."""
    from dataclasses import replace

    if isinstance(count, bool) or not isinstance(count, (int, np.integer)) or count < 1:
        raise SpecError(f"--loras: expected a whole number of adapters >= 1, got {count!r}")
    if dist not in DISTRIBUTIONS:
        raise SpecError(f"--lora-dist: expected one of {', '.join(DISTRIBUTIONS)}, got "
                        f"{dist!r}")
    if not (np.isfinite(skew) and skew >= 0):
        raise SpecError(f"--lora-skew: expected a Zipf exponent >= 0, got {skew}")
    n = len(requests)
    if dist == "round-robin":
        return replace(requests, adapter=np.arange(n, dtype=np.int64) % count)
    weights = np.ones(count) if dist == "uniform" else 1.0 / np.arange(1, count + 1) ** skew
    rng = np.random.default_rng([seed, 0x10A])
    pick = rng.choice(count, size=n, p=weights / weights.sum()).astype(np.int64)
    return replace(requests, adapter=pick)


def used(requests: object) -> int:
    """Distinct adapters the requests name."""
    a = requests.adapter
    return 0 if a is None else len(np.unique(a[a >= 0]))
