"""A step of mixed sequence groups, priced by hand; step records; a seeded fuzz of the grid."""

import math

import numpy as np
import pytest

import perfmodel as pm
from perfmodel.cost.ops import attended_positions
from perfmodel.cost.roofline import op_time
from perfmodel.cost.step import Dtypes, Step, price_step, step_records
from perfmodel.cost.tiling import prefill_tile_fraction
from perfmodel.specs import Parallelism, SpecError, Workloads
from perfmodel.specs.load import HARDWARE_DIR, MODELS_DIR, shipped
from tests.datasheet import datasheet

CONTEXTS = np.linspace(1000, 4000, 63).round().astype(int)     # 63 decodes, 1,000 .. 4,000
CHUNK = (1, 512, 512)                                            # a 512-token prefill chunk


def _price(model, hw, groups):
    return price_step(model, hw, Parallelism(), Step.mixed(groups), Dtypes.of())


@pytest.fixture(scope="module")
def mixed():
    """Llama-3-8B on an H100: the mixed step, the chunk alone and the decodes alone."""
    model, hw = pm.model("llama-3-8b"), datasheet("h100-sxm")
    decodes = [(1, 1, int(c)) for c in CONTEXTS]
    return (model, hw, _price(model, hw, [CHUNK, *decodes]), _price(model, hw, [CHUNK]),
            _price(model, hw, decodes))


def test_mixed_step_flops_and_bytes_are_the_groups_sums_weights_once(mixed):
    _, _, both, chunk, decodes = mixed
    assert both.names == chunk.names == decodes.names
    np.testing.assert_allclose(both.flops, chunk.flops + decodes.flops, rtol=1e-12)
    for source in ("act_read", "act_write", "kv_read", "kv_write"):
        np.testing.assert_allclose(getattr(both.bytes, source),
                                   getattr(chunk.bytes, source) + getattr(decodes.bytes, source),
                                   rtol=1e-12)
    for i, (name, kind) in enumerate(zip(both.names, both.kinds, strict=True)):
        weights = both.bytes.weights[i, 0]
        if kind == "embedding":         # a gather reads one table row per token: they add
            assert weights == chunk.bytes.weights[i, 0] + decodes.bytes.weights[i, 0]
        else:                           # matrices and norm scales are read once per step
            assert weights == chunk.bytes.weights[i, 0] == decodes.bytes.weights[i, 0], name


def test_mixed_step_gemm_time_is_the_roofline_of_its_total_rows(mixed):
    """qkv_proj on the step's 575 tokens, by hand (H100 file: 128 x 256 tiles, 132 SMs,
    gemm_fraction 0.8, k ramp 128; 3.35 TB/s x 0.9; 2 us per kernel, 2.4 us launch)."""
    _, _, both, chunk, decodes = mixed
    m, n, k = 575, (32 + 2 * 8) * 128, 4096
    # rows: 5 tiles of 128 (575/640 used); columns: 24 tiles of 256; 120 tiles < 132 SMs,
    # but split-K would need 132 // 120 = 1: no split. One wave of 120/132.
    eff = 0.8 * (575 / 640) * (120 / 132) * (4096 / (4096 + 128))
    compute = 2 * m * n * k / (989.4e12 * eff)
    memory = (k * n + m * k + m * n) * 2 / (3.35e12 * 0.9)
    per_layer = max(max(compute, memory) + 2e-6, 2.4e-6)
    i = both.names.index("qkv_proj")
    assert both.time_s[i, 0] == pytest.approx(32 * per_layer, rel=1e-12)
    # not the sum of the parts: the weights stream once for both groups
    assert both.time_s[i, 0] < chunk.time_s[i, 0] + decodes.time_s[i, 0]


def test_mixed_step_attention_time_is_the_roofline_of_its_totals(mixed):
    """One varlen kernel: compute = the chunk's FLOPs at its tile efficiency + the decodes'
    FLOPs at the decode pool's; memory = all its bytes; one fixed cost."""
    _, hw, both, _, _ = mixed
    i = both.names.index("attention")
    q, kv = 512, 512
    chunk_eff = 0.75 * float(prefill_tile_fraction(
        hw, 1, 32, 8, 128, q, kv, 0, attended_positions(q, kv)))
    chunk_flops = 2 * 32 * attended_positions(q, kv) * 256
    # decode pool: 63 sequences x 8 KV heads = 504 programs (>= 0.8 x 132: no key split),
    # 4 query heads in a 16-row tile; unequal programs longest first
    n = 63 * 8
    total = 8 * CONTEXTS.sum()
    makespan = max(CONTEXTS.max(), total / 132 + (math.ceil(n / 132) - n / 132)
                   * CONTEXTS.min())
    pool_eff = 0.75 * 4 / 16 * total / (132 * makespan)
    decode_flops = 2 * 32 * CONTEXTS.sum() * 256
    compute = chunk_flops / (989.4e12 * chunk_eff) + decode_flops / (989.4e12 * pool_eff)
    nbytes = both.bytes.total[i, 0] / 32
    memory = nbytes / (3.35e12 * 0.9)
    assert both.flops[i, 0] == pytest.approx(32 * (chunk_flops + decode_flops), rel=1e-12)
    assert both.time_s[i, 0] == pytest.approx(32 * max(max(compute, memory) + 2e-6, 2.4e-6),
                                              rel=1e-9)
    assert both.compute_s[i, 0] == pytest.approx(compute, rel=1e-9)


def test_uniform_step_is_one_group_and_padding_groups_cost_nothing(h100):
    model = pm.model("mixtral-8x7b")
    one = price_step(model, h100, Parallelism(), Step.uniform(8, 1, 900), Dtypes.of())
    padded = price_step(model, h100, Parallelism(),
                        Step(np.array([[8, 0, 0]]), np.array([[1, 1, 5]]),
                             np.array([[900, 1, 9]])), Dtypes.of())
    np.testing.assert_allclose(padded.time_s, one.time_s, rtol=1e-12)
    np.testing.assert_allclose(padded.flops, one.flops, rtol=1e-12)


def test_step_records_sum_to_the_priced_step(h100):
    model, plan = pm.model("deepseek-v3"), Parallelism(tp=8)
    step = Step.mixed([(2, 300, 800), (5, 1, 2000)])
    cost = price_step(model, h100, plan, step, Dtypes.of(kv="fp8"))
    records = step_records(model, h100, plan, step, Dtypes.of(kv="fp8"))
    names = [r.name for r in records]
    assert set(names) == {n for n, c in zip(cost.names, cost.count[:, 0], strict=True) if c}
    # both MLA forms run: the chunk expanded, the decodes absorbed
    assert {"kv_b_proj", "attention_expanded", "q_absorb", "attention"} <= set(names)
    total = sum(float(op_time(r, h100).time_s[0]) for r in records)
    assert total == pytest.approx(float(cost.time[0]), rel=1e-12)


@pytest.mark.parametrize(("groups", "message"), [
    ([(1, 5, 4)], "1 <= new_tokens <= context"),
    ([(0, 1, 4)], "at least one sequence"),
    ([(-1, 1, 4), (1, 1, 4)], "at least one sequence"),
])
def test_bad_steps_are_spec_errors(groups, message):
    with pytest.raises(SpecError, match=message):
        Step.mixed(groups)


def test_seeded_fuzz_of_the_vectorised_grid():
    """3,000 random configurations over every shipped model and device: finite, positive,
    consistent; a sample of them equal to the single estimate."""
    rng = np.random.default_rng(20261123)
    models, devices = shipped(MODELS_DIR), shipped(HARDWARE_DIR)
    dtypes = np.array(["bf16", "fp8", "int4", "fp16"])
    checked = 0
    for _ in range(30):
        model = pm.model(str(rng.choice(models)))
        hw = pm.hardware(str(rng.choice(devices)))
        n = 100
        w = Workloads.of(batch=rng.integers(1, 300, n), prompt_len=rng.integers(1, 20_000, n),
                         gen_len=rng.integers(1, 3000, n), weights_dtype=rng.choice(dtypes, n),
                         kv_dtype=rng.choice(dtypes[:2], n), cuda_graphs=rng.random(n) < 0.5)
        est = pm.estimate_many(hw, model, w)
        for values in (est.ttft_s, est.tpot_s, est.e2e_s, est.throughput_tokens_per_s,
                       est.memory.weights_bytes, est.memory.kv_cache_bytes):
            assert np.all(np.isfinite(values)) and np.all(values > 0)
        assert np.all(est.e2e_s >= est.ttft_s)
        assert np.all((est.memory.max_batch >= 0) & (est.memory.fits == (w.batch
                                                                          <= est.memory.max_batch)))
        i = int(rng.integers(n))
        assert pm.estimate(hw, model, w.item(i)).tpot_s == pytest.approx(est.tpot_s[i], rel=1e-12)
        checked += n
    assert checked == 3000
