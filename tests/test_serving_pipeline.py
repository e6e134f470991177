"""Pipeline parallelism in the serving simulator (``serving.pipeline``): hand-derived
goldens of which requests ride which micro-batch and when their tokens come, the rule that
a request waits for its batch's output, pp=1 through the pipeline loop equal to the plain
loop, a lone request equal to ``estimate --pp``, the properties PP should have, the
lockstep routers, the refusals and the command line."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from typer.testing import CliRunner

import perfmodel as pm
from perfmodel.cli.app import app
from perfmodel.serving import engine_loop, pipeline
from perfmodel.serving.engine_loop import simulate_one
from perfmodel.serving.engines.sglang import SGLangConfig
from perfmodel.serving.engines.trtllm import TRTLLMConfig
from perfmodel.serving.engines.vllm import EngineConfig
from perfmodel.serving.fleet.replicas import run_replicas, subset
from perfmodel.serving.host_time import resolve
from perfmodel.serving.pricing import StepPricer, kv_pool
from perfmodel.serving.requests import Requests
from perfmodel.serving.simulate import simulate
from perfmodel.serving.traffic import generate
from perfmodel.specs.errors import SpecError
from perfmodel.specs.workload import Parallelism, Workload

LLAMA, QWEN = pm.model("llama-3-8b"), pm.model("qwen3-8b")
H100 = pm.hardware("h100-sxm")
MS = 1e-3


def _tokens(res, i: int) -> list[float]:
    return (res.token_s[res.token_offsets[i]:res.token_offsets[i + 1]] / MS).round(9).tolist()


def _fix(monkeypatch, stage_ms: list[float]) -> None:
    """Every batch takes ``stage_ms`` on the stages, no send, no host time; a pp=1 step
    their sum."""
    def stages(self, batches):
        k = len(batches)
        return np.tile(np.array(stage_ms) * MS, (k, 1)), np.zeros((k, self.pp - 1)), \
            np.zeros(k)

    def times(self, batches):
        self.last_host = np.zeros(len(batches))
        return np.full(len(batches), sum(stage_ms) * MS)

    monkeypatch.setattr(pipeline.StagePricer, "__call__", stages)
    monkeypatch.setattr(StepPricer, "times", times)


@pytest.fixture
def fixed_stages(monkeypatch):
    """10 ms on each stage (of 2, or of 4 where asked), 20 ms a pp=1 step."""
    _fix(monkeypatch, [10.0, 10.0])


# goldens ----------------------------------------------------------------------------------

def test_golden_micro_batches_against_one_stage(fixed_stages):
    """A (4 prompt tokens, 3 out), B (4, 2), C (4, 2) at t=0, a budget of 8 tokens.

    pp=2 (vLLM's batch queue of 2): t=0 schedules [A, B] (the budget is spent), and, the
    queue not full, [C] at once; stage 0 runs them 0-10 and 10-20, stage 1 10-20 and 20-30.
    The queue full, the engine waits for [A, B]: tokens at 20. t=20: [A, B] decode (C is in
    flight: skipped), out at 40; the engine waits for [C]: its token at 30. t=30: [C], out
    at 50. t=40: A's and B's second tokens (B done); [A], out at 60. t=50: C's second
    (done). t=60: A's third.

    pp=1, 20 ms steps: [A, B] 0-20; [A, B, C] 20-40 (C joins the decodes); [A, C] 40-60."""
    req = Requests.of([0.0] * 3, [4, 4, 4], [3, 2, 2])
    engine = EngineConfig(max_num_batched_tokens=8, max_num_seqs=8)
    two = simulate(LLAMA, H100, req, Parallelism(pp=2), engine)
    assert [_tokens(two, i) for i in range(3)] == [[20, 40, 60], [20, 40], [30, 50]]
    s = two.steps
    assert (s.start_s / MS).round(9).tolist() == [0, 0, 20, 30, 40]
    assert ((s.start_s + s.time_s) / MS).round(9).tolist() == [20, 30, 40, 50, 60]
    assert s.seqs.tolist() == [2, 1, 2, 1, 1] and s.tokens.tolist() == [8, 4, 2, 1, 1]
    assert s.stage_s.shape == (5, 2) and np.all(s.stage_s == 10 * MS)
    one = simulate(LLAMA, H100, req, Parallelism(), engine)
    assert [_tokens(one, i) for i in range(3)] == [[20, 40, 60], [20, 40], [40, 60]]
    assert one.steps.seqs.tolist() == [2, 3, 2]


def test_golden_a_prompt_s_next_chunk_enters_the_pipe_behind_the_first(fixed_stages):
    """A 12-token prompt over a budget of 8: [A: 8 tokens] at t=0 (out at 20) and at once
    its last 4 (vLLM schedules the rest of a prompt whose first chunk is in flight), out
    at 30, when A's first token comes; one stage: two 20 ms steps, 40."""
    req = Requests.of([0.0], [12], [2])
    engine = EngineConfig(max_num_batched_tokens=8, max_num_seqs=8)
    two = simulate(LLAMA, H100, req, Parallelism(pp=2), engine)
    assert _tokens(two, 0) == [30, 50]
    assert two.steps.tokens.tolist() == [8, 4, 1]
    assert _tokens(simulate(LLAMA, H100, req, Parallelism(), engine), 0) == [40, 60]


def test_a_decoding_request_rides_one_batch_in_flight_at_a_time(monkeypatch):
    """Alone, a decoding request gets one token per trip through the four stages (40 ms),
    not one per stage time: the engine cannot schedule it again before its output
    returns."""
    _fix(monkeypatch, [10.0] * 4)
    res = simulate(LLAMA, H100, Requests.of([0.0], [4], [4]), Parallelism(pp=4),
                   EngineConfig())
    assert _tokens(res, 0) == [40, 80, 120, 160]


def test_golden_the_slowest_stage_sets_the_pace(monkeypatch):
    """Stages of 5 and 15 ms; A and B (4 prompt tokens, 3 out) with a budget of 4 tokens
    ride two micro-batches X and Y. X: stage 0 0-5, stage 1 5-20; Y: stage 0 5-10, stage 1
    waits for X, 20-35. X returns at 20 and goes again: stage 0 20-25, stage 1 waits for Y,
    35-50; Y returns at 35: 35-40, 50-65; ... batches return every 15 ms (the slowest
    stage), each request's tokens every 30 (two batches in turn); alone, a request gets a
    token every 20 ms (the sum of the stages)."""
    _fix(monkeypatch, [5.0, 15.0])
    engine = EngineConfig(max_num_batched_tokens=4, max_num_seqs=4)
    res = simulate(LLAMA, H100, Requests.of([0.0, 0.0], [4, 4], [3, 3]), Parallelism(pp=2),
                   engine)
    assert [_tokens(res, i) for i in range(2)] == [[20, 50, 80], [35, 65, 95]]
    ends = (res.steps.start_s + res.steps.time_s) / MS
    assert np.diff(ends).round(9).tolist() == [15.0] * 5
    alone = simulate(LLAMA, H100, Requests.of([0.0], [4], [3]), Parallelism(pp=2), engine)
    assert _tokens(alone, 0) == [20, 40, 60]


# against the plain loop and the estimate --------------------------------------------------

def _cases() -> list:
    closed = generate(14, concurrency=3, input_len=300, output_len=40,
                      length_dist="uniform", seed=6)
    loaded = generate(24, rate=60.0, input_len=300, output_len=100, length_dist="uniform",
                      shared_prefix=160, seed=4)
    return [(closed, EngineConfig(max_num_batched_tokens=512)),
            (loaded, EngineConfig(max_num_batched_tokens=512, max_num_seqs=6)),
            (loaded, _blocks(70, EngineConfig(max_num_batched_tokens=256, max_num_seqs=6,
                                              host=resolve("vllm", mode="v1"))))]


def _blocks(blocks: int, engine: EngineConfig) -> EngineConfig:
    """``engine`` with the --gpu-memory-utilization that leaves QWEN ``blocks`` KV blocks
    on one H100 (``engine.kv_pool``'s rule)."""
    p = kv_pool(QWEN, H100, Parallelism(), Workload.for_model(QWEN), engine)
    util = (H100.runtime_reserved_bytes + p.weights_bytes + p.activation_bytes
            + (blocks + 0.5) * p.bytes_per_block) / H100.memory_bytes
    return replace(engine, gpu_memory_utilization=util)


@pytest.mark.parametrize("case", range(3))
def test_one_stage_through_the_pipeline_loop_is_the_plain_loop(monkeypatch, case):
    """pp=1 is vLLM's batch queue of one: the pipeline loop gives the plain loop's run
    (the v1 host time included: it has no overlap to differ by)."""
    req, engine = _cases()[case]
    plain = simulate(QWEN, H100, req, engine=engine)
    monkeypatch.setattr(engine_loop, "advance", pipeline.advance)
    piped = simulate(QWEN, H100, req, engine=engine)
    assert piped.preemptions.any() or case < 2
    for name in ("scheduled_s", "first_token_s", "finish_s", "token_s"):
        np.testing.assert_allclose(getattr(piped, name), getattr(plain, name), rtol=1e-9)
    assert np.array_equal(piped.preemptions, plain.preemptions)
    assert np.array_equal(piped.steps.tokens, plain.steps.tokens)


@pytest.mark.parametrize("pp", [2, 4])
@pytest.mark.parametrize("prompt, out", [(100, 10), (3000, 20)])
def test_a_lone_request_costs_the_estimate_with_pp(pp, prompt, out):
    """Alone, every step is one micro-batch through every stage and boundary: the
    estimate's m = 1 case (``schedules.pipeline``)."""
    plan = Parallelism(pp=pp)
    est = pm.estimate(H100, LLAMA, Workload(prompt_len=prompt, gen_len=out, cuda_graphs=True),
                      plan)
    res = simulate(LLAMA, H100, Requests.of([0.0], [prompt], [out]), plan)
    assert res.ttft_s[0] == pytest.approx(est.ttft_s, rel=1e-9)
    assert res.tpot_s[0] == pytest.approx(est.tpot_s, rel=1e-9)
    assert np.all(res.steps.send_s > 0) and res.steps.stage_s.shape[1] == pp


# properties -------------------------------------------------------------------------------

def _load(n: int = 400, rate: float = 300.0) -> Requests:
    return generate(n, rate=rate, input_len=512, output_len=128, seed=1)


def test_more_stages_serve_more_and_a_lone_request_no_faster():
    lone = Requests.of([0.0], [512], [32])
    runs = {pp: simulate(LLAMA, H100, _load(), Parallelism(pp=pp)) for pp in (1, 2, 4)}
    alone = {pp: simulate(LLAMA, H100, lone, Parallelism(pp=pp)) for pp in (1, 2, 4)}
    tput = [runs[pp].throughput_tokens_per_s for pp in (1, 2, 4)]
    e2e = [alone[pp].e2e_s[0] for pp in (1, 2, 4)]
    assert tput[0] < tput[1] < tput[2]
    assert e2e[0] <= e2e[1] <= e2e[2]
    for res in runs.values():
        assert np.all(np.isfinite(res.token_s)) and np.all(res.steps.time_s > 0)


def test_at_fixed_gpus_pipeline_stages_are_slower_alone_than_tensor_parallelism():
    """Two GPUs: TP2 splits every layer, PP2 runs the halves one after the other (and
    sends between them), so a lone request is slower under PP."""
    lone = Requests.of([0.0], [512], [32])
    tp = simulate(LLAMA, H100, lone, Parallelism(tp=2)).e2e_s[0]
    pp = simulate(LLAMA, H100, lone, Parallelism(pp=2)).e2e_s[0]
    assert pp > tp


@pytest.mark.parametrize("seed", range(4))
def test_random_pipelines_keep_the_invariants(seed):
    """Seeded fuzz: every token in order, finite and after its arrival, no more than pp
    batches in flight, every stage's time and every wait non-negative."""
    rng = np.random.default_rng(seed)
    pp = int(rng.choice([2, 3, 4]))
    n = int(rng.integers(5, 40))
    req = generate(n, rate=float(rng.uniform(5, 200)), input_len=int(rng.integers(16, 600)),
                   output_len=int(rng.integers(1, 60)), length_dist="uniform",
                   shared_prefix=int(rng.choice([0, 64])), seed=seed)
    engine = EngineConfig(max_num_batched_tokens=int(rng.choice([256, 2048])),
                          max_num_seqs=int(rng.choice([4, 64])),
                          gpu_memory_utilization=float(rng.choice([0.15, 0.9])),
                          host=resolve("vllm"))
    res = simulate(QWEN, H100, req, Parallelism(tp=int(rng.choice([1, 2])), pp=pp), engine)
    assert np.all(np.isfinite(res.token_s)) and np.all(res.ttft_s > 0)
    for i in range(n):
        t = res.token_s[res.token_offsets[i]:res.token_offsets[i + 1]]
        assert np.all(np.diff(t) > 0) and t[0] >= res.scheduled_s[i] >= res.arrival_s[i]
    s = res.steps
    end = s.start_s + s.time_s
    assert max(int(((s.start_s <= t) & (end > t)).sum()) for t in s.start_s) <= pp
    assert np.all(s.stage_s > 0) and np.all(s.send_s >= 0)
    assert np.all(s.time_s - s.gpu_s - s.send_s - s.host_s >= -1e-12)
    assert s.tokens.sum() >= int((req.input_tokens - res.prefix_hit_tokens
                                  + req.output_tokens - 1).sum())


def test_each_stage_holds_its_own_layers_kv():
    w = Workload.for_model(LLAMA)
    one = kv_pool(LLAMA, H100, Parallelism(), w, EngineConfig()).blocks
    two = kv_pool(LLAMA, H100, Parallelism(pp=2), w, EngineConfig()).blocks
    assert two >= 2 * one


def test_a_load_aware_router_stays_exact_with_pipelines():
    """Each pipelined replica of a lockstep run equals the same replica simulated alone."""
    reqs = generate(90, rate=40, input_len=300, output_len=40, length_dist="lognormal",
                    seed=3)
    one, w, engine = Parallelism(pp=2), Workload.for_model(LLAMA), EngineConfig()
    blocks = kv_pool(LLAMA, H100, one, w, engine).blocks
    parts, runs = run_replicas(LLAMA, H100, one, w, engine, reqs, 3, blocks,
                               "least-requests", 1, None)
    assert sorted(np.concatenate(parts).tolist()) == list(range(90))
    for idx, run in zip(parts, runs, strict=True):
        alone = simulate_one(LLAMA, H100, one, w, engine, subset(reqs, idx, 3), blocks, None)
        np.testing.assert_allclose(run.first_token_s, alone.first_token_s, rtol=1e-9)
        np.testing.assert_allclose(run.finish_s, alone.finish_s, rtol=1e-9)


# refusals and the command line -------------------------------------------------------------

@pytest.mark.parametrize("plan, engine, match", [
    (Parallelism(pp=2), SGLangConfig(), "event_loop_pp"),
    (Parallelism(pp=2), TRTLLMConfig(), "_executor_loop_pp"),
    (Parallelism(pp=2), EngineConfig(scheduler="static"), "static"),
    (Parallelism(pp=2, ep=2, attention_dp=True), EngineConfig(), "--attention-dp"),
])
def test_what_pipelines_are_not_simulated_with(plan, engine, match):
    with pytest.raises(SpecError, match=match):
        simulate(LLAMA, H100, Requests.of([0.0], [10], [2]), plan, engine)


def test_cli_simulates_pipeline_stages(tmp_path):
    runner = CliRunner()
    args = ["simulate", "-m", "llama-3-8b", "-H", "h100-sxm", "--rate", "20",
            "--num-requests", "30", "--input-len", "256", "--output-len", "16", "--no-band",
            "--no-progress"]
    out = runner.invoke(app, [*args, "--pp", "2", "-f", "json", "--out", str(tmp_path)])
    assert out.exit_code == 0, out.output
    summary = json.loads(out.output[out.output.index("{"):out.output.rindex("}") + 1])
    assert summary["pipeline"]["stages"] == 2 and summary["n_requests"] == 30
    head = (tmp_path / "steps.csv").read_text().splitlines()[0].split(",")
    assert {"stage0_s", "stage1_s", "send_s", "wait_s"} <= set(head)
    table = runner.invoke(app, [*args, "--pp", "2"])
    assert table.exit_code == 0 and "PP2" in table.output and "pipeline" in table.output
    # vLLM 0.24 runs async scheduling, which it turns off under PP: said on stderr
    assert "warning: --pp 2: vLLM turns async scheduling off" in table.output
    sync = runner.invoke(app, [*args, "--pp", "2", "--engine-mode", "v1"])
    assert sync.exit_code == 0 and "warning" not in sync.output
    bad = runner.invoke(app, [*args, "--pp", "2", "--engine", "sglang"])
    assert bad.exit_code == 2 and bad.output.startswith("error: --pp: 2 with --engine sglang")
    assert len(bad.output.strip().splitlines()) == 1


def test_an_uncertainty_edge_scales_every_stage():
    req = Requests.of([0.0], [256], [4])
    mid = simulate(LLAMA, H100, req, Parallelism(pp=2))
    low, high = (simulate(LLAMA, H100, req, Parallelism(pp=2), edge=e) for e in (0, 1))
    assert low.e2e_s[0] < mid.e2e_s[0] < high.e2e_s[0]
    np.testing.assert_allclose(low.steps.stage_s.sum(axis=1) + low.steps.send_s,
                               low.steps.time_s, rtol=1e-12)
    assert replace(mid.steps, stage_s=None).gpu_s.shape == mid.steps.gpu_s.shape


def test_pipelined_replicas_in_worker_processes_give_the_same_run():
    reqs = generate(60, rate=40.0, input_len=300, output_len=30, seed=2)
    plan = Parallelism(pp=2, dp=2)
    one, two = (simulate(LLAMA, H100, reqs, plan, workers=k) for k in (1, 2))
    np.testing.assert_array_equal(one.token_s, two.token_s)
    np.testing.assert_array_equal(one.steps.stage_s, two.steps.stage_s)
