"""The page's server bounds its work and shrugs off malformed requests (issue 33, findings
4 and 6): jobs run two per core with a bounded queue (429 past it), each cancellable until
it ends and its processes killed with it; a simulation forks no pool; a bad length, an
oversized body or an odd path is a clean 4xx, closed, never a traceback or a held thread;
connections and uploads are bounded."""

import json
import socket
import subprocess
import time

import pytest

from perfmodel.ui import jobs
from perfmodel.ui.server import start
from tests.test_ui_security import BASE, SECRET, SLOS, _alive, _until, _wait, request


@pytest.fixture(scope="module")
def server():
    srv, _ = start(timeout_s=1.0)
    yield srv
    srv.shutdown()
    srv.server_close()


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


def test_connections_and_uploads_are_bounded(monkeypatch):
    from perfmodel.ui import options
    from perfmodel.ui import server as module

    monkeypatch.setattr(module, "MAX_CONNECTIONS", 3)
    monkeypatch.setattr(options, "MAX_UPLOADS", 2)
    srv, _ = start(timeout_s=5.0)
    port = srv.server_address[1]
    held = [socket.create_connection(("127.0.0.1", port)) for _ in range(3)]
    try:
        for s in held:
            s.sendall(b"GET / HTTP/1.1\r\n")          # half a request: a thread each
        time.sleep(0.3)
        assert raw(srv, head(srv, "GET", "/api/choices")).startswith(b"HTTP/1.1 503")
        for s in held:
            s.close()
        _until(lambda: _answers(srv), 30)    # their threads see the close and free a slot
        refs = [json.loads(request(srv, "POST", f"/api/upload?kind=trace&name=t{i}.csv",
                                   b"arrival_s,input_tokens,output_tokens\n0,10,2\n")[2])
                ["ref"] for i in range(3)]
        assert len(srv.uploads._files) == 2            # the oldest went
        status, _, text = request(srv, "POST", "/api/simulate", {**BASE, "trace": refs[0]})
        assert status == 400 and "no such upload" in text
    finally:
        srv.shutdown()
        srv.server_close()


def _answers(srv) -> bool:
    try:
        return request(srv, "GET", "/api/choices")[0] == 200
    except OSError:
        return False
