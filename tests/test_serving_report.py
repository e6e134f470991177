"""Presentation of a serving simulation (``report.serving_tables``, ``report.serving_plots``)
on a hand-built SimResult whose metrics are derived by hand, which also checks the metric
definitions of ``serving.results`` (vLLM's benchmark: TTFT, TPOT, ITL, E2E)."""

import io
import json

import matplotlib
import numpy as np
import pandas as pd
import pytest

from perfmodel.report import serving_plots, serving_tables
from perfmodel.serving.requests import Requests
from perfmodel.serving.results import SimResult, StepLog

matplotlib.use("Agg")

# Three requests. r0: arrives 0, scheduled 0.1, 3 tokens at 0.5 0.6 0.8; r1: arrives 0.2,
# scheduled at once, one token at 0.7; r2: arrives 0.4, scheduled 0.6, 4 tokens at
# 1.0 1.1 1.2 1.3.
TOKENS = ([0.5, 0.6, 0.8], [0.7], [1.0, 1.1, 1.2, 1.3])
TTFT = [0.5, 0.5, 0.6]
E2E = [0.8, 0.5, 0.9]
QUEUE = [0.1, 0.0, 0.2]
TPOT = [0.15, 0.1]                  # (0.8 - 0.5) / 2, (1.3 - 1.0) / 3; r1 has one token
ITL = [0.1, 0.2, 0.1, 0.1, 0.1]     # within requests only: not 0.8 -> 0.7 nor 0.7 -> 1.0
DURATION = 1.3                      # time 0 to the last token


def make_result(label: str = "hand", steps: int = 5) -> SimResult:
    reqs = Requests.of([0.0, 0.2, 0.4], [100, 50, 200], [3, 1, 4], [7, -1, 7], [40, 0, 40])
    offsets = np.cumsum([0] + [len(t) for t in TOKENS])
    t = np.linspace(0.0, 1.2, steps)
    log = StepLog(t, np.full(steps, 0.1), np.arange(steps) % 3 + 1, np.full(steps, 64),
                  np.arange(steps) % 2 * 60, np.arange(steps) * 2, np.arange(steps) % 2)
    return SimResult(reqs, np.array([0.0, 0.2, 0.4]), np.array([0.1, 0.2, 0.6]),
                     np.array([t[0] for t in TOKENS]), np.array([t[-1] for t in TOKENS]),
                     np.array([0, 1, 0]), np.array([0, 0, 32]), offsets,
                     np.concatenate(TOKENS), log, kv_blocks_total=20, label=label)


@pytest.fixture(scope="module")
def res() -> SimResult:
    return make_result()


def test_metrics_match_the_hand_derivation(res):
    assert res.ttft_s == pytest.approx(TTFT)
    assert res.e2e_s == pytest.approx(E2E)
    assert res.queue_s == pytest.approx(QUEUE)
    assert res.tpot_s == pytest.approx(TPOT)
    assert res.itl_s == pytest.approx(ITL)
    assert res.duration_s == pytest.approx(DURATION)
    assert res.throughput_tokens_per_s == pytest.approx(8 / DURATION)
    assert res.requests_per_s == pytest.approx(3 / DURATION)
    np.testing.assert_allclose(res.itl_max_s, [0.2, np.nan, 0.1])
    # TTFT <= 0.55 s and TPOT <= 0.12 s: r0's TPOT misses, r2's TTFT misses; r1 (no TPOT) ok
    assert res.goodput(0.55, 0.12) == pytest.approx(1 / DURATION)


def test_summary_percentiles_interpolate_as_numpy(res):
    s = res.summary(slo_ttft_s=0.55)
    assert s["ttft_s"] == pytest.approx({"mean": 1.6 / 3, "p50": 0.5, "p90": 0.58, "p99": 0.598})
    assert s["tpot_s"] == pytest.approx({"mean": 0.125, "p50": 0.125, "p90": 0.145,
                                         "p99": 0.1495})
    assert s["itl_s"] == pytest.approx({"mean": 0.12, "p50": 0.1, "p90": 0.16, "p99": 0.196})
    assert s["e2e_s"] == pytest.approx({"mean": 2.2 / 3, "p50": 0.8, "p90": 0.88, "p99": 0.898})
    assert s["queue_s"] == pytest.approx({"mean": 0.1, "p50": 0.1, "p90": 0.18, "p99": 0.198})
    assert s["goodput_requests_per_s"] == pytest.approx(2 / DURATION)
    assert (s["n_requests"], s["n_preempted"], s["prefix_hit_tokens"], s["steps"]) == (3, 1, 32, 5)
    assert s["peak_kv_use"] == pytest.approx(8 / 20) and s["peak_running"] == 3


def test_summary_table_in_ms(res):
    text = serving_tables.summary_table(res.summary(slo_ttft_s=0.55), "run A")
    lines = text.splitlines()
    assert lines[0] == "run A"
    row = {ln.split()[0]: ln.split()[1:] for ln in lines[2:7]}
    assert row["TTFT"] == ["533.33", "500.00", "580.00", "598.00"]
    assert row["TPOT"] == ["125.00", "125.00", "145.00", "149.50"]
    assert row["ITL"] == ["120.00", "100.00", "160.00", "196.00"]
    assert row["E2E"] == ["733.33", "800.00", "880.00", "898.00"]
    assert row["queueing"] == ["100.00", "100.00", "180.00", "198.00"]
    assert "goodput" in text and "1.538 requests/s" in text
    assert "6 output tokens/s, 2.308 requests/s" in text            # 8 / 1.3 s, 3 / 1.3 s
    assert "40.0% of 20 blocks" in text and "3 sequences" in text
    assert "goodput" not in serving_tables.summary_table(res.summary())


def test_requests_csv_round_trips_with_a_blank_tpot(res):
    text = serving_tables.requests_csv(res)
    assert "nan" not in text.lower()
    df = pd.read_csv(io.StringIO(text))
    assert list(df.columns) == list(res.records())
    assert df["ttft_s"].tolist() == pytest.approx(TTFT)
    assert df["tpot_s"].isna().tolist() == [False, True, False]
    assert df["tpot_s"].dropna().tolist() == pytest.approx(TPOT)
    assert text.splitlines()[2].split(",")[df.columns.get_loc("tpot_s")] == ""
    assert df["output_tokens"].tolist() == [3, 1, 4]
    assert df["prefix_id"].tolist() == [7, -1, 7]


def test_steps_csv(res):
    df = pd.read_csv(io.StringIO(serving_tables.steps_csv(res)))
    assert list(df.columns) == ["start_s", "time_s", "gpu_s", "host_s", "seqs", "tokens",
                                "prefill_tokens", "kv_blocks", "kv_use", "waiting"]
    assert len(df) == 5
    assert df["gpu_s"].tolist() == pytest.approx(df["time_s"]) and not df["host_s"].any()
    assert df["kv_use"].tolist() == pytest.approx([0, 0.1, 0.2, 0.3, 0.4])


def test_summary_json_keeps_keys_and_has_no_nan(res):
    s = res.summary()
    back = json.loads(serving_tables.summary_json(s))
    assert list(back) == list(s) and back["ttft_s"]["p90"] == pytest.approx(0.58)
    odd = {"a": float("nan"), "b": np.int64(3), "c": [np.float64(np.inf), 1.5]}
    text = serving_tables.summary_json(odd)
    assert "NaN" not in text and "Infinity" not in text
    assert json.loads(text) == {"a": None, "b": 3, "c": [None, 1.5]}


def load_points() -> list[tuple[float, dict]]:
    s = make_result().summary()
    return [(1.0, s), (4.0, dict(s, requests_per_s=3.9)), (2.0, s)]


def test_load_table_one_row_per_rate():
    lines = serving_tables.load_table(load_points()).splitlines()
    assert len(lines) == 2 + 3
    first = lines[2].split()
    assert first[0] == "1" and first[3:] == ["0.533", "0.580", "145.00", "0.100"]
    assert lines[3].split()[1] == "3.900"


def test_latency_cdfs():
    a, b = make_result("a"), make_result("b")
    fig = serving_plots.latency_cdfs([a, b], ["a", "b"])
    assert len(fig.axes) == 4
    assert [ax.get_title().split(":")[0] for ax in fig.axes] == ["TTFT", "TPOT", "ITL", "E2E"]
    for ax in fig.axes:
        assert [ln.get_label() for ln in ax.get_lines()] == ["a", "b"]
        assert "(ms)" in ax.get_xlabel()
    x, y = fig.axes[0].get_lines()[0].get_data()
    assert list(x) == pytest.approx([500, 500, 500, 600]) and list(y) == pytest.approx(
        [0, 1 / 3, 2 / 3, 1])
    assert fig.axes[0].get_xscale() == "linear"
    assert "CDF" in fig.get_suptitle()
    with pytest.raises(ValueError):
        serving_plots.latency_cdfs([a, b], ["a"])


def test_time_series_panels_and_decimation():
    fig = serving_plots.time_series(make_result("run A"))
    assert len(fig.axes) == 3 and "run A" in fig.get_suptitle()
    assert [len(ax.get_lines()) for ax in fig.axes] == [2, 2, 2]        # + the 100% line
    prompt, decode = fig.axes[2].get_lines()                 # steps 1 and 3 ran prompt tokens
    assert list(prompt.get_xdata()) == pytest.approx([0.3, 0.9])
    assert list(decode.get_xdata()) == pytest.approx([0.0, 0.6, 1.2])
    assert fig.axes[1].get_lines()[0].get_ydata().max() == pytest.approx(40.0)
    assert "(ms)" in fig.axes[2].get_ylabel() and "(s)" in fig.axes[2].get_xlabel()
    long = serving_plots.time_series(make_result(steps=20_003))
    assert all(len(ln.get_xdata()) <= serving_plots.MAX_POINTS for ax in long.axes
               for ln in ax.get_lines())
    seqs = long.axes[0].get_lines()[0].get_ydata()
    assert seqs.min() == 1 and seqs.max() == 3                        # extremes kept


def test_load_curve_draws_the_capacity_line():
    fig = serving_plots.load_curve(load_points(), capacity_rps=3.0)
    ax = fig.axes[0]
    lines = {ln.get_label(): ln for ln in ax.get_lines()}
    assert set(lines) == {"TTFT mean", "TTFT p90", "queueing mean", "TPOT p90",
                          "estimated capacity"}
    assert list(lines["estimated capacity"].get_xdata()) == [3.0, 3.0]
    assert list(lines["TTFT mean"].get_xdata()) == [1.0, 2.0, 4.0]      # sorted by rate
    assert lines["TPOT p90"].get_ydata()[0] == pytest.approx(145.0)
    assert ax.get_yscale() == "log" and "req" in ax.get_xlabel() and "ms" in ax.get_ylabel()
    plain = serving_plots.load_curve(load_points())
    assert "estimated capacity" not in [ln.get_label() for ln in plain.axes[0].get_lines()]


def test_pareto_front_step_line_and_labels():
    df = pd.DataFrame({"tps_user": [10.0, 20.0, 40.0, 15.0], "per_gpu": [900.0, 700.0, 300.0,
                                                                         500.0]},
                      index=[5, 6, 7, 8])
    fig = serving_plots.pareto_front(df, "tps_user", "per_gpu", [True, True, True, False],
                                     ["tp1", "tp2", "tp4", "dominated"], "front")
    ax = fig.axes[0]
    front = next(ln for ln in ax.get_lines() if ln.get_label() == "Pareto front")
    assert front.get_drawstyle() == "steps-pre"
    assert list(front.get_xdata()) == [10.0, 20.0, 40.0]
    assert sorted(t.get_text() for t in ax.texts) == ["tp1", "tp2", "tp4"]
    assert fig.get_suptitle() == "front"
