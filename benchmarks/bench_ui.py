"""Benchmark the browser page: time from ``perfmodel ui`` to a page that answers and a first
estimate, and the latency of an estimate update (server side, and through a real browser
where chromium and chromedriver are installed).

    python benchmarks/bench_ui.py [--quick]

Not a test: prints the numbers docs/speed.md quotes (Llama-3-8B on an H100 SXM, the page's
defaults; the update changes the batch). Medians of repeats; on a shared 2-core machine they
move by 10-30% between runs.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = {"model": "llama-3-8b", "hardware": "h100-sxm"}


def post(url: str, body: dict, token: str) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json",
                                          "Authorization": f"token {token}"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())


def start_up() -> tuple[float, float]:
    """Seconds from launching ``perfmodel ui --no-browser`` to GET / answering, and to the
    first estimate answered (what the page asks for first)."""
    t0 = time.perf_counter()
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-m", "perfmodel.cli", "ui", "--no-browser",
                             "--port", "0"], stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = proc.stderr.readline()
        url, token = re.search(r"(http://\S+/)\?token=(\S+)", line).groups()
        with urllib.request.urlopen(url, timeout=30) as r:
            r.read()
        page = time.perf_counter() - t0
        post(url + "api/estimate", SETTINGS, token)
        return page, time.perf_counter() - t0
    finally:
        proc.terminate()
        proc.wait(10)


def server_updates(n: int) -> list[float]:
    """Seconds per estimate request (a new batch each time) on a warm server."""
    from perfmodel.ui.server import start

    server, _ = start()
    try:
        post(server.base + "api/estimate", SETTINGS, server.token)
        times = []
        for i in range(n):
            t0 = time.perf_counter()
            post(server.base + "api/estimate", {**SETTINGS, "batch": 1 + i % 64},
                 server.token)
            times.append(time.perf_counter() - t0)
        return times
    finally:
        server.shutdown()
        server.server_close()


BROWSER_LOOP = """
const n = arguments[0], done = arguments[arguments.length - 1], times = [];
(async () => {
  for (let i = 0; i < n; i++) {
    const box = document.querySelector('#batch');
    const t0 = performance.now();
    box.value = String(2 + i % 64);
    box.dispatchEvent(new Event('input', {bubbles: true}));
    const v = window.perfmodelState.version;
    while (window.perfmodelState.version === v || window.perfmodelState.pending) {
      await new Promise(r => setTimeout(r, 1));
    }
    await new Promise(r => requestAnimationFrame(() => r()));   // painted
    times.push(performance.now() - t0);
  }
  done(times);
})();
"""


def browser_updates(n: int) -> list[float] | None:
    """Milliseconds from typing a batch to the new numbers and operator table painted
    (chromium)."""
    sys.path.insert(0, str(ROOT))
    from perfmodel.ui.server import start
    from tests import webdriver

    if webdriver.binaries() is None:
        return None
    server, _ = start()
    browser = webdriver.Browser()
    try:
        t0 = time.perf_counter()
        browser.get(server.url)
        browser.wait("window.perfmodelState && window.perfmodelState.ready", 60)
        print(f"  browser: page loaded and first estimate drawn in "
              f"{time.perf_counter() - t0:.2f} s (a browser already running)")
        return webdriver.run_async(browser, BROWSER_LOOP, n)
    finally:
        browser.quit()
        server.shutdown()
        server.server_close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    runs, n = (2, 20) if args.quick else (5, 60)
    starts = [start_up() for _ in range(runs)]
    print(f"perfmodel ui --no-browser to a page answering: median "
          f"{statistics.median(s[0] for s in starts):.2f} s; to the first estimate: "
          f"{statistics.median(s[1] for s in starts):.2f} s ({runs} launches)")
    times = sorted(server_updates(n))
    print(f"estimate update, server (HTTP round trip, estimate + roofline JSON): median "
          f"{statistics.median(times) * 1e3:.0f} ms, p90 {times[int(0.9 * n)] * 1e3:.0f} ms "
          f"({n} requests)")
    ms = browser_updates(n)
    if ms is None:
        print("estimate update, browser: skipped (no chromium/chromedriver)")
    else:
        ms = sorted(ms)
        print("estimate update, browser (input event to the new numbers and operator table "
              f"painted): median "
              f"{statistics.median(ms):.0f} ms, p90 {ms[int(0.9 * len(ms))]:.0f} ms "
              f"({len(ms)} updates)")


if __name__ == "__main__":
    main()
