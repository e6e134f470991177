"""Expert-parallel dispatch and combine as DeepEP runs them: bytes per device, then time.

One formula for every caller: the kernel corpus (``compare.forms``, DeepEP rows timed by
aiconfigurator's collectors) and the step template's data-parallel attention + EP step
(``cost.instantiate``, ``AllToAllSpec``) both build an ``AllToAll`` record with ``kernel``
set from ``traffic`` here, and ``cost.roofline`` times it with ``ep_parts``.

Kernels (DeepEP legacy kernels, github.com/deepseek-ai/DeepEP at dd758ca,
``csrc/kernels/legacy/``):

- normal (high-throughput) mode, one node (``intranode.cu``, ``dispatch`` / ``combine``):
  ``num_sms`` blocks, even ones send and odd ones receive (``is_sender = sm_id % 2 == 0``),
  ``num_channels = num_sms / 2``; each token is copied once to every rank holding any of
  its top-k experts (``is_token_in_rank``), its own rank included (a copy into its own
  buffer). The copy runs at most ``num_sms`` x a per-SM rate (``sm_bytes_per_s``) and
  the NVLink part at the link's achieved share.
- normal mode across nodes (``internode.cu``): a token crosses RDMA once per remote node
  holding one of its experts and is forwarded over NVLink to the ranks there
  (``is_forwarder`` warps); bytes per token = hidden x dtype + scales + top-k indices and
  weights + ``SourceMeta`` (``get_num_bytes_per_token``).
- low-latency mode (``internode_ll.cu``, ``dispatch`` / ``combine``): one warp group per
  expert on ``ceil(E / ceil(E / SMs))`` SMs (``sm_budget``), one message per
  (token, expert) pair, no deduplication (``dst_expert_idx`` per top-k slot), of
  ``sizeof(int4) + hidden (+ hidden / 128 float scales)`` bytes in fp8 or ``16 + 2 hidden``
  in bf16 (``num_bytes_per_msg``); IBGDA puts over RDMA, NVLink P2P inside a node when
  allowed. The combine sends each pair's bf16 output back.

Time = latency_s (+ network_latency_s across nodes) + max((sent / sm_bytes_per_s + copies x
copy_s) / sms, link / (link x link_fraction), network / (NIC x network_fraction)): the SMs
copy bytes at a rate and pay a fixed cost per token copy (its flags, indices and queue
slots: a warp's bookkeeping per token, whatever its width). The constants are per
device and engine (``efficiency.ep_kernels.<kernel>``, fitted by ``validate.corpus.ep``
on the collectors' rows); a kernel not listed prices at the collective figures
(``collective_latency_s``, ``collective_fraction``, the NIC at its rate, no SM cap).
DeepEP's README (V1 table, before b306af0) gives the second source for the fractions:
intranode normal 153-158 GB/s of H800's ~160 GB/s NVLink, internode 43-58 GB/s of a
50 GB/s CX7 (logical bandwidth, local traffic included).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from perfmodel.cost.collectives import Parts
from perfmodel.cost.routing import token_reach
from perfmodel.specs.hardware import Hardware

Num = float | np.ndarray

KERNELS = ("normal_dispatch", "normal_combine", "ll_dispatch", "ll_combine")
FIELDS = ("latency_s", "link_fraction", "network_fraction", "sm_bytes_per_s",
          "network_latency_s", "copy_s")
DEFAULT_SMS = 20            # deep_ep/buffers/legacy.py: Buffer.num_sms = 20
LL_HEADER = 16.0            # internode_ll.cu: sizeof(int4) ahead of each message
SCALE_GROUP = 128           # internode_ll.cu kNumPerChannels: one fp32 scale per 128
META_BYTES = 8.0            # internode.cu: sizeof(SourceMeta), per token
TOPK_BYTES = 8.0            # internode.cu get_num_bytes_per_token: int idx + float weight
# payload bytes per hidden element by dtype name, scales included (fp8: a float per 128;
# nvfp4: an fp8 scale per 16 of 4-bit values)
PAYLOAD = {"bf16": 2.0, "fp16": 2.0, "fp8": 1.0 + 4.0 / SCALE_GROUP, "fp4": 0.5 + 1.0 / 16}


class Traffic(NamedTuple):
    """Bytes one device moves in a dispatch or combine: ``sent`` (every copy its SMs make,
    its own rank's included), over the ``link`` (NVLink) and over the ``network`` (RDMA),
    and the token ``copies`` (messages) its SMs make."""

    sent: np.ndarray
    link: np.ndarray
    network: np.ndarray
    copies: np.ndarray | float = 0.0


def kernel_code(mode: str, phase: str) -> int:
    """Index of ``<mode>_<phase>`` in ``KERNELS`` (mode normal | ll, phase dispatch |
    combine)."""
    return KERNELS.index(f"{mode}_{phase}")


def token_bytes(kernel: Num, hidden: Num, elem_bytes: Num, topk: Num) -> np.ndarray:
    """Bytes of one copy of a token: hidden x ``elem_bytes`` (scales included), plus a normal
    dispatch's top-k indices and weights and source meta, or a low-latency message's header."""
    k = np.asarray(kernel)
    body = np.asarray(hidden, dtype=float) * elem_bytes
    extra = np.where(k == 0, np.asarray(topk) * TOPK_BYTES + META_BYTES,
                     np.where(k >= 2, LL_HEADER, 0.0))
    return body + extra


def traffic(kernel: Num, tokens: Num, nbytes: Num, topk: Num, devices: Num, nodes: Num,
            reach_devices: Num, reach_nodes: Num) -> Traffic:
    """Per-device bytes of ``tokens`` tokens of ``nbytes`` each (``token_bytes``) over
    ``devices`` on ``nodes`` nodes. Normal mode copies a token once per device reached
    (``reach_devices`` others, from ``routing.token_reach``, plus its own with the same
    chance) and once per remote node reached over RDMA; low-latency once per pair, the
    pairs spread evenly: (n - ppn)/n of them off the node, (ppn - 1)/n over NVLink."""
    k, t, b, n, m = (np.asarray(x, dtype=float) for x in (kernel, tokens, nbytes, devices,
                                                           nodes))
    ppn = n / np.maximum(m, 1.0)
    own = np.where(n > 1, np.asarray(reach_devices) / np.maximum(n - 1, 1.0), 1.0)
    pairs = t * np.asarray(topk, dtype=float) * b
    ll = k >= 2
    sent = np.where(ll, pairs, t * (np.asarray(reach_devices) + own) * b)
    link = np.where(ll, pairs * (ppn - 1) / n, t * np.asarray(reach_devices) * b)
    network = np.where(ll, pairs * (n - ppn) / n, t * np.asarray(reach_nodes) * b)
    return Traffic(sent, link, network, sent / np.where(b > 0, b, 1.0))


def sm_budget(kernel: Num, sms: Num, experts: Num, tokens: Num, units: int) -> np.ndarray:
    """SMs that copy: normal mode its ``sms`` (0: DeepEP's default) in channels of two, each
    channel a range of the tokens (``get_channel_task_range``): at most 2 x tokens of them;
    low-latency ``ceil(E / ceil(E / units))`` SMs of one warp group per expert
    (internode_ll.cu launch: ``num_warp_groups = ceil_div(num_experts, num_device_sms)``),
    whose dispatch sends token ``sm_id, sm_id + num_sms, ...`` (at most ``tokens`` SMs busy)
    and whose combine sends per expert."""
    k, e, t = (np.asarray(x, dtype=float) for x in (kernel, experts, tokens))
    normal = np.minimum(np.where(np.asarray(sms) > 0, sms, DEFAULT_SMS), 2.0 * t)
    groups = np.ceil(e / max(int(units), 1))
    ll = np.ceil(e / groups)
    ll = np.where(k == 2, np.minimum(ll, t), ll)
    return np.where(k >= 2, ll, normal)


def reach(n_experts: int, top_k: int, devices: int, per_node: int, groups: int = 1,
          topk_groups: int = 1) -> tuple[float, float]:
    """(other devices, remote nodes) one token's experts reach (``routing.token_reach``)."""
    r = token_reach(int(n_experts), int(top_k), int(devices), int(per_node), int(groups),
                    int(topk_groups))
    return r.devices, r.nodes


def constants(hw: Hardware) -> np.ndarray:
    """(kernels, fields) table of ``hw``'s ``ep_kernels``; a kernel not listed at the
    collective figures (module doc)."""
    link = hw.interconnect
    default = (link.collective_latency_s, hw.efficiency.collective_fraction, 1.0, 0.0, 0.0,
               0.0)
    table = hw.efficiency.ep_kernels
    return np.array([table.get(name, default) for name in KERNELS], dtype=float)


def _over(nbytes: np.ndarray, rate: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(nbytes > 0, nbytes / np.where(rate > 0, rate, np.nan), 0.0)


def ep_parts(hw: Hardware, kernel: Num, moved: Traffic, nodes: Num, sms: Num = DEFAULT_SMS
             ) -> Parts:
    """A DeepEP dispatch or combine (``kernel``: index in ``KERNELS``) moving ``moved`` on
    ``hw``, as its two terms (module doc); ``sms``: the SMs that copy (``sm_budget``)."""
    p = constants(hw)[np.asarray(kernel, dtype=int)]
    lat, lf, nf, sm_rate, net_lat, copy_s = (p[..., i] for i in range(len(FIELDS)))
    link = hw.interconnect
    units = np.where(np.asarray(sms) > 0, sms, DEFAULT_SMS)
    cap = np.where(sm_rate > 0, _over(moved.sent, units * sm_rate), 0.0) \
        + np.asarray(moved.copies) * copy_s / units
    wire = np.maximum(cap, np.maximum(_over(moved.link, link.link_bytes_per_s * lf),
                                      _over(moved.network, link.network_bytes_per_s * nf)))
    m = np.asarray(nodes, dtype=float)
    latency = lat + np.where(m > 1, net_lat, 0.0)
    return Parts(latency + 0.0 * wire, np.nan_to_num(wire, nan=np.inf))
