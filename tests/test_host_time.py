"""Engine host time: the step and API-server formulas by hand, the shipped profiles (every
constant sourced or marked as a default), versions to modes, the simulator's GPU/host
split, profile files, and the calibration recovering constants it was not told."""

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import perfmodel as pm
from perfmodel.cli.app import app
from perfmodel.compare import serving
from perfmodel.compare import serving_calibrate as cal
from perfmodel.serving import host_time
from perfmodel.serving.engines.vllm import EngineConfig
from perfmodel.serving.host_time import HostTime, resolve
from perfmodel.serving.requests import Requests
from perfmodel.serving.simulate import simulate
from perfmodel.specs.errors import SpecError
from perfmodel.specs.workload import Parallelism


def test_step_by_hand():
    sync = HostTime(step_s=1e-3, seq_s=1e-5, exposed_s=2e-4)
    over = replace(sync, overlap=True)
    gpu, seqs = np.array([5e-3, 1e-3, 1e-3]), np.array([10, 10, 100])
    # sync: all of 1 ms + n x 10 us shows, plus the exposed 0.2 ms
    assert sync.step(gpu, seqs) == pytest.approx([1.3e-3, 1.3e-3, 2.2e-3])
    # overlapped: only the excess over the GPU's step (1.1 ms - 1 ms; 2 ms - 1 ms) shows
    assert over.step(gpu, seqs) == pytest.approx([2e-4, 3e-4, 1.2e-3])
    assert HostTime().none and not sync.none


def test_api_server_serves_one_request_at_a_time():
    h = HostTime(request_s=0.1, prompt_token_s=1e-3)
    seen = h.admit(np.array([0.0, 0.0, 1.0, 1.05]), np.array([100, 0, 100, 100]))
    # 0.2 s each with 100 tokens, 0.1 s with none; the second waits for the first
    assert seen == pytest.approx([0.2, 0.3, 1.2, 1.4])
    t = np.array([0.0, 1.0])
    assert HostTime().admit(t, np.array([5, 5])) is t


@pytest.mark.parametrize("engine,version,mode", [
    ("vllm", "0.24.0", "v1-async"), ("vllm", "0.23.0 (+residency patch)", "v1-async"),
    ("vllm", "0.12.0", "v1-async"), ("vllm", "0.11.2", "v1"), ("vllm", "0.8.0", "v1"),
    ("vllm", "v0.6.3", "v0"), ("sglang", None, "overlap"), ("sglang", "0.3.6", "no-overlap"),
    ("sglang", "0.5.9", "overlap-eager-prefill"), ("sglang", "0.5.10", "overlap"),
    ("trtllm", None, "overlap")])
def test_versions_pick_modes(engine, version, mode):
    assert host_time.default_mode(engine, version) == mode
    assert f"({mode}, http)" in resolve(engine, version).name


def test_every_shipped_constant_has_a_source():
    for engine in host_time.shipped():
        table = host_time._table(engine)
        for mode, body in table["modes"].items():
            assert set(host_time.STEP_KEYS) <= set(body), (engine, mode)
            assert set(body["sources"]) >= {"step_s", "seq_s"}, (engine, mode)
            if "schedule_ahead" in body:        # a flag that changes numbers names its source
                assert "schedule_ahead" in body["sources"], (engine, mode)
        for front in host_time.FRONTENDS:
            body = table["frontends"][front]
            flags = {"tokenize_apart"} & set(body)
            assert set(body["sources"]) == set(host_time.FRONT_KEYS) | flags
    # overlap modes hide what sync modes pay: same work, less shown
    assert resolve("sglang", mode="overlap").step(np.array([0.01]), np.array([64]))[0] < \
        resolve("sglang", mode="no-overlap").step(np.array([0.01]), np.array([64]))[0]


def test_bad_choices_are_one_line_errors():
    with pytest.raises(SpecError, match="--engine-mode: expected one of v1-async"):
        resolve("vllm", mode="async")
    with pytest.raises(SpecError, match="--engine-version: expected a version"):
        resolve("vllm", "latest")


def _lone(host: HostTime, prompt: int = 500, out: int = 8):
    m, hw = pm.model("llama-3-8b"), pm.hardware("h100-sxm")
    reqs = Requests.of([0.0, 100.0], [prompt] * 2, [out] * 2)
    return simulate(m, hw, reqs, Parallelism(), EngineConfig(host=host))


def test_lone_request_adds_host_time_by_hand():
    gpu = _lone(HostTime())
    h = HostTime(step_s=1e-3, seq_s=1e-4, request_s=2e-3, prompt_token_s=1e-5, stream_s=3e-4)
    res = _lone(h)
    # TTFT: API server 2 ms + 500 x 10 us, the prefill step's host 1.1 ms, the stream 0.3 ms
    assert res.ttft_s - gpu.ttft_s == pytest.approx([8.4e-3] * 2, abs=1e-9)
    # every decode gap: one step's host time, 1.1 ms
    assert res.itl_s - gpu.itl_s == pytest.approx(np.full(14, 1.1e-3), abs=1e-9)
    s = res.steps
    assert s.gpu_s == pytest.approx(gpu.steps.time_s) and s.host_s == pytest.approx(1.1e-3)
    t = res.summary()["engine_time"]
    assert t["host_s"] == pytest.approx(1.1e-3 * len(s.time_s))
    assert t["api_server_mean_s"] == pytest.approx(7e-3) and t["stream_s"] == 3e-4
    assert res.arrival_s.tolist() == [0.0, 100.0]       # the client's send times
    assert gpu.summary()["engine_time"]["host_s"] == 0.0


def test_profile_file_round_trip_and_errors(tmp_path):
    h = HostTime(step_s=1e-3, exposed_s=2e-4, overlap=True, request_s=4e-3, name="mine")
    path = tmp_path / "p.yaml"
    host_time.write_profile(path, h, {"calibration": {"fit_runs": ["a"]}})
    back = host_time.load_profile(path)
    assert back == replace(h, name="mine")
    path.write_text("host: {step_s: -1}\n")
    with pytest.raises(SpecError, match=r"host\.step_s: expected a non-negative"):
        host_time.load_profile(path)
    result = CliRunner().invoke(app, ["simulate", "--model", "llama-3-8b", "--hardware",
                                      "h100-sxm", "--engine-profile", str(path)])
    assert result.exit_code == 2 and "error: --engine-profile" in result.output
    result = CliRunner().invoke(app, ["simulate", "--model", "llama-3-8b", "--hardware",
                                      "h100-sxm", "--engine-mode", "fast"])
    assert result.exit_code == 2 and "error: --engine-mode: expected one of" in result.output


def test_compare_reads_engine_version_and_frontend():
    host, notes = serving._host({"engine": "vLLM (AsyncLLM in-process, no HTTP)",
                                 "engine_version": "0.19.0"}, "vllm")
    assert host.request_s == 0 and host.stream_s == 0 and host.overlap and not notes
    host, notes = serving._host({"engine": "vLLM", "engine_version": "0.7.3"}, "vllm")
    assert not host.overlap and "(v0, http)" in host.name
    host, notes = serving._host({"engine": "vLLM", "engine_version": "nightly"}, "vllm")
    assert notes and "0.24.0" in host.name


def test_calibration_recovers_the_constants_it_was_not_told():
    """Runs 'measured' with one profile; the fit starts from another and must find it."""
    m, hw = pm.model("llama-3-8b"), pm.hardware("h100-sxm")
    truth = HostTime(step_s=1e-3, seq_s=1e-5, exposed_s=0.5e-3, overlap=True,
                     request_s=6e-3, prompt_token_s=8e-6, stream_s=2e-4)
    runs = []
    for i, prompt in enumerate((300, 1200)):
        reqs = Requests.of(np.arange(6) * 2.0, [prompt] * 6, [16] * 6)
        summary = simulate(m, hw, reqs, Parallelism(), EngineConfig(host=truth)).summary()
        measured = {k: summary[k] for k in ("ttft_s", "itl_s", "tpot_s", "e2e_s")}
        runs.append(serving.Run(f"r{i}", "llama-3-8b", "h100-sxm", Parallelism(),
                                EngineConfig(host=truth), reqs, measured))
    start = replace(truth, exposed_s=0.0, request_s=1e-3, prompt_token_s=0.0)
    fitted, history = cal.fit(runs, start)
    assert len(history) == cal.ROUNDS and all(cal.low_load(r) for r in runs)
    assert fitted.exposed_s == pytest.approx(truth.exposed_s, rel=0.02)
    assert fitted.request_s == pytest.approx(truth.request_s, rel=0.05)
    assert fitted.prompt_token_s == pytest.approx(truth.prompt_token_s, rel=0.05)
    assert (fitted.step_s, fitted.seq_s, fitted.stream_s) == (1e-3, 1e-5, 2e-4)
    rows = cal.predict(runs, fitted)
    assert max(abs(r["ttft_s.p50"]) for r in rows) < 0.01


def test_split_is_by_rate_and_deterministic():
    def run(i: str, rate: float) -> serving.Run:
        return serving.Run(i, "", "", Parallelism(), EngineConfig(),
                           Requests.of(np.arange(5) / rate, [10] * 5, [2] * 5), {})
    runs = [run(str(r), r) for r in (5.0, 1.0, 3.0, 2.0, 4.0, 6.0)]
    fit, held = cal.split(runs, 3)
    assert [r.id for r in fit] == ["1.0", "4.0"]
    assert [r.id for r in held] == ["2.0", "3.0", "5.0", "6.0"]


def test_calibrate_serving_command(tmp_path: Path):
    from tests.test_compare_serving import _files

    exp, req = _files(tmp_path)
    out = tmp_path / "cal"
    result = CliRunner().invoke(app, ["calibrate-serving", str(exp), "--requests", str(req),
                                      "--out", str(out), "--no-progress"])
    assert result.exit_code == 0, result.output
    assert "zero-shot" in result.output and (out / "engine-profile.yaml").is_file()
    host = host_time.load_profile(out / "engine-profile.yaml")
    assert host.overlap and "calibrated on 1 runs" in host.name
    result = CliRunner().invoke(app, ["calibrate-serving", str(exp), "--requests", str(req),
                                      "--only", "nothing"])
    assert result.exit_code == 2 and "error: --only" in result.output
