"""The page's JSON API without a browser: the numbers are the CLI's, a mistake is the CLI's
one line (400), anything else a one-line 500, and the server keeps answering; uploads stay
in a temporary folder that is removed."""

import json
import os
import shlex
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from typer.testing import CliRunner

import perfmodel as pm
from perfmodel.cli.app import app
from perfmodel.ui import api
from perfmodel.ui.server import start

runner = CliRunner()
# a simulation's runs: the central one, and the band's two edges where the device has a band
RUNS = 3 if pm.hardware("h100-sxm").uncertainty is not None else 1
BASE = {"model": "llama-3-8b", "hardware": "h100-sxm"}
LLAMA_HF = {"model_type": "llama", "hidden_size": 512, "num_hidden_layers": 4,
            "num_attention_heads": 8, "num_key_value_heads": 2, "intermediate_size": 1536,
            "vocab_size": 32000, "max_position_embeddings": 4096, "torch_dtype": "bfloat16"}


@pytest.fixture(scope="module")
def server():
    srv, _ = start()
    yield srv
    srv.shutdown()
    srv.server_close()


def call(srv, path: str, body=None, raw: bytes | None = None):
    """The page's request: the token in its header, JSON as application/json, an upload
    as application/octet-stream."""
    data = raw if raw is not None else None if body is None else json.dumps(body).encode()
    kind = "application/octet-stream" if path.startswith("/api/upload") else \
        "application/json"
    req = urllib.request.Request(srv.base + path.lstrip("/"), data=data,
                                 method="GET" if data is None else "POST",
                                 headers={"Authorization": f"token {srv.token}",
                                          **({"Content-Type": kind} if data else {})})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def cli(line: str) -> tuple[int, str, str]:
    """Run a page's ``perfmodel ...`` command line through the CLI."""
    args = shlex.split(line)
    assert args[0] == "perfmodel"
    result = runner.invoke(app, args[1:])
    return result.exit_code, result.stdout, result.stderr


@pytest.mark.parametrize("settings", [
    {"batch": 8},
    {"batch": "32", "act-dtype": "fp8", "kv-dtype": "fp8", "weights-dtype": "fp8"},
    {"model": "mixtral-8x7b", "hardware": "a100-80gb-sxm", "tp": 2, "cuda-graphs": True},
    {"draft-heads": 2, "acceptance": "0.8", "prefix-hit-rate": "1", "shared-prefix": 128},
])
def test_estimate_is_the_cli_json_and_its_command_reproduces_it(server, settings):
    status, page = call(server, "/api/estimate", {**BASE, **settings})
    assert status == 200, page
    code, out, _ = cli(page["command"])
    assert code == 0
    assert page["estimate"] == json.loads(out)          # every number, exactly
    assert "--prefix-hit-rate" not in page["command"]     # a default is left out ('1' = 1.0)


def test_roofline_points_and_their_command(server):
    _, page = call(server, "/api/estimate", {**BASE, "batch": 16, "pp": 2})
    points = page["roofline"]["points"]
    assert {p["phase"] for p in points} == {"prefill", "decode"}
    for p in points:   # each placed where its FLOPs, bytes and time put it
        assert p["intensity"] == pytest.approx(p["flops"] / p["bytes"])
        assert p["attained_flops_per_s"] == pytest.approx(p["flops"] / p["time_s"])
        assert p["bound"] in ("compute", "memory", "overhead", "latency", "communication")
    assert page["roofline"]["command"].startswith("perfmodel roofline --model llama-3-8b")
    assert page["roofline"]["dropped"] == ["--pp"]      # said, not silently dropped


def test_curve_points_are_estimates_at_each_batch(server):
    status, page = call(server, "/api/curve", {**BASE, "batch": 12, "prompt": 256})
    assert status == 200
    batches = [r["batch"] for r in page["rows"]]
    assert batches == sorted(batches) and 12 in batches and batches[0] == 1
    row = page["rows"][batches.index(4)]
    _, out, _ = cli("perfmodel estimate --model llama-3-8b --hardware h100-sxm --batch 4 "
                    "--prompt 256 --format json")
    assert row["tpot_s"] == json.loads(out)["tpot_s"]
    assert "--batch 1,2,4,8,12" in page["command"] and "--prompt 256" in page["command"]


@pytest.mark.parametrize("settings", [
    {"batch": 0}, {"act-dtype": "fp7"}, {"model": "no-such-model"}, {"tp": 3},
    {"acceptance": "0.7"}, {"batch": "many"}, {"memory-fraction": 2},
])
def test_a_mistake_is_the_clis_one_line(server, settings):
    status, page = call(server, "/api/estimate", {**BASE, **settings})
    assert status == 400
    args = [f"--{k}" if v is True else f"--{k} {shlex.quote(str(v))}" for k, v in
            {**BASE, **settings}.items()]
    code, _, err = cli("perfmodel estimate " + " ".join(args))
    assert code == 2
    assert err.strip().splitlines() == [f"error: {page['error']}"]


def test_bad_requests_and_internal_errors_keep_the_server_up(server, monkeypatch):
    assert call(server, "/api/estimate", raw=b"{not json")[0] == 400
    assert call(server, "/api/estimate", raw=b"[1, 2]")[0] == 400
    assert call(server, "/api/nothing", {})[0] == 404
    assert call(server, "/static/../server.py")[0] == 404
    assert call(server, "/api/estimate", {**BASE, "help": True})[0] == 200   # not an option
    monkeypatch.setattr(api, "estimate", lambda *a: 1 / 0)
    status, page = call(server, "/api/estimate", BASE)
    assert status == 500 and page["error"].startswith("internal error: ZeroDivisionError")
    monkeypatch.undo()
    assert call(server, "/api/estimate", BASE)[0] == 200


def test_page_assets_ship_in_the_package_and_name_no_network(server):
    with urllib.request.urlopen(server.url, timeout=30) as r:
        html = r.read().decode()
    static = Path(api.__file__).parent / "static"
    for name in ("app.js", "charts.js", "style.css"):
        assert f"/static/{name}" in html and (static / name).is_file()
    for f in static.iterdir():
        text = f.read_text()
        assert "https://" not in text and "//cdn" not in text, f.name


def test_uploads_are_checked_kept_in_a_temp_folder_and_removed(tmp_path):
    srv, _ = start()
    try:
        config = tmp_path / "uploaded" / "config.json"    # a config's model is its folder
        config.parent.mkdir()
        config.write_text(json.dumps(LLAMA_HF))
        status, page = call(srv, "/api/upload?kind=model&name=bad.json", raw=b"{\"a\": 1")
        assert status == 400 and page["error"].startswith("bad.json")
        assert "perfmodel-ui-" not in page["error"]         # the file's name, not the temp path
        status, up = call(srv, "/api/upload?kind=model&name=config.json",
                          raw=config.read_bytes())
        assert status == 200 and up["ref"].startswith("upload:")
        folder = Path(srv.uploads._dir.name)
        assert folder.is_dir() and folder.name.startswith("perfmodel-ui-")
        status, page = call(srv, "/api/estimate", {**BASE, "model": up["ref"]})
        assert status == 200 and "--model config.json" in page["command"]
        code, out, _ = cli(page["command"].replace("config.json", str(config)))
        assert code == 0 and json.loads(out) == page["estimate"]
        status, page = call(srv, "/api/upload?kind=shoes&name=x", raw=b"x")
        assert status == 400
    finally:
        srv.shutdown()
        srv.server_close()
    assert not folder.exists()


def wait(srv, job_id: str, timeout: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        _, view = call(srv, f"/api/job/{job_id}")
        if view["state"] not in ("queued", "running") or time.monotonic() > deadline:
            return view
        time.sleep(0.05)


def test_simulation_is_the_clis_and_can_be_cancelled(server):
    settings = {**BASE, "rate": "3", "num-requests": 40, "slo-ttft": 1, "slo-tpot": 0.05}
    _, job = call(server, "/api/simulate", settings)
    view = wait(server, job["id"])
    assert view["state"] == "done" and view["done"] == view["total"] == 40 * RUNS
    run = view["result"]["runs"][0]
    code, out, _ = cli(view["result"]["command"])
    assert code == 0 and run["summary"] == json.loads(out)
    assert run["cdf"]["ttft_s"][-1][1] == 1.0 and "goodput_requests_per_s" in run["summary"]
    _, job = call(server, "/api/simulate", {**settings, "num-requests": 20000, "rate": "50"})
    time.sleep(0.3)
    call(server, f"/api/job/{job['id']}/cancel", {})
    view = wait(server, job["id"])
    assert view["state"] == "cancelled" and view["done"] < 20000
    status, page = call(server, "/api/simulate", {**BASE, "rate": "0"})
    assert status == 400 and page["error"].startswith("--rate")


def test_plan_is_the_clis_answer(server):
    settings = {**BASE, "gpus": 2, "slo-ttft": 1, "slo-tpot": 0.05, "input-len": 512,
                "output-len": 64, "requests": 100}
    _, job = call(server, "/api/plan", settings)
    view = wait(server, job["id"], 120)
    assert view["state"] == "done", view["error"]
    code, out, _ = cli(view["result"]["command"] + " --format json")
    assert code == 0 and json.loads(out)["winner"] == view["result"]["plan"]["winner"]
    _, job = call(server, "/api/plan", {**settings, "slo-tpot": 0})   # the CLI's own check
    view = wait(server, job["id"])
    code, _, err = cli(view["result"] is None and
                       "perfmodel plan " + " ".join(f"--{k} {v}" for k, v in
                                                    {**settings, "slo-tpot": 0}.items()))
    assert view["state"] == "error" and code == 2
    assert err.strip().splitlines() == [f"error: {view['error']}"]
    status, page = call(server, "/api/plan", {**settings, "requests": 5})   # click's bound
    assert status == 400 and page["error"].startswith("--requests: 5 is not in the range")
    code, _, err = cli("perfmodel plan " + " ".join(f"--{k} {v}" for k, v in
                                                    {**settings, "requests": 5}.items()))
    assert err.strip().splitlines() == [f"error: {page['error']}"]


def test_ui_command_refuses_a_busy_port_in_one_line(server):
    port = server.server_address[1]
    result = runner.invoke(app, ["ui", "--port", str(port), "--no-browser"])
    assert result.exit_code == 2
    assert result.stderr.strip().splitlines() == [
        f"error: --port: cannot listen on 127.0.0.1:{port} (Address already in use), "
        "expected a free port (--port 0 picks one)"]


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM])
def test_ui_command_serves_on_localhost_says_so_and_stops_cleanly(stop):
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    # SIGINT at its default, as a terminal starts it: a background job of a shell script
    # (pytest run with '&') inherits it ignored, and Python then installs no Ctrl-C handler
    proc = subprocess.Popen([sys.executable, "-m", "perfmodel.cli", "ui", "--no-browser",
                             "--port", "0"], stderr=subprocess.PIPE, text=True, env=env,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        line = proc.stderr.readline()
        assert line.startswith("perfmodel ui: serving http://127.0.0.1:")
        assert "(this machine only)" in line
        url = line.split()[3]
        with urllib.request.urlopen(url, timeout=30) as r:
            assert r.status == 200 and b"perfmodel" in r.read()
        proc.send_signal(stop)
        assert proc.wait(20) == 0
        assert proc.stderr.read().strip() == "perfmodel ui: stopped"
    finally:
        if proc.poll() is None:
            proc.kill()


def test_a_trace_upload_drives_the_simulation(server, tmp_path):
    rows = ["arrival_s,input_tokens,output_tokens"] + [f"{i * 0.25},{200 + 10 * i},{20 + i}"
                                                        for i in range(16)]
    trace = tmp_path / "trace.csv"
    trace.write_text("\n".join(rows) + "\n")
    status, up = call(server, "/api/upload?kind=trace&name=trace.csv", raw=trace.read_bytes())
    assert status == 200
    _, job = call(server, "/api/simulate", {**BASE, "trace": up["ref"]})
    view = wait(server, job["id"])
    assert view["state"] == "done" and view["total"] == 16 * RUNS
    line = view["result"]["command"]
    assert "--trace trace.csv" in line
    code, out, _ = cli(line.replace("trace.csv", str(trace)))
    assert code == 0 and json.loads(out) == view["result"]["runs"][0]["summary"]
    status, page = call(server, "/api/upload?kind=trace&name=t.csv", raw=b"a,b\n1,2\n")
    assert status == 400 and page["error"].startswith("t.csv")


def test_seeded_fuzz_of_settings_never_500s(server):
    """Random settings, garbage included: every answer is the CLI's numbers or its one
    line (400), never an internal error, and the server answers after each."""
    import random

    rng = random.Random(28)
    values = {"batch": [1, 7, 0, -3, "x", 1e9, "", None, 2**40], "prompt": [1, 4096, 0, "1e3"],
              "gen": [1, 2, -1, "nan"], "act-dtype": ["bf16", "fp8", "int4", "??", 3],
              "kv-dtype": ["fp8", "bf16", "fp4", ""], "weights-dtype": ["int4", "fp8", "zz"],
              "weights-format": ["nvfp4", "w4a16-g128", "nope"], "tp": [1, 2, 8, 3, 0, 1000],
              "pp": [1, 2, 5], "ep": [1, 2, 8], "dp": [1, 2, -1], "attention-dp": [True, False],
              "mtp-depth": [None, 1, 3], "draft-heads": [None, 2], "acceptance": ["0.7", "2",
                                                                                "a,b", None],
              "shared-prefix": [0, 128, 10**7], "prefix-hit-rate": [0, 0.5, 1, 7],
              "model": ["llama-3-8b", "mixtral-8x7b", "deepseek-v2-lite", "../../etc/passwd"],
              "hardware": ["h100-sxm", "a100-80gb-sxm", "mi300x", "/dev/null"],
              "engine": ["vllm", "sglang", "nonsense"], "cuda-graphs": [True, "yes"],
              "memory-fraction": [0.5, 0, 1.5], "no-such-option": [1]}
    statuses = []
    for _ in range(60):
        settings = {k: rng.choice(v) for k, v in values.items() if rng.random() < 0.12}
        status, page = call(server, "/api/estimate", {**BASE, **settings})
        assert status in (200, 400), (settings, page)
        assert status == 200 or (page["error"] and "\n" not in page["error"])
        statuses.append(status)
    assert 200 in statuses and 400 in statuses
    assert call(server, "/api/estimate", BASE)[0] == 200


BANDED = """version: 1
base: h100-sxm
name: banded
uncertainty:
  source: "a test band (not measured)"
  error_q10: {gemm: -0.1, gemv: -0.1, attention_prefill: -0.15, attention_decode: -0.1,
              memory: -0.05, collective: -0.2}
  error_q90: {gemm: 0.2, gemv: 0.1, attention_prefill: 0.15, attention_decode: 0.1,
              memory: 0.05, collective: 0.2}
"""


def test_a_device_with_a_band_shows_the_clis_band_in_estimate_and_simulation(server,
                                                                              tmp_path):
    path = tmp_path / "banded.yaml"
    path.write_text(BANDED)
    status, up = call(server, "/api/upload?kind=hardware&name=banded.yaml",
                      raw=path.read_bytes())
    assert status == 200
    _, page = call(server, "/api/estimate", {**BASE, "hardware": up["ref"], "batch": 8})
    e = page["estimate"]
    assert e["ttft_s_low"] < e["ttft_s"] < e["ttft_s_high"]
    code, out, _ = cli(page["command"].replace("banded.yaml", str(path)))
    assert code == 0 and json.loads(out) == e
    _, job = call(server, "/api/simulate", {**BASE, "hardware": up["ref"], "rate": "2",
                                            "num-requests": 30})
    view = wait(server, job["id"])
    assert view["state"] == "done" and view["total"] == 90         # centre and two edges
    summary = view["result"]["runs"][0]["summary"]
    code, out, _ = cli(view["result"]["command"].replace("banded.yaml", str(path)))
    assert code == 0 and json.loads(out) == summary
    assert "a test band" in json.dumps(summary)
