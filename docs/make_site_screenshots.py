"""Screenshots of the built site (home, a command page, the API reference) into docs/img/site/
with Debian's headless chromium; 256-colour PNGs, to keep them small.

    PYTHONPATH=. python docs/make_site_screenshots.py
"""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "img" / "site"
PAGES = {"home": "index.html", "estimate": "estimate/index.html", "api": "api/index.html"}


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        site = Path(tmp) / "site"
        subprocess.run(["mkdocs", "build", "--strict", "-q", "--site-dir", str(site)],
                       check=True, cwd=ROOT)
        for name, page in PAGES.items():
            shot = Path(tmp) / f"{name}.png"
            subprocess.run(["chromium", "--headless", "--no-sandbox", "--disable-gpu",
                            "--hide-scrollbars", "--window-size=1280,900",
                            f"--screenshot={shot}", (site / page).as_uri()],
                           check=True, capture_output=True)
            image = Image.open(shot).convert("RGB")
            image.quantize(colors=256, method=Image.Quantize.FASTOCTREE).save(
                OUT / f"{name}.png", optimize=True)
            print(f"docs/img/site/{name}.png: {(OUT / f'{name}.png').stat().st_size // 1024} KB")


if __name__ == "__main__":
    main()
