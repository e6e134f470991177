"""A seeded fuzz of the page's HTTP API (issue 33's must-show), on loopback: random
methods, paths, headers (token or not, Host, Origin, content types, lengths), settings
(paths in and out of ``--root``, /proc and /etc, uploads, shipped names, garbage) and
bodies. Over every answer, and every job it started: no 5xx, no planted secret, no file
written in the root, outside it or in the working folder; and a request sent while a
broken one holds its connection open is answered within 1 s."""

import http.client
import json
import os
import random
import socket
import time

import pytest

from perfmodel.ui.server import start
from tests.test_ui_security import plant

SEED = 33
REQUESTS = 400        # at most this many requests...
SECONDS = 20.0        # ...and at most this long
SECRET = "CANARY-fuzz-2b9e"
ROUTES = ["/", "/index.html", "/static/app.js", "/static/x", "/static/%00", "/api/choices",
          *["/api/estimate"] * 6, "/api/curve", *["/api/simulate"] * 4, "/api/plan",
          "/api/job/",
          "/api/job/JOB", "/api/job/JOB/cancel", "/api/upload?kind=model&name=c.json",
          "/api/upload?kind=hardware&name=h.yaml", "/api/upload?kind=trace&name=t.csv",
          "/api/upload?kind=shoes", "/api/nothing", "/../../etc/passwd", "/static/../../x",
          "/api/estimate?token=TOKEN", "/?token=TOKEN", "/?token=wrong"]
POSTS = ["/api/estimate"] * 4 + ["/api/simulate"] * 4 + [
    "/api/curve", "/api/plan", "/api/upload?kind=model&name=c.json",
    "/api/upload?kind=hardware&name=h.yaml", "/api/upload?kind=trace&name=t.csv",
    "/api/job/JOB/cancel"]
METHODS = ["GET"] * 2 + ["POST"] * 12 + ["HEAD", "PUT", "DELETE", "OPTIONS", "PATCH"]
KEYS = ["model", "hardware", "draft", "trace", "lengths-from", "prices", "engine-profile",
        "out", "cluster", "workers", "batch", "prompt", "gen", "tp", "dp", "rate",
        "num-requests", "gpus", "requests", "slo-ttft", "slo-tpot", "input-len",
        "output-len", "kv-dtype", "engine", "help", "format", "seed", "--out", "-o"]


def values(root, outside):
    return ["/etc/passwd", "/proc/self/environ", "/proc/self/cmdline",
            str(outside / "secret.csv"), str(outside / "secret.yaml"),
            "../outside/secret.yaml", "secret.yaml", "secret.csv", "link.yaml",
            str(root / "secret.yaml"), "upload:UPLOAD", "upload:nope", "llama-3-8b", "h100-sxm",
            "qwen3-8b", "a100-80gb-sxm", "vllm", "fp8", "", None, True, False, 0, 1, 2, 8,
            -1, 10**30, 1e308, "nan", "1e9", "x" * 300, "\x00", "local", "tcp://1.2.3.4:1",
            ["a"], {"b": 1}, 3, 40, "0.5", str(outside), "/tmp", "~", "$HOME/s.yaml"]


def bodies(rng, vals):
    kind = rng.random()
    if kind < 0.7:
        settings = {"model": "llama-3-8b", "hardware": "h100-sxm"} if rng.random() < .7 \
            else {}
        settings.update({"rate": 2, "num-requests": rng.choice([5, 20]), "gpus": 1,
                         "slo-ttft": 1, "slo-tpot": 0.05, "requests": 100,
                         "input-len": 128, "output-len": 16} if rng.random() < 0.6 else {})
        for key in rng.sample(KEYS, rng.choice([0, 1, 1, 2, 3])):
            settings[key] = rng.choice(vals)
        return json.dumps(settings).encode()
    return rng.choice([b"", b"{", b"[1,2]", b"null", b"\xff\xfe", b"{}" * 1000,
                       b"[" * 5000 + b"]" * 5000, f"{SECRET}: 1\n".encode(),
                       b"arrival_s,input_tokens,output_tokens\n0,10,2\n",
                       json.dumps({"model_type": "llama", SECRET: 1}).encode(),
                       b"version: 1\nbase: ../../outside/secret.yaml\n"])


def headers(rng, srv, port, path):
    """The page's own headers, one of them spoilt in a quarter of the requests."""
    kind = "application/octet-stream" if "upload" in path else "application/json"
    out = {"Authorization": f"token {srv.token}", "Host": f"127.0.0.1:{port}",
           "Content-Type": kind}
    if rng.random() < 0.3:
        out["Origin"] = f"http://127.0.0.1:{port}"
    if rng.random() < 0.25:
        spoil = rng.choice(["Authorization", "Host", "Origin", "Content-Type", "Cookie",
                            "Content-Length", "Sec-Fetch-Site"])
        out[spoil] = rng.choice({
            "Authorization": ["token x", "Bearer", "", "token " + srv.token[:-1]],
            "Host": ["evil.example", "", "[::1]", "127.0.0.1:1:2", f"localhost:{port}"],
            "Origin": ["http://evil.example", "null", "file://"],
            "Content-Type": ["text/plain", "", "application/json; charset=utf-8",
                             "multipart/form-data"],
            "Cookie": [f"{srv.cookie}={srv.token}", "a=b;;;", "\x7f"],
            "Content-Length": ["-1", "abc", "5", "99999999"],
            "Sec-Fetch-Site": ["cross-site", "same-origin"]}[spoil])
        if spoil == "Cookie":
            out.pop("Authorization")
    return out


def send(port, method, path, head, body):
    """(status, text) of one request; a closed connection reads as status 0."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
        for k, v in head.items():
            conn.putheader(k, v)
        if "Content-Length" not in head:
            conn.putheader("Content-Length", str(len(body)))
        conn.endheaders(body if "Content-Length" not in head else body[:5])
        res = conn.getresponse()
        return res.status, res.read().decode("utf-8", "replace")
    except (ConnectionError, http.client.HTTPException, TimeoutError):
        return 0, ""
    finally:
        conn.close()


def listing(*folders):
    return {f: sorted(os.listdir(f)) for f in folders}


@pytest.fixture
def planted(tmp_path):
    return plant(tmp_path, SECRET)


def test_seeded_fuzz_of_the_http_api(planted):
    root, outside = planted
    rng = random.Random(SEED)
    srv, _ = start(root=root, timeout_s=1.0)
    port = srv.server_address[1]
    vals, jobs, statuses = values(root, outside), [], {}
    before = listing(root, outside, os.getcwd())
    upload = "none"
    t0 = time.monotonic()
    try:
        for i in range(REQUESTS):
            if time.monotonic() - t0 > SECONDS:
                break
            if i % 50 == 0:
                _a_broken_request_blocks_no_other(srv, port, rng)
            method = rng.choice(METHODS)
            routes = POSTS if method == "POST" and rng.random() < 0.8 else ROUTES
            path = rng.choice(routes).replace("JOB", rng.choice(jobs or ["abc"])) \
                .replace("TOKEN", srv.token)
            body = bodies(rng, vals).replace(b"UPLOAD", upload.encode())
            status, text = send(port, method, path, headers(rng, srv, port, path),
                                body if method != "GET" or rng.random() < 0.2 else b"")
            statuses[status] = statuses.get(status, 0) + 1
            assert status < 500, (method, path, status, text)
            assert SECRET not in text and "root:x:" not in text, (method, path, text)
            if status == 200 and text.startswith("{"):
                answer = json.loads(text)
                if "ref" in answer:
                    upload = answer["ref"].removeprefix("upload:")
                if answer.get("state") in ("queued", "running"):
                    jobs.append(answer["id"])
        time.sleep(1.0)
        for job in jobs:   # what each job said, done or not
            status, text = send(port, "GET", f"/api/job/{job}", {
                "Host": f"127.0.0.1:{port}", "Authorization": f"token {srv.token}"}, b"")
            assert status == 200 and SECRET not in text
            assert "internal error" not in text, text
    finally:
        srv.shutdown()
        srv.server_close()
    assert listing(root, outside, os.getcwd()) == before     # nothing written
    done = sum(statuses.values())
    print("fuzz:", done, "requests", dict(sorted(statuses.items())), len(jobs), "jobs")
    assert done >= 150, statuses
    assert {200, 400, 403, 404}.issubset(statuses), statuses      # it reached every layer


def _a_broken_request_blocks_no_other(srv, port, rng):
    """Hold a connection with half a body (or half a header) open, and time another."""
    broken = socket.create_connection(("127.0.0.1", port))
    try:
        head = (f"POST /api/estimate HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: "
                f"token {srv.token}\r\nContent-Type: application/json\r\n")
        broken.sendall((head + "Content-Length: 500\r\n\r\n{").encode()
                       if rng.random() < 0.5 else head.encode())
        t0 = time.monotonic()
        status, _ = send(port, "GET", "/api/choices", {
            "Host": f"127.0.0.1:{port}", "Authorization": f"token {srv.token}"}, b"")
        assert status == 200 and time.monotonic() - t0 < 1.0
    finally:
        broken.close()
