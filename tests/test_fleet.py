"""Routers across data-parallel replicas, the lockstep that keeps load-aware ones exact,
parallel workers, and conversations (multi-turn sessions and their prefix-cache hits)."""

import numpy as np
import pytest

import perfmodel as pm
from perfmodel.serving import sessions, traffic
from perfmodel.serving.engine_loop import simulate_one
from perfmodel.serving.fleet import routers as fleet
from perfmodel.serving.fleet.replicas import run_replicas
from perfmodel.serving.requests import Requests
from perfmodel.serving.simulate import simulate
from perfmodel.specs.errors import SpecError
from perfmodel.specs.workload import Parallelism, Workload

MODEL, HW = pm.model("llama-3-8b"), pm.hardware("h100-sxm")


def test_least_requests_reads_completions_round_robin_does_not():
    """r0 (1,000 outputs) and r1 (1 output) start on replicas 0 and 1; at t=1 s r1 has
    finished and r0 has not, so r2 goes to replica 1 under least-requests, to replica 0
    (its turn) under round-robin; r3 at t=1000 s finds both idle: the lowest index."""
    reqs = Requests.of([0.0, 0.001, 1.0, 1000.0], [100, 100, 100, 100], [1000, 1, 5, 5])
    plan = Parallelism(dp=2)
    lr = simulate(MODEL, HW, reqs, plan, router="least-requests")
    rr = simulate(MODEL, HW, reqs, plan, router="round-robin")
    assert lr.finish_s[1] < 1.0 < lr.finish_s[0]
    for res in (lr, rr):
        assert np.all(res.first_token_s > res.arrival_s)
    # r2 waits behind r0's decodes only where it shares r0's replica
    assert lr.first_token_s[2] - 1.0 < rr.first_token_s[2] - 1.0


def test_lockstep_is_exact():
    """Each replica of a lockstep run, simulated alone on the requests the router gave
    it, gives the same times: advancing to each arrival changes nothing."""
    reqs = traffic.generate(120, rate=40, input_len=300, output_len=60,
                            length_dist="lognormal", seed=3)
    one = Parallelism()
    w = Workload.for_model(MODEL)
    from perfmodel.serving.engines.vllm import EngineConfig
    from perfmodel.serving.pricing import kv_pool
    engine = EngineConfig()
    blocks = kv_pool(MODEL, HW, one, w, engine).blocks
    parts, runs = run_replicas(MODEL, HW, one, w, engine, reqs, 3, blocks,
                               "least-tokens", 1, None)
    assert sorted(np.concatenate(parts).tolist()) == list(range(120))
    from perfmodel.serving.fleet.replicas import subset
    for idx, run in zip(parts, runs, strict=True):
        alone = simulate_one(MODEL, HW, one, w, engine, subset(reqs, idx, 3), blocks, None)
        np.testing.assert_allclose(run.first_token_s, alone.first_token_s, rtol=1e-9)
        np.testing.assert_allclose(run.finish_s, alone.finish_s, rtol=1e-9)


def test_workers_give_the_same_result():
    reqs = traffic.generate(200, rate=30, input_len=256, output_len=64, seed=1)
    plan = Parallelism(dp=4)
    one = simulate(MODEL, HW, reqs, plan, workers=1)
    two = simulate(MODEL, HW, reqs, plan, workers=2)
    np.testing.assert_array_equal(one.first_token_s, two.first_token_s)
    np.testing.assert_array_equal(one.token_s, two.token_s)


def test_affinity_keeps_a_session_on_one_replica():
    reqs = traffic.generate(60, rate=6, input_len=100, output_len=20, turns=3,
                            think_time=5.0, seed=2)
    parts = fleet.deal(reqs, 4, "session-affinity")
    home = {}
    for e, idx in enumerate(parts):
        for s in reqs.session_id[idx].tolist():
            assert home.setdefault(s, e) == e
    rr = fleet.deal(reqs, 4, "round-robin")
    where = [{e for e, idx in enumerate(rr) if s in reqs.session_id[idx]} for s in range(20)]
    assert max(len(x) for x in where) > 1       # round-robin splits conversations


def test_generated_conversations_grow_turn_by_turn():
    """Turn k's prompt is turn k-1's prompt and answer plus the new message, which is its
    shared prefix; the turns of a session arrive think_time apart."""
    reqs = traffic.generate(6, rate=1.0, input_len=100, output_len=10, turns=3,
                            think_time=30.0, turn_growth=7)
    s0 = np.flatnonzero(reqs.session_id == 0)
    assert reqs.turn[s0].tolist() == [1, 2, 3]
    assert reqs.input_tokens[s0].tolist() == [100, 117, 134]
    assert reqs.prefix_tokens[s0].tolist() == [0, 110, 127]
    np.testing.assert_allclose(np.diff(reqs.arrival_s[s0]), 30.0)


def test_multi_turn_hits_the_cache_single_shot_does_not():
    reqs = traffic.generate(40, rate=2.0, input_len=400, output_len=50, turns=4,
                            think_time=10.0, turn_growth=50, seed=4)
    multi = simulate(MODEL, HW, reqs).summary()
    single = simulate(MODEL, HW, sessions.single_shot(reqs)).summary()
    own = reqs.input_tokens - reqs.prefix_tokens
    # every later turn hits its whole conversation so far, in 16-token blocks
    hit = (reqs.prefix_tokens // 16 * 16).sum()
    assert multi["prefix_hit_tokens"] == hit
    assert single["prefix_hit_tokens"] == 0
    assert multi["ttft_s"]["mean"] < single["ttft_s"]["mean"]
    assert multi["prefix_hit_rate"] == pytest.approx(hit / reqs.input_tokens.sum())
    assert own.min() >= 1


def test_trace_sessions(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("arrival_s,input_tokens,output_tokens,session_id,turn\n"
                    "0,100,20,a,1\n1,50,5,,\n5,150,20,a,2\n")
    reqs = traffic.read_trace(path)
    assert reqs.prefix_tokens.tolist() == [0, 0, 120]
    assert reqs.session_id.tolist() == [0, -1, 0]
    path.write_text("arrival_s,input_tokens,output_tokens,session_id,turn\n"
                    "0,100,20,a,1\n5,110,20,a,2\n")
    with pytest.raises(SpecError, match="shorter than the conversation so far"):
        traffic.read_trace(path)
    path.write_text("arrival_s,input_tokens,output_tokens,session_id\n0,100,20,a\n")
    with pytest.raises(SpecError, match="go together"):
        traffic.read_trace(path)


@pytest.mark.parametrize("kw,match", [({"router": "random"}, "--router"),
                                      ({"workers": 0}, "--workers")])
def test_bad_fleet_options(kw, match):
    reqs = traffic.generate(4, rate=1, input_len=10, output_len=2)
    with pytest.raises(SpecError, match=match):
        simulate(MODEL, HW, reqs, Parallelism(dp=2), **kw)


@pytest.mark.parametrize("kw,match", [({"turns": 0}, "--turns"),
                                      ({"turns": 2, "think_time": -1.0}, "--think-time"),
                                      ({"turns": 2, "shared_prefix": 10}, "--turns")])
def test_bad_conversation_options(kw, match):
    with pytest.raises(SpecError, match=match):
        traffic.generate(10, rate=1.0, input_len=50, output_len=5, **kw)


def test_dp_attention_ranks_step_in_lockstep():
    """Two ranks of an MoE replica under data-parallel attention: r0 (a 2,000-token
    prompt) on rank 0, r1 (100 tokens) on rank 1. Every step of rank 1 starts when one of
    rank 0's does and lasts as long (the slower rank's time); r1's first token comes with
    r0's, its 100-token prefill paced by the 2,000-token one."""
    from perfmodel.serving.engines.vllm import EngineConfig
    from perfmodel.serving.pricing import kv_pool

    model = pm.model("qwen3-30b-a3b")
    plan = Parallelism(ep=2, attention_dp=True)
    reqs = Requests.of([0.0, 0.0], [2000, 100], [50, 5])
    res = simulate(model, HW, reqs, plan)
    assert res.first_token_s[1] == pytest.approx(res.first_token_s[0])
    w, engine = Workload.for_model(model), EngineConfig()
    blocks = kv_pool(model, HW, plan, w, engine).blocks
    _, runs = run_replicas(model, HW, plan, w, engine, reqs, 2, blocks, "round-robin", 1,
                           None)
    lead = {round(s[0], 12): s[1] for s in runs[0].log}
    for start, dt, *_ in runs[1].log:
        assert lead[round(start, 12)] == dt
