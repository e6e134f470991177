"""cost.collectives: hand-derived ring and tree times, properties, and the stated error
against public nccl-tests and DeepEP figures (tests/data/collectives.csv,
perfmodel/hardware/README.md "Collectives")."""

from __future__ import annotations

import csv
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import perfmodel as pm
from perfmodel.cost.collectives import (
    all_gather_s,
    all_reduce_s,
    all_to_all_s,
    reduce_scatter_s,
    ring_all_reduce,
    send_s,
    tree_all_reduce,
)
from perfmodel.cost.ops import AllReduce, AllToAll
from perfmodel.cost.roofline import op_time
from tests.datasheet import datasheet

H100 = datasheet("h100-sxm")
DATA = Path(__file__).parent / "data" / "collectives.csv"
US = 1e-6
# h100-sxm: link 450 GB/s x 0.82 = 369 GB/s; hop 0.6 us; network 50 GB/s, hop 2.7 us;
# base 6.6 us
LINK = 450e9 * 0.82
S = 64e6


def test_ring_one_node_golden():
    # 8 devices: 2 x 7 = 14 NVLink hops; 2 x 7/8 x S over the link
    ring = ring_all_reduce(H100, 8, S)
    assert ring.latency_s == pytest.approx(6.6 * US + 14 * 0.6 * US)
    assert ring.wire_s == pytest.approx(1.75 * S / LINK)
    assert all_reduce_s(H100, 8, S) == pytest.approx(ring.total)


def test_tree_one_node_golden_and_ring_wins():
    # 2 x (7 x 0.6) us, S / (0.5 x 369 GB/s): same latency as the ring, slower wire
    tree = tree_all_reduce(H100, 8, S)
    assert tree.latency_s == pytest.approx(6.6 * US + 2 * 7 * 0.6 * US)
    assert tree.wire_s == pytest.approx(S / (0.5 * LINK))
    assert all_reduce_s(H100, 8, 8.0) == pytest.approx(ring_all_reduce(H100, 8, 8.0).total)


def test_two_nodes_golden():
    # 16 devices, 2 nodes: ring 30 steps, 2 of them between nodes; bus min(369, 8 x 50)
    ring = ring_all_reduce(H100, 16, S, nodes=2)
    assert ring.latency_s == pytest.approx((6.6 + 28 * 0.6 + 2 * 2.7) * US)
    assert ring.wire_s == pytest.approx(2 * 15 / 16 * S / LINK)
    # tree: 2 x (7 intra + log2(2) = 1 inter) hops; NICs 2 x 8 x 50 = 800 > 369
    tree = tree_all_reduce(H100, 16, S, nodes=2)
    assert tree.latency_s == pytest.approx((6.6 + 2 * (7 * 0.6 + 2.7)) * US)
    assert tree.wire_s == pytest.approx(S / (0.5 * LINK))
    # 4 nodes: the NICs (8 x 50 = 400) count once for the tree, 2 inter hops
    tree4 = tree_all_reduce(H100, 32, S, nodes=4)
    assert tree4.latency_s == pytest.approx((6.6 + 2 * (7 * 0.6 + 2 * 2.7)) * US)
    assert tree4.wire_s == pytest.approx(S / (0.5 * LINK))


def test_slow_network_binds_the_ring():
    slow = replace(H100, interconnect=replace(H100.interconnect, network_bytes_per_s=12.5e9))
    ring = ring_all_reduce(slow, 24, S, nodes=3)              # 8 x 12.5 = 100 GB/s per node
    assert ring.wire_s == pytest.approx(2 * 23 / 24 * S / 100e9)
    assert ring.latency_s == pytest.approx((6.6 + 42 * 0.6 + 4 * 2.7) * US)


def test_gather_scatter_and_single_device():
    assert all_gather_s(H100, 8, S) == pytest.approx((6.6 + 7 * 0.6) * US + 7 / 8 * S / LINK)
    assert reduce_scatter_s(H100, 8, S) == all_gather_s(H100, 8, S)
    for f in (all_reduce_s, all_gather_s, all_to_all_s):
        assert f(H100, 1, S) == 0.0


def test_all_to_all_golden():
    # one node: 7/8 of the bytes over the link, one hop
    assert all_to_all_s(H100, 8, S) == pytest.approx((6.6 + 0.6) * US + 7 / 8 * S / LINK)
    # two nodes of 8: 7/16 over NVLink, 8/16 over the 50 GB/s NIC, at once
    assert all_to_all_s(H100, 16, S, nodes=2) == pytest.approx((6.6 + 2.7) * US
                                                               + 0.5 * S / 50e9)


def test_properties():
    sizes = np.logspace(0, 10, 41)
    for nodes in (1, 2, 4):
        t = all_reduce_s(H100, 8 * nodes, sizes, nodes)
        assert np.all(np.diff(t) > 0)
        a = all_to_all_s(H100, 8 * nodes, sizes, nodes)
        assert np.all(np.diff(a) > 0)
    # more nodes never faster at equal bytes per device
    for f in (all_reduce_s, all_gather_s, all_to_all_s):
        one, two, four = (f(H100, 8 * m, sizes, m) for m in (1, 2, 4))
        assert np.all(two >= one) and np.all(four >= two)
    # across nodes the tree wins small messages, the ring large ones
    for nodes in (2, 4, 8):
        n = 8 * nodes
        assert tree_all_reduce(H100, n, 1e3, nodes).total < ring_all_reduce(H100, n, 1e3,
                                                                            nodes).total
        assert ring_all_reduce(H100, n, 1e10, nodes).total < tree_all_reduce(H100, n, 1e10,
                                                                             nodes).total


def test_send_matches_the_pipeline_rule():
    link = H100.interconnect
    assert send_s(H100, 1e6) == pytest.approx(link.latency_s + 1e6 / link.link_bytes_per_s)
    assert send_s(H100, 1e6, inter=True) == pytest.approx(
        link.network_latency_s + 1e6 / link.network_bytes_per_s)


def test_records_priced_through_the_collectives():
    op = AllReduce(payload=np.array([8.0, S]), devices=8, count=2)
    t = op_time(op, H100)
    assert t.time_s == pytest.approx(2 * all_reduce_s(H100, 8, np.array([8.0, S])))
    a = AllToAll(payload=S, devices=16, nodes=2)
    assert op_time(a, H100).time_s == pytest.approx(all_to_all_s(H100, 16, S, 2))
    assert a.bytes.act_read == pytest.approx(15 / 16 * S)


def _device(row: dict) -> pm.Hardware:
    hw = pm.hardware(row["device"])
    link = hw.interconnect
    if row["link_bytes_per_s"]:
        link = replace(link, link_bytes_per_s=float(row["link_bytes_per_s"]))
    if row["network_bytes_per_s"]:
        link = replace(link, network_bytes_per_s=float(row["network_bytes_per_s"]))
    return replace(hw, interconnect=link)


def model_figure(row: dict) -> float:
    """The model's value of the row's metric, for the row's configuration."""
    hw, n, m = _device(row), int(row["devices"]), int(row["nodes"])
    nbytes = float(row["bytes"])
    if row["op"] == "all_reduce":
        t = float(all_reduce_s(hw, n, nbytes, m))
        return 2 * (n - 1) / n * nbytes / t / 1e9 if row["metric"] == "busbw_GBps" else t / US
    # all_to_all: ``bytes`` is what a device sends to the others (its own share excluded)
    t = float(all_to_all_s(hw, n, nbytes * n / (n - 1), m))
    if row["metric"] == "time_us":
        return t / US
    ppn = n // m                         # the bottleneck: NVLink on one node, else the NIC
    share = (ppn - 1) / (n - 1) if m == 1 else (n - ppn) / (n - 1)
    return share * nbytes / t / 1e9


def error_rows() -> list[tuple[dict, float, float]]:
    """(row, model figure, relative error (model - measured) / measured) for every row."""
    with DATA.open() as f:
        rows = list(csv.DictReader(f))
    out = []
    for row in rows:
        model = model_figure(row)
        out.append((row, model, model / float(row["value"]) - 1.0))
    return out


# The measured worst |error| of each group, rounded up (perfmodel/hardware/README.md explains each).
BOUNDS = {"nvlink": 0.17, "ib": 0.03, "tcpxo": 0.90, "tcpxo_large": 0.17,
          "deepep_normal": 0.17, "deepep_ll": 0.20, "deepep_ll_small": 1.65}


def test_stated_error_against_public_figures():
    worst: dict[str, float] = {}
    for row, _, err in error_rows():
        assert math.isfinite(err)
        worst[row["group"]] = max(worst.get(row["group"], 0.0), abs(err))
    assert set(worst) == set(BOUNDS)
    for group, bound in BOUNDS.items():
        assert worst[group] <= bound, (group, worst[group])
