"""A conversation's later turn is sent its think time after the client has the previous
turn's last token (``serving.sessions``): a hand-derived golden on a two-session trace with
every step priced 10 ms, the host time's part, the property that more think time never
ends a session sooner, and the CLI."""

import itertools

import numpy as np
import pytest

import perfmodel as pm
from perfmodel.serving import sessions, traffic
from perfmodel.serving.engines.vllm import EngineConfig
from perfmodel.serving.host_time import HostTime
from perfmodel.serving.pricing import StepPricer
from perfmodel.serving.simulate import simulate
from perfmodel.specs.errors import SpecError
from perfmodel.specs.workload import Parallelism

MODEL, HW = pm.model("llama-3-8b"), pm.hardware("h100-sxm")
DT = 0.01
TRACE = """arrival_s,input_tokens,output_tokens,session_id,turn
0.000,32,3,a,1
0.005,40,2,b,1
0.100,51,2,a,2
0.100,58,1,b,2
"""


@pytest.fixture
def flat_steps(monkeypatch):
    """Every step 10 ms of GPU time (host time per step none): times by hand."""
    def times(self, batches):
        self.calls += 1
        self.priced += len(batches)
        self.last_host = np.zeros(len(batches))
        return np.full(len(batches), DT)
    monkeypatch.setattr(StepPricer, "times", times)


def _trace(tmp_path, think=None):
    path = tmp_path / "talk.csv"
    path.write_text(TRACE)
    reqs = traffic.read_trace(path)
    return reqs if think is None else sessions.after_answers(reqs, think)


def test_two_sessions_by_hand(flat_steps, tmp_path):
    """vLLM, 16-token blocks, 10 ms steps. Step 1 [0, 10 ms): a1's prompt (b1 arrives at
    5 ms, during it). Step 2: a1 decodes, b1's prompt. Step 3 ends at 30 ms: a1's third
    token and b1's second: both finish. a2 and b2 are sent 20 ms after: at 50 ms (their
    recorded 100 ms unused). a1 computed 32 + 2 tokens (its last token is never fed
    back): 2 full blocks cached, so a2 hits 32 of 51; b1 computed 41: b2 hits 32 of 58.
    Step 4 [50, 60 ms): both prefills (19 + 26 tokens); b2's one token ends it. Step 5:
    a2's second token, at 70 ms."""
    res = simulate(MODEL, HW, _trace(tmp_path, 0.02))
    np.testing.assert_allclose(res.arrival_s, [0.0, 0.005, 0.05, 0.05], atol=1e-12)
    np.testing.assert_allclose(res.finish_s, [0.03, 0.03, 0.07, 0.06], atol=1e-12)
    np.testing.assert_allclose(res.first_token_s, [0.01, 0.02, 0.06, 0.06], atol=1e-12)
    assert res.prefix_hit_tokens.tolist() == [0, 0, 32, 32]
    recorded = simulate(MODEL, HW, _trace(tmp_path))           # the trace's own times
    np.testing.assert_allclose(recorded.arrival_s, [0.0, 0.005, 0.1, 0.1], atol=1e-12)
    np.testing.assert_allclose(recorded.finish_s, [0.03, 0.03, 0.12, 0.11], atol=1e-12)


def test_host_time_delays_the_next_turn_by_the_stream_and_its_api_server(flat_steps,
                                                                        tmp_path):
    """The client has a1's last token stream_s after the engine's step; a2 is sent 20 ms
    later and reaches the engine after its own API-server time (request_s + per token)."""
    host = HostTime(request_s=0.003, prompt_token_s=1e-4, stream_s=0.002)
    res = simulate(MODEL, HW, _trace(tmp_path, 0.02), engine=EngineConfig(host=host))
    a1, a2 = 0, 2
    assert res.arrival_s[a2] == pytest.approx(res.finish_s[a1] + 0.02, abs=1e-12)
    assert res.info["api_server_s"][a2] == pytest.approx(0.003 + 51e-4)
    engine_sees = res.finish_s[a1] - 0.002 + 0.02 + 0.002 + 0.003 + 51e-4
    assert res.scheduled_s[a2] >= engine_sees - 1e-12


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_more_think_time_never_ends_a_session_sooner(seed):
    reqs = traffic.generate(60, rate=12.0, input_len=300, output_len=40, turns=3,
                            think_time=0.0, turn_growth=60, length_dist="lognormal",
                            seed=seed)
    ends = []
    for think in (0.0, 0.2, 1.0, 5.0):
        res = simulate(MODEL, HW, sessions.after_answers(reqs, think))
        end = np.zeros(int(reqs.session_id.max()) + 1)
        np.maximum.at(end, reqs.session_id, res.finish_s)
        ends.append(end)
        later = reqs.turn > 1
        assert res.arrival_s[later].min() > 0
    assert all(np.all(b >= a) for a, b in itertools.pairwise(ends))


def test_a_turn_waits_for_its_answer_in_the_generator():
    """Each later turn is sent think_time after the previous turn's last token."""
    reqs = traffic.generate(12, rate=4.0, input_len=200, output_len=30, turns=3,
                            think_time=0.5, turn_growth=40, seed=1)
    res = simulate(MODEL, HW, reqs)
    for s in range(4):
        mine = np.flatnonzero(reqs.session_id == s)
        mine = mine[np.argsort(reqs.turn[mine])]
        np.testing.assert_allclose(res.arrival_s[mine[1:]], res.finish_s[mine[:-1]] + 0.5,
                                   rtol=1e-12)


def test_replicas_dealt_apart_keep_nominal_times_affinity_follows_answers():
    reqs = traffic.generate(24, rate=4.0, input_len=200, output_len=30, turns=3,
                            think_time=0.5, turn_growth=40, seed=1)
    rr = simulate(MODEL, HW, reqs, Parallelism(dp=2))
    np.testing.assert_allclose(rr.arrival_s, reqs.arrival_s)
    aff = simulate(MODEL, HW, reqs, Parallelism(dp=2), router="session-affinity")
    later = reqs.turn > 1
    assert np.all(aff.arrival_s[later] > reqs.arrival_s[later])


def test_think_time_needs_sessions(tmp_path):
    path = tmp_path / "plain.csv"
    path.write_text("arrival_s,input_tokens,output_tokens\n0,10,2\n")
    with pytest.raises(SpecError, match="--think-time: applies to a trace with session_id"):
        sessions.after_answers(traffic.read_trace(path), 1.0)


def test_cli_trace_think_time_warns_and_respaces(tmp_path):
    import json

    from typer.testing import CliRunner

    from perfmodel.cli.app import app

    path = tmp_path / "talk.csv"
    path.write_text(TRACE)
    base = ["simulate", "-m", "llama-3-8b", "-H", "h100-sxm", "--no-progress", "--format",
            "json", "--trace", str(path)]
    runner = CliRunner()
    kept = runner.invoke(app, base)
    spaced = runner.invoke(app, [*base, "--think-time", "5"])
    assert kept.exit_code == 0 and spaced.exit_code == 0, spaced.output
    assert "warning: --think-time 5: talk.csv's later turns are sent" in spaced.output
    assert "warning" not in kept.output
    one, two = (json.loads(r.stdout[r.stdout.index("{"):]) for r in (kept, spaced))
    assert two["duration_s"] > one["duration_s"] + 4.9
    rr = runner.invoke(app, ["simulate", "-m", "llama-3-8b", "-H", "h100-sxm",
                             "--no-progress", "--rate", "2", "--num-requests", "12",
                             "--turns", "3", "--think-time", "1", "--dp", "2"])
    assert rr.exit_code == 0, rr.output
    assert "warning: --router round-robin: a session's turns run on different" in rr.output


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
@pytest.mark.parametrize("think", [0.0, 0.05])
def test_turns_after_answers_priced_ahead_equal_step_by_step(engine, think, monkeypatch):
    """The dry runs stop where a turn's answer ends (its next turn's time rests on it) and
    the replay cuts where a pending turn arrives: with one step at a time the run is the
    same."""
    from perfmodel.serving import engine_loop, host_time, lookahead
    from perfmodel.serving import simulate as sim
    from perfmodel.serving.engines import engine_config

    reqs = traffic.generate(48, rate=40.0, input_len=300, output_len=20, turns=3,
                            think_time=think, turn_growth=40, length_dist="lognormal",
                            seed=7)
    config = engine_config(engine, host=host_time.resolve(engine))
    ahead = sim.simulate(MODEL, HW, reqs, engine=config)
    monkeypatch.setattr(engine_loop, "LOOKAHEAD", 1)
    init = lookahead.Guess.__init__

    def one(self):
        init(self)
        self.lookahead = 1
    monkeypatch.setattr(lookahead.Guess, "__init__", one)
    alone = sim.simulate(MODEL, HW, reqs, engine=config)
    np.testing.assert_allclose(ahead.arrival_s, alone.arrival_s, rtol=1e-12)
    np.testing.assert_allclose(ahead.token_s, alone.token_s, rtol=1e-12)
    assert ahead.info["price_calls"] < alone.info["price_calls"]
