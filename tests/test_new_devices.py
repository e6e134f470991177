"""The 2026 devices (issue 36): each file loads with a source per block, its peak rates are
the per-clock products its source states, and a device nobody calibrated says so."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from typer.testing import CliRunner

import perfmodel as pm
from perfmodel.cli.app import app

ROOT = Path(__file__).resolve().parents[1]
NEW = ("mi325x", "mi355x", "tpu-v7", "trainium2", "trainium3", "gaudi3", "h20", "rtx-5090",
       "rtx-pro-6000-server", "dgx-spark")
UNCALIBRATED = ("mi325x", "mi355x", "mi300x", "tpu-v7", "tpu-v6e", "trainium2", "trainium3",
                "gaudi3",
                "rtx-5090", "dgx-spark")
runner = CliRunner()


@pytest.mark.parametrize("name", NEW)
def test_every_block_has_a_source(name: str) -> None:
    hw = pm.hardware(name)
    for block in ("compute", "memory", "on_chip", "interconnect", "efficiency"):
        assert hw.sources[block].strip(), block
    assert hw.memory_bytes > 1e10 and hw.memory_bytes_per_s > 1e11


@pytest.mark.parametrize(("name", "dtype", "units", "per_clock", "hz"), [
    ("mi355x", "fp8", 256, 8192, 2.4e9),     # CDNA 4: 8192 FP8 FLOP per CU per clock
    ("mi355x", "bf16", 256, 4096, 2.4e9),
    ("mi355x", "fp4", 256, 16384, 2.4e9),
    ("mi325x", "bf16", 304, 2048, 2.1e9),    # CDNA 3 as MI300X
    ("rtx-pro-6000-server", "bf16", 188, 1024, 2.43e9),   # Workstation's per-clock rate
])
def test_peak_is_units_times_rate_times_clock(name, dtype, units, per_clock, hz) -> None:
    assert pm.hardware(name).peak(dtype) == pytest.approx(units * per_clock * hz, rel=2e-3)


def test_power_block() -> None:
    assert pm.hardware("mi355x").tdp_watts == 1400
    assert pm.hardware("h20").tdp_watts == 400
    assert pm.hardware("h20").idle_watts is None
    assert pm.hardware("tpu-v7").tdp_watts is None          # Google publishes none


def test_power_idle_above_tdp_is_refused(tmp_path: Path) -> None:
    text = (ROOT / "perfmodel" / "hardware" / "h20.yaml").read_text().replace(
        "tdp_watts: 400", "tdp_watts: 400\n  idle_watts: 500")
    path = tmp_path / "h20-bad.yaml"
    path.write_text(text.replace("name: h20", "name: h20-bad"))
    out = runner.invoke(app, ["estimate", "-m", "llama-3-8b", "-H", str(path)])
    assert out.exit_code != 0
    assert "power.idle_watts" in out.output and "at most 400" in out.output


def _band_script():
    spec = importlib.util.spec_from_file_location(
        "uncalibrated_band", ROOT / "reports" / "kernels" / "uncalibrated_band.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name", UNCALIBRATED)
def test_uncalibrated_band_is_the_scripts(name: str) -> None:
    """The shipped blocks hold what the 'before' residuals give, nothing tuned by hand."""
    script = _band_script()
    want = script.band()
    unc = pm.hardware(name).uncertainty
    assert unc.uncalibrated and unc.source == script.SOURCE
    assert unc.q10 == want["error_q10"] and unc.q90 == want["error_q90"]


def test_uncalibrated_band_golden() -> None:
    """Hand check of the row-weighted median the half-width is."""
    script = _band_script()
    assert script.weighted_median([0.2, 0.9, 0.5], [1, 1, 5]) == 0.5
    assert script.weighted_median([0.2, 0.9], [3, 1]) == 0.2


def test_uncalibrated_says_so_beside_the_number() -> None:
    out = runner.invoke(app, ["estimate", "-m", "llama-3-8b", "-H", "mi355x"]).output
    rows = {line.split("  ")[0]: line for line in out.splitlines()}
    assert "uncalibrated)" in rows["TPOT (decode mean)"]
    assert rows["band"].startswith("band                uncalibrated device")
    calibrated = runner.invoke(app, ["estimate", "-m", "llama-3-8b", "-H", "h200-sxm"]).output
    assert "uncalibrated" not in calibrated
