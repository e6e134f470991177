"""Who may talk to the page's server, checked on every request as Jupyter's server does:

- **Host allow-list** (DNS rebinding): a name that resolves to 127.0.0.1 for an attacker's
  page still says its own name in ``Host``; only loopback names are answered (any name with
  ``--allow-remote``).
- **Origin** (cross-site requests): a browser names the page that sent a request; only this
  server's own origin is answered, and ``Sec-Fetch-Site: cross-site`` never.
- **Token** (every ``/api/`` call): the random token of the start-up URL, from the cookie
  ``GET /?token=...`` sets (HttpOnly, SameSite=Strict) or an ``Authorization: token ...``
  header; without it, 403.
- **Content types**: JSON only as ``application/json`` and uploads as
  ``application/octet-stream`` (types a cross-site form cannot send without a preflight,
  which is refused); state changes by POST only.
"""

from __future__ import annotations

import hmac
import ipaddress
from http import HTTPStatus
from http.cookies import CookieError, SimpleCookie
from typing import Any
from urllib.parse import parse_qs, urlparse

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
JSON_TYPE = "application/json"
UPLOAD_TYPE = "application/octet-stream"
HEADERS = (("Cache-Control", "no-store"), ("X-Content-Type-Options", "nosniff"),
           ("Referrer-Policy", "no-referrer"), ("X-Frame-Options", "DENY"),
           ("Content-Security-Policy", "frame-ancestors 'none'"))
NO_TOKEN = ("no token: open the address perfmodel ui printed at start-up (it ends in "
            "?token=...), or send the header 'Authorization: token ...'")


class Refused(Exception):
    """A request answered at once with ``status`` and a one-line message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def loopback(host: str) -> bool:
    """Whether ``host`` (a listening address or a Host header's name) is this machine only."""
    name = host.strip("[]").lower()
    if name in LOOPBACK_NAMES or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def _name(host_header: str) -> str:
    """The name of a ``Host`` header or an origin's netloc, without its port."""
    text = host_header.strip().lower()
    if text.startswith("["):
        return text[1:text.find("]")] if "]" in text else text
    return text.rsplit(":", 1)[0] if text.count(":") == 1 else text


def check(handler: Any, api: bool) -> None:
    """Raise ``Refused`` (403) for a request this server must not answer."""
    server, headers = handler.server, handler.headers
    host = headers.get("Host")
    if host is None or not (server.allow_remote or loopback(_name(host))):
        raise Refused(HTTPStatus.FORBIDDEN, "Host: not a name of this server (expected "
                      "localhost or 127.0.0.1; perfmodel ui --allow-remote takes any)")
    origin = headers.get("Origin")
    if origin is not None and not _same_origin(origin, host):
        raise Refused(HTTPStatus.FORBIDDEN, "Origin: a page of another site; expected this "
                      "server's own page")
    if (headers.get("Sec-Fetch-Site") or "").lower() == "cross-site":
        raise Refused(HTTPStatus.FORBIDDEN, "Sec-Fetch-Site: cross-site; expected this "
                      "server's own page")
    if api and not authorized(handler):
        raise Refused(HTTPStatus.FORBIDDEN, NO_TOKEN)


def _same_origin(origin: str, host: str) -> bool:
    """``Origin: http://HOST`` for the ``Host`` the request was sent to (a loopback name)."""
    url = urlparse(origin)
    return url.scheme == "http" and url.netloc.lower() == host.strip().lower()


def _equal(given: str | None, token: str) -> bool:
    return given is not None and hmac.compare_digest(given.encode("utf-8", "replace"),
                                                     token.encode())


def authorized(handler: Any) -> bool:
    """The token, from the cookie or an ``Authorization: token ...`` header."""
    server = handler.server
    scheme, _, value = (handler.headers.get("Authorization") or "").partition(" ")
    if scheme.lower() == "token" and _equal(value.strip(), server.token):
        return True
    try:
        jar = SimpleCookie(handler.headers.get("Cookie") or "")
    except CookieError:
        return False
    morsel = jar.get(server.cookie)
    return morsel is not None and _equal(morsel.value, server.token)


def token_in_query(handler: Any) -> bool:
    """Whether the request's URL carries the right ``?token=``."""
    given = parse_qs(urlparse(handler.path).query).get("token", [None])[0]
    return _equal(given, handler.server.token)


def login_headers(server: Any) -> tuple[tuple[str, str], ...]:
    """The redirect from ``/?token=...`` to ``/`` that keeps the token in a cookie only
    this server's own pages send (and the address bar no longer shows)."""
    return (("Location", "/"),
            ("Set-Cookie", f"{server.cookie}={server.token}; Path=/; HttpOnly; "
                           "SameSite=Strict"))


def content_type(handler: Any, expected: str) -> None:
    """Raise ``Refused`` (415) unless the body is sent as ``expected``."""
    given = (handler.headers.get("Content-Type") or "").split(";")[0].strip().lower()
    if given != expected:
        raise Refused(HTTPStatus.UNSUPPORTED_MEDIA_TYPE, f"Content-Type: expected "
                      f"{expected}")
