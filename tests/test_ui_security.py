"""The page's server is safe to leave running (issue 33's security findings, one test or
more each): it answers only its own page holding the token, reads only shipped specs,
uploads and files under ``--root``, writes nothing, bounds its work, and no malformed
request holds a thread or gets a traceback."""

import http.client
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from perfmodel.cli.app import app
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
