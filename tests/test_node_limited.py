"""Group-limited (node-limited) routing: the nodes and devices one token's experts reach
under expert parallelism (``routing.token_reach``), golden values worked by hand for a group
that is part of a node, a whole node and several nodes, properties, a Monte Carlo check on
an uneven layout, the all-to-all's network share, the estimate's assumption line, and the
model fields from YAML and Hugging Face configs."""

import json
from dataclasses import replace
from math import comb
from pathlib import Path

import numpy as np
import pytest

import perfmodel as pm
from perfmodel.cost.instantiate import remote_share
from perfmodel.cost.roofline import op_time
from perfmodel.cost.routing import token_reach
from perfmodel.cost.step import Dtypes, Step, step_records
from perfmodel.specs.errors import SpecError
from perfmodel.specs.hf import model_from_hf_config
from perfmodel.specs.load import MODELS_DIR

HF = Path(__file__).parent / "data" / "hf"
DSV3, H200 = pm.model("deepseek-v3"), pm.hardware("h200-sxm")


def _missed(pool: int, held: int, k: int = 8) -> float:
    """C(pool - held, k) / C(pool, k): k distinct picks of ``pool`` all avoid ``held``."""
    return comb(pool - held, k) / comb(pool, k)


def test_deepseek_v3_ep16_on_two_nodes_by_hand():
    """256 experts, 8 groups of 32, top 8 from at most 4 groups; EP16 on 2 nodes of 8:
    16 experts per device, 128 per node, so each node holds 4 whole groups (a group is 2
    devices). The sender's node is one of the 2; the other is what crosses the network.

    No limit: the other node's 128 experts are all missed with C(128, 8) / C(256, 8)
    = 0.0034899, so 0.9965101 remote nodes per token.
    Limit: the 4 picked groups put i on the other node with probability C(4, i) C(4, 4 - i)
    / C(8, 4) = (1, 16, 36, 16, 1) / 70; then the 8 experts come from the 128 of the picked
    groups and miss the other node's 32 i with C(128 - 32 i, 8) / C(128, 8) = 1, 0.0927473,
    0.0030959, 7.357e-6, 0; so 1 - (1 + 16 x 0.0927473 + 36 x 0.0030959 + 16 x 7.357e-6)
    / 70 = 0.9629211 remote nodes.
    Devices (15 others): a device's 16 experts are one group's half; no limit: 15 (1 -
    C(240, 8) / C(256, 8)) = 6.11557; limit: its group is picked with probability 1/2,
    then 15 x 1/2 x (1 - C(112, 8) / C(128, 8)) = 5.00565."""
    free = token_reach(256, 8, 16, 8)
    assert free.nodes == pytest.approx(1 - _missed(256, 128), rel=1e-12)
    assert free.nodes == pytest.approx(0.9965101, abs=1e-7)
    split = [comb(4, i) * comb(4, 4 - i) / comb(8, 4) for i in range(5)]
    assert [round(s * 70) for s in split] == [1, 16, 36, 16, 1]
    limited = token_reach(256, 8, 16, 8, 8, 4)
    by_hand = 1 - sum(s * _missed(128, 32 * i) for i, s in enumerate(split))
    assert limited.nodes == pytest.approx(by_hand, rel=1e-12)
    assert limited.nodes == pytest.approx(0.9629211, abs=1e-7)
    assert free.devices == pytest.approx(15 * (1 - _missed(256, 16)), rel=1e-12)
    assert limited.devices == pytest.approx(15 * 0.5 * (1 - _missed(128, 16)), rel=1e-12)
    assert limited.devices == pytest.approx(5.00565, abs=1e-5)


def test_a_group_per_node_caps_the_nodes_at_topk_groups():
    """EP64 on 8 nodes of 8 (DeepSeek-V3's training layout): 32 experts per node, each node
    one group, so a token reaches at most 4 nodes. A node is reached when its group is
    picked (4/8) and one of the 8 picks lands in its 32 of the 128: 7 other nodes x 1/2 x
    (1 - C(96, 8) / C(128, 8)) = 3.17538, against 7 (1 - C(224, 8) / C(256, 8)) = 4.63282
    with no limit (above 4 nodes; the limit takes off 31%)."""
    limited = token_reach(256, 8, 64, 8, 8, 4)
    assert limited.nodes == pytest.approx(7 * 0.5 * (1 - _missed(128, 32)), rel=1e-12)
    assert limited.nodes == pytest.approx(3.17538, abs=1e-5)
    assert token_reach(256, 8, 64, 8).nodes == pytest.approx(7 * (1 - _missed(256, 32)))
    assert limited.nodes <= 4


def test_a_group_over_several_nodes():
    """EP256 on 32 nodes of 8: one expert per device, a group's 32 on 4 nodes, each node 8
    experts of one group: 31 x 1/2 x (1 - C(120, 8) / C(128, 8)) = 6.39037 other nodes
    (no limit: 31 (1 - C(248, 8) / C(256, 8)) = 7.03971). Each pick is its own device: 8
    distinct devices, the sender's own 1/256 of the time: 8 x 255/256 others."""
    limited = token_reach(256, 8, 256, 8, 8, 4)
    assert limited.nodes == pytest.approx(31 * 0.5 * (1 - _missed(128, 8)), rel=1e-12)
    assert token_reach(256, 8, 256, 8).nodes == pytest.approx(31 * (1 - _missed(256, 8)))
    assert limited.devices == pytest.approx(8 * 255 / 256, rel=1e-12)


def _configs(n: int, seed: int = 7):
    rng = np.random.default_rng(seed)
    for _ in range(n):
        groups = int(rng.choice([1, 2, 3, 4, 6, 8, 12, 16]))
        size = int(rng.integers(1, 17))
        picked = int(rng.integers(1, groups + 1))
        top_k = int(rng.integers(1, picked * size + 1))
        yield (groups * size, top_k, int(rng.integers(1, groups * size + 1)),
               int(rng.integers(1, 9)), groups, picked)


def test_the_limit_never_adds_traffic_and_all_groups_is_none():
    """Over random layouts (ep not dividing the experts, nodes part-filled, groups a part
    of a device or spanning nodes): limiting the groups never raises the remote nodes or
    the other devices; picking every group is no limit (equal to one group); the nodes
    never exceed the other nodes, top_k, or, where each node holds whole groups, the
    nodes of topk_groups groups."""
    for experts, top_k, ep, per_node, groups, picked in _configs(400):
        free = token_reach(experts, top_k, ep, per_node)
        limited = token_reach(experts, top_k, ep, per_node, groups, picked)
        assert limited.nodes <= free.nodes + 1e-12
        assert limited.devices <= free.devices + 1e-12
        every = token_reach(experts, top_k, ep, per_node, groups, groups)
        assert every.nodes == pytest.approx(free.nodes, rel=1e-12, abs=1e-15)
        assert every.devices == pytest.approx(free.devices, rel=1e-12, abs=1e-15)
        nodes = -(-ep // per_node)
        assert 0 <= limited.nodes <= min(nodes - 1, top_k) + 1e-12
        assert 0 <= limited.devices <= min(ep - 1, top_k) + 1e-12
        node_experts = per_node * -(-experts // ep)
        if ep % per_node == 0 and experts % ep == 0 and node_experts % (experts // groups) == 0:
            assert limited.nodes <= picked + 1e-12


@pytest.mark.parametrize("experts, top_k, ep, per_node, groups, picked", [
    (24, 3, 6, 4, 6, 2),       # a group per device, 4 devices then 2 on the second node
    (24, 3, 6, 4, 4, 2),       # groups of 6 across devices of 4
    (30, 4, 5, 2, 3, 1),       # one group of 10 over 2.5 devices, 3 nodes
])
def test_monte_carlo_agrees(experts, top_k, ep, per_node, groups, picked):
    """Tokens drawn as the model states it (a uniform sender among the ep devices, a
    uniform set of groups, then top_k distinct experts uniform among theirs), counted:
    the exact expectation lies within 5 standard errors of the sample mean."""
    rng = np.random.default_rng(3)
    t, size = 200_000, experts // groups
    chosen = np.argsort(rng.random((t, groups)), axis=1)[:, :picked]
    allowed = np.zeros((t, groups), dtype=bool)
    np.put_along_axis(allowed, chosen, True, axis=1)
    keys = np.where(np.repeat(allowed, size, axis=1), rng.random((t, experts)), np.inf)
    picks = np.argsort(keys, axis=1)[:, :top_k]
    device = picks // -(-experts // ep)
    sender = rng.integers(0, ep, t)
    node, home = device // per_node, sender // per_node
    n_nodes = -(-ep // per_node)
    hit = np.zeros((t, n_nodes), dtype=bool)
    np.put_along_axis(hit, node, True, axis=1)
    remote = hit.sum(axis=1) - hit[np.arange(t), home]
    on = np.zeros((t, ep), dtype=bool)
    np.put_along_axis(on, device, True, axis=1)
    others = on.sum(axis=1) - on[np.arange(t), sender]
    exact = token_reach(experts, top_k, ep, per_node, groups, picked)
    for sample, want in ((remote, exact.nodes), (others, exact.devices)):
        assert abs(sample.mean() - want) < 5 * sample.std() / np.sqrt(t) + 1e-9


def test_the_dispatch_sends_fewer_bytes_over_the_network_with_the_limit():
    """DeepSeek-V3 EP16 + DP attention on 2 x 8 H200, a prefill step (DeepEP's normal mode,
    which sends a token once per remote node, ``cost.ep``): the dispatch's network bytes are
    0.9629211 remote nodes a token (0.9965101 with the limit lifted), 12.04% of the pair
    bytes, and its time is no longer; on one node (EP8) the limit lowers the devices a token
    reaches, so its copies. A decode step runs the low-latency kernels, one message per
    pair: half the pairs cross and the time stays, limit or not."""
    plan = pm.Parallelism(ep=16, attention_dp=True)
    free = replace(DSV3, moe=replace(DSV3.moe, topk_groups=8))
    step, dtypes = Step.uniform(4, 256, 256), Dtypes.of("fp8")

    def dispatch(model, p=plan, step=step):
        return next(r for r in step_records(model, H200, p, step, dtypes)
                    if r.name == "moe_dispatch")

    limited, lifted = dispatch(DSV3), dispatch(free)
    ratio = float(np.ravel(limited.network_bytes)[0] / np.ravel(lifted.network_bytes)[0])
    assert ratio == pytest.approx(0.9629211 / 0.9965101, rel=1e-6)
    assert remote_share(DSV3.moe, 16, 8) == pytest.approx(0.9629211 / 8, rel=1e-6)
    decode = Step.uniform(64, 1, 2048)
    a, b = dispatch(DSV3, step=decode), dispatch(free, step=decode)
    assert np.ravel(a.network_bytes)[0] == pytest.approx(np.ravel(a.payload)[0] / 2)
    assert np.ravel(a.network_bytes)[0] == pytest.approx(np.ravel(b.network_bytes)[0])
    assert np.all(op_time(limited, H200).time_s <= op_time(lifted, H200).time_s)
    one = pm.Parallelism(ep=8, attention_dp=True)
    # one node: normal mode copies a token per device reached, which the limit (4 groups,
    # one device each) lowers; low-latency sends every pair either way
    assert op_time(dispatch(DSV3, one), H200).time_s < op_time(dispatch(free, one),
                                                                H200).time_s
    assert op_time(dispatch(DSV3, one, decode), H200).time_s == pytest.approx(
        op_time(dispatch(free, one, decode), H200).time_s, rel=1e-12)


def test_the_estimate_states_the_nodes_a_token_reaches():
    plan = pm.Parallelism(ep=16, attention_dp=True)
    wl = pm.Workload(batch=64, prompt_len=512, gen_len=8, weights_dtype="fp8")
    est = pm.estimate(H200, DSV3, wl, plan)
    line = next(w for w in est.to_dict()["warnings"] if w.startswith("EP all-to-all"))
    assert "over 2 nodes of 8" in line and "from at most 4 of 8 expert groups" in line
    assert "0.963 of the 1 other nodes" in line and "5.01 other devices" in line
    assert "12.0% of the dispatch and combine bytes" in line
    single = pm.estimate(H200, DSV3, wl, pm.Parallelism(ep=8, attention_dp=True))
    assert not any(w.startswith("EP all-to-all") for w in single.warnings)


def test_model_fields_and_their_errors(tmp_path):
    assert (DSV3.moe.n_groups, DSV3.moe.topk_groups, DSV3.moe.group_limited) == (8, 4, True)
    lite = pm.model("deepseek-v2-lite").moe
    assert (lite.n_groups, lite.topk_groups, lite.group_limited) == (1, 1, False)
    text = (MODELS_DIR / "deepseek-v3.yaml").read_text()
    for change, field in (("n_groups: 7", "moe.n_groups"), ("topk_groups: 9", "topk_groups"),
                          ("topk_groups: 0", "topk_groups")):
        key = change.split(":")[0]
        bad = "\n".join(f"  {change}" if line.startswith(f"  {key}:") else line
                        for line in text.splitlines())
        path = tmp_path / "bad.yaml"
        path.write_text(bad)
        with pytest.raises(SpecError, match=field):
            pm.model(str(path))


def test_top_k_beyond_the_picked_groups_is_an_error(tmp_path):
    text = (MODELS_DIR / "deepseek-v3.yaml").read_text()
    path = tmp_path / "bad.yaml"     # 1 group of 32 experts cannot give 40
    path.write_text(text.replace("  top_k: 8 ", "  top_k: 40 ").replace(
        "  topk_groups: 4 ", "  topk_groups: 1 "))
    with pytest.raises(SpecError, match="topk_groups x n_experts / n_groups >= top_k"):
        pm.model(str(path))


@pytest.mark.parametrize("family", ["deepseek-v2-lite", "kimi-k2"])
def test_hf_import_reads_n_group_and_topk_group(family):
    data = json.loads((HF / f"{family}.json").read_text())
    assert model_from_hf_config(data, "config.json").moe.n_groups == 1     # absent: none
    groups = data["n_routed_experts"] // 2
    data |= {"n_group": groups, "topk_group": 1}
    moe = model_from_hf_config(data, "config.json").moe
    assert (moe.n_groups, moe.topk_groups, moe.group_limited) == (groups, 1, True)
    data |= {"topk_group": groups + 1}
    with pytest.raises(SpecError, match="topk_group"):
        model_from_hf_config(data, "config.json")
