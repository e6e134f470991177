"""Collectives and point-to-point sends: a latency term plus a bandwidth term, vectorised.

Every function takes numbers or numpy arrays that broadcast together and returns seconds.
Figures come from ``hw.interconnect`` (per device, per direction: ``link_bytes_per_s`` and
``latency_s`` per hop inside a node of ``max_devices``; ``network_bytes_per_s`` and
``network_latency_s`` per hop between nodes; ``collective_latency_s`` once per collective)
and ``hw.efficiency.collective_fraction`` (the share of the link a collective reaches:
NCCL's protocol overhead on NVLink). The network figure is used as given, as the pipeline's
sends use it: no fraction of the NVLink's is applied to a NIC.

The model follows NCCL's own (``src/graph/tuning.cc``, ``ncclTopoTuneModel`` and
``ncclTopoGetAlgoTime``): time = latency + bytes / algorithm bandwidth, with

- ring (all-reduce: nsteps = 2(n-1), nInterSteps = 2(nodes-1); all-gather and
  reduce-scatter: n-1 and nodes-1): latency = base + (nsteps - nInterSteps) x intra hop +
  nInterSteps x inter hop; each device sends nsteps/n x S (NCCL's ratio nRanks / nsteps).
  Bus bandwidth: the link; across nodes the slower of the link and the node's NICs
  (ppn x network per device): NCCL runs one ring per channel, each crossing the node
  boundary on its own NIC, so a node's boundary carries one ring's traffic spread over its
  NICs (3 nodes of 8 A100 with 4 HDR NICs: 100 GB/s, nccl-tests issue 119).
- double binary tree (all-reduce across nodes): latency = base + 2((ppn - 1) x intra hop
  + floor(log2 nodes) x inter hop); algorithm bandwidth = 0.5 x the bus figure (NCCL's
  ratio .5 for trees): a device sends S up (reduce) and S down (broadcast). Across more
  than 2 nodes a node sends 2S over its NICs (inner in one tree, leaf in the other); with
  2 nodes only S, so there the NIC term counts twice (NCCL takes bwIntra for
  nNodes <= 2).
- all-reduce: the faster of the two, as NCCL picks by ``ncclTopoGetAlgoTime``. NCCL also
  has per-protocol constants (LL, LL128, Simple); this model keeps one pair, the LL
  latencies and the Simple bandwidth, so it is optimistic in between.

- custom all-reduce (``interconnect.custom_all_reduce_max_bytes`` > 0): vLLM and SGLang
  run their own all-reduce kernel instead of NCCL for a message under that size over 2, 4,
  6 or 8 devices of one NVLink node (vLLM ``distributed/device_communicators/
  custom_all_reduce.py``, ``should_custom_ar``: ``_SUPPORTED_WORLD_SIZES = [2, 4, 6, 8]``,
  ``max_size = 8192 * 1024``). Its kernel (``csrc/custom_all_reduce.cuh``, ``allreduce``)
  is one-stage (each device reads every peer's whole buffer: (n-1) x S) for 2 devices or,
  on a full NVLink node, below 512 KB (n <= 4) or 256 KB (n <= 8); two-stage otherwise
  (reduce-scatter then all-gather through peer loads: 2(n-1)/n x S). Time =
  custom_all_reduce_latency_s + bytes / (link x custom_all_reduce_fraction): its 36
  blocks of peer loads reach a share of the link of their own, and one launch with a
  flag handshake replaces NCCL's protocol latency.

All-to-all (NCCL alltoall, DeepEP dispatch and combine): each device sends (n-1)/n of its
bytes, spread evenly; on-node peers over the link, off-node peers over the device's own NIC,
both at once; latency = base + one hop (every peer is sent to in parallel).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from perfmodel.specs.hardware import Hardware

Num = float | np.ndarray

__all__ = ["Parts", "all_gather_s", "all_reduce_parts", "all_reduce_s", "all_to_all_parts",
           "all_to_all_s", "custom_all_reduce_parts", "reduce_scatter_s", "ring_all_reduce",
           "send_s", "tree_all_reduce"]

TREE_RATIO = 0.5        # NCCL tuning.cc: algorithm bandwidth = busBw x .5 for trees


class Parts(NamedTuple):
    """A collective's time as its two terms, seconds (arrays broadcast together)."""

    latency_s: np.ndarray
    wire_s: np.ndarray

    @property
    def total(self) -> np.ndarray:
        return self.latency_s + self.wire_s


def _arrays(*xs: Num) -> list[np.ndarray]:
    return [np.asarray(x, dtype=float) for x in xs]


def _link_rate(hw: Hardware) -> float:
    """Achievable bytes/s per device per direction on the intra-node link."""
    return hw.interconnect.link_bytes_per_s * hw.efficiency.collective_fraction


def _bus_rate(hw: Hardware, ppn: np.ndarray, nodes: np.ndarray, nic_factor: Num = 1.0
              ) -> np.ndarray:
    """Bus bytes/s per device: the link; across nodes at most the node's NICs
    (ppn x network per device x ``nic_factor``). No network figure: 0 (infinite time)."""
    net = ppn * hw.interconnect.network_bytes_per_s * nic_factor
    return np.where(nodes > 1, np.minimum(_link_rate(hw), net), _link_rate(hw))


def _over(nbytes: np.ndarray, rate: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(nbytes > 0, nbytes / rate, 0.0)


def _ring_latency(hw: Hardware, steps: np.ndarray, inter_steps: np.ndarray) -> np.ndarray:
    """base + (steps - inter) intra hops + inter network hops (NCCL's ring latency)."""
    link = hw.interconnect
    return link.collective_latency_s + (steps - inter_steps) * link.latency_s \
        + inter_steps * link.network_latency_s


def _ring(hw: Hardware, devices: Num, nbytes: Num, nodes: Num, passes: int) -> Parts:
    """A ring of ``passes`` sweeps (2 for all-reduce, 1 for all-gather / reduce-scatter)
    over ``devices`` on ``nodes`` nodes: passes(n-1)/n x S per device."""
    n, s, m = _arrays(devices, nbytes, nodes)
    latency = _ring_latency(hw, passes * (n - 1), passes * (m - 1))
    wire = _over(passes * (n - 1) / n * s, _bus_rate(hw, n / m, m))
    single = n <= 1
    return Parts(np.where(single, 0.0, latency), np.where(single, 0.0, wire))


def ring_all_reduce(hw: Hardware, devices: Num, nbytes: Num, nodes: Num = 1) -> Parts:
    """Ring all-reduce of ``nbytes`` (the buffer each device holds): 2(n-1)/n x S."""
    return _ring(hw, devices, nbytes, nodes, 2)


def tree_all_reduce(hw: Hardware, devices: Num, nbytes: Num, nodes: Num = 1) -> Parts:
    """Double-binary-tree all-reduce: latency 2((ppn-1) intra + floor(log2 nodes) inter)
    hops, S / (0.5 x bus) on the wire (the NICs count twice with 2 nodes: module doc)."""
    n, s, m = _arrays(devices, nbytes, nodes)
    link = hw.interconnect
    ppn = n / m
    latency = link.collective_latency_s + 2.0 * ((ppn - 1) * link.latency_s
                                                 + np.floor(np.log2(m)) * link.network_latency_s)
    wire = _over(s, TREE_RATIO * _bus_rate(hw, ppn, m, np.where(m <= 2, 2.0, 1.0)))
    single = n <= 1
    return Parts(np.where(single, 0.0, latency), np.where(single, 0.0, wire))


CUSTOM_WORLD_SIZES = (2, 4, 6, 8)       # vLLM CustomAllreduce._SUPPORTED_WORLD_SIZES


def custom_all_reduce_parts(hw: Hardware, devices: Num, nbytes: Num) -> Parts | None:
    """The engine's custom all-reduce of ``nbytes`` over ``devices`` of one node (module
    doc), whatever its size limit; None when the device has none."""
    link = hw.interconnect
    if not link.custom_all_reduce_max_bytes:
        return None
    n, s = _arrays(devices, nbytes)
    one_stage = (n <= 2) | ((n <= 4) & (s < 512 * 1024)) | ((n <= 8) & (s < 256 * 1024))
    moved = np.where(one_stage, (n - 1) * s, 2.0 * (n - 1) / np.maximum(n, 1) * s)
    rate = link.link_bytes_per_s * link.custom_all_reduce_fraction
    single = n <= 1
    return Parts(np.where(single, 0.0, link.custom_all_reduce_latency_s + 0 * s),
                 np.where(single, 0.0, _over(moved, rate)))


def all_reduce_parts(hw: Hardware, devices: Num, nbytes: Num, nodes: Num = 1) -> Parts:
    """The engine's custom all-reduce where it applies (one NVLink node, 2/4/6/8 devices,
    under its size limit), else the faster of NCCL's ring and tree per instance (ring on a
    tie), as its two terms."""
    ring = ring_all_reduce(hw, devices, nbytes, nodes)
    tree = tree_all_reduce(hw, devices, nbytes, nodes)
    use_tree = tree.total < ring.total
    out = Parts(np.where(use_tree, tree.latency_s, ring.latency_s),
                np.where(use_tree, tree.wire_s, ring.wire_s))
    custom = custom_all_reduce_parts(hw, devices, nbytes)
    if custom is None:
        return out
    n, s, m = _arrays(devices, nbytes, nodes)
    on = (m <= 1) & np.isin(n, CUSTOM_WORLD_SIZES) \
        & (s < hw.interconnect.custom_all_reduce_max_bytes) \
        & ((n <= 2) | (hw.interconnect.topology == "switch"))
    return Parts(np.where(on, custom.latency_s, out.latency_s),
                 np.where(on, custom.wire_s, out.wire_s))


def all_reduce_s(hw: Hardware, devices: Num, nbytes: Num, nodes: Num = 1) -> np.ndarray:
    """Seconds to all-reduce ``nbytes`` per device over ``devices`` on ``nodes`` nodes."""
    return all_reduce_parts(hw, devices, nbytes, nodes).total


def all_gather_s(hw: Hardware, devices: Num, nbytes: Num, nodes: Num = 1) -> np.ndarray:
    """Ring all-gather into ``nbytes`` (the gathered buffer): (n-1)/n x S per device."""
    return _ring(hw, devices, nbytes, nodes, 1).total


def reduce_scatter_s(hw: Hardware, devices: Num, nbytes: Num, nodes: Num = 1) -> np.ndarray:
    """Ring reduce-scatter of ``nbytes`` (the input buffer): (n-1)/n x S per device."""
    return _ring(hw, devices, nbytes, nodes, 1).total


def all_to_all_parts(hw: Hardware, devices: Num, bytes_per_device: Num, nodes: Num = 1,
                     off_node: Num | None = None) -> Parts:
    """All-to-all of ``bytes_per_device`` (spread evenly over the ``devices``, its own share
    kept): (ppn-1)/n of it over the link and (n-ppn)/n over the device's NIC, at once;
    latency = base + one hop (the network's when peers are off the node). ``off_node``:
    the share that crosses the NIC instead, where the sender sends each token once per
    remote node and the receiving node forwards it over NVLink (DeepEP's internode
    kernels); a negative value keeps the even (n-ppn)/n."""
    n, b, m = _arrays(devices, bytes_per_device, nodes)
    link = hw.interconnect
    ppn = n / m
    even = (n - ppn) / n
    share = even if off_node is None else np.where(np.asarray(off_node) < 0, even, off_node)
    intra = _over((ppn - 1) / n * b, _link_rate(hw))
    inter = _over(share * b, np.full(np.shape(m), link.network_bytes_per_s))
    latency = link.collective_latency_s + np.where(m > 1, link.network_latency_s,
                                                   link.latency_s)
    single = n <= 1
    return Parts(np.where(single, 0.0, latency),
                 np.where(single, 0.0, np.maximum(intra, inter)))


def all_to_all_s(hw: Hardware, devices: Num, bytes_per_device: Num, nodes: Num = 1
                 ) -> np.ndarray:
    """Seconds for an all-to-all of ``bytes_per_device`` (see ``all_to_all_parts``)."""
    return all_to_all_parts(hw, devices, bytes_per_device, nodes).total


def send_s(hw: Hardware, nbytes: Num, inter: Num = False) -> np.ndarray:
    """Point-to-point send of ``nbytes``: one hop's latency plus bytes over the raw link
    (``inter``: between nodes, over the device's NIC)."""
    link = hw.interconnect
    s, cross = np.asarray(nbytes, dtype=float), np.asarray(inter, dtype=bool)
    with np.errstate(divide="ignore"):
        net = np.where(cross, link.network_latency_s + s / link.network_bytes_per_s, 0.0) \
            if link.network_bytes_per_s else np.where(cross, np.inf, 0.0)
    return np.where(cross, net, link.latency_s + s / link.link_bytes_per_s)
