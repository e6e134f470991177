"""The public trace readers (``perfmodel.serving.traces``): each shipped sample through
``simulate --trace`` (the request count and the first rows' arrivals and lengths, read by
hand from the sample files in tests/data/traces), one through ``plan --trace``, the
Mooncake hash_ids mapped onto the prefix model by a hand-derived golden, and the options
and errors."""

import csv
import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from perfmodel.cli.app import app
from perfmodel.serving import traces, traffic
from perfmodel.serving.traces import mooncake
from perfmodel.specs.errors import SpecError

DATA = Path(__file__).parent / "data" / "traces"
SIM = ["simulate", "-m", "llama-3.1-8b", "-H", "h100-sxm", "--no-band", "--no-progress"]

# file -> (format, requests, [(arrival s, input, output) of the first three rows])
SAMPLES = {
    # timestamps 0, 0, 0 ms (lines 1-3)
    "mooncake_conversation_head.jsonl": ("mooncake", 40, [(0.0, 6758, 500), (0.0, 7322, 490),
                                                          (0.0, 7236, 794)]),
    # 18:17:03.9799600, 04.0319600, 04.0781490
    "azure2023_code_head.csv": ("azure", 40, [(0.0, 4808, 10), (0.052, 3180, 8),
                                              (0.098189, 110, 27)]),
    # 00:00:00.009930, .017335, .022314 (+00:00)
    "azure2024_code_head.csv": ("azure", 5, [(0.0, 2162, 5), (0.007405, 2399, 6),
                                             (0.012384, 76, 15)]),
    # Timestamp 5, 45, 118 s
    "burstgpt_1_head.csv": ("burstgpt", 3, [(0.0, 472, 18), (40.0, 1087, 230),
                                            (113.0, 417, 276)]),
    # 24 rows, two with 0 response tokens (left out); Timestamp 5, 13, 14 s
    "burstgpt_3_synthetic.csv": ("burstgpt", 22, [(0.0, 706, 139), (8.0, 335, 297),
                                                  (9.0, 1180, 68)]),
}


@pytest.fixture(autouse=True)
def _no_figures(monkeypatch):
    """``--out`` writes the per-request table these tests read; its figures are not
    drawn (matplotlib's time, nothing checked here)."""
    from perfmodel.report import serving_plots

    for name in ("time_series", "latency_cdfs"):
        monkeypatch.setattr(serving_plots, name, lambda *a, **k: None)
    monkeypatch.setattr("perfmodel.cli.simulate_files.save", lambda *a, **k: None)


def _simulate(tmp_path: Path, *args: str) -> tuple[list[dict], str]:
    result = CliRunner().invoke(app, [*SIM, *args, "--out", str(tmp_path / "o")])
    assert result.exit_code == 0, result.output
    with (tmp_path / "o" / "requests.csv").open() as file:
        return list(csv.DictReader(file)), result.stderr


@pytest.mark.parametrize("name", SAMPLES)
def test_simulate_takes_each_sample(name, tmp_path):
    fmt, count, first = SAMPLES[name]
    assert traces.detect(DATA / name) == fmt
    rows, _ = _simulate(tmp_path, "--trace", str(DATA / name))
    assert len(rows) == count
    got = [(float(r["arrival_s"]), int(r["input_tokens"]), int(r["output_tokens"]))
           for r in rows[:3]]
    for (t, i, o), (t0, i0, o0) in zip(got, first, strict=True):
        assert (i, o) == (i0, o0) and t == pytest.approx(t0, abs=1e-6)


def test_the_mooncake_sample_shares_its_first_block(tmp_path):
    """Every line of the sample begins with hash 0: one 512-token chain, which the 39
    requests after the first hit, and the warning says all of it is kept."""
    rows, err = _simulate(tmp_path, "--trace", str(DATA / "mooncake_conversation_head.jsonl"))
    assert {r["prefix_id"] for r in rows} == {"0"}
    assert sum(int(r["prefix_hit_tokens"]) for r in rows) == 39 * 512
    assert "19,968 of 19,968 reusable prompt tokens kept (100%" in err


def test_simulate_takes_sharegpt_with_a_rate(tmp_path):
    """11 of 12 entries have two turns; lengths are characters / 4 rounded up (entry 1: a
    42-character prompt, a 117-character answer); arrivals those --rate 2 --seed 3 draws."""
    name = str(DATA / "sharegpt_synthetic.json")
    result = CliRunner().invoke(app, [*SIM, "--trace", name])
    assert result.exit_code == 2 and "no arrival times" in result.stderr
    rows, err = _simulate(tmp_path, "--trace", name, "--rate", "2", "--seed", "3")
    assert len(rows) == 11 and "1 of 12 requests left out" in err
    assert [(int(r["input_tokens"]), int(r["output_tokens"])) for r in rows[:2]] == \
        [(11, 30), (15, 74)]
    times = traffic.generate(11, rate=2, seed=3, input_len=1, output_len=1).arrival_s
    assert [float(r["arrival_s"]) for r in rows] == pytest.approx(times, abs=1e-6)


def test_plan_takes_a_public_trace():
    """The Azure 2023 sample: 40 requests over 34.2844 s (18:17:03.97996 to 18:17:38.26440)
    is 39 / 34.2844 req/s; its mean lengths; the check draws from the file itself."""
    result = CliRunner().invoke(app, ["plan", "-m", "llama-3.1-8b", "-H", "h100-sxm",
                                      "--slo-ttft", "1", "--slo-tpot", "0.05", "--requests",
                                      "100", "--trace", str(DATA / "azure2023_code_head.csv"),
                                      "-f", "json"])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    reqs = traces.read(DATA / "azure2023_code_head.csv").requests
    assert plan["rate_req_s"] == pytest.approx(39 / 34.284439)
    assert plan["input_len"] == pytest.approx(reqs.input_tokens.mean())
    assert "--lengths-from " + str(DATA / "azure2023_code_head.csv") in \
        plan["simulate_command"]


def test_mooncake_prefixes_hand_derived():
    """r0 [1,2,3,4] 2000 tok; r1 [1,2,3,5,6] 2560; r2 [1,2,3,5,7] 2560; r3 [1,8] 1000;
    r4 [1,8,10] 1500; r5 [11] 100. Shared paths (leading blocks another request also has):
    3, 4, 4, 2, 2, 0 blocks. r0 starts chain 0 (cached as 3 blocks); r1 extends it to
    [1,2,3,5] and r2 lies on it, each hitting 3; r3 leaves it after block 1, a branch:
    chain 1, cached as 2 blocks, which r4 hits. The hashes would reuse 3 + 4 + 1 + 2
    blocks (r2 hits r1's block 5, r3 the shared block 1); the chains give 3 + 3 + 2."""
    paths = [[1, 2, 3, 4], [1, 2, 3, 5, 6], [1, 2, 3, 5, 7], [1, 8], [1, 8, 10], [11]]
    inputs = np.array([2000, 2560, 2560, 1000, 1500, 100])
    ids, tokens, kept, ideal = mooncake.prefixes(paths, inputs)
    assert ids.tolist() == [0, 0, 0, 1, 1, -1]
    assert tokens.tolist() == [1536, 2048, 2048, 1000, 1024, 0]
    assert (kept, ideal) == (8 * 512, 10 * 512)


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_azure_2024_times_with_and_without_a_fraction(tmp_path):
    path = _write(tmp_path, "a.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n"
                  "2024-05-12 00:00:00.001163+00:00,1452,3\n2024-05-12 00:00:01+00:00,584,3\n")
    reqs = traces.read(path).requests
    assert reqs.arrival_s.tolist() == pytest.approx([0.0, 0.998837])


def test_window_and_speedup():
    """The Azure 2023 sample's rows from 1 s to 2 s after its first (18:17:04.97996 to
    18:17:05.97996): rows 9-13 of the file, at 04.9960010 .. 05.3790470, halved."""
    reqs = traces.read(DATA / "azure2023_code_head.csv").requests
    cut = traces.reshape(reqs, traces.parse_window("1:2"), 2.0)
    inside = np.array([4.9960010, 5.2792720, 5.2792970, 5.3788820, 5.3790470]) - 3.9799600
    assert cut.arrival_s.tolist() == pytest.approx(((inside - 1) / 2).tolist())
    assert cut.input_tokens.tolist() == [34, 1145, 201, 137, 7427]
    assert traces.parse_window(":600") == (0.0, 600.0)
    assert traces.parse_window("600:") == (600.0, float("inf"))
    for bad in ("5", "a:b", "10:5", "-1:3"):
        with pytest.raises(SpecError, match="--trace-window"):
            traces.parse_window(bad)


@pytest.mark.parametrize(("args", "expected"), [
    (["--trace-format", "mooncak"], "--trace-format: expected one of auto, native, mooncake"),
    (["--trace-format", "mooncake"], "line 1: not JSON (column 1), expected one JSON object"),
    (["--trace-format", "burstgpt"], "missing column 'Timestamp' (a BurstGPT trace"),
    (["--trace-window", "100:200"], "--trace-window: no request arrives in [100, 200) s"),
    (["--rate", "2"], "--rate: azure2023_code_head.csv has its own arrival times"),
    (["--trace-speedup", "0"], "--trace-speedup: expected a number > 0"),
])
def test_bad_trace_options(args, expected):
    result = CliRunner().invoke(app, [*SIM, "--trace", str(DATA / "azure2023_code_head.csv"),
                                      *args])
    assert result.exit_code == 2 and len(result.stderr.splitlines()) == 1, result.output
    assert expected in result.stderr


def test_trace_options_need_a_trace():
    result = CliRunner().invoke(app, [*SIM, "--rate", "1", "--trace-window", "0:5"])
    assert result.exit_code == 2 and "--trace-window: applies to --trace" in result.stderr


@pytest.mark.parametrize(("name", "text", "expected"), [
    ("m.jsonl", '{"timestamp": 0, "input_length": 5, "output_length": 1}\n{"timestamp": 1}\n',
     "line 2: missing field 'input_length'"),
    ("m.jsonl", '{"timestamp": -1, "input_length": 5, "output_length": 1}\n',
     "line 1: field 'timestamp': expected milliseconds >= 0"),
    ("m.jsonl", '{"timestamp": 0, "input_length": 5.5, "output_length": 1}\n',
     "field 'input_length': expected a whole number of tokens"),
    ("a.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2024-05-12 00:00:00,1,1\nsoon,1,1\n",
     "column 'TIMESTAMP', row 3: expected a date and time"),
    ("a.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2024-05-12 00:00:00,x,1\n",
     "column 'ContextTokens', row 2: expected a whole number of tokens in [0,"),
    ("b.csv", "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
              "1,ChatGPT,0,0,0,API log\n", "no request with at least one prompt and one output"),
    ("s.json", '{"conversations": []}', "expected a JSON list of"),
    ("s.json", '[{"conversations": [{"from": "human", "value": 3}, {}]}]',
     "entry 1: expected each turn an object with a text 'value'"),
])
def test_reader_errors_name_the_place(tmp_path, name, text, expected):
    path = _write(tmp_path, name, text)
    fmt = {"m": "mooncake", "a": "azure", "b": "burstgpt", "s": "sharegpt"}[name[0]]
    with pytest.raises(SpecError) as exc:
        traces.read(path, fmt)
    assert expected in str(exc.value) and str(path) in str(exc.value)


def test_failed_calls_are_counted(tmp_path):
    loaded = traces.read(DATA / "burstgpt_3_synthetic.csv")
    assert loaded.notes == ("burstgpt_3_synthetic.csv: 2 of 24 requests left out: no prompt "
                            "token or no output token (a failed or empty request)",)


def test_an_unknown_file_keeps_the_native_message(tmp_path):
    path = _write(tmp_path, "x.csv", "when,what\n1,2\n")
    with pytest.raises(SpecError, match=r"header column 1 of 2 is not a trace column .*; or "
                       r"a trace in a published format"):
        traces.read(path)


def test_lengths_from_takes_a_public_trace(tmp_path):
    rows, _ = _simulate(tmp_path, "--rate", "5", "--num-requests", "20", "--length-dist",
                        "empirical", "--lengths-from", str(DATA / "burstgpt_1_head.csv"))
    pairs = {(472, 18), (1087, 230), (417, 276)}
    assert len(rows) == 20
    assert {(int(r["input_tokens"]), int(r["output_tokens"])) for r in rows} <= pairs


def test_a_native_trace_keeps_its_own_message(tmp_path):
    path = _write(tmp_path, "n.csv", "arrival_s,input_tokens,output_tokens\n-1,5,5\n")
    with pytest.raises(SpecError) as exc:
        traces.read(path)
    assert "expected a time >= 0 s" in str(exc.value)
    assert "published format" not in str(exc.value)


@pytest.mark.parametrize("fmt", ["auto", *traces.FORMATS])
def test_a_pipe_is_refused_unread(tmp_path, fmt):
    """Telling a format reads no byte of a pipe (the read would block): each reader says
    it is not a regular file."""
    import os

    fifo = tmp_path / "t.jsonl"
    os.mkfifo(fifo)
    with pytest.raises(SpecError, match="not a regular file"):
        traces.read(fifo, fmt)
