"""The SGLang and TensorRT-LLM schedulers: goldens derived by hand from each engine's source
(``serving.engines.sglang`` and ``serving.engines.trtllm`` cite the functions), and the
places where the three engines' rules differ."""

import numpy as np
import pytest

from perfmodel.serving.engines import engine_config
from perfmodel.serving.engines.sglang import SGLangConfig
from perfmodel.serving.engines.trtllm import TRTLLMConfig
from perfmodel.serving.engines.vllm import EngineConfig
from perfmodel.specs.errors import SpecError


def steps(engine, prompt, output, blocks, prefix=None, ptok=None, first=None):
    """Drive the scheduler alone (no pricing): [(requests, their tokens)] per step. All
    requests wait from the start, or only ``first`` until it finishes, then the rest."""
    n = len(prompt)
    pre = np.full(n, -1, np.int64) if prefix is None else np.array(prefix, np.int64)
    pt = np.zeros(n, np.int64) if ptok is None else np.array(ptok, np.int64)
    engine = engine.resolved(blocks, 4096)
    st = engine.state(np.array(prompt, np.int64), np.array(output, np.int64), pre, pt, blocks)
    st.waiting.extend(range(n) if first is None else [first])
    out = []
    while st.running or st.waiting or getattr(st, "chunked", -1) >= 0:
        b = st.schedule()
        out.append((b.ids.tolist(), b.new.tolist()))
        st.commit(b)
        if first is not None and not st.running:
            st.waiting.extend(r for r in range(n) if r != first)
            first = None
    return out, st


PROMPTS, OUTPUTS = [6, 10, 3, 4], [3, 2, 2, 2]


def test_sglang_golden():
    """chunked_prefill_size 8, max_prefill_tokens 16, max_running_requests 3, a 64-token
    pool. Step 1: r0 whole (6; budget: 6 + 3 new + 1 page of 64), r1 cut to the 2 chunk
    tokens left: it becomes the chunked request. Step 2: the chunked r1 goes first (its 8
    left), which spends the chunk budget: r2 cannot be cut to 0 tokens. No decode yet:
    prefill first. Step 3: r2 (one seat left of 3). Step 4: the seats are full, so a
    decode batch of r0, r1, r2 (r1, r2 finish). Step 5: r3's prefill, not r0's decode.
    Step 6: r0 and r3 decode and finish."""
    got, st = steps(SGLangConfig(chunked_prefill_size=8, max_prefill_tokens=16,
                                 max_running_requests=3), PROMPTS, OUTPUTS, 64)
    assert got == [([0, 1], [6, 2]), ([1], [8]), ([2], [3]), ([0, 1, 2], [1, 1, 1]),
                   ([3], [4]), ([0, 3], [1, 1])]
    assert st.emitted.tolist() == OUTPUTS


def test_trtllm_golden():
    """GUARANTEED_NO_EVICT, max_batch_size 3, max_num_tokens 12, 4-token blocks, chunked
    prefill, 16 blocks. Step 1: capacity lets r0, r1, r2 in (3 + 3 + 2 blocks to
    completion of 16; the batch is full); the micro-batch has 12 tokens for 19 prompt
    tokens: r0 all 6, r1 6 cut to a block multiple (4), r2 the 2 left cut to 0 (waits).
    Step 2: r0 decodes (1), r1's last 6 and r2's 3 (10 of 11 left). Step 3: three decodes
    (r3 has no seat). Steps 4-5: r3."""
    got, st = steps(TRTLLMConfig(max_batch_size=3, max_num_tokens=12, tokens_per_block=4,
                                 enable_chunked_prefill=True), PROMPTS, OUTPUTS, 16)
    assert got == [([0, 1], [6, 4]), ([0, 1, 2], [1, 6, 3]), ([0, 1, 2], [1, 1, 1]),
                   ([3], [4]), ([3], [1])]
    assert st.emitted.tolist() == OUTPUTS


def test_vllm_chunks_where_trtllm_aligns_to_blocks():
    got, _ = steps(EngineConfig(max_num_seqs=3, max_num_batched_tokens=12, block_size=4),
                   PROMPTS, OUTPUTS, 16)
    assert got[0] == ([0, 1], [6, 6])       # vLLM cuts r1 to the 6 tokens left, unaligned


def test_overload_preempts_only_where_the_rule_allows():
    """Four 8-token prompts of 8 outputs in 8 blocks of 4: vLLM admits all four and
    preempts as decodes grow; TensorRT-LLM's GUARANTEED_NO_EVICT admits two (4 blocks each
    to completion) and never preempts, MAX_UTILIZATION pauses; SGLang reserves the output
    at admission (new-token ratio) and takes one at a time."""
    prompts, outputs = [8] * 4, [8] * 4
    pre = {}
    for name, engine, blocks in (
            ("vllm", EngineConfig(max_num_seqs=4, max_num_batched_tokens=64, block_size=4), 8),
            ("sglang", SGLangConfig(page_size=4, max_running_requests=4), 8),
            ("no-evict", TRTLLMConfig(tokens_per_block=4), 8),
            ("max-util", TRTLLMConfig(tokens_per_block=4,
                                      capacity_scheduler_policy="MAX_UTILIZATION"), 8)):
        got, st = steps(engine, prompts, outputs, blocks)
        assert st.emitted.tolist() == outputs
        pre[name] = (int(st.preemptions.sum()), len(got[0][0]))
    assert pre == {"vllm": (2, 4), "sglang": (0, 1), "no-evict": (0, 2), "max-util": (2, 4)}


def test_sglang_retracts_fewest_outputs_first():
    """A pool too small for the decodes: the running request with the fewest output tokens
    is retracted (to the tail of the queue) and recomputed later."""
    _, st = steps(SGLangConfig(page_size=1, max_running_requests=4,
                             schedule_conservativeness=0.01), [8] * 4, [12] * 4, 40)
    assert st.emitted.tolist() == [12] * 4
    assert st.preemptions.sum() > 0
    assert st.preemptions[0] == 0            # the first admitted has the most outputs


def test_shared_prefix_hits_differ_by_granularity_and_skip():
    """A 40-token shared prefix of 60-token prompts. All arriving at once: TensorRT-LLM
    holds back r1 and r2 a step (``beneficialToSkip``) so they reuse r0's block (32
    tokens); vLLM and SGLang (fcfs) compute all three. After r0 has finished: vLLM hits 2
    blocks of 16 (32 tokens), SGLang the whole 40 (token pages)."""
    kw = dict(prefix=[0, 0, 0], ptok=[40, 40, 40])
    _, st = steps(TRTLLMConfig(), [60] * 3, [2] * 3, 100, **kw)
    assert st.hit_tokens.tolist() == [0, 32, 32]
    _, st = steps(EngineConfig(), [60] * 3, [2] * 3, 100, **kw)
    assert st.hit_tokens.tolist() == [0, 0, 0]
    _, st = steps(EngineConfig(), [60] * 3, [2] * 3, 100, first=0, **kw)
    assert st.hit_tokens.tolist() == [0, 32, 32]
    _, st = steps(SGLangConfig(), [60] * 3, [2] * 3, 1000, first=0, **kw)
    assert st.hit_tokens.tolist() == [0, 40, 40]


def test_sglang_lpm_puts_the_longest_cached_prefix_first():
    kw = dict(prefix=[0, -1, 0], ptok=[40, 0, 40], first=0)
    fcfs, _ = steps(SGLangConfig(chunked_prefill_size=64), [60] * 3, [2] * 3, 1000, **kw)
    lpm, _ = steps(SGLangConfig(chunked_prefill_size=64, schedule_policy="lpm"), [60] * 3,
                   [2] * 3, 1000, **kw)
    assert fcfs[2] == ([1, 2], [60, 4])     # r1 whole, r2's 20 uncached cut to 4
    assert lpm[2] == ([2, 1], [20, 44])     # r2 (40 cached) first, r1 cut to 44


@pytest.mark.parametrize("name,flags,field", [
    ("sglang", {"schedule_policy": "sjf"}, "--schedule-policy"),
    ("sglang", {"chunked_prefill_size": 0}, "--chunked-prefill-size"),
    ("trtllm", {"capacity_scheduler_policy": "FOO"}, "--capacity-scheduler-policy"),
    ("trtllm", {"max_num_tokens": 0}, "--max-num-tokens"),
    ("vllm-x", {}, "--engine")])
def test_bad_engine_flags(name, flags, field):
    with pytest.raises(SpecError, match=field):
        engine_config(name, **flags)


def test_command_lines():
    assert "--schedule-policy lpm" in SGLangConfig(schedule_policy="lpm").flags()
    line = TRTLLMConfig(capacity_scheduler_policy="MAX_UTILIZATION").flags()
    assert "--max_num_tokens 8192" in line and "MAX_UTILIZATION" in line


def test_cli_engines_routers_and_conversations():
    import json

    from typer.testing import CliRunner

    from perfmodel.cli.app import app

    runner = CliRunner()
    base = ["simulate", "-m", "llama-3-8b", "-H", "h100-sxm", "--no-progress",
            "--format", "json", "--num-requests", "40", "--input-len", "200",
            "--output-len", "20"]
    trt = runner.invoke(app, [*base, "--rate", "5", "--engine", "trtllm",
                              "--capacity-scheduler-policy", "MAX_UTILIZATION"])
    assert trt.exit_code == 0, trt.output
    assert json.loads(trt.stdout[trt.stdout.index("{"):])["n_requests"] == 40
    talk = runner.invoke(app, [*base, "--rate", "2", "--turns", "4", "--think-time", "5",
                               "--dp", "2", "--router", "session-affinity"])
    assert talk.exit_code == 0, talk.output
    assert json.loads(talk.stdout[talk.stdout.index("{"):])["prefix_hit_rate"] > 0.3
    wrong = runner.invoke(app, [*base, "--rate", "5", "--schedule-policy", "lpm"])
    assert wrong.exit_code == 2
    assert "error: --schedule-policy: applies to --engine sglang, not vllm" in wrong.output
    bad = runner.invoke(app, [*base, "--rate", "5", "--dp", "2", "--router", "fastest"])
    assert bad.exit_code == 2 and "error: --router: expected one of" in bad.output


@pytest.mark.parametrize("name,flags", [
    ("sglang", {}), ("sglang", {"schedule_policy": "lpm", "chunked_prefill_size": 256}),
    ("sglang", {"schedule_policy": "dfs-weight", "chunked_prefill_size": 256}),
    ("trtllm", {}), ("trtllm", {"capacity_scheduler_policy": "MAX_UTILIZATION",
                                "enable_chunked_prefill": True, "max_num_tokens": 512})])
def test_priced_ahead_equals_step_by_step(name, flags, monkeypatch):
    """The simulator prices steps ahead from dry runs and keeps those no arrival changed
    (``Batch.open``); with one step at a time the run must be the same."""
    import perfmodel as pm
    from perfmodel.serving import engine_loop, lookahead, traffic
    from perfmodel.serving import simulate as sim

    model, hw = pm.model("llama-3-8b"), pm.hardware("h100-sxm")
    reqs = traffic.generate(80, rate=60, input_len=400, output_len=40, shared_prefix=64,
                            length_dist="lognormal", seed=5)
    engine = engine_config(name, **flags)
    ahead = sim.simulate(model, hw, reqs, engine=engine)
    monkeypatch.setattr(engine_loop, "LOOKAHEAD", 1)
    monkeypatch.setattr(lookahead.Guess, "__init__", _one_step_guess(lookahead.Guess.__init__))
    alone = sim.simulate(model, hw, reqs, engine=engine)
    np.testing.assert_allclose(ahead.first_token_s, alone.first_token_s, rtol=1e-12)
    np.testing.assert_allclose(ahead.token_s, alone.token_s, rtol=1e-12)


def _one_step_guess(init):
    def patched(self):
        init(self)
        self.lookahead = 1
    return patched


def test_trtllm_needs_only_the_prompt_to_fit_max_num_tokens():
    """Chunked prefill off: TensorRT-LLM refuses only a prompt longer than max_num_tokens
    (``llmapi/llm.py`` ``_check_arguments``: prompt + query length, never the output), so a
    budget of 64 serves 60-token prompts with 20 output tokens (80 in all), where vLLM's
    rule (prompt + output within the budget) refuses it; a 70-token prompt is refused."""
    import perfmodel as pm
    from perfmodel.serving import simulate as sim
    from perfmodel.serving.requests import Requests

    model, hw = pm.model("llama-3-8b"), pm.hardware("h100-sxm")
    reqs = Requests.of(np.zeros(2), [60, 60], [20, 20])
    engine = TRTLLMConfig(max_num_tokens=64)
    res = sim.simulate(model, hw, reqs, engine=engine)
    assert np.all(res.finish_s > res.first_token_s)
    with pytest.raises(SpecError, match="max-num-batched-tokens"):
        sim.simulate(model, hw, reqs, engine=EngineConfig(
            max_num_seqs=2, max_num_batched_tokens=64, chunked_prefill=False))
    with pytest.raises(SpecError, match="prompt of 70 tokens"):
        sim.simulate(model, hw, Requests.of(np.zeros(1), [70], [5]), engine=engine)
