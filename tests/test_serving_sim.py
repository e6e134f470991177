"""The serving simulator end to end (``serving.simulate``): a lone request costs what the
estimate says, every request gets its tokens in order, the engine's limits hold, KV
pressure preempts, a shared prefix is hit, continuous batching beats the static baseline,
a closed loop keeps its users, queues grow past capacity, and the priced-ahead replay gives
exactly what a plain step-by-step loop gives."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

import perfmodel as pm
from perfmodel.serving.engines.state import Batch
from perfmodel.serving.engines.vllm import EngineConfig, VLLMState
from perfmodel.serving.pricing import StepPricer, capacity_rps, kv_pool
from perfmodel.serving.requests import Requests
from perfmodel.serving.simulate import simulate
from perfmodel.serving.traffic import generate
from perfmodel.specs.errors import SpecError
from perfmodel.specs.workload import Parallelism, Workload

LLAMA = pm.model("llama-3-8b")
QWEN = pm.model("qwen3-8b")
H100 = pm.hardware("h100-sxm")


def _util_for(blocks: int, engine: EngineConfig, model=QWEN, hw=H100) -> EngineConfig:
    """``engine`` with the --gpu-memory-utilization that leaves exactly ``blocks`` KV blocks
    (vLLM's rule, ``engine.kv_pool``: usable = share x memory - reserve, less weights and
    the profile run's activations)."""
    w = Workload.for_model(model)
    p = kv_pool(model, hw, Parallelism(), w, engine)
    util = (hw.runtime_reserved_bytes + p.weights_bytes + p.activation_bytes
            + (blocks + 0.5) * p.bytes_per_block) / hw.memory_bytes
    out = replace(engine, gpu_memory_utilization=util)
    assert kv_pool(model, hw, Parallelism(), w, out).blocks == blocks
    return out


def _tokens(res, i: int) -> np.ndarray:
    return res.token_s[res.token_offsets[i]:res.token_offsets[i + 1]]


def _check(res, engine: EngineConfig) -> None:
    """What holds of every run on one engine."""
    req = res.requests
    assert np.all(np.isfinite(res.token_s)) and np.all(res.arrival_s >= 0)
    assert np.array_equal(np.diff(res.token_offsets), req.output_tokens)
    for i in range(len(res)):
        t = _tokens(res, i)
        assert np.all(np.diff(t) > 0)
        assert t[0] == res.first_token_s[i] and t[-1] == res.finish_s[i]
    assert np.all(res.queue_s >= 0)
    assert np.all(res.ttft_s >= res.queue_s) and np.all(res.e2e_s >= res.ttft_s)
    s = res.steps
    assert np.all(s.time_s > 0) and np.all(s.tokens >= s.seqs) and np.all(s.seqs >= 1)
    assert s.tokens.max() <= engine.max_num_batched_tokens
    assert s.seqs.max() <= engine.max_num_seqs
    assert s.kv_blocks.max() <= res.kv_blocks_total and s.waiting.min() >= 0
    assert np.all(s.start_s[1:] >= s.start_s[:-1] + s.time_s[:-1])
    assert np.all(np.isin(res.token_s, s.start_s + s.time_s))   # tokens come at step ends
    assert s.kv_blocks[-1] == 0 or engine.prefix_caching           # all blocks given back
    # each request computes its prompt less its prefix hit once, then one token per output
    # token after the first; preemption only adds recomputation, padding adds rows
    least = int((req.input_tokens - res.prefix_hit_tokens + req.output_tokens - 1).sum())
    exact = engine.scheduler == "continuous" and not res.preemptions.any()
    assert s.tokens.sum() == least if exact else s.tokens.sum() >= least


# a lone request ---------------------------------------------------------------------------

@pytest.mark.parametrize("model", [LLAMA, QWEN], ids=["llama-3-8b", "qwen3-8b"])
@pytest.mark.parametrize("prompt, out", [(100, 10), (1000, 50), (5000, 20), (2, 2)])
def test_a_lone_request_costs_the_estimate(model, prompt, out):
    est = pm.estimate(H100, model, Workload(prompt_len=prompt, gen_len=out, cuda_graphs=True))
    far = 1000.0
    res = simulate(model, H100, Requests.of([0.0, far], [prompt] * 2, [out] * 2))
    assert res.ttft_s == pytest.approx([est.ttft_s] * 2, rel=1e-9)
    assert res.tpot_s == pytest.approx([est.tpot_s] * 2, rel=1e-9)
    assert res.scheduled_s.tolist() == [0.0, far]
    assert res.steps.seqs.max() == 1
    _check(res, EngineConfig())


def test_a_one_token_prompt_runs_as_a_decode_step():
    """A step whose every request computes one token is a decode step to the engine (vLLM
    v1's uniform-decode batch, replayed as a CUDA graph), a one-token prompt included; the
    estimate prices any prompt as a prefill, with host launches, so here the two differ."""
    res = simulate(LLAMA, H100, Requests.of([0.0], [1], [3]))
    pricer = StepPricer(LLAMA, H100, Parallelism(), Workload.for_model(LLAMA), EngineConfig())
    step = Batch(np.array([0]), np.array([1]), np.array([1]), False, True, 0)
    assert res.ttft_s[0] == pytest.approx(pricer.times([step])[0], rel=1e-12)
    assert res.steps.prefill_tokens.sum() == 0
    est = pm.estimate(H100, LLAMA, Workload(prompt_len=1, gen_len=3, cuda_graphs=True))
    assert res.ttft_s[0] < est.ttft_s


def test_a_prompt_longer_than_the_budget_is_prefilled_in_chunks():
    engine = EngineConfig(max_num_batched_tokens=512)
    res = simulate(LLAMA, H100, Requests.of([0.0], [2000], [4]), engine=engine)
    chunks = [(512, 512), (512, 1024), (512, 1536), (464, 2000)]
    assert res.steps.tokens[:4].tolist() == [512, 512, 512, 464]
    pricer = StepPricer(LLAMA, H100, Parallelism(), Workload.for_model(LLAMA), engine)
    t = 0.0
    for new, ctx in chunks:
        t += float(pricer.times([Batch(np.array([0]), np.array([new]), np.array([ctx]),
                                       True, True, 0)])[0])
    assert res.ttft_s[0] == pytest.approx(t, rel=1e-12)
    one = pm.estimate(H100, LLAMA, Workload(prompt_len=2000, gen_len=4, cuda_graphs=True))
    assert res.ttft_s[0] > one.ttft_s * 1.05        # four passes over the weights, not one
    _check(res, engine)


# the engine's limits ----------------------------------------------------------------------

def test_no_step_exceeds_the_token_budget_or_the_seats():
    engine = EngineConfig(max_num_batched_tokens=256, max_num_seqs=4)
    rng = np.random.default_rng(5)
    req = Requests.of(np.zeros(12), rng.integers(50, 700, 12), rng.integers(2, 30, 12))
    res = simulate(QWEN, H100, req, engine=engine)
    _check(res, engine)
    assert res.steps.tokens.max() == 256 and res.steps.seqs.max() == 4   # both reached
    assert res.summary()["peak_running"] == 4


def test_without_chunked_prefill_a_prompt_within_the_budget_runs_in_one_step():
    engine = EngineConfig(max_num_batched_tokens=1024, chunked_prefill=False)
    req = Requests.of([0.0, 0.01], [1000, 900], [5, 5])
    res = simulate(LLAMA, H100, req, engine=engine)
    assert res.steps.tokens[0] == 1000 and res.steps.prefill_tokens[0] == 1000
    assert 900 in res.steps.prefill_tokens.tolist()         # the second whole, never split
    est = pm.estimate(H100, LLAMA, Workload(prompt_len=1000, gen_len=5, cuda_graphs=True))
    assert res.ttft_s[0] == pytest.approx(est.ttft_s, rel=1e-9)
    _check(res, engine)


def test_without_chunked_prefill_a_request_longer_than_the_budget_is_refused():
    engine = EngineConfig(max_num_batched_tokens=512, chunked_prefill=False)
    with pytest.raises(SpecError, match="--max-num-batched-tokens"):
        simulate(LLAMA, H100, Requests.of([0.0], [600], [3]), engine=engine)


def test_a_small_kv_pool_preempts_and_every_request_still_finishes():
    engine = _util_for(60, EngineConfig(max_num_seqs=8))
    req = Requests.of(np.zeros(6), [64] * 6, [400] * 6)     # 29 blocks each at the end
    res = simulate(QWEN, H100, req, engine=engine)
    assert res.kv_blocks_total == 60
    assert res.summary()["n_preempted"] > 0
    assert res.steps.kv_blocks.max() <= 60 and res.summary()["peak_kv_use"] > 0.9
    _check(res, engine)
    big = simulate(QWEN, H100, req, engine=EngineConfig(max_num_seqs=8))
    assert big.summary()["n_preempted"] == 0 and big.finish_s.max() < res.finish_s.max()
    _check(big, EngineConfig(max_num_seqs=8))


# prefix caching ---------------------------------------------------------------------------

def test_a_shared_prefix_is_hit_by_every_later_request():
    arrival = [0.0, 5.0, 10.0, 15.0, 20.0, 25.0]
    inputs = [2100, 2100, 2100, 2000, 2048, 2048]
    pid, ptok = [0, 0, 0, 0, 1, 1], [2000, 2000, 2000, 2000, 2048, 2048]
    req = Requests.of(arrival, inputs, [8] * 6, pid, ptok)
    res = simulate(LLAMA, H100, req)
    # 2000 tokens: 125 full blocks; 2048 tokens of prompt, all prefix: 127, not 128
    assert res.prefix_hit_tokens.tolist() == [0, 2000, 2000, 1984, 0, 2032]
    assert np.all(res.ttft_s[1:3] < res.ttft_s[0] / 5)
    pricer = StepPricer(LLAMA, H100, Parallelism(), Workload.for_model(LLAMA), EngineConfig())
    hit = pricer.times([Batch(np.array([0]), np.array([100]), np.array([2100]), 1, 1, 0)])[0]
    assert res.ttft_s[1] == pytest.approx(hit, rel=1e-12)
    _check(res, EngineConfig())
    off = EngineConfig(prefix_caching=False)
    cold = simulate(LLAMA, H100, req, engine=off)
    assert not cold.prefix_hit_tokens.any()
    assert cold.ttft_s[:3] == pytest.approx([res.ttft_s[0]] * 3, rel=1e-12)
    _check(cold, off)


# load ---------------------------------------------------------------------------------------

def test_continuous_batching_beats_the_static_baseline():
    req = generate(48, rate=40.0, input_len=200, output_len=150, length_dist="lognormal",
                   spread=1.0, seed=3)
    cont = EngineConfig(max_num_seqs=8)
    stat = replace(cont, scheduler="static")
    a, b = simulate(QWEN, H100, req, engine=cont), simulate(QWEN, H100, req, engine=stat)
    _check(a, cont)
    _check(b, stat)
    assert a.throughput_tokens_per_s > 1.3 * b.throughput_tokens_per_s
    assert a.summary()["queue_s"]["mean"] < b.summary()["queue_s"]["mean"]

    def joins_a_running_batch(res) -> bool:
        s, f = res.scheduled_s, res.finish_s
        return bool(np.any((s[None, :] < s[:, None]) & (f[None, :] > s[:, None])))

    assert not joins_a_running_batch(b) and joins_a_running_batch(a)


def test_a_closed_loop_never_has_more_than_its_users_in_flight():
    users = 4
    req = generate(30, concurrency=users, input_len=300, output_len=50,
                   length_dist="uniform", seed=1)
    engine = EngineConfig(max_num_seqs=16)
    res = simulate(QWEN, H100, req, engine=engine)
    _check(res, engine)
    t = res.arrival_s
    flight = ((t[None, :] <= t[:, None]) & (res.finish_s[None, :] > t[:, None])).sum(1)
    assert flight.max() == users
    assert np.all(t[:users] == 0)
    assert np.all(np.isin(t[users:], res.finish_s))        # each sent as one finished
    assert res.steps.seqs.max() <= users


def test_queueing_grows_without_bound_past_capacity():
    engine = EngineConfig(max_num_seqs=8)
    cap = capacity_rps(QWEN, H100, Parallelism(), Workload(prompt_len=200, gen_len=64),
                       engine)

    def queue(n: int, load: float) -> float:
        req = generate(n, rate=load * cap, arrival="constant", input_len=200, output_len=64)
        res = simulate(QWEN, H100, req, engine=engine)
        _check(res, engine)
        return float(res.queue_s.mean())

    light, heavy, longer = queue(40, 0.5), queue(40, 2.0), queue(80, 2.0)
    assert heavy > 20 * max(light, 1e-3)
    assert longer > 1.6 * heavy            # twice the requests, about twice the wait


# determinism and fuzz ---------------------------------------------------------------------

def _random_case(rng: np.random.Generator, model=QWEN) -> tuple[Requests, EngineConfig]:
    n = int(rng.integers(2, 16))
    arrival = np.cumsum(rng.exponential(1 / rng.uniform(2, 200), n))
    if rng.random() < 0.3:
        arrival = np.round(arrival, 1)     # ties
    inputs, outputs = rng.integers(1, 1200, n), rng.integers(1, 60, n)
    shared = rng.random() < 0.5
    pid = np.where(rng.random(n) < 0.6, rng.integers(0, 2, n), -1) if shared else None
    ptok = np.minimum(inputs, rng.choice([16, 100, 600])) if shared else None
    chunked = rng.random() < 0.7
    engine = EngineConfig(max_num_batched_tokens=int(rng.choice([256, 512, 2048]))
                          if chunked else 2048, chunked_prefill=chunked,
                          max_num_seqs=int(rng.integers(1, 9)),
                          block_size=int(rng.choice([16, 32])),
                          prefix_caching=bool(rng.random() < 0.8),
                          scheduler="static" if rng.random() < 0.2 else "continuous")
    if rng.random() < 0.5:                 # a pool just big enough for the longest request
        longest = int(max(-(-(inputs + outputs) // engine.block_size)))
        engine = _util_for(longest + int(rng.integers(0, 60)), engine, model)
    closed = int(rng.integers(1, 5)) if rng.random() < 0.2 else 0
    if closed:
        arrival = np.zeros(n) if rng.random() < 0.5 else rng.uniform(0, 0.05, n)
    return Requests.of(arrival, inputs, outputs, pid, ptok, closed_loop=closed), engine


def test_same_inputs_give_the_same_run():
    engine = _util_for(80, EngineConfig(max_num_batched_tokens=512, max_num_seqs=6))
    req = generate(20, rate=30.0, input_len=300, output_len=120, length_dist="lognormal",
                   shared_prefix=200, seed=9)
    a, b = simulate(QWEN, H100, req, engine=engine), simulate(QWEN, H100, req, engine=engine)
    assert a.preemptions.any() and a.prefix_hit_tokens.any()
    for name in ("arrival_s", "scheduled_s", "first_token_s", "finish_s", "token_s",
                 "preemptions", "prefix_hit_tokens"):
        assert np.array_equal(getattr(a, name), getattr(b, name))
    for name in ("start_s", "time_s", "tokens", "kv_blocks", "waiting"):
        assert np.array_equal(getattr(a.steps, name), getattr(b.steps, name))


def test_random_configurations_all_complete_with_the_invariants():
    rng = np.random.default_rng(2024)
    seen = set()
    for _ in range(20):
        req, engine = _random_case(rng)
        res = simulate(QWEN, H100, req, engine=engine)
        _check(res, engine)
        assert not np.isnan(res.scheduled_s).any()
        summary = res.summary()
        assert all(np.isfinite(v) for k, v in summary.items() if isinstance(v, float))
        seen |= {engine.scheduler, ("chunked", engine.chunked_prefill),
                 ("closed", bool(req.closed_loop)), ("preempted", bool(res.preemptions.any())),
                 ("hit", bool(res.prefix_hit_tokens.any()))}
    assert {"static", "continuous", ("chunked", False), ("chunked", True), ("closed", True),
            ("closed", False), ("preempted", True), ("hit", True)} <= seen


# the priced-ahead replay against a plain loop ----------------------------------------------

def _reference(model, req: Requests, engine: EngineConfig) -> dict:
    """One step at a time: let in what has arrived by the step's start, schedule, price the
    step alone, commit. A closed loop's user sends its next request when one finishes,
    after that request's think time (``arrival_s``), at once when it is 0."""
    w, plan = Workload.for_model(model), Parallelism()
    pricer = StepPricer(model, H100, plan, w, engine)
    st = VLLMState.new(engine, req.input_tokens, req.output_tokens, req.prefix_id,
                         req.prefix_tokens, kv_pool(model, H100, plan, w, engine).blocks)
    n, users = len(req), min(req.closed_loop, len(req))
    out = {k: np.full(n, np.nan) for k in ("scheduled_s", "first_token_s", "finish_s")}
    out["arrival_s"] = req.arrival_s.astype(float).copy()
    sent = sorted((float(req.arrival_s[i]), i) for i in range(users)) if users else \
        [(float(a), i) for i, a in enumerate(req.arrival_s)]      # (time, request), by time
    tokens: list[list[float]] = [[] for _ in range(n)]
    t, nxt, done = 0.0, users, 0
    while done < n:
        while sent and sent[0][0] <= t:
            out["arrival_s"][sent[0][1]] = sent[0][0]
            st.waiting.append(sent.pop(0)[1])
        if not st.running and not st.waiting:
            t = sent[0][0]
            continue
        batch = st.schedule()
        dt = float(pricer.times([batch])[0])
        emit, finished = st.commit(batch)
        fresh = batch.ids[np.isnan(out["scheduled_s"][batch.ids])]
        out["scheduled_s"][fresh] = t
        t += dt
        for r in emit.tolist():
            tokens[r].append(t)
        out["finish_s"][finished] = t
        done += len(finished)
        for _ in range(len(finished) if users else 0):
            if nxt < n:
                think = float(req.arrival_s[nxt])
                if think > 0:
                    sent = sorted([*sent, (t + think, nxt)])
                else:
                    out["arrival_s"][nxt] = t
                    st.waiting.append(nxt)
                nxt += 1
    out["token_s"] = np.concatenate(tokens)
    out["first_token_s"] = np.array([x[0] for x in tokens])
    out["preemptions"], out["prefix_hit_tokens"] = st.preemptions, st.hit_tokens
    return out


def _same(res, ref: dict) -> None:
    for name in ("arrival_s", "scheduled_s", "first_token_s", "finish_s", "token_s"):
        assert getattr(res, name) == pytest.approx(ref[name], rel=1e-12, abs=1e-12), name
    assert np.array_equal(res.preemptions, ref["preemptions"])
    assert np.array_equal(res.prefix_hit_tokens, ref["prefix_hit_tokens"])


@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4, 5])
def test_the_replay_equals_a_step_by_step_loop(seed):
    rng = np.random.default_rng(100 + seed)
    req, engine = _random_case(rng)
    if req.closed_loop:                    # the plain loop is an open loop's
        req = Requests.of(np.cumsum(rng.exponential(0.02, len(req))), req.input_tokens,
                          req.output_tokens, req.prefix_id, req.prefix_tokens)
    _same(simulate(QWEN, H100, req, engine=engine), _reference(QWEN, req, engine))


def test_the_replay_equals_a_step_by_step_loop_under_load_with_preemption():
    engine = _util_for(70, EngineConfig(max_num_batched_tokens=512, max_num_seqs=6))
    req = generate(24, rate=60.0, input_len=300, output_len=100, length_dist="uniform",
                   shared_prefix=160, seed=4)
    res = simulate(QWEN, H100, req, engine=engine)
    assert res.preemptions.any() and res.info["price_calls"] < len(res.steps.start_s) / 10
    _same(res, _reference(QWEN, req, engine))


def test_the_replay_equals_a_step_by_step_loop_in_a_closed_loop():
    req = generate(16, concurrency=3, input_len=400, output_len=60, length_dist="uniform",
                   seed=6)
    engine = EngineConfig(max_num_batched_tokens=512)
    res = simulate(QWEN, H100, req, engine=engine)
    assert res.info["price_calls"] < len(res.steps.start_s) / 4
    _same(res, _reference(QWEN, req, engine))


def test_a_closed_loop_request_sent_after_a_think_time_joins_the_next_step():
    req = Requests.of([0.0, 0.01], [100, 100], [20, 20], closed_loop=2)
    res = simulate(QWEN, H100, req)
    ref = _reference(QWEN, req, EngineConfig())
    # the next step's start (to the last bits: the loop and the replay sum in other orders)
    assert ref["scheduled_s"][1] == pytest.approx(res.steps.start_s[2], rel=1e-12, abs=1e-12)
    _same(res, ref)


def test_a_request_arriving_exactly_at_a_step_start_joins_that_step():
    alone = simulate(QWEN, H100, Requests.of([0.0], [100], [40]))
    late = []
    for k, start in enumerate(alone.steps.start_s[1:].tolist(), 1):
        res = simulate(QWEN, H100, Requests.of([0.0, start], [100, 30], [40, 5]))
        if res.scheduled_s[1] != start:
            late.append(k)
    assert late == []
