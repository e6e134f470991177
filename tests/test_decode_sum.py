"""The exact decode sum (``schedules.decode``) against every decode step priced alone.

The sum prices a few contexts and weighs them; it is exact only if it samples every
context where a step's time bends. The attention kernel's bends are its key-split changes,
whose rule has one home (``cost.attention.split_tile``): these tests cross split boundaries,
windows and launch-bound steps on several architectures and devices, and perturb the
attention efficiency constants, so that a change to the pricing that moves a bend the sum
does not sample fails here instead of turning the sum into an approximation.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import perfmodel as pm
from perfmodel.cost.attention import packed_programs, split_tile
from perfmodel.cost.step import Dtypes, Step, StepCost, price_step
from perfmodel.schedules.static import phase_timing
from perfmodel.specs import Parallelism, Workload
from perfmodel.specs.composition import MAX_OVERLAP, Composition

CPU = "reports/cpu/hardware.yaml"
FP32 = {"weights_dtype": "fp32", "act_dtype": "fp32", "kv_dtype": "fp32"}


def brute(model: pm.Model, hw: pm.Hardware, wl: Workload, plan: Parallelism) -> StepCost:
    """Every decode step (contexts S+1 ... S+G-1), each priced alone."""
    contexts = np.arange(wl.prompt_len + 1, wl.prompt_len + wl.gen_len)
    d = Dtypes.of(wl.weights_dtype, wl.act_dtype, wl.kv_dtype, wl.weight_group_size)
    timing = np.broadcast_to(phase_timing(hw, "decode", wl.cuda_graphs), len(contexts))
    step = Step.uniform(wl.batch, 1, contexts, expert_skew=wl.expert_skew)
    return price_step(model, hw, plan, step, d.take(np.zeros(len(contexts), dtype=int)),
                      timing)


def _check(model: pm.Model, hw: pm.Hardware, wl: Workload, plan: Parallelism) -> StepCost:
    cost = brute(model, hw, wl, plan)
    est = pm.estimate(hw, model, wl, plan)
    assert est.decode.steps == wl.gen_len - 1
    assert est.decode.time_s == pytest.approx(cost.time.sum(), rel=1e-9)
    assert est.decode.last_step_s == pytest.approx(cost.time[-1], rel=1e-12)
    return cost


def _bends(cost: StepCost) -> np.ndarray:
    """Whether the attention's compute time bends (its slope changes beyond rounding) at
    each inner context: a split change (a memory-bound step hides it in its time)."""
    rows = [i for i, k in enumerate(cost.kinds) if k == "attention"]
    compute = cost.compute_s[rows].sum(axis=0)
    return np.abs(np.diff(compute, 2)) > 1e-9 * compute.max()


# batch and prompt chosen so that the range crosses key-tile multiples while the programs
# leave the SMs short (the split count changes): 128-key tiles for head_dim 128, 64 for
# gemma-2's 256 and MLA's 576-wide latent; gemma-2's 4096 window; a hybrid's few attention
# layers; a CPU without GQA packing (no split: launch and host terms only)
CASES = [
    ("llama-3-8b", "h100-sxm", Workload(batch=1, prompt_len=200, gen_len=200), 1),
    ("llama-3-8b", "a100-80gb-sxm", Workload(batch=3, prompt_len=90, gen_len=300), 2),
    ("gemma-2-9b", "h100-sxm", Workload(batch=2, prompt_len=4030, gen_len=140), 1),
    ("gemma-2-9b", "a100-80gb-sxm", Workload(batch=1, prompt_len=100, gen_len=150), 1),
    ("deepseek-v2-lite", "h100-sxm", Workload(batch=1, prompt_len=60, gen_len=150), 1),
    ("deepseek-v2-lite", "a100-80gb-sxm", Workload(batch=4, prompt_len=1000, gen_len=140), 1),
    ("mixtral-8x7b", "h100-sxm", Workload(batch=2, prompt_len=250, gen_len=150), 2),
    ("qwen3-30b-a3b", "a100-80gb-sxm", Workload(batch=1, prompt_len=120, gen_len=150), 1),
    ("jamba-1.5-mini", "h100-sxm", Workload(batch=1, prompt_len=120, gen_len=150), 1),
    ("nemotron-h-8b", "a100-80gb-sxm", Workload(batch=2, prompt_len=500, gen_len=150), 1),
    ("llama-3-8b", CPU, Workload(batch=2, prompt_len=100, gen_len=60, **FP32), 1),
    ("qwen3-30b-a3b", CPU, Workload(batch=1, prompt_len=30, gen_len=40, **FP32), 1),
]


@pytest.mark.parametrize(("model", "hw", "wl", "tp"), CASES)
def test_decode_sum_equals_every_step_priced_alone(model, hw, wl, tp):
    m, h, plan = pm.model(model), pm.hardware(hw), Parallelism(tp=tp)
    cost = _check(m, h, wl, plan)
    if h.efficiency.attention_decode_pack_gqa:
        assert _bends(cost).any()          # the range crosses a split change


def test_split_tile_is_where_the_split_changes(h100):
    """Between multiples of split_tile the decode attention's time is linear in the
    context; across one it bends (a GQA model at batch 1: 8 programs on 132 SMs)."""
    m = pm.model("llama-3-8b")
    tile = int(split_tile(h100, packed_programs(1, m.n_heads, m.n_kv_heads), m.head_dim))
    assert tile == 128
    second = _bends(brute(m, h100, Workload(batch=1, prompt_len=3 * tile - 20, gen_len=60),
                          Parallelism()))
    contexts = np.arange(3 * tile - 19, 3 * tile + 40)[1:-1]
    assert set(contexts[second].tolist()) <= {3 * tile, 3 * tile + 1}
    assert second.any()
    # a pool that fills the units never splits: no tile
    assert split_tile(h100, np.array([0.8 * h100.compute_units]), m.head_dim) == 0
    cpu = pm.hardware(CPU)
    assert split_tile(cpu, np.array([1]), m.head_dim) == 0      # no GQA packing


@settings(max_examples=12, deadline=None, derandomize=True)
@given(model=st.sampled_from(["llama-3-8b", "deepseek-v2-lite", "gemma-2-9b"]),
       fraction=st.floats(0.2, 0.95), latency=st.floats(0.0, 4e-5),
       launch=st.floats(0.0, 2e-5), tile_kv=st.sampled_from([32, 64, 128, 256]),
       tile_q=st.sampled_from([64, 128]), units=st.integers(8, 200),
       batch=st.integers(1, 6), prompt=st.integers(1, 700), gen=st.integers(2, 160),
       graphs=st.booleans(), overlap=st.floats(0.0, MAX_OVERLAP))
def test_perturbed_attention_constants_keep_the_sum_exact(model, fraction, latency, launch,
                                                          tile_kv, tile_q, units, batch,
                                                          prompt, gen, graphs, overlap):
    h100 = pm.hardware("h100-sxm")
    eff = replace(h100.efficiency, attention_fraction=fraction, launch_overhead_s=launch,
                  kernel_latency_by_kind=h100.efficiency.kernel_latency_by_kind
                  | {"attention": latency}, attention_tile_kv=tile_kv,
                  attention_tile_q=((1, tile_q),))
    hw = replace(h100, efficiency=eff, compute_units=units,
                 composition=Composition(overlap, "test"))      # a composed graph step
    _check(pm.model(model), hw, Workload(batch=batch, prompt_len=prompt, gen_len=gen,
                                         cuda_graphs=graphs), Parallelism())
