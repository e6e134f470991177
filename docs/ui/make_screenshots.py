"""Screenshots of each view of ``perfmodel ui`` into docs/ui/ (headless chromium).

    PYTHONPATH=. python docs/ui/make_screenshots.py

Needs chromium and chromedriver (Debian: apt-get install chromium chromium-driver).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from perfmodel.ui.server import start  # noqa: E402
from tests import webdriver  # noqa: E402

OUT = Path(__file__).resolve().parent
# No shipped device has an uncertainty: block yet, so the estimate screenshot uploads this
# one to show the band: ILLUSTRATIVE edges (the test suite's), not measured ones.
ILLUSTRATIVE = """version: 1
base: h100-sxm
name: h100-sxm-illustrative-band
uncertainty:
  source: "illustrative edges for the screenshot, not measured"
  error_q10: {gemm: -0.1, gemv: -0.1, attention_prefill: -0.15, attention_decode: -0.1,
              memory: -0.05, collective: -0.2}
  error_q90: {gemm: 0.2, gemv: 0.1, attention_prefill: 0.15, attention_decode: 0.1,
              memory: 0.05, collective: 0.2}
"""
SETTLED = "window.perfmodelState.pending === 0 && window.perfmodelState.version > {v}"


def main() -> None:
    server, _ = start()
    b = webdriver.Browser(1280, 860)

    def settle(action) -> None:
        v = b.js("return window.perfmodelState.version")
        action()
        b.wait(SETTLED.format(v=v), 120)

    def shot(name: str) -> None:
        size = b.screenshot(OUT / f"{name}.png")
        print(f"docs/ui/{name}.png: {size / 1024:.0f} KB")

    try:
        b.get(server.url)
        b.wait("window.perfmodelState && window.perfmodelState.ready", 60)
        settle(lambda: b.type("#batch", "32"))
        settle(lambda: b.click('[name="kv-dtype"] option[value="fp8"]'))
        with tempfile.TemporaryDirectory() as tmp:
            banded = Path(tmp) / "illustrative-band.yaml"
            banded.write_text(ILLUSTRATIVE)
            settle(lambda: b.type("#hardware-file", str(banded), clear=False))
        shot("estimate")
        settle(lambda: b.click('#hardware option[value="h100-sxm"]'))
        b.click('#tabs button[data-view="roofline"]')
        b.js("""const c = [...document.querySelectorAll('#roofline-chart circle[data-tip]')]
                  .find(e => e.getAttribute('data-tip').startsWith('decode attention'))
                  || document.querySelector('#roofline-chart circle[data-tip]');
                const r = c.getBoundingClientRect();
                c.dispatchEvent(new MouseEvent('mousemove', {bubbles: true,
                  clientX: r.x + 4, clientY: r.y + 4}));""")
        shot("roofline")
        settle(lambda: b.click('#tabs button[data-view="batch"]'))
        shot("batch")
        b.click('#tabs button[data-view="simulate"]')
        b.type('#sim-form [name="rate"]', "2,6")
        settle(lambda: b.click("#sim-run"))
        b.wait("window.perfmodelState.sim", 120)
        shot("simulate")
        b.click('#tabs button[data-view="plan"]')
        b.type('#plan-form [name="gpus"]', "4")
        settle(lambda: b.click("#plan-run"))
        b.wait("window.perfmodelState.plan", 300)
        shot("plan")
        b.js("window.scrollTo(0, 0)")
        b.click('#tabs button[data-view="estimate"]')
        with tempfile.TemporaryDirectory() as tmp:
            bad = Path(tmp) / "config.json"
            bad.write_text('{"model_type": "llama", "hidden_size": 4096}')
            settle(lambda: b.type("#model-file", str(bad), clear=False))
        settle(lambda: b.type('[name="tp"]', "3"))
        b.js("document.activeElement.blur(); window.scrollTo(0, 0)")
        shot("errors")
    finally:
        b.quit()
        server.shutdown()
        server.server_close()


if __name__ == "__main__":
    main()
