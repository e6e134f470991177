"""A few W3C WebDriver calls over HTTP (the protocol chromedriver speaks), enough for the
page's browser tests and screenshots: no client library to install, only Debian's chromium
and chromium-driver (``.ci/run`` installs them).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

ELEMENT = "element-6066-11e4-a52e-4f735466cecf"     # the W3C key of an element reference


def binaries() -> tuple[str, str] | None:
    """(chromium, chromedriver) found on PATH, or None."""
    browser = next(filter(None, (shutil.which(n) for n in ("chromium", "chromium-browser",
                                                           "google-chrome"))), None)
    driver = shutil.which("chromedriver")
    return (browser, driver) if browser and driver else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Browser:
    """A headless chromium driven by chromedriver; ``quit()`` ends both."""

    def __init__(self, width: int = 1400, height: int = 1000) -> None:
        found = binaries()
        if found is None:
            raise RuntimeError("chromium and chromedriver are not on PATH")
        browser, driver = found
        port = _free_port()
        self.driver = subprocess.Popen([driver, f"--port={port}"], stdout=subprocess.DEVNULL,
                                       stderr=subprocess.DEVNULL)
        self.base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 20
        while True:
            try:
                self._call("GET", "/status")
                break
            except (urllib.error.URLError, ConnectionError):
                if time.monotonic() > deadline:
                    self.driver.kill()
                    raise
                time.sleep(0.1)
        args = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                f"--window-size={width},{height}", "--hide-scrollbars"]
        caps = {"capabilities": {"alwaysMatch": {
            "browserName": "chrome", "goog:chromeOptions": {"binary": browser, "args": args}}}}
        self.session = self._call("POST", "/session", caps)["sessionId"]

    def _call(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                out = json.loads(r.read() or b"{}")
        except urllib.error.HTTPError as exc:
            detail = json.loads(exc.read() or b"{}").get("value", {})
            raise RuntimeError(f"webdriver {path}: {detail.get('message', exc)}"
                               .splitlines()[0]) from None
        return out.get("value")

    def _s(self, method: str, path: str, body: Any = None) -> Any:
        return self._call(method, f"/session/{self.session}{path}", body)

    def get(self, url: str) -> None:
        self._s("POST", "/url", {"url": url})

    def js(self, script: str, *args: Any) -> Any:
        return self._s("POST", "/execute/sync", {"script": script, "args": list(args)})

    def find(self, css: str) -> dict:
        return self._s("POST", "/element", {"using": "css selector", "value": css})

    def click(self, css: str) -> None:
        self._s("POST", f"/element/{self.find(css)[ELEMENT]}/click", {})

    def type(self, css: str, text: str, clear: bool = True) -> None:
        el = self.find(css)[ELEMENT]
        if clear:
            self._s("POST", f"/element/{el}/clear", {})
        self._s("POST", f"/element/{el}/value", {"text": text})

    def text(self, css: str) -> str:
        return self._s("GET", f"/element/{self.find(css)[ELEMENT]}/text")

    def wait(self, script: str, timeout: float = 20.0) -> Any:
        """Poll ``return <script>`` until it is truthy; its value."""
        deadline = time.monotonic() + timeout
        while True:
            value = self.js("return " + script)
            if value:
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(f"waited {timeout:g} s for: {script}")
            time.sleep(0.05)

    def screenshot(self, path: Path) -> int:
        data = base64.b64decode(self._s("GET", "/screenshot"))
        path.write_bytes(data)
        return len(data)

    def quit(self) -> None:
        try:
            self._call("DELETE", f"/session/{self.session}")
        except Exception:
            pass
        self.driver.terminate()
        try:
            self.driver.wait(10)
        except subprocess.TimeoutExpired:
            self.driver.kill()


def required() -> bool:
    """Whether a missing browser fails the tests (CI) instead of skipping them."""
    return os.environ.get("PERFMODEL_REQUIRE_BROWSER") == "1"


def run_async(browser: Browser, script: str, *args: Any) -> Any:
    """Run ``script`` with a callback as its last argument (``arguments[arguments.length -
    1]``) and return what it passes the callback."""
    return browser._s("POST", "/execute/async", {"script": script, "args": list(args)})
