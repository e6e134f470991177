"""Load-aware routers stay exact: the lockstep (every replica, and under data-parallel
attention every rank of a replica, advanced to each arrival in one process) against a
brute-force reference that re-simulates, for each arrival, every replica from scratch on
the requests placed so far and reads its load from the finished run."""

import json

import numpy as np
import pytest
from typer.testing import CliRunner

import perfmodel as pm
from perfmodel.cli.app import app
from perfmodel.serving import traffic
from perfmodel.serving.engine_loop import record, start
from perfmodel.serving.engines.vllm import EngineConfig
from perfmodel.serving.fleet import routers as fleet
from perfmodel.serving.fleet.replicas import run_replicas, subset
from perfmodel.serving.pricing import kv_pool
from perfmodel.specs.workload import Parallelism, Workload

HW = pm.hardware("h100-sxm")
MOE = pm.model("qwen3-30b-a3b")


def _published(run, t):
    """(waiting, KV blocks in use) the engine published after its last step ended by t."""
    rows = [r for r in run.log if r[0] + r[1] <= t]
    return (rows[-1][6], rows[-1][5]) if rows else (0, 0)


def _brute(model, one, reqs, dp, ways, router):
    """Each arrival placed by re-simulating every replica's ranks from scratch (in lockstep
    with each other, ``fleet.ranks_lockstep``) on what they hold so far."""
    w, engine = Workload.for_model(model), EngineConfig()
    blocks = kv_pool(model, HW, one, w, engine).blocks
    engines = dp * ways
    held = [[] for _ in range(engines)]

    def replica(g):
        ranks = [(r, np.array(held[g * ways + r], np.int64)) for r in range(ways)]
        ranks = [(r, idx) for r, idx in ranks if len(idx)]
        runs = [start(model, HW, one, w, engine, subset(reqs, idx, engines), blocks)
                for _, idx in ranks]
        if len(runs) > 1:
            fleet.ranks_lockstep(runs, record)
        elif runs:
            from perfmodel.serving.engine_loop import advance
            advance(runs[0])
        return {r: (idx, run) for (r, idx), run in zip(ranks, runs, strict=True)}

    tokens = reqs.input_tokens + reqs.output_tokens
    rng = np.random.default_rng(0)
    for i in range(len(reqs)):
        t = float(reqs.arrival_s[i])
        loads = []
        for g in range(dp):
            done = replica(g)
            ranks = []
            for r in range(ways):
                if r not in done:
                    ranks.append((0, 0, 0, 0, blocks))
                    continue
                idx, run = done[r]
                left = idx[run.finish_s > t]
                ranks.append((len(left), int(tokens[left].sum()), *_published(run, t),
                              blocks))
            loads.append(ranks)
        g = fleet._replica(loads, router, rng)
        held[g * ways + fleet._rank(loads[g], router)].append(i)
    final = {g: replica(g) for g in range(dp)}
    return held, final


@pytest.mark.parametrize("router,dp,ways", [("least-requests", 2, 2), ("least-tokens", 1, 3),
                                            ("queue-kv", 2, 2), ("queue-kv", 3, 1),
                                            ("power-of-two", 3, 1)])
def test_lockstep_matches_brute_force(router, dp, ways):
    model = MOE if ways > 1 else pm.model("llama-3-8b")
    one = Parallelism(ep=ways, attention_dp=True) if ways > 1 else Parallelism()
    reqs = traffic.generate(20, rate=40, input_len=300, output_len=6,
                            length_dist="lognormal", arrival="gamma", burstiness=0.3, seed=7)
    held, final = _brute(model, one, reqs, dp, ways, router)
    w, engine = Workload.for_model(model), EngineConfig()
    blocks = kv_pool(model, HW, one, w, engine).blocks
    parts, runs = run_replicas(model, HW, one, w, engine, reqs, dp * ways, blocks, router,
                               1, None)
    expect = [np.array(h, np.int64) for h in held if h]
    assert [p.tolist() for p in parts] == [e.tolist() for e in expect]
    alone = [final[e // ways][e % ways][1] for e in range(dp * ways) if held[e]]
    for run, ref in zip(runs, alone, strict=True):
        np.testing.assert_array_equal(run.first_token_s, ref.first_token_s)
        np.testing.assert_array_equal(run.finish_s, ref.finish_s)


def test_rank_choice_is_sglangs_dp_controller():
    """SGLang's total_requests: the fewest running + waiting, ties to the lowest rank;
    total_tokens: the fewest tokens, ties by requests."""
    ranks = [(3, 900, 0, 0, 1), (2, 900, 0, 0, 1), (2, 500, 0, 0, 1), (5, 500, 0, 0, 1)]
    assert fleet._rank(ranks, "least-requests") == 1
    assert fleet._rank(ranks, "least-tokens") == 2


def test_queue_kv_scores_as_llm_d():
    """Queue score (max - q) / (max - min), 1 when all equal, plus 1 - KV usage: a longer
    queue loses to a fuller cache only when the cache gap outweighs the queue's."""
    loads = [[(0, 0, 4, 10, 100)], [(0, 0, 0, 90, 100)], [(0, 0, 2, 20, 100)]]
    # scores: 0 + 0.9, 1 + 0.1, 0.5 + 0.8
    assert fleet._replica(loads, "queue-kv") == 2
    same = [[(0, 0, 3, 50, 100)], [(0, 0, 3, 40, 100)]]
    assert fleet._replica(same, "queue-kv") == 1


def test_cli_load_aware_router_with_attention_dp():
    res = CliRunner().invoke(app, [
        "simulate", "-m", "qwen3-30b-a3b", "--hardware", "h100-sxm", "--ep", "2",
        "--attention-dp", "--dp", "2", "--router", "least-requests", "--rate", "20",
        "--num-requests", "24", "--input-len", "256", "--output-len", "16", "-f", "json",
        "--no-band", "--no-progress"])
    assert res.exit_code == 0, res.output
    summary = json.loads(res.output)
    assert summary["n_requests"] == 24
    assert summary["ttft_s"]["p50"] > 0


def test_power_of_two_keeps_the_less_busy_of_two_draws():
    """Three replicas, 1, 5 and 9 requests in flight: the busiest loses every draw it is
    in, the least busy wins every draw it is in (two of three pairs hold it)."""
    loads = [[(5, 0, 0, 0, 1)], [(1, 0, 0, 0, 1)], [(9, 0, 0, 0, 1)]]
    rng = np.random.default_rng(1)
    picks = np.array([fleet._replica(loads, "power-of-two", rng) for _ in range(3000)])
    assert not np.any(picks == 2)
    assert abs(np.mean(picks == 1) - 2 / 3) < 0.03
