"""Speculative decoding in the serving simulator (``serving.engines.speculation``): a
hand-derived golden of which tokens each step verifies and accepts, the KV and batch room
drafts take, the client's chunks, the estimate's speculative TPOT at low load, the engines'
flags both ways, and the CLI."""

import json

import numpy as np
import pytest
from typer.testing import CliRunner

import perfmodel as pm
from perfmodel.cli.app import app
from perfmodel.serving import traffic
from perfmodel.serving.engines import engine_config
from perfmodel.serving.engines.speculation import SpecDecode
from perfmodel.serving.engines.speculation_flags import (
    engine_flags,
    from_sglang,
    from_trtllm,
    from_vllm,
)
from perfmodel.serving.engines.vllm import EngineConfig
from perfmodel.serving.requests import Requests
from perfmodel.serving.simulate import simulate
from perfmodel.specs.errors import SpecError

runner = CliRunner()
M, HW = pm.model("llama-3-8b"), pm.hardware("h100-sxm")


def _spec(k: int = 2, rates: tuple = (0.5, 0.5), **kw: object) -> SpecDecode:
    return SpecDecode("eagle", k, rates, k + 1, lookahead=k, **kw)


def _state(engine: object, prompt: list, output: list, blocks: int = 100) -> object:
    n = len(prompt)
    st = engine.state(np.array(prompt), np.array(output), np.full(n, -1), np.zeros(n, int),
                      blocks)
    st.waiting.extend(range(n))
    return st


def _steps(st: object) -> list:
    out = []
    while st.running or st.waiting:
        batch = st.schedule()
        before = st.emitted.copy()
        st.commit(batch)
        out.append((batch.new.tolist(), batch.drafts.tolist(),
                    (st.emitted - before)[batch.ids].tolist()))
    return out


def test_golden_small_trace_verifies_and_accepts_as_derived_by_hand():
    """Prompt 4, output 6, k = 2 at rates 0.5, 0.5: E = 1 + 0.5 + 0.25 = 1.75 tokens per
    verify. Expected mode ends verify j (1, 2, ...) at floor(j E) decode tokens: 1, 3, 5,
    7. Step 1: the prompt (4 tokens), token 1. Step 2: token 1 and 2 drafts verified (3
    tokens), floor(1.75) - 0 = 1 token: 0 drafts accepted. Step 3: floor(3.5) - 1 = 2
    tokens (1 accepted). Step 4: floor(5.25) - 3 = 2 tokens: the 6th, done. KV blocks (4
    tokens each) cover computed + 3 new + 2 lookahead: 4 + 3 + 2 = 9 -> 3 blocks at step 2,
    5 + 5 = 10 at step 3 and 7 + 5 = 12 at step 4, still 3."""
    engine = EngineConfig(max_num_seqs=4, max_num_batched_tokens=64, block_size=4,
                          speculative=_spec())
    st = _state(engine, [4], [6])
    held = []
    steps = []
    while st.running or st.waiting:
        batch = st.schedule()
        held.append(int(st.own[0]))
        before = int(st.emitted[0])
        st.commit(batch)
        steps.append((int(batch.new[0]), int(batch.drafts[0]), int(st.emitted[0]) - before,
                      int(st.computed[0])))
    assert steps == [(4, 0, 1, 4), (3, 2, 1, 5), (3, 2, 2, 7), (3, 2, 2, 9)]
    assert held == [1, 3, 3, 3]
    assert st.spec_steps[0] == 3 and st.spec_drafted[0] == 6 and st.spec_accepted[0] == 2
    assert st.pool.free == 100         # every block back once it finished


def test_budget_trims_the_drafts_of_the_last_decode_in_the_step():
    """Two decoding requests, a budget of 4 tokens: the first takes 1 + 2 drafts, the second
    the 1 left, its last token and no drafts (vLLM caps num_new_tokens by the budget)."""
    engine = EngineConfig(max_num_seqs=2, max_num_batched_tokens=8, block_size=4,
                          speculative=_spec())
    st = _state(engine, [4, 4], [9, 9])
    st.commit(st.schedule())                      # both prompts, 8 tokens
    st.engine = EngineConfig(max_num_seqs=2, max_num_batched_tokens=4, block_size=4,
                             speculative=_spec())
    batch = st.schedule()
    assert batch.new.tolist() == [3, 1] and batch.drafts.tolist() == [2, 0]
    assert not batch.prefill                      # verifies only: a uniform decode batch


def test_sampled_acceptance_is_seeded_and_all_or_nothing_rates_are_exact():
    """Rates (1, 0): every verify accepts exactly the first draft; (1, 1): both. A seeded
    table keyed by (request, emitted) repeats itself run to run."""
    for rates, per_verify in (((1.0, 0.0), 2), ((1.0, 1.0), 3)):
        engine = EngineConfig(speculative=_spec(rates=rates, mode="sampled", seed=3))
        gains = [g[2][0] for g in _steps(_state(engine, [8], [13]))]
        assert gains[0] == 1 and set(gains[1:-1]) == {per_verify}
    engine = EngineConfig(speculative=_spec(rates=(0.6, 0.6), mode="sampled", seed=5))
    one, two = (_steps(_state(engine, [8, 5], [40, 30])) for _ in range(2))
    assert one == two


def test_chunks_arrive_together_and_itl_counts_chunks():
    """A verify's tokens share its end time: TPOT spans every token, ITL the gaps between
    chunks (vLLM's benchmark appends one ITL per streamed chunk)."""
    res = simulate(M, HW, Requests.of([0.0], [64], [20]),
                   engine=EngineConfig(speculative=_spec(rates=(1.0, 1.0))))
    times = res.token_s
    assert np.all(np.diff(times) >= 0)
    chunks = np.unique(times)
    assert len(chunks) == 1 + -(-19 // 3)           # the prefill's token, then 3 a verify
    assert len(res.itl_s) == len(chunks) - 1 and np.all(res.itl_s > 0)
    s = res.summary()["speculation"]
    # every verify accepts both drafts (the last one's second past the output is counted
    # as vLLM's metrics count it, before the request's max_tokens cuts it)
    assert s["verify_steps"] == 7 and s["acceptance_length"] == 3.0


@pytest.mark.parametrize("method", ["eagle", "eagle3"])
def test_low_load_tpot_matches_the_estimate_within_2_percent(method):
    """One request at a time, EAGLE k = 4 at acceptance 0.7 (E = 2.773): the simulator's
    TPOT (every verify and draft step priced as it runs) against ``estimate``'s speculative
    TPOT ((draft + verify) / E at the mean context) for the same drafter."""
    spec = SpecDecode(method, 4, (0.7,) * 4, 5, lookahead=4)
    res = simulate(M, HW, Requests.of([0.0], [1024], [128]),
                   engine=EngineConfig(speculative=spec))
    est = pm.estimate(HW, M, pm.Workload(batch=1, prompt_len=1024, gen_len=128),
                      speculation=spec.speculation())
    sim = float(res.tpot_s[0])
    assert sim == pytest.approx(est.tpot_s, rel=0.02)
    plain = float(simulate(M, HW, Requests.of([0.0], [1024], [128])).tpot_s[0])
    assert plain / sim > 1.8          # and it pays at batch 1


def test_pool_counts_the_drafters_weights_and_kv():
    """An EAGLE head takes its layer's weights off the memory and adds one layer's KV to
    every block (1/32 of Llama-3-8B's): fewer blocks than without."""
    plain = simulate(M, HW, Requests.of([0.0], [64], [4])).info["kv_pool"]
    head = simulate(M, HW, Requests.of([0.0], [64], [4]),
                    engine=EngineConfig(speculative=_spec())).info["kv_pool"]
    assert head.bytes_per_block == pytest.approx(plain.bytes_per_block * 33 / 32)
    assert head.weights_bytes > plain.weights_bytes
    assert head.blocks < plain.blocks * 32 / 33


def test_ngram_drafts_cost_no_gpu_time_and_reserve_no_lookahead():
    spec = from_vllm('{"method": "ngram", "num_speculative_tokens": 3}', ("1.0", None))
    assert spec.lookahead == 0 and spec.speculation() is None
    res = simulate(M, HW, Requests.of([0.0], [64], [9]), engine=EngineConfig(speculative=spec))
    assert res.summary()["speculation"]["acceptance_length"] == pytest.approx(4.0)


def test_sglang_and_trtllm_run_speculation_with_their_own_names():
    reqs = Requests.of([0.0, 0.0], [256, 128], [64, 64])
    sgl = from_sglang("EAGLE", "lmsys/sglang-EAGLE-LLaMA3-Instruct-8B", 3, 1, None,
                      ("0.7", None))
    trt = from_trtllm('{"decoding_type": "Eagle", "max_draft_len": 3}', ("0.7", None))
    for name, spec in (("sglang", sgl), ("trtllm", trt)):
        engine = engine_config(name, speculative=spec)
        res = simulate(M, HW, reqs, engine=engine)
        s = res.summary()["speculation"]
        assert s["verify_steps"] > 0 and 1 < s["acceptance_length"] <= 4
        assert (res.finish_s > 0).all()
    assert "--speculative-algorithm EAGLE" in engine_config("sglang", speculative=sgl).flags()
    assert "speculative_config: {decoding_type: Eagle, max_draft_len: 3}" in \
        engine_config("trtllm", speculative=trt).flags()


def test_flags_round_trip_and_bad_input_is_one_line():
    spec = from_vllm('{"method": "eagle3", "num_speculative_tokens": 3, "model": "x/y"}',
                     ("0.8,0.7,0.6", None))
    assert json.loads(engine_flags(spec, "vllm").split(" ", 1)[1].strip("'")) == {
        "method": "eagle3", "num_speculative_tokens": 3, "model": "x/y"}
    assert spec.rates == (0.8, 0.7, 0.6)
    mtp = from_vllm('{"method": "mtp", "num_speculative_tokens": 1}',
                    (None, "deepseek-v3-mtp"))
    assert mtp.rates == (0.875,) and "2412.19437" in mtp.source
    for text, rates, what in (('{"method": "medusa2", "num_speculative_tokens": 2}',
                               ("0.5", None), "method"),
                              ('{"method": "eagle"}', ("0.5", None), "num_speculative_tokens"),
                              ("not json", ("0.5", None), "JSON"),
                              ('{"method": "eagle", "num_speculative_tokens": 2}',
                               ("0.5,0.5,0.5", None), "--acceptance"),
                              ('{"method": "eagle", "num_speculative_tokens": 2}',
                               (None, None), "--acceptance")):
        with pytest.raises(SpecError, match=what):
            from_vllm(text, rates)


def test_cli_simulate_reports_speculation_in_json_and_table():
    args = ["simulate", "--model", "llama-3-8b", "--hardware", "h100-sxm", "--rate", "4",
            "--num-requests", "8", "--input-len", "128", "--output-len", "32", "--no-band",
            "--no-progress", "--speculative-config",
            '{"method": "eagle", "num_speculative_tokens": 3, "model": "e/h"}',
            "--acceptance", "0.7"]
    out = runner.invoke(app, [*args, "--format", "json"])
    assert out.exit_code == 0, out.output
    s = json.loads(out.output)["speculation"]
    assert s["method"] == "eagle" and s["num_speculative_tokens"] == 3
    assert 1 < s["acceptance_length"] < 4
    table = runner.invoke(app, args)
    assert "acceptance length" in table.output and "--speculative-config" in table.output
    bad = runner.invoke(app, [*args[:-4], "--speculative-num-steps", "3"])
    assert bad.exit_code != 0 and "applies to --engine sglang" in bad.output
    assert "Traceback" not in bad.output
    for extra, what in ((["--acceptance-mode", "mean"], "--acceptance-mode: expected one of"),
                        (["--prefill-replicas", "1"], "--speculative-config: not with"),
                        (["--acceptance-profile", "nope"], "--acceptance / --acceptance-prof"),
                        (["--scheduler", "static"], "static baseline does not speculate")):
        bad = runner.invoke(app, [*args, *extra])
        assert bad.exit_code != 0 and what in bad.output, bad.output
        assert "Traceback" not in bad.output and len(bad.output.strip().splitlines()) == 1


def test_speed_up_falls_with_load_and_crosses_1():
    """128-token prompts, 256-token outputs (short contexts), EAGLE k = 4 at 0.7: one user
    gets about twice the tokens/s; 256 users, a batch past the estimate's break-even batch
    (205 at this context, ``break_even_batch``), get less than without speculation (each
    verify's 5 tokens a request make the step compute-bound)."""
    spec = SpecDecode("eagle", 4, (0.7,) * 4, 5, lookahead=4)
    ups = []
    for users in (1, 256):
        reqs = traffic.generate(max(users, 2), concurrency=users, input_len=128,
                                output_len=256, seed=0)
        plain = simulate(M, HW, reqs).throughput_tokens_per_s
        ups.append(simulate(M, HW, reqs, engine=EngineConfig(speculative=spec))
                   .throughput_tokens_per_s / plain)
    assert ups[0] > 1.9 and ups[1] < 1.0


def test_planner_searches_speculation_on_and_off_and_launches_with_its_flags():
    from perfmodel.serving.engines.speculation_flags import simulate_flags
    from perfmodel.serving.planner import plans
    from perfmodel.serving.planner.launch import Deployment, Server, launch
    from perfmodel.serving.planner.launch_data import checkpoint, unknown_flags

    spec = from_vllm('{"method": "eagle", "num_speculative_tokens": 3, "model": "e/h"}',
                     ("0.7", None))
    target = plans.Target(8, 1.0, 0.02, 1024, 128, rate=2.0, speculative=spec)
    cols, _ = plans.candidates(M, [HW], target)
    on = cols["speculative"] == "eagle"
    assert on.any() and (~on).any()
    same = (~on) & (cols["tp"] == 1) & (cols["batch"] == 8) & (cols["precision"] == "bf16")
    fast = on & (cols["tp"] == 1) & (cols["batch"] == 8) & (cols["precision"] == "bf16")
    assert cols["step_s"][fast].max() < cols["step_s"][same].min()   # faster at batch 8
    dep = Deployment(checkpoint(M), Server(tp=1), speculative=spec)
    vllm = launch(dep, "vllm").text()
    assert '--speculative-config \'{"method": "eagle", "num_speculative_tokens": 3' in vllm
    assert "--speculative-num-steps 3" in launch(dep, "sglang").text()
    assert "decoding_type: Eagle" in launch(dep, "trtllm").text()
    assert "--acceptance 0.7,0.7,0.7" in simulate_flags(spec, "vllm")
    for engine in ("vllm", "sglang"):      # every flag is one the engine version defines
        assert unknown_flags(launch(dep, engine)) == []


@pytest.mark.parametrize("name", ["vllm", "sglang", "trtllm"])
def test_invariants_hold_with_speculation_on_a_seeded_stream(name):
    """Every request emits exactly its output tokens, each step computes at least one token
    a request, and the pool's blocks all come back, under a pool tight enough that vLLM
    preempts and SGLang and TensorRT-LLM hold requests back."""
    rng = np.random.default_rng(7)
    prompt, output = rng.integers(8, 200, 40), rng.integers(1, 90, 40)
    spec = _spec(k=3, rates=(0.8, 0.6, 0.4), mode="sampled", seed=1)
    blocks = {"vllm": 150, "sglang": 900, "trtllm": 40}[name]
    engine = engine_config(name, speculative=spec).resolved(blocks, 4096)   # as simulate
    st = _state(engine, prompt.tolist(), output.tolist(), blocks)
    for _ in range(10_000):
        if not (st.running or st.waiting):
            break
        batch = st.schedule()
        assert batch is not None and (batch.new >= 1).all()
        st.commit(batch)
    assert (st.emitted == output).all() and st.pool.free == blocks
    assert name != "vllm" or st.preemptions.sum() > 0


def test_a_speculative_plans_printed_command_reproduces_its_check():
    """The winner serves with EAGLE (faster at this low rate); the ``perfmodel simulate``
    command the plan prints, speculative flags and acceptance included, gives the check's
    whole-run TPOT p90 again."""
    import shlex

    plan = runner.invoke(app, ["plan", "-m", "llama-3-8b", "-H", "h100-sxm", "--slo-ttft",
                               "1", "--slo-tpot", "0.02", "--rate", "4", "--input-len", "256",
                               "--output-len", "64", "--requests", "100", "--no-progress",
                               "--speculative-config",
                               '{"method": "eagle", "num_speculative_tokens": 3}',
                               "--acceptance", "0.7", "-f", "json"])
    assert plan.exit_code == 0, plan.output
    won = json.loads(plan.output)["winner"]
    assert won["label"].endswith("+eagle") and "--speculative-config" in won["command"]
    again = runner.invoke(app, [*shlex.split(won["command"])[1:], "-f", "json", "--no-band",
                                "--no-progress"])
    assert again.exit_code == 0, again.output
    assert json.loads(again.output)["tpot_s"]["p90"] == pytest.approx(
        won["whole_run_tpot_p90_s"], rel=1e-9)
