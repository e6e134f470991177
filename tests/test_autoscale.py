"""Autoscaling replay (``serving.fleet.autoscale``, ``fleet.scaling``, ``fleet.startup``,
``serving.rate_shape``): the policy's decisions on a toy metric series derived by hand,
the replicas' lifecycle in a replay, a min = max fleet identical to the fixed one, the
start-up's arithmetic, the shaped arrivals, and the CLI."""

import json
import math

import numpy as np
import pytest
from typer.testing import CliRunner

from perfmodel.cli.app import app
from perfmodel.serving import traffic
from perfmodel.serving.fleet.autoscale import Autoscaler, policy
from perfmodel.serving.fleet.startup import graph_sizes, startup
from perfmodel.serving.rate_shape import parse
from perfmodel.serving.simulate import simulate
from perfmodel.specs import load
from perfmodel.specs.errors import SpecError
from perfmodel.specs.workload import Parallelism

runner = CliRunner()
BASE = ["simulate", "-m", "llama-3-8b", "-H", "h100-sxm", "--no-progress"]

# (t, summed queue over the ready replicas or None, ready, starting) -> replicas wanted,
# queue target 4, 1-12 replicas, decisions every 15 s, scale-down window 45 s, tolerance 0.1
SERIES = [
    (15, 4, 1, 0, 1),      # ratio 4/4 = 1: within tolerance, the current 1
    (30, 20, 1, 0, 5),     # ratio 5: ceil(5 x 1) = 5; the up limit max(2, 1 + 4) = 5
    (45, 0, 1, 4, 5),      # proposal 0, but the window's largest (30 s: 5) holds 5
    (60, 60, 1, 4, 10),    # 60/4 = 15 > 1 with 4 starting: again 60/(5 x 4) = 3,
                           # ceil(3 x 5) = 15, limited to max(10, 9) = 10
    (75, 18, 4, 6, 10),    # 18/16 = 1.125 > 1.1, but 18/(10 x 4) = 0.45: the current 10
    (90, 42, 10, 0, 10),   # 42/40 = 1.05: within tolerance
    (105, 8, 10, 0, 10),   # proposal ceil(0.2 x 10) = 2; window max (60 s: 15) -> 10
    (120, 8, 10, 0, 10),   # window 75..120: 10, 10, 2, 2 -> 10
    (135, 8, 10, 0, 10),   # window 90..135: 10, 2, 2, 2 -> 10
    (150, 8, 10, 0, 2),    # window 105..150: all 2 -> 2
    (165, None, 2, 0, 2),  # no metric: the current 2
    (180, 0, 2, 0, 2),     # proposal 0; window 135..180: 2, 2, 2, 0 -> 2
    (195, 0, 2, 0, 2),     # window 150..195: 2, 2, 0, 0
    (210, 0, 2, 0, 2),     # window 165..210: 2, 0, 0, 0
    (225, 0, 2, 0, 1),     # window 180..225: all 0 -> clamped to --min-replicas 1
]


def test_hpa_decisions_on_a_toy_series_match_the_hand_derivation():
    scaler = Autoscaler(policy("queue", 4.0, 1, 12, 15.0, 45.0))
    got = [scaler.decide(t, m, ready, starting) for t, m, ready, starting, _ in SERIES]
    assert got == [row[-1] for row in SERIES]


def test_ttft_target_scales_the_ready_replicas_by_the_ratio():
    """An object metric: p90 TTFT 2 s against 1 s on 3 replicas -> ceil(2 x 3) = 6; 0.5 s
    -> ceil(0.5 x 3) = 2 (scale-down window 0)."""
    assert Autoscaler(policy("ttft", None, 1, 8, 15.0, 0.0, slo_ttft=1.0)).decide(
        15.0, 2.0, 3, 0) == 6
    assert Autoscaler(policy("ttft", 1.0, 1, 8, 15.0, 0.0)).decide(15.0, 0.5, 3, 0) == 2


def test_a_decision_without_a_metric_is_null_in_json():
    from perfmodel.serving.fleet.scaling import Scaled

    sc = Scaled(policy("ttft", 1.0, 1, 2), 10.0, 1, decisions=[(15.0, 1, 0, 0, 1, math.nan)])
    assert json.loads(json.dumps(sc.to_dict()))["replicas_over_time"]["metric"] == [None]


@pytest.mark.parametrize("args, word", [
    (("bogus", None, 1, 2), "--autoscale"), (("kv", 1.5, 1, 2), "--autoscale-target"),
    (("queue", None, 3, 2), "--max-replicas"), (("ttft", None, 1, 2), "--slo-ttft")])
def test_bad_policy_is_one_line_naming_the_option(args, word):
    with pytest.raises(SpecError, match=word):
        policy(*args)


def test_startup_adds_weights_load_graph_capture_and_the_engine_start():
    """vLLM captures [1, 2, 4] + 8..248 by 8 + 256..512 by 16 = 3 + 31 + 17 = 51 graphs at
    max_num_seqs 256; 16 GB at 0.547 GB/s = 29.25 s."""
    assert (graph_sizes(256), graph_sizes(4), graph_sizes(1), graph_sizes(200)) == \
        (51, 4, 2, 3 + 31 + 10)
    s = startup(16e9, 256, True)
    assert s.weights_s == pytest.approx(16e9 / 0.547e9)
    assert s.graphs_s == pytest.approx(51 * 0.057)
    assert s.total_s == pytest.approx(30.0 + 16e9 / 0.547e9 + 51 * 0.057)
    assert startup(16e9, 256, False).graphs_s == 0.0


def test_sine_rate_puts_the_hand_derived_share_in_the_high_half_period():
    """Over whole periods of rate r(1 + A sin(2 pi t/P)), the first half of each period
    holds (1 + 2A/pi)/2 of the arrivals: 0.7546 at A = 0.8; seeded, deterministic."""
    shape = parse("sine:100:0.8")
    reqs = traffic.generate(20000, rate=20.0, input_len=8, output_len=4, rate_shape=shape)
    t = reqs.arrival_s
    whole = t[t < 100 * math.floor(t[-1] / 100)]
    share = np.mean((whole % 100) < 50)
    assert share == pytest.approx((1 + 2 * 0.8 / math.pi) / 2, abs=0.015)
    assert len(whole) / (100 * math.floor(t[-1] / 100)) == pytest.approx(20.0, rel=0.03)
    again = traffic.generate(20000, rate=20.0, input_len=8, output_len=4, rate_shape=shape)
    assert np.array_equal(t, again.arrival_s) and np.all(np.diff(t) >= 0)
    for bad in ("sine:0:0.5", "sine:10:1", "cosine:10:0.5", "sine:x:0.5"):
        with pytest.raises(SpecError, match="--rate-shape"):
            parse(bad)


@pytest.fixture(scope="module")
def llama():
    return load.model("llama-3-8b"), load.hardware("h100-sxm")


def test_min_equal_max_is_the_fixed_fleet_bit_for_bit(llama):
    """No decision can change a fleet of 2 to 2: the autoscaled replay deals round-robin
    as the fixed fleet does, and steps the same engines."""
    m, hw = llama
    reqs = traffic.generate(60, rate=20.0, input_len=256, output_len=16, seed=3)
    fixed = simulate(m, hw, reqs, Parallelism(dp=2))
    scaled = simulate(m, hw, reqs, autoscale=policy("queue", None, 2, 2, 1.0, 0.0))
    for name in ("ttft_s", "finish_s", "token_s"):
        assert np.array_equal(getattr(fixed, name), getattr(scaled, name))
    assert len(scaled.info["autoscale"].spans) == 2


def test_replay_launches_drains_and_counts_gpu_time(llama):
    """A burst then quiet: the fleet grows, a launched replica takes no request before it
    is ready, a draining one none after its drain, and GPU-seconds are the spans'."""
    m, hw = llama
    reqs = traffic.generate(400, rate=20.0, input_len=2048, output_len=16,
                            rate_shape=parse("sine:10:0.9"), seed=1)
    pol = policy("queue", 2.0, 1, 3, 1.0, 2.0)
    res = simulate(m, hw, reqs, autoscale=pol, startup_s=2.0)
    sc = res.info["autoscale"]
    assert len(sc.spans) > 1 and max(d[4] for d in sc.decisions) <= 3
    assert all(d[1] + d[2] <= 3 for d in sc.decisions)
    assert sc.gpu_seconds == pytest.approx(sum(s[3] - s[0] for s in sc.spans))
    drained = 0
    for (launch, ready, drain, stop), (first, last) in zip(sc.spans, sc.served, strict=True):
        assert ready == launch or ready == pytest.approx(launch + 2.0)
        assert stop >= launch
        if not np.isnan(first):
            assert first >= ready and (np.isnan(drain) or last <= drain)
        if not np.isnan(drain):
            drained += 1
            assert stop >= drain
    assert drained >= 1
    assert np.all(np.isfinite(res.ttft_s)) and len(res) == 400
    assert sc.to_dict()["replicas_over_time"]["t_s"][0] == 1.0


def test_cli_compares_the_autoscaled_fleet_with_fixed_min_and_max(tmp_path):
    prices = tmp_path / "p.yaml"
    prices.write_text("source: test\nusd_per_gpu_hour:\n  h100-sxm: 2.0\n")
    args = [*BASE, "--rate", "40", "--rate-shape", "sine:6:0.8", "--num-requests", "160",
            "--input-len", "512", "--output-len", "16", "--autoscale", "queue",
            "--min-replicas", "1", "--max-replicas", "2", "--scale-interval", "1",
            "--scale-down-window", "2", "--startup-s", "1", "--slo-ttft", "0.5",
            "--prices", str(prices), "--out", str(tmp_path / "out")]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "GPU-hours" in result.stdout and "fixed 2" in result.stdout
    assert (tmp_path / "out" / "autoscale.png").stat().st_size > 0
    data = json.loads((tmp_path / "out" / "autoscale.json").read_text())
    fleets = {f["fleet"]: f for f in data["fleets"]}
    assert set(fleets) == {"autoscaled queue", "fixed 1", "fixed 2"}
    assert fleets["fixed 2"]["gpu_hours"] == pytest.approx(2 * fleets["fixed 1"]["gpu_hours"],
                                                           rel=0.2)
    assert fleets["fixed 2"]["usd"] == pytest.approx(2.0 * fleets["fixed 2"]["gpu_hours"])
    assert all(0 <= f["slo_attainment"] <= 1 for f in fleets.values())
    low, high = fleets["fixed 1"]["gpu_hours"], fleets["fixed 2"]["gpu_hours"]
    assert low * 0.99 <= fleets["autoscaled queue"]["gpu_hours"] <= high * 1.01
    over = data["autoscale"]["replicas_over_time"]
    assert len(over["t_s"]) == len(over["serving"]) >= 2
    assert all(1 <= w <= 2 for w in over["wanted"])


@pytest.mark.parametrize("extra, word", [
    (["--autoscale", "nope"], "--autoscale"),
    (["--autoscale", "queue", "--min-replicas", "3", "--max-replicas", "2"], "--max-replicas"),
    (["--autoscale", "queue", "--dp", "2"], "--dp"),
    (["--rate-shape", "sine:10"], "--rate-shape")])
def test_cli_bad_input_is_one_line(extra, word):
    result = runner.invoke(app, [*BASE, "--rate", "5", "--num-requests", "10", *extra])
    assert result.exit_code != 0
    assert word in result.output and "Traceback" not in result.output
