"""Disaggregated prefill and decode: one pool of instances computes prompts, another
generates, and each request's KV cache moves between them.

The flow is vLLM's disaggregated prefill with a KV connector (NixlConnector) behind its
proxy (``tests/v1/kv_connector/nixl_integration/toy_proxy_server.py`` in vllm-project/vllm),
which is also SGLang's PD disaggregation in outline (docs.sglang.io, advanced_features/
pd_disaggregation):

1. the proxy sends the request to a prefill instance (round-robin) with ``max_tokens = 1``
   and ``do_remote_decode``, and waits for the whole (non-streamed) answer: here the
   prefill pool is simulated (``serving.simulate``) on the requests with one output token;
2. the prompt's KV cache goes from the prefill instance to a decode instance over the link
   between the pools (NIXL reads it); priced as a point-to-point send
   (``cost.collectives.send_s``): every device of the prefill group sends its own shard,
   prompt tokens x KV bytes per token per device (``cost.memory.kv_bytes_per_token`` at
   the prefill plan's tp), at once, and every decode device receives its shard; the
   slower end sets the time. ``link`` (``serving.kv_links``, ``kv_links.yaml``): "nixl",
   "mooncake", "rdma" or "network" (the raw line rate): the pools sit on different nodes,
   each device's NIC (``interconnect.network_bytes_per_s``) at the link's share of it;
   "nvlink": one node, the devices' own link (``interconnect.link_bytes_per_s``: NVLink,
   or PCIe on a card without it). With ``contention``, transfers leaving one prefill
   instance queue on its NICs (``kv_links.queued``);
3. the decode instance gets the request when its KV has arrived (prefill finish +
   transfer) and generates every output token. vLLM's scheduler, once the KV is in,
   recomputes the prompt's last token to get its logits (``Scheduler.
   _update_waiting_for_remote_kv``: ``num_computed_tokens -= 1`` when every token
   arrived), so the decode requests carry ``Requests.prefilled = input - 1``: their first
   step on the decode instance is a one-token row, no prompt compute.

TTFT is arrival to the first token the user sees: the proxy streams the decode instance's
answer and drops the prefill instance's token, so it comes from the decode side, after
the transfer (SGLang passes the prefill's token along with the KV and the decode server
streams it without that one-token step: there TTFT is one decode step shorter). TPOT and
ITL are the decode pool's.

Host time: each pool is an engine with its own settings' host time (``serving.host_time``;
``EngineConfig.host``), added as ``simulate`` adds it: the prefill instance's API server
before it sees the request and the stream of its one token to the proxy before the
transfer starts, the decode instance's API server once the KV has arrived, its steps' host
time and its stream to the client.

Not modelled: transfers contending for one decode instance's NICs, the prefill instance
holding the blocks until they are read, the decode instance reserving blocks before the
transfer, and a hybrid model's recurrent state (only the KV cache moves).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np

from perfmodel.cost.collectives import send_s
from perfmodel.cost.memory import kv_bytes_of, kv_bytes_per_token
from perfmodel.serving.engines.vllm import EngineConfig
from perfmodel.serving.kv_links import KvLink, links, queued, round_robin
from perfmodel.serving.kv_links import link as link_of
from perfmodel.serving.requests import Requests
from perfmodel.serving.results import SimResult
from perfmodel.serving.simulate import simulate
from perfmodel.specs.errors import SpecError
from perfmodel.specs.hardware import Hardware
from perfmodel.specs.model import Model
from perfmodel.specs.workload import Parallelism, Workload, Workloads


@dataclass(frozen=True)
class Pool:
    """One side of a disaggregated deployment: ``plan.dp`` instances of ``plan`` (tp, ep)
    on ``hardware``, each an engine with ``engine``'s settings (None: the caller's)."""

    hardware: Hardware
    plan: Parallelism = field(default_factory=Parallelism)
    engine: EngineConfig | None = None

    @property
    def gpus(self) -> int:
        return self.plan.devices

    def describe(self) -> str:
        return f"{self.plan.dp} x {self.hardware.name} {replace(self.plan, dp=1).describe()}" \
            .rstrip()


def kv_transfer_s(model: Model, prefill: Pool, decode: Pool, tokens: np.ndarray,
                  workload: Workload, link: str = "network") -> np.ndarray:
    """Seconds to move the KV of ``tokens`` prompt tokens (per request) from a prefill
    instance to a decode instance: each side's devices send / receive their own shards at
    once, one point-to-point send each (``send_s``), the slower side sets the time."""
    kind = _check_link(prefill, decode, link)
    kvb = kv_bytes_of(model, Workloads.from_list([workload]))
    ends = [send_s(pool.hardware, np.asarray(tokens, float)
                   * float(kv_bytes_per_token(model, pool.plan.tp, kvb)[0])
                   / kind.bandwidth_fraction, kind.inter_node)
            for pool in (prefill, decode)]
    return np.maximum(*ends) + kind.overhead_s


def transit_s(prefill: Pool, decode: Pool, link: str) -> float:
    """The part of a transfer over ``link`` that is transit, not wire time: the slower
    end's one-hop latency and the link's software time (``kv_links.queued``)."""
    kind = link_of(link)
    nets = [p.hardware.interconnect for p in (prefill, decode)]
    hop = max(n.network_latency_s if kind.inter_node else n.latency_s for n in nets)
    return hop + kind.overhead_s


def describe_link(prefill: Pool, decode: Pool, link: str) -> str:
    """'nixl (pools on different nodes): each device's NIC, 92.5% of 50 GB/s per
    direction' and the like: what the transfer is priced over."""
    kind = link_of(link)
    share = "" if kind.bandwidth_fraction == 1 else f"{kind.bandwidth_fraction:.1%} of "
    if kind.inter_node:
        rate = min(p.hardware.interconnect.network_bytes_per_s for p in (prefill, decode))
        return f"{link} (pools on different nodes): each device's NIC, {share}" \
               f"{rate / 1e9:g} GB/s per direction"
    net = prefill.hardware.interconnect
    return f"{link} (pools in one node): the devices' own link ({net.topology}), {share}" \
           f"{net.link_bytes_per_s / 1e9:g} GB/s per device per direction"


def _check_link(prefill: Pool, decode: Pool, link: str) -> KvLink:
    kind = link_of(link)
    if kind.inter_node:
        for pool in (prefill, decode):
            if not pool.hardware.interconnect.network_bytes_per_s:
                raise SpecError(
                    f"disaggregated: link {link!r} needs interconnect.network_bytes_per_s in "
                    f"{pool.hardware.name}'s hardware file (none given); use link 'nvlink' "
                    "when both pools sit in one node")
        return kind
    if prefill.hardware.name != decode.hardware.name:
        raise SpecError(f"disaggregated: link {link!r} joins devices of one node, got "
                        f"{prefill.hardware.name} and {decode.hardware.name}")
    room = prefill.hardware.interconnect.max_devices
    if prefill.gpus + decode.gpus > room:
        nic = next(k for k, v in links().items() if v.inter_node)
        raise SpecError(f"disaggregated: link {link!r} puts both pools in one node, but "
                        f"{prefill.gpus} + {decode.gpus} GPUs exceed its {room}; use "
                        f"link {nic!r}")
    return kind


def _check_requests(requests: Requests) -> None:
    if requests.closed_loop or getattr(requests, "client_cap", 0):
        raise SpecError("disaggregated: closed-loop users and client concurrency caps are "
                        "not simulated across two pools; give an open-loop stream (--rate "
                        "or a trace)")


def simulate_disaggregated(model: Model, requests: Requests, prefill: Pool, decode: Pool,
                           link: str = "network", engine: EngineConfig | None = None,
                           workload: Workload | None = None,
                           progress: Callable[[int, int, float], None] | None = None,
                           label: str = "", contention: bool = False) -> SimResult:
    """Serve ``requests`` on ``prefill`` and ``decode`` pools (see the module docstring):
    one ``SimResult`` per request, TTFT to the decode side's first token, the decode
    pool's step log; ``info`` holds both pools' own results, the link and every
    request's transfer time (and with ``contention``, its time queued for the prefill
    instance's NICs). ``engine``: the settings of a pool that has none."""
    _check_requests(requests)
    _check_link(prefill, decode, link)
    workload = workload or Workload.for_model(model)
    n = len(requests)

    def part(offset: int) -> Callable[[int, int, float], None] | None:
        return None if progress is None else \
            lambda done, _, clock: progress(offset + done, 2 * n, clock)

    first = replace(requests, output_tokens=np.ones(n, np.int64), prefilled=None)
    pre = simulate(model, prefill.hardware, first, prefill.plan, prefill.engine or engine,
                   workload, part(0), f"{label} prefill".strip())
    moved = kv_transfer_s(model, prefill, decode, requests.input_tokens, workload, link)
    ready, wait = pre.finish_s + moved, np.zeros(n)
    if contention:
        hop = transit_s(prefill, decode, link)
        ready, wait = queued(pre.finish_s, moved - hop, hop,
                             round_robin(requests.arrival_s, prefill.plan.dp))
    order = np.argsort(ready, kind="stable")
    handed = Requests(ready[order], requests.input_tokens[order],
                      requests.output_tokens[order], requests.prefix_id[order],
                      requests.prefix_tokens[order], prefilled=requests.input_tokens[order] - 1)
    dec = simulate(model, decode.hardware, handed, decode.plan, decode.engine or engine,
                   workload, part(n), f"{label} decode".strip())
    info = {"mode": "disaggregated", "link": describe_link(prefill, decode, link),
            "prefill_pool": prefill.describe(), "decode_pool": decode.describe(),
            "gpus": prefill.gpus + decode.gpus, "transfer_s": moved, "kv_ready_s": ready,
            "kv_queued_s": wait, "contention": contention,
            "prefill": pre, "decode": dec,
            "ttft": "arrival to the decode instance's first token, after the KV transfer"}
    return _merge(requests, pre, dec, order, label, info)


def _merge(requests: Requests, pre: SimResult, dec: SimResult, order: np.ndarray,
           label: str, info: dict) -> SimResult:
    """One result in ``requests`` order: arrival and first scheduling from the prefill
    pool, tokens from the decode pool (``order``: its requests, by KV arrival)."""
    back = np.empty_like(order)
    back[order] = np.arange(len(order))
    out = requests.output_tokens
    offsets = np.concatenate([[0], np.cumsum(out)])
    starts = dec.token_offsets[:-1][back]
    index = np.repeat(starts - offsets[:-1], out) + np.arange(int(offsets[-1]))
    return SimResult(requests, pre.arrival_s, pre.scheduled_s, dec.first_token_s[back],
                     dec.finish_s[back], pre.preemptions + dec.preemptions[back],
                     pre.prefix_hit_tokens, offsets, dec.token_s[index], dec.steps,
                     dec.kv_blocks_total, label, info)


def compare_aggregated(model: Model, requests: Requests, prefill: Pool, decode: Pool,
                       link: str = "network", engine: EngineConfig | None = None,
                       workload: Workload | None = None, plan: Parallelism | None = None,
                       slo_ttft_s: float | None = None, slo_tpot_s: float | None = None
                       ) -> dict:
    """The same traffic on the same GPUs, aggregated and disaggregated: every GPU of both
    pools in replicas of ``plan`` (default: the decode pool's, one replica), dp = total
    GPUs // GPUs per replica, each engine (``engine``, else the decode pool's) running
    prefill and decode, against xP + yD. Returns the GPU count, both deployments in words
    and both ``SimResult.summary`` dicts (with goodput when SLOs are given)."""
    if prefill.hardware.name != decode.hardware.name:
        raise SpecError(f"compare_aggregated: the pools run on {prefill.hardware.name} and "
                        f"{decode.hardware.name}; an aggregated deployment has one device")
    gpus = prefill.gpus + decode.gpus
    replica = replace(plan or decode.plan, dp=1)
    if replica.devices > gpus:
        raise SpecError(f"compare_aggregated: one replica ({replica.describe()}) needs "
                        f"{replica.devices} GPUs, the pools have {gpus}")
    together = replace(replica, dp=gpus // replica.devices)
    agg = simulate(model, decode.hardware, requests, together, engine or decode.engine,
                   workload, label="aggregated")
    dis = simulate_disaggregated(model, requests, prefill, decode, link, engine, workload,
                                 label="disaggregated")
    return {"gpus": gpus, "unused_gpus": gpus - together.devices,
            "aggregated_plan": f"{decode.hardware.name} {together.describe()}",
            "disaggregated_plan": f"{prefill.describe()} prefill + {decode.describe()} decode",
            "link": dis.info["link"],
            "aggregated": agg.summary(slo_ttft_s, slo_tpot_s),
            "disaggregated": dis.summary(slo_ttft_s, slo_tpot_s)}
