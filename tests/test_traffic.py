"""Request streams: generated arrivals and lengths, and CSV traces read, written and refused."""

from __future__ import annotations

import math

import numpy as np
import pytest

from perfmodel.serving.requests import Requests
from perfmodel.serving.traffic import describe, generate, read_trace, write_trace
from perfmodel.specs.errors import SpecError

N = 20000


def _gaps(requests: Requests) -> np.ndarray:
    return np.diff(np.concatenate([[0.0], requests.arrival_s]))


def _cv2(gaps: np.ndarray) -> float:
    return float(np.var(gaps) / np.mean(gaps) ** 2)


def test_one_seed_gives_one_stream_and_another_seed_another():
    kw = dict(rate=3.0, input_len=500, output_len=100, length_dist="lognormal")
    a, b, c = generate(500, **kw, seed=7), generate(500, **kw, seed=7), generate(500, **kw)
    for name in ("arrival_s", "input_tokens", "output_tokens"):
        assert np.array_equal(getattr(a, name), getattr(b, name))
        assert not np.array_equal(getattr(a, name), getattr(c, name))


def test_arrivals_input_and_output_lengths_draw_from_separate_streams():
    kw = dict(input_len=500, length_dist="uniform", seed=3)
    slow = generate(300, rate=1.0, output_len=100, **kw)
    fast = generate(300, rate=9.0, arrival="gamma", burstiness=0.5, output_len=100, **kw)
    longer = generate(300, rate=1.0, output_len=400, **kw)
    assert np.array_equal(slow.input_tokens, fast.input_tokens)
    assert np.array_equal(slow.output_tokens, fast.output_tokens)
    assert np.array_equal(slow.input_tokens, longer.input_tokens)
    assert np.array_equal(slow.arrival_s, longer.arrival_s)
    fixed = generate(300, rate=1.0, input_len=500, output_len=100, seed=3)
    assert np.array_equal(slow.arrival_s, fixed.arrival_s)


def test_poisson_gaps_have_mean_one_over_rate_and_cv_one():
    r = generate(N, rate=4.0, input_len=10, output_len=10)
    gaps = _gaps(r)
    assert np.all(gaps > 0)
    assert np.mean(gaps) == pytest.approx(0.25, rel=0.03)
    assert math.sqrt(_cv2(gaps)) == pytest.approx(1.0, abs=0.05)
    assert r.arrival_s[-1] == pytest.approx(N / 4.0, rel=1e-12)   # vLLM's rescaling


@pytest.mark.parametrize("burstiness", [0.25, 0.5, 2.0, 8.0])
def test_gamma_gaps_have_squared_cv_one_over_burstiness(burstiness):
    """vLLM: gamma shape = burstiness, scale = 1/(rate*burstiness), so CV^2 = 1/burstiness."""
    gaps = _gaps(generate(N, rate=2.0, arrival="gamma", burstiness=burstiness,
                          input_len=10, output_len=10, seed=1))
    assert np.mean(gaps) == pytest.approx(0.5, rel=0.03)
    assert _cv2(gaps) == pytest.approx(1 / burstiness, rel=0.1)


def test_gamma_with_burstiness_one_is_poisson_and_infinite_burstiness_is_constant():
    kw = dict(rate=5.0, input_len=10, output_len=10, seed=4)
    poisson = generate(1000, **kw)
    assert np.array_equal(generate(1000, arrival="gamma", **kw).arrival_s, poisson.arrival_s)
    flat = generate(1000, arrival="gamma", burstiness=math.inf, **kw)
    assert np.array_equal(flat.arrival_s, generate(1000, arrival="constant", **kw).arrival_s)


def test_constant_gaps_are_exactly_one_over_rate_from_the_first_gap():
    r = generate(1000, rate=8.0, arrival="constant", input_len=10, output_len=10)
    assert r.arrival_s[0] == 0.125
    np.testing.assert_allclose(_gaps(r), 0.125, rtol=1e-9)


def test_infinite_rate_sends_everything_at_once():
    r = generate(10, rate=math.inf, input_len=10, output_len=10)
    assert np.all(r.arrival_s == 0) and r.closed_loop == 0


@pytest.mark.parametrize("sigma", [0.5, 1.0])
def test_lognormal_lengths_have_the_asked_mean(sigma):
    r = generate(N, rate=1.0, input_len=800, output_len=200, length_dist="lognormal",
                 spread=sigma)
    assert np.mean(r.input_tokens) == pytest.approx(800, rel=0.03)
    assert np.mean(r.output_tokens) == pytest.approx(200, rel=0.03)
    assert np.std(np.log(r.input_tokens)) == pytest.approx(sigma, rel=0.05)
    assert r.output_tokens.min() >= 1


def test_lognormal_lengths_are_at_least_one():
    r = generate(N, rate=1.0, input_len=2, output_len=1, length_dist="lognormal", spread=2.0)
    assert r.input_tokens.min() == 1 and r.output_tokens.min() == 1


def test_uniform_lengths_fill_their_bounds():
    r = generate(N, rate=1.0, input_len=100, output_len=11, length_dist="uniform", spread=0.3)
    assert (r.input_tokens.min(), r.input_tokens.max()) == (70, 130)
    assert (r.output_tokens.min(), r.output_tokens.max()) == (7, 15)   # floor 7.7, ceil 14.3
    assert len(np.unique(r.input_tokens)) == 61


def test_uniform_lengths_never_drop_below_one():
    r = generate(2000, rate=1.0, input_len=2, output_len=1, length_dist="uniform", spread=0.9)
    assert r.input_tokens.min() == 1 and r.output_tokens.min() == 1


def test_empirical_lengths_are_pairs_from_the_source():
    source = Requests.of([0, 1, 2], [100, 2000, 37], [5, 50, 500])
    r = generate(3000, rate=2.0, input_len=1, output_len=1, length_dist="empirical",
                 lengths_from=source)
    pairs = set(zip(r.input_tokens.tolist(), r.output_tokens.tolist(), strict=True))
    assert pairs == {(100, 5), (2000, 50), (37, 500)}


def test_shared_prefix_precedes_each_requests_own_tokens():
    r = generate(50, rate=1.0, input_len=300, output_len=20, length_dist="uniform",
                 shared_prefix=2000)
    own = generate(50, rate=1.0, input_len=300, output_len=20, length_dist="uniform")
    assert np.array_equal(r.input_tokens, own.input_tokens + 2000)
    assert np.all(r.prefix_id == 0) and np.all(r.prefix_tokens == 2000)
    assert np.all(own.prefix_id == -1) and np.all(own.prefix_tokens == 0)


def test_closed_loop_has_users_and_no_think_time():
    r = generate(100, concurrency=8, input_len=10, output_len=10)
    assert r.closed_loop == 8 and np.all(r.arrival_s == 0) and len(r) == 100


@pytest.mark.parametrize("kw, words", [
    (dict(), ["--rate", "--concurrency"]),
    (dict(rate=1.0, concurrency=4), ["--rate", "--concurrency"]),
    (dict(rate=0.0), ["--rate", "> 0"]),
    (dict(rate=1.0, arrival="posson"), ["--arrival", "did you mean 'poisson'"]),
    (dict(rate=1.0, burstiness=0.5), ["--burstiness", "gamma"]),
    (dict(rate=1.0, arrival="gamma", burstiness=0.0), ["--burstiness", "> 0"]),
    (dict(concurrency=4, arrival="gamma"), ["--arrival", "--rate"]),
    (dict(rate=1.0, length_dist="normal"), ["--length-dist"]),
    (dict(rate=1.0, length_dist="uniform", spread=1.0), ["--spread", "[0, 1)"]),
    (dict(rate=1.0, length_dist="lognormal", spread=-1.0), ["--spread", "[0, 3]"]),
    (dict(rate=1.0, length_dist="empirical"), ["--lengths-from"]),
    (dict(rate=1.0, lengths_from=Requests.of([0], [1], [1])), ["--lengths-from"]),
    (dict(rate=1.0, input_len=0), ["--input-len"]),
    (dict(rate=1.0, shared_prefix=-5), ["--shared-prefix"]),
    (dict(rate=1.0, seed=-1), ["--seed"]),
])
def test_bad_arguments_name_the_option(kw, words):
    args = dict(input_len=10, output_len=10) | kw
    with pytest.raises(SpecError) as err:
        generate(10, **args)
    for word in words:
        assert word in str(err.value)
    assert "\n" not in str(err.value)


def test_a_generated_stream_round_trips_through_a_trace(tmp_path):
    r = generate(500, rate=7.0, arrival="gamma", burstiness=0.3, input_len=900,
                 output_len=150, length_dist="lognormal", shared_prefix=1000, seed=5)
    write_trace(r, tmp_path / "t.csv")
    back = read_trace(tmp_path / "t.csv")
    for name in ("arrival_s", "input_tokens", "output_tokens", "prefix_id", "prefix_tokens"):
        assert np.array_equal(getattr(back, name), getattr(r, name)), name
    plain = generate(20, rate=1.0, input_len=9, output_len=9)
    write_trace(plain, tmp_path / "p.csv")
    assert (tmp_path / "p.csv").read_text().splitlines()[0] == \
        "arrival_s,input_tokens,output_tokens"
    assert np.array_equal(read_trace(str(tmp_path / "p.csv")).prefix_id, plain.prefix_id)


def test_a_trace_is_sorted_stably_and_its_prefix_names_become_ids(tmp_path):
    path = tmp_path / "trace.csv"
    path.write_text("input_tokens,arrival_s,output_tokens,prefix_id,prefix_tokens\n"
                    "10,2.0,1,sys-b,5\n"
                    "11,0.5,2,,\n"
                    "\n"
                    "12,0.5,3,sys-a,4\n"
                    "13,0,4,sys-b,5\n"
                    "14,2.0,5,sys-a,4\n")
    r = read_trace(path)
    assert r.arrival_s.tolist() == [0.0, 0.5, 0.5, 2.0, 2.0]
    assert r.input_tokens.tolist() == [13, 11, 12, 10, 14]
    assert r.prefix_id.tolist() == [0, -1, 1, 0, 1]
    assert r.prefix_tokens.tolist() == [5, 0, 4, 5, 4]


def test_write_trace_refuses_closed_loop_and_an_unwritable_path(tmp_path):
    with pytest.raises(SpecError, match="closed-loop"):
        write_trace(generate(5, concurrency=2, input_len=1, output_len=1), tmp_path / "c.csv")
    with pytest.raises(SpecError, match="cannot write"):
        write_trace(generate(5, rate=1.0, input_len=1, output_len=1), tmp_path / "no" / "x.csv")


HEAD = "arrival_s,input_tokens,output_tokens\n"
PHEAD = "arrival_s,input_tokens,output_tokens,prefix_id,prefix_tokens\n"


@pytest.mark.parametrize("text, words", [
    (HEAD + "0,1,1\n1,1,1\n-1.5,1,1\n",
     ["column 'arrival_s', row 4: expected a time >= 0 s, got -1.5"]),
    ("arrival_s,input_tokens\n0,1\n",
     ["missing column 'output_tokens' (expected arrival_s, input_tokens, output_tokens"]),
    (HEAD + "0,2.5,1\n", ["column 'input_tokens', row 2", "whole number", "2.5"]),
    (HEAD + "0,1,0\n", ["column 'output_tokens', row 2", ">= 1", "got 0"]),
    (HEAD + "nan,1,1\n", ["column 'arrival_s', row 2", "got nan"]),
    (HEAD + "0,inf,1\n", ["column 'input_tokens', row 2", "got inf"]),
    (HEAD + "0,many,1\n", ["column 'input_tokens', row 2", "got text that is not a number"]),
    (HEAD + "0,,1\n", ["column 'input_tokens', row 2", "empty field"]),
    ("", ["empty file", "arrival_s"]),
    (HEAD, ["no requests"]),
    (HEAD + "0,1\n", ["row 2", "expected 3 fields", "got 2"]),
    ("arrival_s,input_tokens,output_tokns\n0,1,1\n",
     ["header column 3 of 3 is not a trace column", "did you mean 'output_tokens'"]),
    ("arrival_s,input_tokens,input_tokens,output_tokens\n0,1,1,1\n",
     ["column 'input_tokens' given twice"]),
    ("arrival_s,input_tokens,output_tokens,prefix_id\n0,1,1,a\n",
     ["missing column 'prefix_tokens'", "'prefix_id' needs it"]),
    (PHEAD + "0,100,1,a,101\n", ["column 'prefix_tokens', row 2", "at most input_tokens"]),
    (PHEAD + "0,100,1,a,50\n1,100,1,a,60\n",
     ["column 'prefix_tokens', row 3", "this prefix_id has 50 tokens at row 2", "got 60"]),
    (PHEAD + "0,100,1,a,\n", ["column 'prefix_tokens', row 2", "empty field"]),
    (PHEAD + "0,100,1,,20\n", ["column 'prefix_tokens', row 2", "prefix_id is empty"]),
])
def test_a_bad_trace_is_one_line_naming_file_column_and_row(tmp_path, text, words):
    path = tmp_path / "trace.csv"
    path.write_text(text)
    with pytest.raises(SpecError) as err:
        read_trace(path)
    message = str(err.value)
    assert message.startswith(f"{path}: ") and "\n" not in message
    for word in words:
        assert word in message


def test_an_unreadable_trace_path_is_named(tmp_path):
    with pytest.raises(SpecError, match="no such file"):
        read_trace(tmp_path / "missing.csv")
    with pytest.raises(SpecError, match="is a directory"):
        read_trace(tmp_path)
    binary = tmp_path / "trace.csv"
    binary.write_bytes(b"arrival_s,input_tokens,output_tokens\n\xff\xfe,1,1\n")
    with pytest.raises(SpecError, match=r"trace\.csv: not a CSV trace"):
        read_trace(binary)


def test_describe_says_rate_or_users_lengths_and_sharing():
    open_loop = describe(generate(100, rate=4.0, input_len=300, output_len=50,
                                  shared_prefix=700))
    assert open_loop == ("100 requests, 4 req/s over 25 s; mean input 1000 tokens, "
                         "mean output 50 tokens; 100% share a prefix (70% of prompt tokens)")
    closed = describe(generate(1, concurrency=3, input_len=5, output_len=6))
    assert closed == ("1 request, closed loop, 3 concurrent users; mean input 5 tokens, "
                      "mean output 6 tokens; no shared prefix")
    burst = describe(Requests.of([0, 0], [1, 3], [1, 1], [0, 1], [1, 1]))
    assert "all arriving at t=0" in burst and "2 prefixes (50% of prompt tokens)" in burst
