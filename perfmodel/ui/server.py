"""The page's server: the standard library's threading HTTP server, the page's files from
the package (nothing from the network), and a JSON API over the CLI's functions.

A user mistake is answered ``400 {"error": "<the CLI's one-line message>"}``; anything else
``500 {"error": "internal error: ..."}`` on one line; no request stops the server.
"""

from __future__ import annotations

import json
import mimetypes
import sys
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from perfmodel.specs.errors import SpecError
from perfmodel.ui import api, jobs
from perfmodel.ui.options import MAX_UPLOAD_BYTES, Uploads

STATIC = Path(__file__).resolve().parent / "static"
MAX_BODY = MAX_UPLOAD_BYTES + 65536


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, host: str, port: int, quiet: bool = True) -> None:
        self.uploads = Uploads()        # before binding: a failed bind calls server_close
        self.jobs = jobs.Jobs(self.uploads)
        self.quiet = quiet
        super().__init__((host, port), Handler)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{'[' + host + ']' if ':' in str(host) else host}:{port}/"

    def server_close(self) -> None:
        self.jobs.close()
        self.uploads.close()
        super().server_close()


def start(host: str = "127.0.0.1", port: int = 0) -> tuple[Server, threading.Thread]:
    """A server on ``host:port`` (0: a free port) answering in a daemon thread (tests,
    benchmarks); ``server.shutdown(); server.server_close()`` stops it."""
    server = Server(host, port)
    thread = threading.Thread(target=server.serve_forever, name="perfmodel-ui", daemon=True)
    thread.start()
    return server, thread


class Handler(BaseHTTPRequestHandler):
    server: Server
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        if not self.server.quiet:
            sys.stderr.write(f"{self.address_string()} {format % args}\n")

    # --- plumbing ---------------------------------------------------------------------
    def _send(self, status: int, body: bytes, ctype: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, status: int, data: Any) -> None:
        body = json.dumps(data, allow_nan=False, default=_plain).encode()
        self._send(status, body, "application/json")

    def _body(self) -> bytes:
        size = int(self.headers.get("Content-Length") or 0)
        if size > MAX_BODY:
            raise SpecError(f"request of {size:,} bytes, expected under "
                            f"{MAX_UPLOAD_BYTES // 1024 // 1024} MB")
        return self.rfile.read(size) if size else b""

    def _settings(self) -> dict[str, Any]:
        try:
            data = json.loads(self._body() or b"{}")
        except (ValueError, UnicodeDecodeError) as exc:
            raise SpecError(f"request: expected a JSON object ({exc})") from exc
        if not isinstance(data, dict):
            raise SpecError("request: expected a JSON object of settings")
        return data

    def _answer(self, work: Any) -> None:
        try:
            status = HTTPStatus.OK
            body = json.dumps(work(), allow_nan=False, default=_plain).encode()
        except SpecError as exc:
            status = HTTPStatus.BAD_REQUEST
            body = json.dumps({"error": self.server.uploads.shown(str(exc)).splitlines()[0]
                               }).encode()
        except Exception as exc:   # never let a request take the server down
            status = HTTPStatus.INTERNAL_SERVER_ERROR
            text = f"internal error: {type(exc).__name__}: {exc}".splitlines()[0]
            body = json.dumps({"error": text}).encode()
        try:
            self._send(status, body, "application/json")
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True     # the page moved on (a newer request replaced it)

    # --- routes -------------------------------------------------------------------------
    def do_HEAD(self) -> None:
        self.do_GET()

    def do_GET(self) -> None:
        path = urlparse(self.path).path
        if path.startswith("/api/job/"):
            self._answer(lambda: self.server.jobs.get(path.rsplit("/", 1)[1]).view())
        elif path == "/api/choices":
            self._answer(api.choices)
        else:
            self._static(path)

    def do_POST(self) -> None:
        url = urlparse(self.path)
        path, up = url.path, self.server.uploads
        routes = {
            "/api/estimate": lambda: api.estimate(self._settings(), up),
            "/api/curve": lambda: api.curve(self._settings(), up),
            "/api/simulate": lambda: self.server.jobs.start(
                "simulate", jobs.simulation(self._settings(), up)).view(),
            "/api/plan": lambda: self.server.jobs.start(
                "plan", jobs.planning(self._settings(), up)).view(),
            "/api/upload": lambda: _upload(up, url.query, self.headers, self._body()),
        }
        if path in routes:
            self._answer(routes[path])
        elif path.startswith("/api/job/") and path.endswith("/cancel"):
            self._answer(lambda: self.server.jobs.cancel(path.split("/")[3]).view())
        else:
            self._json(HTTPStatus.NOT_FOUND, {"error": f"{path}: no such API"})

    def _static(self, path: str) -> None:
        name = "index.html" if path in ("", "/") else unquote(path).removeprefix("/static/")
        target = (STATIC / name).resolve()
        if target.parent != STATIC or not target.is_file():
            self._json(HTTPStatus.NOT_FOUND, {"error": f"{path}: not found"})
            return
        ctype = mimetypes.guess_type(target.name)[0] or "application/octet-stream"
        self._send(HTTPStatus.OK, target.read_bytes(),
                   ctype + ("; charset=utf-8" if ctype.startswith("text/") or
                            ctype.endswith("javascript") else ""))


def _plain(value: Any) -> Any:
    """numpy scalars and the like as plain JSON values."""
    if hasattr(value, "item"):
        return value.item()
    if hasattr(value, "tolist"):
        return value.tolist()
    return str(value)


def _upload(uploads: Uploads, query: str, headers: Any, data: bytes) -> dict[str, Any]:
    """Keep an uploaded model config, hardware YAML or trace in memory's temp folder and
    load it as the CLI would: its ``upload:<id>``, or the loader's one-line message."""
    from urllib.parse import parse_qs

    from perfmodel.specs import load

    q = parse_qs(query)
    kind = (q.get("kind") or [""])[0]
    name = (q.get("name") or [headers.get("X-File-Name") or "upload"])[0]
    checks = {"model": load.model, "hardware": load.hardware, "trace": _trace}
    if kind not in checks:
        raise SpecError(f"upload: kind {kind!r}, expected model, hardware or trace")
    ref, path = uploads.add(name, data)
    try:
        loaded = checks[kind](str(path))
    except SpecError as exc:
        message = uploads.shown(str(exc))
        uploads.drop(ref)
        raise SpecError(message) from None
    except Exception as exc:
        uploads.drop(ref)
        raise SpecError(f"{Path(name).name}: cannot read ({type(exc).__name__}: {exc})"
                        .splitlines()[0]) from exc
    return {"ref": ref, "name": path.name, "title": getattr(loaded, "name", path.name)}


def _trace(path: str) -> Any:
    from perfmodel.serving.traffic import read_trace

    return read_trace(Path(path))
