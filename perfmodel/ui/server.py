"""The page's server: the standard library's threading HTTP server, the page's files from
the package (nothing from the network), and a JSON API over the CLI's functions.

Trusts no request it did not authenticate, as Jupyter's server does (``ui/guard``): a
random token, printed in the start-up URL and kept in a cookie, on every API call; Host and
Origin allow-lists against DNS rebinding and cross-site requests; JSON only as
``application/json``; state changed by POST only. A user mistake is answered
``400 {"error": "<the CLI's one-line message>"}``; anything else ``500 {"error":
"internal error: <type>"}`` (the details on the server's stderr); no request stops the
server, and none holds a thread past its socket timeout.
"""

from __future__ import annotations

import json
import mimetypes
import secrets
import sys
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlparse

from perfmodel.specs.errors import SpecError
from perfmodel.ui import api, files, guard, jobs
from perfmodel.ui.guard import Refused
from perfmodel.ui.options import MAX_UPLOAD_BYTES, Uploads

STATIC = Path(__file__).resolve().parent / "static"
STATIC_FILES = {p.name: p for p in STATIC.iterdir() if p.is_file()}
MAX_BODY = MAX_UPLOAD_BYTES + 65536
DISCARD_MAX = 64 * 1024 * 1024   # an oversized body is read and dropped up to this, then closed
BODY_SECONDS = 30.0              # the longest a request body may take to arrive
MAX_CONNECTIONS = 64             # open at once; one more is answered 503 and closed
WORK_WAIT_S = 10.0               # an estimate waits this long for a work slot, then 429
SHOWN_PATH = 80                  # characters of a request's path quoted in a 404


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 64     # the listen backlog (the standard library's is 5)

    def __init__(self, host: str, port: int, quiet: bool = True, token: str | None = None,
                 root: Path | None = None, allow_remote: bool = False,
                 timeout_s: float = 5.0) -> None:
        if not (allow_remote or guard.loopback(host)):
            raise ValueError(f"{host}: not a loopback address (allow_remote=False)")
        self.token = token or secrets.token_urlsafe(32)
        self.allow_remote = allow_remote
        self.timeout_s = timeout_s
        self.uploads = Uploads(files.check_root(root))  # before binding: a failed bind
        self.jobs = jobs.Jobs(self.uploads)              # calls server_close
        self.work = threading.BoundedSemaphore(jobs.MAX_RUNNING)
        self.connections = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self.quiet = quiet
        super().__init__((host, port), Handler)

    @property
    def base(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{'[' + host + ']' if ':' in str(host) else host}:{port}/"

    @property
    def url(self) -> str:
        """The page's address with its token (the cookie is set from it)."""
        return f"{self.base}?token={self.token}"

    @property
    def cookie(self) -> str:
        return f"perfmodel-ui-{self.server_address[1]}"

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.connections.acquire(blocking=False):
            try:
                request.sendall(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n"
                                b"Connection: close\r\n\r\n")
            except OSError:
                pass
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.connections.release()

    def server_close(self) -> None:
        self.jobs.close()
        self.uploads.close()
        super().server_close()


def start(host: str = "127.0.0.1", port: int = 0, **options: Any
          ) -> tuple[Server, threading.Thread]:
    """A server on ``host:port`` (0: a free port) answering in a daemon thread (tests,
    benchmarks); ``server.shutdown(); server.server_close()`` stops it."""
    server = Server(host, port, **options)
    thread = threading.Thread(target=server.serve_forever, name="perfmodel-ui", daemon=True)
    thread.start()
    return server, thread


class Handler(BaseHTTPRequestHandler):
    server: Server
    protocol_version = "HTTP/1.1"

    def setup(self) -> None:
        self.timeout = self.server.timeout_s     # every read and write of this socket
        super().setup()

    def log_message(self, format: str, *args: Any) -> None:
        if not self.server.quiet:
            sys.stderr.write(f"{self.address_string()} {format % args}\n")

    # --- plumbing ---------------------------------------------------------------------
    def _send(self, status: int, body: bytes, ctype: str,
              headers: tuple[tuple[str, str], ...] = ()) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for name, value in (*guard.HEADERS, *headers):
            self.send_header(name, value)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, status: int, data: Any, headers: tuple[tuple[str, str], ...] = ()
              ) -> None:
        body = json.dumps(data, allow_nan=False, default=_plain).encode()
        try:
            self._send(status, body, "application/json", headers)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True     # the page moved on (a newer request replaced it)

    def _body(self) -> bytes:
        """The request's body, read within ``BODY_SECONDS``; a bad or oversized length is
        answered (400, 411, 413) with the connection then closed."""
        if self.headers.get("Transfer-Encoding"):
            self.close_connection = True
            raise Refused(HTTPStatus.LENGTH_REQUIRED, "request: expected a Content-Length, "
                          "not a Transfer-Encoding")
        text = (self.headers.get("Content-Length") or "0").strip()
        if not text.isdigit() or len(text) > 18:
            self.close_connection = True
            raise Refused(HTTPStatus.BAD_REQUEST, "Content-Length: expected a byte count "
                          f"from 0 to {MAX_BODY:,}")
        size = int(text)
        if size > MAX_BODY:
            self.close_connection = True
            self._read(min(size, DISCARD_MAX), keep=False)  # so the client reads the answer
            raise Refused(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"request of {size:,} bytes, "
                          f"expected under {MAX_UPLOAD_BYTES // 1024 // 1024} MB")
        data = self._read(size)
        if len(data) < size:
            self.close_connection = True
            raise Refused(HTTPStatus.BAD_REQUEST, f"request: {len(data):,} bytes of the "
                          f"{size:,} its Content-Length gives")
        return data

    def _read(self, size: int, keep: bool = True) -> bytes:
        """Up to ``size`` bytes, one socket read at a time (each within the socket timeout,
        all within ``BODY_SECONDS``); fewer where the client stopped sending."""
        deadline = time.monotonic() + BODY_SECONDS
        parts, left = [], size
        while left > 0 and time.monotonic() < deadline:
            try:
                chunk = self.rfile.read1(min(left, 1 << 16))
            except (TimeoutError, OSError):
                break
            if not chunk:
                break
            left -= len(chunk)
            if keep:
                parts.append(chunk)
        if left > 0:
            self.close_connection = True
        return b"".join(parts)

    def _settings(self, body: bytes) -> dict[str, Any]:
        try:
            data = json.loads(body or b"{}")
        except (ValueError, UnicodeDecodeError, RecursionError) as exc:
            raise SpecError(f"request: expected a JSON object ({type(exc).__name__})") from exc
        if not isinstance(data, dict):
            raise SpecError("request: expected a JSON object of settings")
        return data

    def _answer(self, work: Any) -> None:
        try:
            status, data = HTTPStatus.OK, work()
            json.dumps(data, allow_nan=False, default=_plain)    # a failure here is a 500
        except Refused as exc:
            status, data = exc.status, {"error": str(exc)}
        except jobs.Busy as exc:
            status, data = HTTPStatus.TOO_MANY_REQUESTS, {"error": str(exc)}
        except SpecError as exc:
            status = HTTPStatus.BAD_REQUEST
            data = {"error": (self.server.uploads.shown(str(exc)).splitlines() or [""])[0]}
        except Exception as exc:   # never let a request take the server down
            status = HTTPStatus.INTERNAL_SERVER_ERROR
            data = {"error": f"internal error: {type(exc).__name__}"}   # no text: it may
            sys.stderr.write(f"perfmodel ui: {self.command} {self.path[:SHOWN_PATH]}: "
                             f"{type(exc).__name__}: {exc}\n")          # quote anything
        self._json(status, data)

    def _guarded(self, handle: Any) -> None:
        """Read the body, check Host, Origin and (for the API) the token, then ``handle``."""
        try:
            body = self._body()
            path = urlparse(self.path).path
            guard.check(self, api=path.startswith("/api/"))
        except Refused as exc:
            self._json(exc.status, {"error": str(exc)})
            return
        handle(path, body)

    def _work(self, fn: Any) -> Any:
        """``fn()`` in one of ``MAX_RUNNING`` work slots (429 when none frees in time)."""
        if not self.server.work.acquire(timeout=WORK_WAIT_S):
            raise jobs.Busy("server busy: every work slot is taken; try again")
        try:
            return fn()
        finally:
            self.server.work.release()

    # --- routes -------------------------------------------------------------------------
    def do_HEAD(self) -> None:
        self.do_GET()

    def do_GET(self) -> None:
        self._guarded(self._get)

    def do_POST(self) -> None:
        self._guarded(self._post)

    def _refuse_method(self) -> None:
        self._guarded(lambda path, body: self._json(
            HTTPStatus.METHOD_NOT_ALLOWED, {"error": f"{self.command}: expected GET or POST"},
            (("Allow", "GET, HEAD, POST"),)))

    do_PUT = do_DELETE = do_PATCH = do_OPTIONS = do_TRACE = do_CONNECT = _refuse_method

    def _get(self, path: str, body: bytes) -> None:
        if path.startswith("/api/job/") and path.count("/") == 3:
            self._answer(lambda: self.server.jobs.get(path.rsplit("/", 1)[1]).view())
        elif path == "/api/choices":
            self._answer(api.choices)
        elif path.startswith("/api/"):
            self._json(HTTPStatus.NOT_FOUND, {"error": f"{path[:SHOWN_PATH]}: no such API"})
        elif path in ("", "/") and guard.token_in_query(self):
            self._json(HTTPStatus.FOUND, {"location": "/"}, guard.login_headers(self.server))
        else:
            self._static(path)

    def _post(self, path: str, body: bytes) -> None:
        up, query = self.server.uploads, urlparse(self.path).query
        routes = {
            "/api/estimate": lambda: self._work(lambda: api.estimate(self._settings(body),
                                                                     up)),
            "/api/curve": lambda: self._work(lambda: api.curve(self._settings(body), up)),
            "/api/simulate": lambda: self.server.jobs.start(
                "simulate", jobs.simulation(self._settings(body), up)).view(),
            "/api/plan": lambda: self.server.jobs.start(
                "plan", jobs.planning(self._settings(body), up)).view(),
            "/api/upload": lambda: _upload(up, query, self.headers, body),
        }
        kind = guard.UPLOAD_TYPE if path == "/api/upload" else guard.JSON_TYPE
        if path in routes:
            self._answer(lambda: guard.content_type(self, kind) or routes[path]())
        elif path.startswith("/api/job/") and path.endswith("/cancel") \
                and path.count("/") == 4:
            self._answer(lambda: guard.content_type(self, kind) or
                         self.server.jobs.cancel(path.split("/")[3]).view())
        else:
            self._json(HTTPStatus.NOT_FOUND, {"error": f"{path[:SHOWN_PATH]}: no such API"})

    def _static(self, path: str) -> None:
        """One of the page's own files, looked up by name (never a path on disk)."""
        name = "index.html" if path in ("", "/") else unquote(path).removeprefix("/static/")
        target = STATIC_FILES.get(name) if path in ("", "/") or path.startswith("/static/") \
            else None
        if target is None:
            self._json(HTTPStatus.NOT_FOUND, {"error": f"{path[:SHOWN_PATH]}: not found"})
            return
        ctype = mimetypes.guess_type(target.name)[0] or "application/octet-stream"
        try:
            self._send(HTTPStatus.OK, target.read_bytes(),
                       ctype + ("; charset=utf-8" if ctype.startswith("text/") or
                                ctype.endswith("javascript") else ""))
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True


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
    from perfmodel.specs import load
    from perfmodel.specs.fields import read_mapping

    q = parse_qs(query)
    kind = (q.get("kind") or [""])[0]
    name = (q.get("name") or [headers.get("X-File-Name") or "upload"])[0]
    checks = {"model": load.model, "hardware": load.hardware, "trace": _trace}
    if kind not in checks:
        raise SpecError("upload: expected kind model, hardware or trace")
    ref, path = uploads.add(name, data)
    try:
        if kind == "hardware" and path.suffix.lower() in (".yaml", ".yml", ".json"):
            files.check_base(read_mapping(path, load.HARDWARE_EXPECTED), path.name)
        loaded = checks[kind](str(path))
    except SpecError as exc:
        message = uploads.shown(str(exc))
        uploads.drop(ref)
        raise SpecError(message) from None
    except Exception as exc:
        uploads.drop(ref)
        raise SpecError(f"{path.name}: cannot read it as a {kind} ({type(exc).__name__})"
                        ) from exc
    return {"ref": ref, "name": path.name, "title": getattr(loaded, "name", path.name)}


def _trace(path: str) -> Any:
    from perfmodel.serving.traffic import read_trace

    return read_trace(Path(path))
