"""The page in a real browser (headless chromium over WebDriver): change model, device, batch
and dtypes and see the CLI's numbers; hover the roofline; run a simulation and a plan;
upload a broken config and an impossible setting and see the CLI's one line; export the view.

Skipped where chromium or chromedriver is missing, unless PERFMODEL_REQUIRE_BROWSER=1 (CI).
"""

import json
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from perfmodel.cli.app import app
from perfmodel.ui.server import start
from tests import webdriver

runner = CliRunner()
SETTLED = ("window.perfmodelState && window.perfmodelState.ready && "
           "window.perfmodelState.pending === 0 && window.perfmodelState.version > {v}")


@pytest.fixture(scope="module")
def page():
    if webdriver.binaries() is None:
        if webdriver.required():
            pytest.fail("PERFMODEL_REQUIRE_BROWSER=1 but chromium/chromedriver are missing")
        pytest.skip("chromium and chromedriver are not installed")
    server, _ = start()
    browser = webdriver.Browser()
    try:
        browser.home = server.url
        browser.get(server.url)
        browser.wait(SETTLED.format(v=0), 30)
        yield browser
    finally:
        browser.quit()
        server.shutdown()
        server.server_close()


def settle(b, action) -> None:
    """Do ``action`` and wait until every request it set off has been answered."""
    v = b.js("return window.perfmodelState.version")
    action()
    b.wait(SETTLED.format(v=v))
    b.wait("window.perfmodelState.pending === 0")


def choose(b, select: str, value: str) -> None:
    settle(b, lambda: b.click(f'{select} option[value="{value}"]'))


def cli(args: list[str]) -> tuple[int, str, str]:
    result = runner.invoke(app, args)
    return result.exit_code, result.stdout, result.stderr


def shown(b, table: str = "#summary") -> dict[str, float]:
    cells = b.js(f"return [...document.querySelectorAll('{table} td[data-key]')]"
                 ".map(e => [e.dataset.key, e.dataset.value])")
    return {k: json.loads(v) for k, v in cells}


def test_changing_model_device_batch_and_dtype_shows_the_clis_numbers(page):
    args = ["--model", "llama-3-8b", "--hardware", "h100-sxm"]
    steps = [(lambda: choose(page, "#model", "qwen3-8b"), ["--model", "qwen3-8b"]),
             (lambda: choose(page, "#hardware", "a100-80gb-sxm"),
              ["--hardware", "a100-80gb-sxm"]),
             (lambda: settle(page, lambda: page.type("#batch", "16")), ["--batch", "16"]),
             (lambda: choose(page, '[name="kv-dtype"]', "fp8"), ["--kv-dtype", "fp8"])]
    for act, change in steps:
        act()
        args = [*args, *change]
        code, out, _ = cli(["estimate", *args, "--format", "json"])
        assert code == 0
        expected, numbers = json.loads(out), shown(page)
        assert len(numbers) >= 10
        for key, value in numbers.items():
            assert value == expected[key], key
    line = page.text("#view-estimate .cli code")
    assert line.startswith("perfmodel estimate --model qwen3-8b --hardware a100-80gb-sxm "
                           "--batch 16 --kv-dtype fp8")
    assert json.loads(cli(shlex.split(line)[1:])[1])["tpot_s"] == shown(page)["tpot_s"]


def test_roofline_hover_names_the_operator(page):
    page.click('#tabs button[data-view="roofline"]')
    tip = page.js("""
        const c = document.querySelector('#roofline-chart circle[data-tip]');
        const r = c.getBoundingClientRect();
        c.dispatchEvent(new MouseEvent('mousemove', {bubbles: true, clientX: r.x, clientY: r.y}));
        return document.getElementById('tipbox').textContent;""")
    assert "FLOPs" in tip and "bytes" in tip and "-bound" in tip
    assert page.js("return document.querySelectorAll('#roofline-chart circle').length") > 10


def test_a_broken_upload_and_an_impossible_setting_show_the_clis_line(page, tmp_path,
                                                                       monkeypatch):
    bad = tmp_path / "config.json"
    bad.write_text('{"model_type": "llama", "hidden_size": ')
    settle(page, lambda: page.type("#model-file", str(bad), clear=False))
    upload = page.wait("document.querySelector('.err[data-for=\"model-file\"]').textContent")
    monkeypatch.chdir(tmp_path)
    code, _, err = cli(["estimate", "--model", "config.json", "--hardware", "h100-sxm"])
    assert code == 2 and err.strip().splitlines() == [upload]
    settle(page, lambda: page.type('[name="tp"]', "3"))
    message = page.text("#form-error")
    code, _, err = cli(["estimate", "--model", "qwen3-8b", "--hardware", "a100-80gb-sxm",
                        "--tp", "3"])
    assert code == 2 and err.strip().splitlines() == [message]
    assert page.text('.err[data-for="model-file"]') == upload     # both stay in view
    settle(page, lambda: page.type('[name="tp"]', "1"))       # the page keeps working
    assert page.text("#form-error") == "" and shown(page)["tpot_s"] > 0


def test_a_small_simulation(page):
    page.click('#tabs button[data-view="simulate"]')
    page.type('#sim-form [name="rate"]', "3")
    page.type('#sim-form [name="num-requests"]', "30")
    settle(page, lambda: page.click("#sim-run"))
    page.wait("window.perfmodelState.sim", 60)
    line = page.text("#view-simulate .cli code")
    assert "--rate 3 --num-requests 30" in line
    code, out, _ = cli(shlex.split(line)[1:])
    assert code == 0
    summary = json.loads(out)
    numbers = shown(page, "#sim-summary")
    assert numbers["ttft_s.p90"] == summary["ttft_s"]["p90"]
    assert numbers["goodput_requests_per_s"] == summary["goodput_requests_per_s"]
    assert page.js("return document.querySelectorAll('#cdf-chart path').length") >= 2


def test_a_plan(page):
    page.click('#tabs button[data-view="plan"]')
    page.type('#plan-form [name="gpus"]', "2")
    page.type('#plan-form [name="requests"]', "100")
    settle(page, lambda: page.click("#plan-run"))
    page.wait("window.perfmodelState.plan", 90)
    line = page.text("#view-plan .cli code")
    code, out, _ = cli([*shlex.split(line)[1:], "--format", "json"])
    assert code == 0
    assert page.text("#plan-head h3") == f"chosen: {json.loads(out)['winner']['label']}"
    assert page.js("return document.querySelectorAll('#pareto-chart circle').length") > 0


def test_static_export_is_one_self_contained_file(page, tmp_path):
    page.click('#tabs button[data-view="roofline"]')
    html = page.js("return window.perfmodelExport()")
    assert "<svg" in html and "attained FLOP/s" in html
    for outside in ("<script", "<link", " src=", "@import"):
        assert outside not in html
    path = tmp_path / "view.html"
    path.write_text(html)
    page.get(path.as_uri())
    assert page.js("return document.querySelectorAll('svg circle').length") > 10
    assert page.js("return document.querySelector('.cli code').textContent") \
        .startswith("perfmodel roofline")
    Path(path).unlink()
    page.get(page.home)                 # back to the page for the tests after this one
    page.wait(SETTLED.format(v=0), 30)


def test_a_device_with_a_band_shows_the_clis_band(page, tmp_path):
    from tests.test_ui_api import BANDED

    path = tmp_path / "banded.yaml"
    path.write_text(BANDED)
    page.click('#tabs button[data-view="estimate"]')
    settle(page, lambda: page.type("#hardware-file", str(path), clear=False))
    line = page.text("#view-estimate .cli code")
    assert "--hardware banded.yaml" in line
    code, out, _ = cli(shlex.split(line.replace("banded.yaml", str(path)))[1:])
    assert code == 0
    expected = json.loads(out)
    bands = page.js("return [...document.querySelectorAll('#summary td[data-band]')]"
                    ".map(e => [e.dataset.band, +e.dataset.low, +e.dataset.high])")
    assert {k for k, _, _ in bands} >= {"ttft_s", "tpot_s", "e2e_s",
                                        "throughput_tokens_per_s"}
    for key, low, high in bands:
        assert (low, high) == (expected[f"{key}_low"], expected[f"{key}_high"])
    assert "80% band" in page.text("#operators")
    assert page.text('.err[data-for="hardware-file"]') == ""


def test_the_token_lives_in_an_httponly_cookie_and_a_page_without_it_is_refused(page):
    """The start-up URL's token became a cookie the page's script cannot read, and left
    the address bar; the same page from a server whose token it lacks gets 403s, said."""
    assert page.js("return location.search") == ""
    assert "perfmodel-ui" not in page.js("return document.cookie")
    other, _ = start()
    try:
        page.get(other.base)
        status = page.wait("document.getElementById('status').textContent.startsWith("
                           "'error:') && document.getElementById('status').textContent", 30)
        assert status.startswith("error: no token: open the address perfmodel ui printed")
    finally:
        other.shutdown()
        other.server_close()
        page.get(page.home)
        page.wait(SETTLED.format(v=0), 30)
