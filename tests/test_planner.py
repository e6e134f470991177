"""The deployment planner: its steady-state formulas, the candidate search, the ranking
confirmed by simulation, and the ``plan`` command's output and one-line errors."""

import numpy as np
import pytest

from perfmodel.serving import planner
from perfmodel.serving.planner import Target, pareto_mask, steady_state
from perfmodel.specs import load
from perfmodel.specs.errors import SpecError

H100, A100 = load.hardware("h100-sxm"), load.hardware("a100-80gb-sxm")
SMALL = load.model("llama-3-8b")


def _state(prefill_dp: int, shares: list[float], transfer: float = 0.0) -> dict:
    one = np.array([1.0])
    # TPOT aggregated = batch / static throughput = 32 / (32 / 0.03) = 30 ms
    return steady_state(0.1 * one, 0.02 * one, one * 32 / 0.03, one * 32, 100.0,
                        one * prefill_dp, one * 2, one * transfer, np.array([shares]))


def test_aggregated_steady_state():
    st = _state(0, [1e-6, 0.5, 0.9, 1.0])
    assert st["tpot_s"][0] == pytest.approx(0.03)
    assert st["capacity_req_s"][0] == pytest.approx(2 * 32 / (100 * 0.03))
    ttft = st["ttft_p90_s"][0]
    assert ttft[0] == pytest.approx(0.1 + 0.02, rel=1e-3)   # no queue at no load
    assert ttft[0] < ttft[1] < ttft[2] and np.isinf(ttft[3])


def test_disaggregated_steady_state():
    st = _state(1, [1e-6, 0.9], transfer=0.01)
    assert st["tpot_s"][0] == pytest.approx(0.02)            # no prompt in the decode steps
    assert st["capacity_req_s"][0] == pytest.approx(10.0)    # one prefill replica, 0.1 s each
    assert st["ttft_p90_s"][0, 0] == pytest.approx(0.13, rel=1e-3)
    # at 90% the one prefill server queues: M/D/1, p90 = m ln(10 rho), m = s / (2 (1 - rho));
    # the decode pool's 64 slots at 28% load wait for nothing
    m = 0.5 * 0.1 / 0.1
    assert st["ttft_p90_s"][0, 1] == pytest.approx(0.13 + m * np.log(9))


def test_queue_wait_p90():
    rho = np.array([0.5, 0.9])
    assert planner._wait_p90(rho, 1, np.ones(2)) == pytest.approx(
        0.5 / (1 - rho) * np.log(10 * rho))                  # M/D/1: Erlang C = rho
    many = planner._wait_p90(np.array([0.5]), np.array([64]), np.array([10.0]))
    assert many[0] == 0.0                                    # 64 slots half busy: no wait


def test_pareto_mask():
    x = np.array([1.0, 2.0, 3.0, 2.0, 1.0])
    y = np.array([5.0, 4.0, 1.0, 3.0, 5.0])
    assert pareto_mask(x, y).tolist() == [True, True, True, False, True]


def test_replica_plans_and_weights():
    assert [p.tp for p in planner.replica_plans(SMALL, H100, 8)] == [1, 2, 4, 8]
    assert [p.tp for p in planner.replica_plans(SMALL, load.hardware("h100-nvl"), 8)] == [1, 2]
    moe = planner.replica_plans(load.model("qwen3-30b-a3b"), H100, 4)
    assert [(p.tp, p.ep, p.attention_dp) for p in moe] == [
        (1, 1, False), (2, 2, False), (4, 4, False), (1, 2, True), (1, 4, True)]
    assert [w.weights_dtype for w in planner.weight_choices(SMALL, H100)] == ["bf16", "fp8"]
    assert [w.weights_dtype for w in planner.weight_choices(SMALL, A100)] == ["bf16"]


def test_replica_times_cap_batches_at_the_kv_ceiling():
    big = load.model("llama-3-70b")
    target = Target(8, 2.0, 0.05, 2048, 256)
    times = planner.replica_times(big, H100, planner.Parallelism(tp=2), target)
    bf16 = times["weights_dtype"] == "bf16"
    assert times["batch"][bf16].tolist() == [7]              # bf16 TP2: room for 7 sequences
    assert times["batch"][~bf16].max() == times["kv_max_batch"][~bf16][0]
    assert np.all(np.diff(times["step_s"][~bf16]) > 0)
    assert not len(planner.replica_times(big, A100, planner.Parallelism(), target)["batch"])


def test_candidates_split_over_nvlink_in_a_node_and_the_network_beyond():
    cols = planner.candidates(SMALL, [H100], Target(16, 2.0, 0.05, 1000, 100))
    split = cols["prefill_replicas"] > 0
    assert set(cols["link"][split & (cols["tp"] == 8)]) == {"network"}
    assert np.all(cols["gpus"] <= 16) and split.any() and (~split).any()
    assert np.all(cols["transfer_s"][split] > 0) and np.all(cols["transfer_s"][~split] == 0)
    inside = planner.candidates(SMALL, [H100], Target(4, 2.0, 0.05, 1000, 100))
    assert set(inside["link"][inside["prefill_replicas"] > 0]) == {"nvlink"}


def test_plan_ranks_confirms_and_picks():
    target = Target(2, 1.0, 0.03, 1000, 100)
    result = planner.plan(SMALL, [H100, A100], target, n_requests=60)
    cols = result.candidates
    assert 1 <= len(result.confirmed) <= planner.CONFIRM
    assert len({c["label"].rsplit(" B", 1)[0] for c in result.confirmed}) == \
        len(result.confirmed)                                # distinct deployments
    w = result.winner
    assert w["confirmed"] and w["meets_slos"] and cols["feasible"][w["index"]]
    assert w["simulated_ttft_p90_s"] <= 1.0 and w["simulated_tpot_p90_s"] <= 0.03
    ranked = planner.ranking(cols, target)
    assert cols["throughput_per_gpu"][ranked[0]] == cols["throughput_per_gpu"][cols[
        "feasible"]].max()
    records = result.records()
    assert len(records) == len(cols["label"]) and any(r["pareto"] for r in records)
    assert isinstance(records[0]["throughput_per_gpu"], float)


def test_a_rate_must_fit_under_the_slo_bound_load():
    easy = planner.evaluate(planner.candidates(SMALL, [H100], Target(2, 1.0, 0.05, 1000, 100)),
                            Target(2, 1.0, 0.05, 1000, 100))
    top = easy["slo_rate_req_s"].max()
    hard = Target(2, 1.0, 0.05, 1000, 100, rate=top * 1.01)
    cols = planner.evaluate(planner.candidates(SMALL, [H100], hard), hard)
    assert not cols["meets_ttft"].any()
    assert np.all(cols["rate_req_s"] == hard.rate)


@pytest.mark.parametrize(("kwargs", "flag"), [
    ({"slo_ttft_s": 0.0}, "--slo-ttft"), ({"slo_tpot_s": -1.0}, "--slo-tpot"),
    ({"gpus": 0}, "--gpus"), ({"input_len": 0}, "--input-len")])
def test_bad_targets_name_the_option(kwargs, flag):
    args = {"gpus": 8, "slo_ttft_s": 2.0, "slo_tpot_s": 0.05, "input_len": 100,
            "output_len": 10} | kwargs
    with pytest.raises(SpecError, match=flag):
        Target(**args)


def test_a_model_that_fits_nowhere():
    with pytest.raises(SpecError, match=r"fits on none of l4 \(-H\) within --gpus 1"):
        planner.plan(load.model("llama-3-70b"), [load.hardware("l4")],
                     Target(1, 2.0, 0.05, 100, 10))
    with pytest.raises(SpecError, match="context limit"):
        planner.plan(SMALL, [H100], Target(1, 2.0, 0.05, 8000, 1000))
