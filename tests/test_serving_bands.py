"""The simulation band on a sample (``serving.bands``): the sample's size, the prefix's
centre taken from the whole run, and the edges drawn as factors of the whole run's centre."""

from __future__ import annotations

import numpy as np
import pytest

import perfmodel as pm
from perfmodel.serving import bands
from perfmodel.serving.simulate import simulate
from perfmodel.serving.traffic import generate


def test_sample_size() -> None:
    """All of a small run; a twelfth of a large one, never under the minimum."""
    assert bands.sample_size(bands.SAMPLE_MIN) == bands.SAMPLE_MIN
    assert bands.sample_size(bands.SAMPLE_MIN + 1) == bands.SAMPLE_MIN
    assert bands.sample_size(120_000) == 10_000


def test_scaled_moves_each_number_by_its_own_factor() -> None:
    centre = {"e2e_s": {"mean": 2.0, "p50": 1.0}, "throughput_tokens_per_s": 100.0,
              "label": "x", "zero": 5.0}
    part = {"e2e_s": {"mean": 1.0, "p50": 0.5}, "throughput_tokens_per_s": 50.0,
            "label": "x", "zero": 0.0}
    edge = {"e2e_s": {"mean": 1.5, "p50": 0.25}, "throughput_tokens_per_s": 40.0,
            "label": "x", "zero": 3.0}
    out = bands.scaled(centre, part, edge)
    assert out["e2e_s"] == {"mean": 3.0, "p50": 0.5}
    assert out["throughput_tokens_per_s"] == pytest.approx(80.0)
    assert out["label"] == "x" and out["zero"] == 5.0


def _run(n: int, rate: float):
    m, hw = pm.model("llama-3-8b"), pm.hardware("h100-sxm")
    reqs = generate(n, rate=rate, input_len=256, output_len=24, seed=3)
    return m, hw, reqs, simulate(m, hw, reqs)


def test_prefix_centre_is_the_whole_runs_head() -> None:
    """Causality, which the sample's ratio rests on: the first half of a prefix, run alone,
    gets the times it got in the whole run (light load: it finished before the prefix's
    last arrival)."""
    m, hw, reqs, whole = _run(120, 4.0)
    alone = simulate(m, hw, reqs.take(np.arange(60)))
    a, b = bands.head(whole, 30), bands.head(alone, 30)
    assert np.allclose(a.finish_s, b.finish_s) and np.allclose(a.token_s, b.token_s)
    assert bands.head(whole, 30).summary()["n_requests"] == 30


def test_edges_on_a_sample(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the minimum lowered, a run's edges come from a prefix: each edge statistic is
    the whole run's centre times the prefix head's edge over its centre, so the band holds
    the centre, and the edge runs see only the prefix."""
    monkeypatch.setattr(bands, "SAMPLE_MIN", 30)
    m, hw, reqs, whole = _run(400, 6.0)
    seen = []

    def run(q, edge):
        seen.append((len(q), edge))
        return simulate(m, hw, q, edge=edge)

    low, high = bands.edge_summaries(reqs, whole, run)
    k = bands.sample_size(len(reqs))
    assert seen == [(k, 0), (k, 1)] and k < len(reqs)
    centre = whole.summary()
    for key in ("e2e_s", "tpot_s", "ttft_s"):
        assert low[key]["p50"] < centre[key]["p50"] < high[key]["p50"]
    ratio = bands.head(run(reqs.take(np.arange(k)), 1), k // 2).summary()["e2e_s"]["mean"] / \
        bands.head(whole, k // 2).summary()["e2e_s"]["mean"]
    assert high["e2e_s"]["mean"] == pytest.approx(centre["e2e_s"]["mean"] * ratio, rel=1e-9)


def test_small_run_edges_are_whole_runs() -> None:
    m, hw, reqs, whole = _run(20, 6.0)
    low, high = bands.edge_summaries(reqs, whole, lambda q, e: simulate(m, hw, q, edge=e))
    assert low == simulate(m, hw, reqs, edge=0).summary()
    assert high["e2e_s"]["mean"] > whole.summary()["e2e_s"]["mean"]
