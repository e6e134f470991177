"""DeepEP dispatch and combine (``cost.ep``): bytes by hand from DeepEP's kernels, the time
formula by hand, its physical properties, the hardware reader's checks, the importer's
rows, and the step pricing its dispatch with the same function."""

from __future__ import annotations

from dataclasses import replace
from math import comb

import numpy as np
import pandas as pd
import pytest

import perfmodel as pm
from perfmodel.compare.errors import predict_rows
from perfmodel.cost import ep
from perfmodel.kernels import aiconfigurator as aic
from perfmodel.specs.errors import SpecError

H200, DSV3 = pm.hardware("h200-sxm"), pm.model("deepseek-v3")
FP8 = 1 + 4 / 128
TABLE = {"normal_dispatch": (25e-6, 0.6, 1.0, 15e9, 0.0, 0.0),
         "normal_combine": (45e-6, 0.5, 1.0, 12e9, 0.0, 0.0),
         "ll_dispatch": (12e-6, 0.5, 0.9, 0.0, 20e-6, 0.0),
         "ll_combine": (12e-6, 0.45, 0.9, 0.0, 20e-6, 0.0)}


def _hw(table: dict = TABLE, hw: pm.Hardware = H200) -> pm.Hardware:
    return replace(hw, efficiency=replace(hw.efficiency, ep_kernels=table))


def _row(op: str, mode: str, m: int, **kw) -> dict:
    return {"op": op, "mode": mode, "m": str(m), "n": "7168", "topk": "8",
            "experts": "256", "n_devices": "8", "dtype": "fp8" if op == "ep_dispatch"
            else "bf16", "measured_s": "1e-4"} | {k: str(v) for k, v in kw.items()}


def test_message_bytes_follow_deepep():
    """A low-latency message is sizeof(int4) + hidden fp8 + hidden/128 float scales
    (internode_ll.cu ``num_bytes_per_msg``): 16 + 7168 + 224 = 7408 B; bf16 16 + 14336. A
    normal dispatch token adds its 8 top-k (int index + float weight) and SourceMeta
    (internode.cu ``get_num_bytes_per_token``): 7392 + 64 + 8."""
    assert ep.token_bytes(2, 7168, ep.PAYLOAD["fp8"], 8) == pytest.approx(7408)
    assert ep.token_bytes(3, 7168, ep.PAYLOAD["bf16"], 8) == pytest.approx(16 + 14336)
    assert ep.token_bytes(0, 7168, ep.PAYLOAD["fp8"], 8) == pytest.approx(7392 + 72)
    assert ep.token_bytes(1, 7168, ep.PAYLOAD["bf16"], 8) == pytest.approx(14336)


def test_normal_mode_copies_once_per_rank_reached():
    """8 ranks of 32 experts, top 8 of 256, uniform: a rank is missed with probability
    C(224, 8) / C(256, 8), so a token is copied to 8 (1 - that) ranks (its own included),
    7 (1 - that) of them over NVLink; low-latency sends all 8 pairs, 7/8 over NVLink."""
    hit = 1 - comb(224, 8) / comb(256, 8)
    devices, nodes = ep.reach(256, 8, 8, 8)
    assert devices == pytest.approx(7 * hit, rel=1e-12) and nodes == 0
    normal = ep.traffic(0, 100, 1000.0, 8, 8, 1, devices, nodes)
    assert normal.sent == pytest.approx(100 * 8 * hit * 1000)
    assert normal.link == pytest.approx(100 * 7 * hit * 1000) and normal.network == 0
    ll = ep.traffic(2, 100, 1000.0, 8, 8, 1, devices, nodes)
    assert ll.sent == pytest.approx(800 * 1000) and ll.link == pytest.approx(700 * 1000)


def test_time_by_hand():
    """4096 tokens, normal dispatch at 4 SMs of 15 GB/s: the SM copy rate binds
    (60 GB/s < 0.6 x 450 GB/s), time = 25 us + sent / 60 GB/s; at 24 SMs (360 GB/s) the
    NVLink share binds: 25 us + link / 270 GB/s."""
    hw = _hw()
    devices, nodes = ep.reach(256, 8, 8, 8)
    b = ep.token_bytes(0, 7168, FP8, 8)
    moved = ep.traffic(0, 4096, b, 8, 8, 1, devices, nodes)
    slow = ep.ep_parts(hw, 0, moved, 1, 4).total
    fast = ep.ep_parts(hw, 0, moved, 1, 24).total
    assert slow == pytest.approx(25e-6 + moved.sent / 60e9, rel=1e-12)
    assert fast == pytest.approx(25e-6 + moved.link / (0.6 * 450e9), rel=1e-12)


def test_each_token_copy_costs_its_sms_a_fixed_time():
    """copy_s 0.5 us: 4096 tokens copied 8 (1 - C(224,8)/C(256,8)) times each, at 4 SMs,
    add copies x 0.5 us / 4 to the SM-bound time."""
    slow = dict(TABLE, normal_dispatch=(25e-6, 0.6, 1.0, 15e9, 0.0, 0.5e-6))
    devices, nodes = ep.reach(256, 8, 8, 8)
    b = ep.token_bytes(0, 7168, FP8, 8)
    moved = ep.traffic(0, 4096, b, 8, 8, 1, devices, nodes)
    assert moved.copies == pytest.approx(4096 * 8 * (1 - comb(224, 8) / comb(256, 8)))
    t = ep.ep_parts(_hw(slow), 0, moved, 1, 4).total
    assert t == pytest.approx(25e-6 + moved.sent / 60e9 + moved.copies * 0.5e-6 / 4,
                              rel=1e-12)


def test_low_latency_runs_one_warp_group_per_expert():
    """internode_ll.cu: ceil(E / ceil(E / SMs)) SMs; H200's 132 SMs hold 256 experts in
    2 groups (128 SMs), 8 experts on 8 SMs; a dispatch of 3 tokens keeps 3 busy."""
    assert ep.sm_budget(2, 0, 256, 4096, 132) == 128
    assert ep.sm_budget(3, 0, 8, 4096, 132) == 8
    assert ep.sm_budget(2, 0, 256, 3, 132) == 3
    assert ep.sm_budget(0, 24, 256, 5, 132) == 10     # normal: two SMs a channel


def test_across_nodes_pays_the_nic_and_its_latency():
    """16 ranks on 2 nodes, low-latency: half the pairs cross the NIC at 0.9 x 50 GB/s,
    and the extra fixed cost of the RDMA path is added only across nodes."""
    hw = _hw()
    moved = ep.traffic(2, 128, 7408.0, 8, 16, 2, 0.0, 0.0)
    assert moved.network == pytest.approx(128 * 8 * 7408 / 2)
    t = ep.ep_parts(hw, 2, moved, 2).total
    assert t == pytest.approx(12e-6 + 20e-6 + moved.network / (0.9 * 50e9), rel=1e-12)
    one = ep.ep_parts(hw, 2, ep.traffic(2, 128, 7408.0, 8, 8, 1, 0.0, 0.0), 1)
    assert one.latency_s == pytest.approx(12e-6)


def test_more_sms_or_fewer_tokens_never_slower():
    hw = _hw()
    rows = [_row("ep_dispatch", "normal", t, sms=s) for t in (16, 256, 4096, 65536)
            for s in (4, 8, 16, 24)]
    t = np.array([r["predicted_s"] for r in predict_rows(rows, hw, "auto", "t")]).reshape(4, 4)
    assert np.all(np.diff(t, axis=1) <= 0) and np.all(np.diff(t, axis=0) >= 0)


def test_uncalibrated_kernel_prices_at_the_collective_figures():
    hw = _hw({})
    p = ep.constants(hw)
    assert np.allclose(p[:, 0], H200.interconnect.collective_latency_s)
    assert np.allclose(p[:, 1], H200.efficiency.collective_fraction)


def test_hardware_reader_checks_ep_kernels():
    from perfmodel.specs.efficiency_block import _ep_kernels
    from perfmodel.specs.fields import Fields

    good = _ep_kernels(Fields({"ll_dispatch": {"latency_s": "12 us", "link_fraction": 0.5}},
                              "h.yaml", "efficiency.ep_kernels"))
    assert good["ll_dispatch"] == pytest.approx((12e-6, 0.5, 1.0, 0.0, 0.0, 0.0))
    with pytest.raises(SpecError, match="expected a DeepEP kernel"):
        _ep_kernels(Fields({"ll_dispatc": {"latency_s": "1 us", "link_fraction": 0.5}},
                           "h.yaml", "efficiency.ep_kernels"))
    with pytest.raises(SpecError, match="link_fraction"):
        _ep_kernels(Fields({"ll_combine": {"latency_s": "1 us", "link_fraction": 1.5}},
                           "h.yaml", "efficiency.ep_kernels"))


def test_bad_mode_is_one_clear_line():
    with pytest.raises(SpecError, match="column mode: expected normal or ll"):
        predict_rows([_row("ep_dispatch", "fast", 16)], H200, "auto", "rows.csv")


def test_importer_splits_phases_and_counts_v2():
    """sglang's wide normal table: one row per phase, transmit + notify in us as ms; a
    moe_a2a row of DeepEP V2 has no known backend (counted, not priced)."""
    wide = pd.DataFrame({"op_name": ["normal"], "node_num": [2], "hidden_size": [7168],
                         "num_token": [64], "num_topk": [8], "num_experts": [256],
                         "dispatch_sms": [20], "dispatch_transmit_us": [100.0],
                         "dispatch_notify_us": [10.0], "combine_sms": [20],
                         "combine_transmit_us": [200.0], "combine_notify_us": [0.0]})
    long = aic.ep_long(wide, "wideep_deepep_normal_perf", "h200_sxm")
    cols, known = aic.deepep(long)
    assert list(cols["op"]) == ["ep_dispatch", "ep_combine"] and known.all()
    assert list(long["latency"]) == pytest.approx([0.11, 0.2])
    assert list(cols["n_devices"]) == [16, 16] and list(cols["topk_groups"]) == [2, 2]
    assert cols["dtype"] == ["fp8", "bf16"]
    a2a = pd.DataFrame({"comm_backend": ["deepep_ll", "deepep_v2_generation"],
                        "phase": ["dispatch", "dispatch"], "comm_dtype": ["default"] * 2,
                        "ep_size": [8, 8], "node_num": [1, 1], "hidden_size": [7168] * 2,
                        "topk": [8, 8], "num_experts": [256] * 2, "num_tokens": [16, 16],
                        "sms": [0, 0], "latency": [50.0, 40.0]})
    cols, known = aic.deepep(aic.ep_long(a2a, "moe_a2a_perf", "h200_sxm"))
    assert list(known) == [True, False]


def test_step_prices_dispatch_with_the_same_formula():
    """The DP-attention decode step's dispatch is DeepEP's low-latency kernel: raising that
    kernel's fixed cost by 10 us raises the step's moe_dispatch by 10 us a layer, and
    leaves the combine as it was; a prefill step runs the normal kernels."""
    from perfmodel.cost.step import Dtypes, Step, price_step

    dpa = pm.Parallelism(ep=8, attention_dp=True)
    slower = dict(TABLE, ll_dispatch=(22e-6, *TABLE["ll_dispatch"][1:]))
    a = price_step(DSV3, _hw(), dpa, Step.uniform(16, 1, 1024), Dtypes.of("fp8"))
    b = price_step(DSV3, _hw(slower), dpa, Step.uniform(16, 1, 1024), Dtypes.of("fp8"))
    i, j = a.names.index("moe_dispatch"), a.names.index("moe_combine")
    layers = DSV3.n_moe_layers
    assert b.time_s[i, 0] - a.time_s[i, 0] == pytest.approx(10e-6 * layers, rel=1e-9)
    assert b.time_s[j, 0] == pytest.approx(a.time_s[j, 0], rel=1e-12)
    normal = dict(TABLE, normal_dispatch=(125e-6, *TABLE["normal_dispatch"][1:]))
    p = price_step(DSV3, _hw(), dpa, Step.uniform(1, 512, 512), Dtypes.of("fp8"))
    q = price_step(DSV3, _hw(normal), dpa, Step.uniform(1, 512, 512), Dtypes.of("fp8"))
    assert q.time_s[i, 0] - p.time_s[i, 0] == pytest.approx(100e-6 * layers, rel=1e-9)


def test_shipped_constants_are_fitted_and_bounded():
    """Every engine of the DeepEP devices carries its four kernels, each inside its
    physical range (validate.corpus.ep.BOUNDS)."""
    from validate.corpus.ep import BOUNDS

    for name in ("h100-sxm", "h200-sxm", "b200", "b300", "gb200", "gb300"):
        for engine in ("vllm", "sglang", "trtllm"):
            table = pm.hardware(name, engine).efficiency.ep_kernels
            assert set(table) == set(ep.KERNELS), (name, engine)
            for row in table.values():
                v = dict(zip(ep.FIELDS, row, strict=True))
                assert 0.5e-6 <= v["latency_s"] <= 1e-3
                assert BOUNDS["link_fraction"][1] <= v["link_fraction"] <= 1.0
                assert v["sm_bytes_per_s"] == 0 or 1e9 <= v["sm_bytes_per_s"] <= 100e9


def test_writer_keeps_every_line_and_reads_back(tmp_path):
    """validate.corpus.ep writes ep_kernels as text: the shipped file's other lines and
    comments all stay, and the loader reads back what was written."""
    from validate.corpus.ep import hardware_text
    from validate.corpus.write import shipped_path

    text = shipped_path("h200-sxm").read_text()
    table = {"ll_dispatch": (11e-6, 0.5, 1.0, 9e9, 0.0, 0.3e-6)}
    out = hardware_text(text, {"vllm": (table, "a note"), "trtllm": (table, "b note")})
    kept = [x for x in text.splitlines() if "ep_kernels" not in x]
    assert [x for x in out.splitlines() if "ep_kernels" not in x] == kept
    path = tmp_path / "h200-sxm.yaml"
    path.write_text(out)
    for engine in ("vllm", "trtllm"):
        got = pm.hardware(path, engine).efficiency.ep_kernels["ll_dispatch"]
        assert got == pytest.approx(table["ll_dispatch"], rel=1e-3)
