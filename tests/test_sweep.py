"""Sweeps: each point is estimate() exactly, the columns, the grid order, and physics
monotonicity."""

import csv
import io
import math

import numpy as np
import pytest

import perfmodel as pm
from perfmodel.cost.memory import memory_estimate
from perfmodel.cost.step import Dtypes, Step, price_step
from perfmodel.report.tables import column_cells, flat_record
from perfmodel.schedules.sweep import (
    SERIES_COLUMNS,
    kv_cache_table,
    max_batch_table,
    powers_of_two,
    rows,
    series,
    sweep,
    time_split_table,
)
from perfmodel.specs.kinds import OP_CLASSES

LLAMA = pm.model("llama-2-13b")


def _records(*args, **kwargs):
    return rows(sweep(*args, **kwargs))


@pytest.mark.parametrize("model,hw,wl,tp", [
    ("llama-2-13b", "h100-sxm", pm.Workload(batch=16, prompt_len=512, gen_len=2048), 1),
    ("mistral-7b", "l4", pm.Workload(batch=256, prompt_len=3000, gen_len=3000), 1),  # window
    ("gemma-2-9b", "a100-80gb-sxm", pm.Workload(batch=8, prompt_len=3500, gen_len=1500), 1),
    ("deepseek-v3", "h200-sxm", pm.Workload(batch=64, prompt_len=8000, gen_len=500), 8),
])
def test_sweep_point_is_estimate_exactly(model, hw, wl, tp):
    """A point of a larger grid (other batches and prompts priced in the same call) is what
    ``estimate`` says for the same configuration, to rounding (decode summed exactly)."""
    m, h, plan = pm.model(model), pm.hardware(hw), pm.Parallelism(tp=tp)
    exact = pm.estimate(h, m, wl, plan)
    grid = _records([m], [h], [1, wl.batch, 300], [100, wl.prompt_len], wl, plan=plan)
    (point,) = [r for r in grid if (r["workload_batch"], r["workload_prompt_len"])
                == (wl.batch, wl.prompt_len)]
    ref = flat_record(exact)
    for key in ("ttft_s", "tpot_s", "e2e_s", "decode_first_step_s", "decode_last_step_s",
                "decode_time_s", "decode_flops", "decode_bytes", "throughput_tokens_per_s"):
        assert point[key] == pytest.approx(ref[key], rel=1e-12), key
    for key in ("max_batch", "fits", "weights_bytes", "kv_cache_bytes", "decode_bound",
                "prefill_bound", "decode_steps", "tp", "warnings"):
        assert point[key] == ref[key], key
    assert point["tp"] == tp and point["pp"] == point["ep"] == point["dp"] == 1


@pytest.mark.parametrize("model,prompt,gen", [
    ("llama-2-13b", 512, 128), ("mistral-7b", 3000, 3000), ("gemma-2-9b", 100, 5),
    ("deepseek-v3", 64, 2), ("deepseek-v3", 1000, 300),
])
def test_decode_is_the_sum_of_every_step(h100, model, prompt, gen):
    """TPOT is the mean of the G - 1 decode steps at contexts S+1 ... S+G-1, each priced on
    its own (no sampling): first and last step included."""
    m = pm.model(model)
    (row,) = _records([m], [h100], [8], [prompt], pm.Workload(gen_len=gen))
    contexts = np.arange(prompt + 1, prompt + gen)
    steps = price_step(m, h100, pm.Parallelism(), Step.uniform(8, 1, contexts),
                       Dtypes.of()).time
    assert row["decode_steps"] == gen - 1
    assert row["tpot_s"] == pytest.approx(steps.mean(), rel=1e-12)
    assert row["decode_first_step_s"] == pytest.approx(steps[0], rel=1e-12)
    assert row["decode_last_step_s"] == pytest.approx(steps[-1], rel=1e-12)


def test_columns_extend_flat_record_and_split_by_class(h100):
    cols = sweep([LLAMA], [h100], [1, 8], [256, 1024], pm.Workload(gen_len=64))
    assert all(len(v) == 4 for v in cols.values())
    assert "decode_samples" not in cols and "workload_tp" not in cols
    records = rows(cols)
    assert [(r["workload_prompt_len"], r["workload_batch"]) for r in records] == \
        [(256, 1), (256, 8), (1024, 1), (1024, 8)]        # batch varies fastest
    ref = flat_record(pm.estimate(h100, LLAMA, pm.Workload(batch=8, prompt_len=1024,
                                                           gen_len=64)))
    assert set(ref) <= set(records[-1])
    assert records[-1]["tpot_s"] == pytest.approx(ref["tpot_s"], rel=1e-12)
    assert records[-1]["workload_weight_group_size"] is None
    for r in records:
        assert sum(r[f"ttft_{c}_s"] for c in OP_CLASSES) == pytest.approx(r["ttft_s"])
        assert sum(r[f"tpot_{c}_s"] for c in OP_CLASSES) == pytest.approx(r["tpot_s"])
        assert r["context_len"] == r["workload_prompt_len"] + 64
        assert r["attention_kind"] == "mha" and r["tp"] == 1
    assert all(type(v) in (int, float, bool, str, type(None)) for v in records[0].values())


def test_grid_order_is_the_sweeps_documented_order(h100, a100):
    """Workloads.grid: the last axis varies fastest; sweep: model x hardware x weights dtype
    x kv dtype x prompt x batch, batch fastest, the same nesting as itertools.product."""
    import itertools

    w = pm.Workloads.grid(weights_dtype=["bf16", "fp8"], prompt_len=[128, 256, 512],
                          batch=[1, 4])
    got = [(w.item(i).weights_dtype, w.item(i).prompt_len, w.item(i).batch)
           for i in range(len(w))]
    assert got == list(itertools.product(["bf16", "fp8"], [128, 256, 512], [1, 4]))
    mistral = pm.model("mistral-7b")
    records = _records([LLAMA, mistral], [h100, a100], [1, 4], [128, 256],
                       weights_dtypes=["bf16", "fp8"], kv_dtypes=["bf16", "fp8"])
    keys = [(r["model"], r["hardware"], r["workload_weights_dtype"], r["workload_kv_dtype"],
             r["workload_prompt_len"], r["workload_batch"]) for r in records]
    assert keys == list(itertools.product(
        ["llama-2-13b", "mistral-7b"], ["h100-sxm", "a100-80gb-sxm"], ["bf16", "fp8"],
        ["bf16", "fp8"], [128, 256], [1, 4]))


def test_column_cells_format_for_csv():
    cols = {"name": ["a,b", 'say "x"', "plain"], "x": np.array([1 / 3, np.nan, 1e-20]),
            "n": np.array([1, 2, 3]), "ok": np.array([True, False, True]),
            "group": np.array([None, 64, None], dtype=object), "w": ["", "w1; w2", None]}
    cells = list(column_cells(cols))
    assert cells[0] == list(cols)
    assert cells[1] == ["a,b", "0.3333333333", "1", "True", "", ""]    # 10 significant
    assert cells[2] == ['say "x"', "", "2", "False", "64", "w1; w2"]   # NaN blank
    assert cells[3] == ["plain", "1e-20", "3", "True", "", ""]         # None blank
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows(cells)
    text = buf.getvalue()
    assert text.splitlines()[1] == '"a,b",0.3333333333,1,True,,'      # comma: quoted
    assert text.splitlines()[2] == '"say ""x""",,2,False,64,w1; w2'
    assert list(csv.reader(io.StringIO(text))) == cells                  # reads back
    assert float(cells[1][1]) == pytest.approx(1 / 3, rel=5e-10)


def test_sweep_columns_round_trip_through_csv(h100):
    cols = sweep([LLAMA], [h100], [1, 8], [128], pm.Workload(gen_len=1))
    buf = io.StringIO()
    csv.writer(buf).writerows(column_cells(cols))
    back = list(csv.DictReader(io.StringIO(buf.getvalue())))
    assert len(back) == 2 and list(back[0]) == list(cols)
    for r, ref in zip(back, rows(cols), strict=True):
        assert float(r["tpot_s"]) == pytest.approx(ref["tpot_s"], rel=1e-9)
        assert r["tpot_gemm_s"] == "" and r["workload_weight_group_size"] == ""
        assert r["fits"] == "True" and r["hardware"] == "h100-sxm"


def test_one_generated_token_has_no_decode_split(h100):
    (row,) = _records([LLAMA], [h100], [1], [128], pm.Workload(gen_len=1))
    assert math.isnan(row["tpot_gemm_s"]) and row["tpot_s"] > 0
    assert row["tpot_s"] == row["decode_first_step_s"] and row["decode_steps"] == 0


def test_product_over_devices_and_dtypes(h100, a100):
    records = _records([LLAMA], [h100, a100], [1, 4], [512], weights_dtypes=["bf16", "fp8"],
                       kv_dtypes=["bf16", "fp8"])
    assert len(records) == 2 * 2 * 2 * 2
    assert {r["workload_kv_dtype"] for r in records} == {"bf16", "fp8"}
    labels = series(records, exclude=("workload_batch",))
    assert len(labels) == 8 and all(len(v) == 2 for v in labels.values())
    assert "h100-sxm, W fp8, KV bf16" in labels


def test_series_name_the_tensor_parallel_degree(h100):
    assert "tp" in SERIES_COLUMNS and "workload_tp" not in SERIES_COLUMNS
    both = [*_records([LLAMA], [h100], [1], [512]),
            *_records([LLAMA], [h100], [1], [512], plan=pm.Parallelism(tp=2))]
    assert set(series(both)) == {"TP 1", "TP 2"}


def test_invalid_workload_is_a_spec_error(h100):
    with pytest.raises(pm.SpecError):
        sweep([LLAMA], [h100], [0], [512])
    with pytest.raises(pm.SpecError, match="no routed experts"):
        sweep([LLAMA], [h100], [1], [512], plan=pm.Parallelism(tp=2, ep=2, pp=2))


def _by(records, key):
    return [r[key] for r in records]


def test_monotone_where_physics_says_so(h100):
    batches = powers_of_two(1, 256)
    records = _records([LLAMA], [h100], batches, [512], pm.Workload(gen_len=128))
    tpot = _by(records, "tpot_s")
    assert tpot == sorted(tpot)                          # more sequences: never a faster step
    thr = _by(records, "decode_tokens_per_s")[:8]        # memory-bound region: throughput grows
    assert thr == sorted(thr)
    assert len({r["max_batch"] for r in records}) == 1   # ceiling does not depend on batch
    assert [r["fits"] for r in records] == [b <= records[0]["max_batch"] for b in batches]
    ctx_rows = _records([LLAMA], [h100], [8], [128, 512, 2048, 8192])
    for key in ("ttft_s", "tpot_s", "kv_cache_bytes_per_sequence", "tpot_attention_s"):
        assert _by(ctx_rows, key) == sorted(_by(ctx_rows, key))
    mb = _by(ctx_rows, "max_batch")
    assert mb == sorted(mb, reverse=True)
    # weights are streamed every decode step: narrower weights, faster memory-bound decode
    bf16, fp8 = _records([LLAMA], [h100], [1], [512], weights_dtypes=["bf16", "fp8"])
    assert fp8["tpot_s"] < bf16["tpot_s"]
    assert bf16["weights_bytes"] / 2 < fp8["weights_bytes"] < 0.52 * bf16["weights_bytes"]


def test_kv_table_by_attention_kind():
    names = ["llama-2-13b", "llama-3-70b", "falcon-7b", "deepseek-v3", "mistral-7b",
             "gemma-2-9b"]
    contexts = [1024, 4096, 16384]
    table = kv_cache_table([pm.model(n) for n in names], contexts)
    per_token = {r["model"]: r["kv_bytes_per_token"] for r in table}
    assert per_token["deepseek-v3"] == 61 * 576 * 2              # MLA latent + rope key
    assert per_token["llama-2-13b"] == 40 * 2 * 40 * 128 * 2     # MHA
    assert per_token["llama-3-70b"] == 80 * 2 * 8 * 128 * 2      # GQA
    assert per_token["falcon-7b"] == 32 * 2 * 1 * 64 * 2         # MQA
    seq = {(r["model"], r["context"]): r["kv_bytes_per_sequence"] for r in table}
    assert seq[("llama-2-13b", 4096)] == 4096 * per_token["llama-2-13b"]
    assert seq[("mistral-7b", 16384)] == seq[("mistral-7b", 4096)]       # all layers windowed
    gemma_growth = seq[("gemma-2-9b", 16384)] - seq[("gemma-2-9b", 4096)]
    assert gemma_growth == pytest.approx((16384 - 4096) * per_token["gemma-2-9b"] / 2)
    kinds = {r["model"]: r["attention_kind"] for r in table}
    assert kinds["falcon-7b"] == "mqa" and kinds["mistral-7b"] == "gqa, window 4096"
    assert all(type(r["context"]) is int and type(r["kv_bytes_per_sequence"]) is float
               for r in table)


def test_kv_table_per_device_under_tp():
    """KV heads split over TP devices; MLA's latent is replicated on every device."""
    models = [pm.model("llama-3-70b"), pm.model("deepseek-v3")]
    one = {r["model"]: r["kv_bytes_per_token"] for r in kv_cache_table(models, [1024])}
    eight = {r["model"]: r["kv_bytes_per_token"] for r in kv_cache_table(models, [1024],
                                                                          tp=8)}
    assert eight["llama-3-70b"] == one["llama-3-70b"] / 8
    assert eight["deepseek-v3"] == one["deepseek-v3"]


def test_max_batch_table_matches_memory_estimate(h100):
    base = pm.Workload(gen_len=128)
    table = max_batch_table([LLAMA], h100, [64, 1024, 4096, 32768], base)
    assert [r["context"] for r in table] == [1024, 4096, 32768]          # 64 <= gen: skipped
    for r in table:
        w = pm.Workloads.of(prompt_len=r["context"] - 128, gen_len=128)
        assert r["max_batch"] == memory_estimate(LLAMA, h100, pm.Parallelism(), w).max_batch
        assert r["max_batch"] == pm.estimate(h100, LLAMA, pm.Workload(
            prompt_len=r["context"] - 128)).memory.max_batch
    assert _by(table, "max_batch") == sorted(_by(table, "max_batch"), reverse=True)
    gpt3 = max_batch_table([pm.model("gpt-3-175b")], h100, [1024, 4096], base)
    assert not gpt3[0]["fits_weights"] and gpt3[0]["max_batch"] == 0
    assert gpt3[0]["kv_pool_bytes"] == 0.0          # no pool, never a negative one
    assert [r["beyond_max_position"] for r in gpt3] == [False, True]    # n_ctx 2048
    assert max_batch_table([LLAMA], h100, [64, 128], base) == []         # nothing longer


def test_max_batch_table_under_tp(h100):
    """TP 2 halves the weights and the KV per sequence on each device: more sequences fit."""
    one = max_batch_table([LLAMA], h100, [4096])[0]
    two = max_batch_table([LLAMA], h100, [4096], plan=pm.Parallelism(tp=2))[0]
    assert two["weights_bytes"] < one["weights_bytes"]
    assert two["kv_bytes_per_sequence"] == one["kv_bytes_per_sequence"] / 2
    assert two["max_batch"] > 2 * one["max_batch"]


def test_time_split_table_sums(h100):
    records = _records([LLAMA], [h100], [4], [2048, 512])
    for phase, total in (("prefill", "ttft_s"), ("decode", "tpot_s")):
        table = time_split_table(records, phase)
        assert [t["context"] for t in table] == [512, 2048]
        by_ctx = {r["workload_prompt_len"]: r[total] for r in records}
        for t in table:
            assert sum(v for k, v in t.items() if k != "context") == \
                pytest.approx(by_ctx[t["context"]])
        assert "gemm" in table[0] and "communication" not in table[0]


def test_powers_of_two():
    assert powers_of_two(1, 100) == [1, 2, 4, 8, 16, 32, 64]
    assert powers_of_two(3, 16) == [4, 8, 16]
