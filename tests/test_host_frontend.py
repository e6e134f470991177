"""The API server as one process (``host_time.api_server``: requests' intake and every
step's output tokens queue for it, first come first served) and vLLM's async scheduling
(``schedule_ahead``: a step's schedule is formed at the previous step's start, a finish
frees its seat one schedule late). Goldens derived by hand, property tests, the CLI."""

from __future__ import annotations

import itertools
import json
from dataclasses import replace

import numpy as np
import pytest
from typer.testing import CliRunner

import perfmodel as pm
from perfmodel.cli.app import app
from perfmodel.serving import host_time
from perfmodel.serving.engines.vllm import EngineConfig
from perfmodel.serving.host_time import HostTime, api_server
from perfmodel.serving.requests import Requests
from perfmodel.serving.simulate import simulate
from perfmodel.specs.errors import SpecError
from perfmodel.specs.workload import Parallelism

LLAMA, H100 = pm.model("llama-3-8b"), pm.hardware("h100-sxm")
AHEAD = HostTime(schedule_ahead=True)       # async scheduling alone: no host seconds


def _sim(reqs: Requests, host: HostTime, **engine) -> object:
    return simulate(LLAMA, H100, reqs, Parallelism(), EngineConfig(host=host, **engine))


def test_api_server_by_hand():
    # intake 2 ms each at 0 and 1 ms; a step ends at 1 ms with 1 token, one at 3 ms with
    # 2 (0.5 ms a token). FCFS, intake first at a tie: intake 0-2, intake 2-4, the 1 ms
    # step's token 4-4.5, the 3 ms step's two 4.5-5.5 (they leave together).
    out = api_server(np.array([0.0, 1e-3]), np.array([2e-3, 2e-3]),
                     np.array([1e-3, 3e-3, 3e-3]), 0.5e-3)
    assert out == pytest.approx([4.5e-3, 5.5e-3, 5.5e-3])
    t = np.array([1.0, 2.0])
    assert api_server(np.zeros(1), np.ones(1), t, 0.0) is not None
    assert api_server(np.zeros(1), np.ones(1), t, 0.0) == pytest.approx(t)


def test_tokenizer_thread_and_event_loop_by_hand():
    # three requests at once, 2 ms of tokenizing and 1 ms of the event loop's own each.
    # One process: 3, 6, 9 ms. Tokenized apart: the thread is done at 2, 4, 6 ms and the
    # loop 1 ms after each (it is free by then): 3, 5, 7 ms; the ceiling is the thread's.
    one = HostTime(request_s=1e-3, prompt_token_s=1e-5)
    apart = replace(one, tokenize_apart=True)
    t, n = np.zeros(3), np.array([200, 200, 200])
    assert one.admit(t, n) == pytest.approx([3e-3, 6e-3, 9e-3])
    assert apart.admit(t, n) == pytest.approx([3e-3, 5e-3, 7e-3])
    at, work = apart.intake(t, n)
    assert at == pytest.approx([2e-3, 4e-3, 6e-3]) and work == pytest.approx([1e-3] * 3)
    # the loop's 1 ms is the ceiling when tokenizing is shorter: 0.5 ms each -> 1.5, 2.5, 3.5
    assert apart.admit(t, n // 4) == pytest.approx([1.5e-3, 2.5e-3, 3.5e-3])


def test_api_server_never_gets_faster_with_more_work():
    rng = np.random.default_rng(7)
    for _ in range(30):
        n, k = int(rng.integers(1, 20)), int(rng.integers(1, 40))
        arrive = np.sort(rng.uniform(0, 1, n))
        work = rng.uniform(0, 0.05, n)
        tokens = rng.choice(np.sort(rng.uniform(0, 1.5, 8)), k)
        per = float(rng.uniform(1e-4, 1e-2))
        base = api_server(arrive, work, tokens, per)
        assert (base >= tokens - 1e-12).all()
        assert (api_server(arrive, work * 1.5, tokens, per) >= base - 1e-12).all()
        assert (api_server(arrive, work, tokens, per * 2) >= base - 1e-12).all()


def test_a_burst_is_held_to_the_api_servers_ceiling():
    # 40 requests at once, 5 ms each of intake: the last reaches the engine at 0.2 s, and
    # the run cannot be faster than 1 / 5 ms = 200 requests/s
    reqs = Requests.of([0.0] * 40, [64] * 40, [2] * 40)
    res = _sim(reqs, HostTime(request_s=5e-3))
    seen = res.arrival_s + res.info["api_server_s"]
    assert seen.max() == pytest.approx(0.2)
    assert res.summary()["requests_per_s"] <= 200.0
    fast = _sim(reqs, HostTime())
    assert fast.summary()["requests_per_s"] > 200.0


def test_more_request_time_never_makes_ttft_smaller():
    reqs = Requests.of(np.linspace(0, 0.5, 25).tolist(), [300] * 25, [6] * 25)
    ttft = [_sim(reqs, HostTime(request_s=r)).ttft_s for r in (0.0, 2e-3, 8e-3, 20e-3)]
    for a, b in itertools.pairwise(ttft):
        assert np.mean(b) >= np.mean(a) and np.median(b) >= np.median(a)


def test_output_work_adds_to_a_lone_requests_tokens_by_hand():
    reqs = Requests.of([0.0], [200], [5])
    gpu = _sim(reqs, HostTime())
    res = _sim(reqs, HostTime(output_token_s=1e-3))
    # alone, each of its tokens waits only its own 1 ms; the gaps between them are the steps'
    assert res.token_s - gpu.token_s == pytest.approx(np.full(5, 1e-3))
    assert res.itl_s == pytest.approx(gpu.itl_s)
    assert res.summary()["engine_time"]["api_output_mean_s"] == pytest.approx(1e-3)


def test_a_new_arrival_joins_one_step_later_under_async_scheduling():
    """A runs alone (prefill at step 0, decodes after). B arrives in the middle of step 1.
    Sync: step 2's schedule is formed at step 1's end, B is in it. Async: step 2's schedule
    was formed at step 1's start (before B), so B joins step 3."""
    probe = _sim(Requests.of([0.0], [128], [12]), HostTime())
    s = probe.steps.start_s
    mid = float((s[1] + s[2]) / 2)
    reqs = Requests.of([0.0, mid], [128, 128], [12, 4])
    sync, ahead = _sim(reqs, HostTime()), _sim(reqs, AHEAD)
    assert np.searchsorted(sync.steps.start_s, sync.scheduled_s[1]) == 2
    assert np.searchsorted(ahead.steps.start_s, ahead.scheduled_s[1]) == 3
    assert ahead.ttft_s[1] > sync.ttft_s[1]
    assert ahead.ttft_s[0] == pytest.approx(sync.ttft_s[0])


def test_an_idle_engine_takes_a_request_at_once_under_async_scheduling():
    reqs = Requests.of([0.0, 50.0], [128, 128], [4, 4])
    ahead, sync = _sim(reqs, AHEAD), _sim(reqs, HostTime())
    assert ahead.scheduled_s == pytest.approx([0.0, 50.0])
    assert ahead.ttft_s == pytest.approx(sync.ttft_s)
    assert ahead.e2e_s == pytest.approx(sync.e2e_s)


def test_a_finished_request_frees_its_seat_one_schedule_late():
    """Two seats. A (3 tokens: prefill + 2 decodes) finishes in step 2; C runs on; B waits
    from the start. Sync: B takes A's seat in step 3. Async: step 3's schedule was formed
    while step 2 ran, with A still seated (not scheduled again): B starts in step 4."""
    reqs = Requests.of([0.0, 0.0, 0.0], [64, 64, 64], [3, 30, 4])
    # A = 0, C = 1, B = 2 (arrival order keeps B last)
    sync = _sim(reqs, HostTime(), max_num_seqs=2)
    ahead = _sim(reqs, AHEAD, max_num_seqs=2)
    assert np.searchsorted(sync.steps.start_s, sync.scheduled_s[2]) == 3
    assert np.searchsorted(ahead.steps.start_s, ahead.scheduled_s[2]) == 4
    assert ahead.steps.seqs[3] == 1 and sync.steps.seqs[3] == 2
    assert ahead.finish_s[0] == pytest.approx(sync.finish_s[0])


def test_async_scheduling_replays_as_a_step_by_step_loop_would():
    """The priced-ahead replay under async scheduling stands where the dry run's guesses
    were wrong: the same run with the look-ahead held to one step gives the same times."""
    from perfmodel.serving import engine_loop

    rng = np.random.default_rng(3)
    t = np.sort(rng.uniform(0, 2, 60))
    reqs = Requests.of(t.tolist(), rng.integers(50, 900, 60).tolist(),
                       rng.integers(1, 40, 60).tolist())
    full = _sim(reqs, AHEAD, max_num_seqs=8)
    old = engine_loop.LOOKAHEAD
    try:
        engine_loop.LOOKAHEAD = 1
        one = _sim(reqs, AHEAD, max_num_seqs=8)
    finally:
        engine_loop.LOOKAHEAD = old
    assert full.first_token_s == pytest.approx(one.first_token_s)
    assert full.finish_s == pytest.approx(one.finish_s)


def test_only_vllms_v1_async_and_sglangs_overlap_modes_schedule_ahead():
    assert host_time.resolve("vllm", "0.24.0").schedule_ahead
    assert not host_time.resolve("vllm", "0.11.0").schedule_ahead
    assert host_time.resolve("sglang", "0.5.14").schedule_ahead
    assert not host_time.resolve("sglang", mode="no-overlap").schedule_ahead
    for mode in host_time.modes("trtllm"):
        assert not host_time.resolve("trtllm", mode=mode).schedule_ahead
    assert not HostTime(schedule_ahead=True).none


def test_profile_carries_output_work_and_the_flag(tmp_path):
    host = replace(host_time.resolve("vllm"), output_token_s=3e-5, name="mine")
    path = tmp_path / "p.yaml"
    host_time.write_profile(path, host, {})
    back = host_time.load_profile(path)
    assert back.output_token_s == 3e-5 and back.schedule_ahead and back.tokenize_apart
    old = path.read_text().replace("  output_token_s: 3.0e-05\n", "")
    old = old.replace("  schedule_ahead: true\n", "").replace("  tokenize_apart: true\n", "")
    path.write_text(old)            # a profile written before these fields: none of either
    back = host_time.load_profile(path)
    assert back.output_token_s == 0.0 and not back.schedule_ahead and not back.tokenize_apart
    path.write_text(old.replace("overlap: true", "overlap: true\n  schedule_ahead: 2"))
    with pytest.raises(SpecError, match="schedule_ahead: expected true or false"):
        host_time.load_profile(path)
    path.write_text(old.replace("stream_s: 0.0002", "stream_s: 0.0002\n  output_token_s: -1"))
    with pytest.raises(SpecError, match="output_token_s: expected a non-negative"):
        host_time.load_profile(path)


def test_cli_prints_the_api_servers_token_work():
    runner = CliRunner()
    args = ["simulate", "-m", "llama-3-8b", "-H", "h100-sxm", "--rate", "4",
            "--num-requests", "12", "--input-len", "128", "--output-len", "8"]
    text = runner.invoke(app, args)
    assert text.exit_code == 0, text.output
    assert "20 us/output token" in text.stdout and "scheduled a step ahead" in text.stdout
    assert "ms per token" in text.stdout
    data = json.loads(runner.invoke(app, [*args, "--format", "json"]).stdout)
    assert data["engine_time"]["api_output_mean_s"] >= 20e-6
    bare = json.loads(runner.invoke(app, [*args, "--format", "json", "--no-host-time"]).stdout)
    assert bare["engine_time"]["api_output_mean_s"] == 0.0


def test_vllm_019_with_data_parallel_attention_schedules_ahead():
    """vLLM's source (vllm/config/vllm.py, VllmConfig.__post_init__) turns async scheduling
    off by default only for pipeline parallel > 1, a non-EAGLE/MTP draft, or an executor
    other than mp/uni/external_launcher; never for data parallel or expert parallel. Each
    DP rank's engine core (DPEngineCoreProc.run_busy_loop -> _process_engine_step) steps
    through the same step_fn, step_with_batch_queue under async scheduling. So the lss
    runs' AsyncLLM with DP 2 + EP at 0.19.0 schedule a step ahead, read from its row."""
    from perfmodel.compare.serving import _host, _plan

    row = {"engine": "vLLM (AsyncLLM in-process, no HTTP)", "engine_version": "0.19.0",
           "tp": "1", "dp": "2", "workload": "... enable_expert_parallel"}
    host, notes = _host(row, "vllm")
    plan, _ = _plan(row)
    assert host.schedule_ahead and not notes and "in-process" in host.name
    assert plan.attention_dp and plan.ep == 2


def test_the_lag_holds_on_each_rank_under_data_parallel_attention():
    """Two ranks in lockstep (an MoE replica, DP attention). A and X at 0 take one rank
    each; B arrives in the middle of step 1 on A's rank. Sync: B is in step 2. Async:
    step 2's schedule was formed at step 1's start, B joins step 3; A's and X's first
    tokens do not move."""
    moe, plan = pm.model("qwen3-30b-a3b"), Parallelism(ep=2, attention_dp=True)

    def run(reqs: Requests, host: HostTime) -> object:
        return simulate(moe, H100, reqs, plan, EngineConfig(host=host))

    s = run(Requests.of([0.0, 0.0], [128, 128], [12, 12]), HostTime()).steps.start_s
    mid = float((s[1] + s[2]) / 2)
    reqs = Requests.of([0.0, 0.0, mid], [128, 128, 128], [12, 12, 4])
    sync, ahead = run(reqs, HostTime()), run(reqs, AHEAD)
    for res, step in ((sync, 2), (ahead, 3)):
        starts = np.unique(res.steps.start_s)
        assert np.searchsorted(starts, res.scheduled_s[2]) == step
    assert ahead.ttft_s[2] > sync.ttft_s[2]
    assert ahead.ttft_s[:2] == pytest.approx(sync.ttft_s[:2])


def _sglang(reqs: Requests, host: HostTime, **flags) -> object:
    from perfmodel.serving.engines import engine_config
    return simulate(LLAMA, H100, reqs, Parallelism(), engine_config("sglang", host=host,
                                                                      **flags))


def test_sglang_overlap_arrival_joins_one_step_later():
    """SGLang's overlap loop (``event_loop_overlap``) forms batch n+1 before batch n's
    result is processed. A alone: prefill at step 0, decodes after; B arrives in the middle
    of step 1. Without overlap B is in step 2 (its prefill batch); with it step 2 was formed
    at step 1's launch, so B joins step 3."""
    probe = _sglang(Requests.of([0.0], [128], [12]), HostTime())
    s = probe.steps.start_s
    reqs = Requests.of([0.0, float((s[1] + s[2]) / 2)], [128, 128], [12, 4])
    sync, ahead = _sglang(reqs, HostTime()), _sglang(reqs, AHEAD)
    assert np.searchsorted(sync.steps.start_s, sync.scheduled_s[1]) == 2
    assert np.searchsorted(ahead.steps.start_s, ahead.scheduled_s[1]) == 3
    assert ahead.ttft_s[0] == pytest.approx(sync.ttft_s[0])


def test_sglang_overlap_frees_a_finished_seat_one_schedule_late():
    """Two seats (--max-running-requests 2). A (3 tokens) and C (30) prefill at step 0, A
    finishes in step 2, B waits. Without overlap step 3 is B's prefill alone and step 4
    decodes B and C. With overlap step 3 was formed with A still seated: C decodes alone
    (A's discarded row not priced), B's prefill is step 4, and step 5 decodes both."""
    reqs = Requests.of([0.0, 0.0, 0.0], [64, 64, 64], [3, 30, 4])
    sync = _sglang(reqs, HostTime(), max_running_requests=2)
    ahead = _sglang(reqs, AHEAD, max_running_requests=2)
    assert np.searchsorted(sync.steps.start_s, sync.scheduled_s).tolist() == [0, 0, 3]
    assert np.searchsorted(ahead.steps.start_s, ahead.scheduled_s).tolist() == [0, 0, 4]
    assert sync.steps.seqs[:6].tolist() == [2, 2, 2, 1, 2, 2]
    assert ahead.steps.seqs[:6].tolist() == [2, 2, 2, 1, 1, 2]
    assert ahead.finish_s[0] == pytest.approx(sync.finish_s[0])
