"""The page's server is safe to leave running (issue 33's security findings, one test or
more each): it answers only its own page holding the token, reads only shipped specs,
uploads and files under ``--root``, writes nothing, bounds its work, and no malformed
request holds a thread or gets a traceback."""

import http.client
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from perfmodel.cli.app import app
from perfmodel.ui import jobs
from perfmodel.ui.server import start

SECRET = "CANARY-5f1d-not-for-the-page"
BASE = {"model": "llama-3-8b", "hardware": "h100-sxm"}
SLOS = {"slo-ttft": 1, "slo-tpot": 0.05}
API = [("GET", "/api/choices"), ("GET", "/api/job/abc"), ("POST", "/api/estimate"),
       ("POST", "/api/curve"), ("POST", "/api/simulate"), ("POST", "/api/plan"),
       ("POST", "/api/upload?kind=model&name=a.json"), ("POST", "/api/job/abc/cancel")]


def plant(top: Path, secret: str) -> tuple[Path, Path]:
    """A root the page may read (a secret in files that are not specs, and a link out of
    it) and a folder outside it holding the same secret."""
    root, outside = top / "root", top / "outside"
    for folder in (root, outside):
        folder.mkdir()
        (folder / "secret.yaml").write_text(f"{secret}: 1\npassword: {secret}\n")
        (folder / "secret.csv").write_text(f"{secret},x\n1,2\n")
    (root / "link.yaml").symlink_to(outside / "secret.yaml")
    return root, outside


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    return plant(tmp_path_factory.mktemp("sec"), SECRET)


@pytest.fixture(scope="module")
def server(planted):
    srv, _ = start(root=planted[0], timeout_s=1.0)
    yield srv
    srv.shutdown()
    srv.server_close()


def request(srv, method, path, body=None, headers=None, token=True, kind=None):
    """(status, headers, body text) of one request over a fresh connection."""
    conn = http.client.HTTPConnection("127.0.0.1", srv.server_address[1], timeout=30)
    data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    sent = {"Content-Type": kind or ("application/octet-stream" if "upload" in path
                                     else "application/json")} if data is not None else {}
    if token:
        sent["Authorization"] = f"token {srv.token}"
    sent.update(headers or {})
    conn.request(method, path, body=data, headers=sent)
    res = conn.getresponse()
    out = res.status, dict(res.getheaders()), res.read().decode("utf-8", "replace")
    conn.close()
    return out


# --- 2. any web page could drive the server ------------------------------------------
@pytest.mark.parametrize("method, path", API)
def test_without_the_token_every_api_call_is_403(server, method, path):
    body = {} if method == "POST" else None
    for headers in ({}, {"Authorization": "token wrong"}, {"Authorization": "Bearer x"},
                    {"Cookie": f"{server.cookie}=wrong"}, {"Cookie": "\x00;;=="}):
        status, _, text = request(server, method, path, body, headers, token=False)
        assert status == 403, (headers, text)
        assert "token" in json.loads(text)["error"]


def test_the_start_up_url_sets_a_strict_cookie_that_opens_the_api(server):
    status, headers, _ = request(server, "GET", f"/?token={server.token}", token=False)
    assert status == 302 and headers["Location"] == "/"
    cookie = headers["Set-Cookie"]
    assert cookie.startswith(f"{server.cookie}={server.token};")
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie
    jar = {"Cookie": cookie.split(";")[0]}
    assert request(server, "GET", "/api/choices", headers=jar, token=False)[0] == 200
    assert request(server, "GET", "/?token=wrong", token=False)[0] == 200   # the page only
    assert "Set-Cookie" not in request(server, "GET", "/?token=wrong", token=False)[1]


@pytest.mark.parametrize("headers", [
    {"Host": "evil.example"}, {"Host": "evil.example:8765"}, {"Host": "10.0.0.1"},
    {"Origin": "http://evil.example"}, {"Origin": "null"},
    {"Origin": "https://127.0.0.1"}, {"Sec-Fetch-Site": "cross-site"},
])
def test_dns_rebinding_and_cross_site_requests_are_refused(server, headers):
    for method, path in API[:3]:
        status, _, text = request(server, method, path, {} if method == "POST" else None,
                                  headers)
        assert status == 403, (headers, text)
    assert request(server, "GET", "/", headers=headers, token=False)[0] == 403


def test_its_own_origin_and_loopback_names_are_answered(server):
    port = server.server_address[1]
    for host in (f"127.0.0.1:{port}", f"localhost:{port}"):
        status, _, _ = request(server, "POST", "/api/estimate", BASE,
                               {"Host": host, "Origin": f"http://{host}",
                                "Sec-Fetch-Site": "same-origin"})
        assert status == 200


@pytest.mark.parametrize("kind", ["text/plain", "application/x-www-form-urlencoded",
                                  "multipart/form-data; boundary=x", ""])
def test_json_only_as_application_json(server, kind):
    status, _, text = request(server, "POST", "/api/estimate", BASE, kind=kind or " ")
    assert status == 415 and "application/json" in text
    status, _, _ = request(server, "POST", "/api/upload?kind=model&name=a.json", b"{}",
                           kind="application/json")
    assert status == 415


@pytest.mark.parametrize("method", ["PUT", "DELETE", "PATCH", "OPTIONS", "TRACE"])
def test_only_get_and_post(server, method):
    status, headers, _ = request(server, method, "/api/estimate")
    assert status == 405 and headers["Allow"] == "GET, HEAD, POST"
    assert "Access-Control-Allow-Origin" not in headers


def test_a_remote_host_needs_allow_remote():
    result = CliRunner().invoke(app, ["ui", "--host", "0.0.0.0", "--no-browser"])
    assert result.exit_code == 2
    assert result.stderr.startswith("error: --host: 0.0.0.0 is not a loopback address")
    assert "--allow-remote" in result.stderr and len(result.stderr.splitlines()) == 1
    with pytest.raises(ValueError):
        start(host="0.0.0.0")
    srv, _ = start(allow_remote=True)     # any Host name, still the token
    try:
        assert request(srv, "GET", "/api/choices", headers={"Host": "box.lan:1"})[0] == 200
        assert request(srv, "GET", "/api/choices", headers={"Host": "box.lan:1"},
                       token=False)[0] == 403
    finally:
        srv.shutdown()
        srv.server_close()


def test_a_missing_root_is_one_line():
    result = CliRunner().invoke(app, ["ui", "--root", "/no/such/dir", "--no-browser"])
    assert result.exit_code == 2
    assert result.stderr.strip() == "error: --root: /no/such/dir: expected an existing folder"


# --- 1. file contents through error messages -----------------------------------------
@pytest.mark.parametrize("setting", ["trace", "lengths-from", "prices", "engine-profile"])
def test_a_path_outside_root_is_refused_unread(server, planted, setting):
    _, outside = planted
    for value in ("/etc/passwd", "/proc/self/environ", str(outside / "secret.csv"),
                  "../outside/secret.csv", "link.yaml", "secret.csv\x00"):
        route = "/api/plan" if setting == "prices" else "/api/simulate"
        status, _, text = request(server, "POST", route, {**BASE, setting: value})
        assert status == 400, (value, text)
        assert SECRET not in text and "root:" not in text
        assert "is not an upload or a file under --root" in text


@pytest.mark.parametrize("setting", ["model", "hardware", "draft"])
def test_a_spec_path_outside_root_is_refused_and_inside_quotes_nothing(server, planted,
                                                                        setting):
    root, outside = planted
    extra = {"acceptance": "0.7"} if setting == "draft" else {}
    for value in (str(outside / "secret.yaml"), "../outside/secret.yaml", "link.yaml",
                  "/etc/passwd.yaml"):
        status, _, text = request(server, "POST", "/api/estimate", {**BASE, **extra,
                                                                    setting: value})
        assert status == 400 and SECRET not in text
        assert "is not a shipped" in text, text
    status, _, text = request(server, "POST", "/api/estimate", {**BASE, **extra,
                                                                 setting: "secret.yaml"})
    assert status == 400 and SECRET not in text
    assert str(root / "secret.yaml") in text and "2 unknown fields" in text


def test_a_file_under_root_is_read_as_the_cli_reads_it(server, planted):
    root, _ = planted
    trace = root / "trace.csv"
    trace.write_text("arrival_s,input_tokens,output_tokens\n0,100,10\n0.5,120,12\n")
    try:
        status, _, text = request(server, "POST", "/api/simulate", {**BASE,
                                                                    "trace": "trace.csv"})
        assert status == 200 and f"--trace {trace}" in _wait(server, json.loads(text)["id"]
                                                             )["result"]["command"]
    finally:
        trace.unlink()


def test_the_trace_setting_no_longer_reads_etc_passwd_without_a_root():
    srv, _ = start()
    try:
        status, _, text = request(srv, "POST", "/api/simulate", {**BASE, "trace": "/etc/passwd"})
        assert status == 400 and "root:" not in text
        assert "(perfmodel ui was started without --root)" in text
        status, _, text = request(srv, "POST", "/api/estimate", {**BASE, "model": "passwd"})
        assert status == 400 and "unknown model 'passwd'" in text
    finally:
        srv.shutdown()
        srv.server_close()


@pytest.mark.parametrize("base", ["/ROOT/secret.yaml", "../../../ROOT/secret.yaml",
                                  "h100-sxm.yaml", "secret", ["h100-sxm"]])
def test_an_uploaded_hardware_yaml_names_a_shipped_base_only(server, planted, base):
    text = "version: 1\nbase: " + json.dumps(base).replace("ROOT", str(planted[1])) + "\n"
    status, _, answer = request(server, "POST", "/api/upload?kind=hardware&name=hw.yaml",
                                text.encode())
    assert status == 400 and SECRET not in answer
    assert "an uploaded hardware YAML's base must be a shipped device" in answer
    ok = "version: 1\nbase: h100-sxm\nname: mine\n"
    assert request(server, "POST", "/api/upload?kind=hardware&name=hw.yaml",
                   ok.encode())[0] == 200


# --- 3. nothing the page asks for is written ------------------------------------------
def test_out_is_refused_and_a_plan_writes_nothing(server, tmp_path, monkeypatch):
    target = tmp_path / "plan-out"
    for route in ("/api/plan", "/api/simulate"):
        status, _, text = request(server, "POST", route, {**BASE, "out": str(target)})
        assert status == 400 and json.loads(text)["error"].startswith("--out: the page "
                                                                      "writes no files")
    assert not target.exists()
    before = set(os.listdir("."))
    status, _, text = request(server, "POST", "/api/plan",
                              {**BASE, **SLOS, "gpus": 1, "requests": 100,
                               "input-len": 256, "output-len": 32})
    view = _wait(server, json.loads(text)["id"], 120)
    assert view["state"] == "done", view["error"]
    assert set(os.listdir(".")) == before


# --- 4. work is bounded, every job cancellable, its processes killed ------------------
def test_jobs_are_bounded_queued_and_cancellable(monkeypatch):
    monkeypatch.setattr(jobs, "MAX_RUNNING", 1)
    monkeypatch.setattr(jobs, "MAX_WAITING", 1)
    monkeypatch.setattr(jobs, "KEEP_DONE", 0)

    def slow(job):
        while not job.cancel.wait(0.01):
            pass
        return {}

    table = jobs.Jobs(uploads=None)
    first = table.start("simulate", slow)
    second = table.start("simulate", slow)
    _until(lambda: first.state == "running")
    assert second.state == "queued"
    with pytest.raises(jobs.Busy, match="2 jobs running or queued, expected at most 2"):
        table.start("simulate", slow)
    table.cancel(second.id)                       # a queued job ends at once
    _until(lambda: second.state == "cancelled")
    third = table.start("plan", slow)             # its place is free again
    assert table.get(first.id) is first           # live jobs are never dropped
    table.cancel(first.id)
    _until(lambda: first.state == "cancelled" and third.state == "running")
    table.cancel(third.id)
    _until(lambda: third.state == "cancelled")


def test_a_cancelled_jobs_processes_die_with_it():
    started = []

    def work(job):
        job.proc = subprocess.Popen(["sh", "-c", "sleep 60 & sleep 60 & wait"],
                                    start_new_session=True)
        started.append(job.proc.pid)
        job.proc.wait()
        raise jobs.Cancelled

    table = jobs.Jobs(uploads=None)
    job = table.start("plan", work)
    _until(lambda: started)
    time.sleep(0.2)
    table.cancel(job.id)
    _until(lambda: job.state == "cancelled")
    group = started[0]
    _until(lambda: not _alive(group))


def test_a_plan_over_the_bound_is_429(monkeypatch):
    monkeypatch.setattr(jobs, "MAX_RUNNING", 1)
    monkeypatch.setattr(jobs, "MAX_WAITING", 0)
    srv, _ = start()
    try:
        settings = {**BASE, **SLOS, "gpus": 8, "requests": 2000, "input-len": 512,
                    "output-len": 64}
        status, _, first = request(srv, "POST", "/api/plan", settings)
        assert status == 200
        status, _, text = request(srv, "POST", "/api/plan", settings)
        assert status == 429 and "try again when one ends" in text
        job = json.loads(first)["id"]
        assert request(srv, "POST", f"/api/job/{job}/cancel", {})[0] == 200
        assert _wait(srv, job)["state"] == "cancelled"
    finally:
        srv.shutdown()
        srv.server_close()


@pytest.mark.parametrize("settings, message", [
    ({"dp": 8, "workers": 8}, "--workers: at most 1 on the page"),
    ({"dp": 2, "cluster": "local"}, "--cluster: the page simulates in its own process"),
])
def test_a_simulation_forks_no_pool(server, settings, message):
    status, _, text = request(server, "POST", "/api/simulate", {**BASE, **settings})
    assert status == 400 and json.loads(text)["error"].startswith(message)


# --- 6. malformed requests ----------------------------------------------------------
def raw(srv, data: bytes, wait: float = 10.0) -> bytes:
    with socket.create_connection(("127.0.0.1", srv.server_address[1]), timeout=wait) as s:
        s.sendall(data)
        out = b""
        try:
            while chunk := s.recv(65536):
                out += chunk
        except (TimeoutError, ConnectionResetError):
            pass
        return out


def head(srv, method: str, path: str, extra: str = "") -> bytes:
    port = srv.server_address[1]
    return (f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: token "
            f"{srv.token}\r\nContent-Type: application/json\r\n{extra}\r\n").encode()


@pytest.mark.parametrize("extra, body, status", [
    ("Content-Length: -1\r\n", b"{}", b"400"),
    ("Content-Length: abc\r\n", b"{}", b"400"),
    ("Content-Length: 99999999999999999999999\r\n", b"", b"400"),
    ("Content-Length: 100\r\n", b"{}", b"400"),           # shorter than it says
    ("Transfer-Encoding: chunked\r\n", b"2\r\n{}\r\n0\r\n\r\n", b"411"),
])
def test_a_bad_length_is_answered_and_closed(server, extra, body, status):
    t0 = time.monotonic()
    answer = raw(server, head(server, "POST", "/api/estimate", extra) + body)
    assert answer.split(b" ")[1] == status, answer[:200]
    assert time.monotonic() - t0 < 5          # the 1 s socket timeout, not a held thread
    assert b"Traceback" not in answer


def test_an_oversized_body_gets_413_not_a_broken_pipe(server):
    size = 6 * 1024 * 1024
    status, headers, text = request(server, "POST", "/api/upload?kind=trace&name=t.csv",
                                    b"x" * size)
    assert status == 413 and "expected under 4 MB" in text
    assert headers.get("Connection") == "close"


@pytest.mark.parametrize("path", ["/static/%00", "/static/" + "a" * 10_000, "/%00",
                                  "/static/../server.py", "/static/%2e%2e/server.py",
                                  "/static/", "/api/job/" + "x" * 5000, "/static/\u00e9"])
def test_odd_paths_get_a_clean_404(server, path, capfd):
    answer = raw(server, head(server, "GET", path.replace("\u00e9", "%C3%A9"),
                              "Connection: close\r\n"))
    assert answer[:12] in (b"HTTP/1.1 404", b"HTTP/1.1 400"), answer[:100]
    assert len(answer) < 2000
    assert "Traceback" not in capfd.readouterr().err


def test_the_listen_backlog_and_a_slow_client_do_not_block_others(server):
    assert server.request_queue_size >= 64
    port = server.server_address[1]
    with socket.create_connection(("127.0.0.1", port)) as slow:
        slow.sendall(head(server, "POST", "/api/estimate", "Content-Length: 1000\r\n")
                     + b"{")
        t0 = time.monotonic()
        assert request(server, "GET", "/api/choices")[0] == 200
        assert time.monotonic() - t0 < 1.0


def test_an_internal_error_says_its_type_only(server, monkeypatch):
    from perfmodel.ui import api

    monkeypatch.setattr(api, "choices", lambda: open(f"/no/{SECRET}"))
    status, _, text = request(server, "GET", "/api/choices")
    assert status == 500 and json.loads(text) == {"error": "internal error: "
                                                           "FileNotFoundError"}


# --- helpers --------------------------------------------------------------------------
def _wait(srv, job_id: str, timeout: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        view = json.loads(request(srv, "GET", f"/api/job/{job_id}")[2])
        if view["state"] not in ("queued", "running") or time.monotonic() > deadline:
            return view
        time.sleep(0.05)


def _until(test, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not test():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def _alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
        return True
    except ProcessLookupError:
        return False


def test_the_ui_command_prints_the_token_url_and_its_api_needs_it():
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    proc = subprocess.Popen([sys.executable, "-m", "perfmodel.cli", "ui", "--no-browser",
                             "--port", "0"], stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = proc.stderr.readline()
        url = line.split()[3]
        assert "/?token=" in url and len(url.split("=", 1)[1]) >= 32
        host, port = url.split("/")[2].split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=30)
        conn.request("GET", "/api/choices")
        assert conn.getresponse().status == 403
        conn.close()
    finally:
        proc.terminate()
        proc.wait(20)


def test_connections_and_uploads_are_bounded(monkeypatch):
    from perfmodel.ui import options
    from perfmodel.ui import server as module

    monkeypatch.setattr(module, "MAX_CONNECTIONS", 2)
    monkeypatch.setattr(options, "MAX_UPLOADS", 2)
    srv, _ = start(timeout_s=5.0)
    port = srv.server_address[1]
    held = [socket.create_connection(("127.0.0.1", port)) for _ in range(2)]
    try:
        for s in held:
            s.sendall(b"GET / HTTP/1.1\r\n")          # half a request: a thread each
        time.sleep(0.3)
        assert raw(srv, head(srv, "GET", "/api/choices")).startswith(b"HTTP/1.1 503")
        for s in held:
            s.close()
        time.sleep(0.3)
        refs = [json.loads(request(srv, "POST", f"/api/upload?kind=trace&name=t{i}.csv",
                                   b"arrival_s,input_tokens,output_tokens\n0,10,2\n")[2])
                ["ref"] for i in range(3)]
        assert len(srv.uploads._files) == 2            # the oldest went
        status, _, text = request(srv, "POST", "/api/simulate", {**BASE, "trace": refs[0]})
        assert status == 400 and "no such upload" in text
    finally:
        srv.shutdown()
        srv.server_close()
