"""The links a disaggregated deployment moves KV caches over, and their contention.

Each link (``kv_links.yaml``, with the source of every figure) is a path, every device's
NIC between nodes or the devices' own link inside one node, and the share of that path's
raw rate a transfer gets (``bandwidth_fraction``), plus any software time per transfer
(``overhead_s``).

Contention (``queued``): the KV of one request leaves its prefill instance over that
instance's NICs (every device its own shard, over its own NIC: ``disagg.kv_transfer_s``),
so transfers from one instance share them. They are taken first come, first served in the
order the prefills finished, each at the whole rate (RDMA READs posted to one NIC drain
in the order they were posted; one transfer already fills the link); the link's latency
is a transit time, not an occupancy, so only the wire time queues. A request's KV arrives
at ``max(its prefill's end, the wire free) + wire time + latency``. Transfers into one
decode instance share its NICs too; that side is not queued: with more prefill than
decode instances the receivers can be the narrower end, and the arrivals then early.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from importlib.resources import files

import numpy as np
import yaml

from perfmodel.specs.errors import SpecError

PATHS = ("nic", "device_link")


@dataclass(frozen=True)
class KvLink:
    """One link as ``kv_links.yaml`` gives it."""

    name: str
    path: str
    bandwidth_fraction: float
    overhead_s: float
    source: str

    @property
    def inter_node(self) -> bool:
        return self.path == "nic"


@cache
def links() -> dict[str, KvLink]:
    """Every link of ``kv_links.yaml`` by name."""
    data = yaml.safe_load(files("perfmodel.serving").joinpath("kv_links.yaml").read_text())
    out = {name: KvLink(name, **row) for name, row in data.items()}
    for k in out.values():
        if k.path not in PATHS or not 0 < k.bandwidth_fraction <= 1 or k.overhead_s < 0:
            raise SpecError(f"kv_links.yaml: {k.name}: expected path one of "
                            f"{', '.join(PATHS)}, 0 < bandwidth_fraction <= 1, overhead_s >= 0")
    return out


def link(name: str) -> KvLink:
    """The link ``name``; another name is one line naming the choices."""
    known = links()
    if name not in known:
        raise SpecError(f"disaggregated: link must be one of {', '.join(known)}, got {name!r}")
    return known[name]


def queued(done_s: np.ndarray, wire_s: np.ndarray, latency_s: float,
           sender: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(KV arrival, time queued) per request whose prefill ended at ``done_s`` on prefill
    instance ``sender``, its KV ``wire_s`` seconds on the wire and ``latency_s`` in
    transit: each instance's transfers one after another, by prefill end (ties by
    request)."""
    done = np.asarray(done_s, float)
    wire = np.broadcast_to(np.asarray(wire_s, float), done.shape)
    start = np.empty_like(done)
    free: dict[int, float] = {}
    for i in np.lexsort((np.arange(len(done)), done)).tolist():
        s = int(sender[i])
        start[i] = max(done[i], free.get(s, done[i]))
        free[s] = start[i] + wire[i]
    return start + wire + latency_s, start - done


def round_robin(arrival_s: np.ndarray, instances: int) -> np.ndarray:
    """The prefill instance of each request: dealt in arrival order, one after another
    (vLLM's proxy, ``toy_proxy_server.py``; ``fleet.routers.deal`` round-robin)."""
    order = np.argsort(arrival_s, kind="stable")
    out = np.empty(len(order), np.int64)
    out[order] = np.arange(len(order)) % max(instances, 1)
    return out
