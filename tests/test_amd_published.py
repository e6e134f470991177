"""The CDNA 3 files' gemm_fraction is the fit of AMD's published GEMM figures
(reports/amd_published/), and their calibration blocks state the held-out error it has."""

from __future__ import annotations

import csv
import importlib.util
import sys
from pathlib import Path

import pytest

from perfmodel.compare.errors import predict_rows
from perfmodel.compare.rows import read_measurements
from perfmodel.specs.load import hardware

HERE = Path(__file__).resolve().parents[1] / "reports" / "amd_published"


def _fit_module():
    spec = importlib.util.spec_from_file_location("amd_fit", HERE / "fit.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module     # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def fit():
    return _fit_module()


@pytest.mark.parametrize("device", ["mi300x", "mi325x"])
def test_shipped_constants_are_the_fit(fit, device: str) -> None:
    hw, s = hardware(device), fit.summary(device)
    assert hw.efficiency.gemm_fraction == s["gemm_fraction"]
    cal = hw.calibration
    assert cal["fitted"] == {"gemm_fraction": s["gemm_fraction"]}
    assert cal["rows"] == {"gemm": s["rows"]}
    assert cal["held_out_median_abs_error"] == {"gemm": s["held_out_median_abs_error"]}
    assert cal["fit_median_abs_error"] == s["fit_median_abs_error"]
    # only the GEMMs are fitted: the band stays the uncalibrated rule's
    assert hw.uncertainty.uncalibrated


def test_held_out_figures(fit) -> None:
    """Leave one source out: MI300X 3.9%, MI325X 11.8% (its TAF predicted too fast)."""
    assert fit.summary("mi300x")["held_out_median_abs_error"] == 0.039
    s = fit.summary("mi325x")
    assert s["held_out_median_abs_error"] == 0.118
    taf = [e for fold, f, _, e in s["held_out"] if f.source == "amd-taf-2026"]
    assert len(taf) == 3 and all(-0.25 < e < -0.1 for e in taf)


def test_rows_are_the_published_rates() -> None:
    """measured_s = 2 m n k / published TFLOP/s, every row, and the file reads as
    measurements."""
    with (HERE / "gemm.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 12
    for r in rows:
        flops = 2.0 * int(r["m"]) * int(r["n"]) * int(r["k"])
        assert float(r["measured_s"]) == pytest.approx(
            flops / (float(r["published_tflops"]) * 1e12), rel=1e-6)
    assert len(read_measurements(HERE / "gemm.csv", devices=["mi325x"])) == 7


def test_mi355x_is_evaluated_not_fitted(fit) -> None:
    """One published MI355X figure: the family rule's error is reported, the file keeps it."""
    hw = hardware("mi355x")
    assert hw.efficiency.gemm_fraction == 0.51 and hw.calibration is None
    (figure,) = fit.figures("mi355x")
    assert fit.error(figure, hw) == pytest.approx(0.240, abs=5e-4)


def test_maf_shape_by_hand() -> None:
    """4096 x 4864 x 32896 bf16 on the MI325X: 304 tiles of 256x256 (or 1216 of 128x128)
    fill the 304 CUs in whole waves, no padding, so the time is the FLOPs at peak x
    gemm_fraction x the k ramp 32896 / (32896 + 128), plus the 2 us kernel latency."""
    hw = hardware("mi325x")
    row = {"op": "gemm", "dtype": "bf16", "m": "4096", "n": "4864", "k": "32896",
           "measured_s": "1"}
    flops = 2.0 * 4096 * 4864 * 32896
    hand = flops / (1307.4e12 * 0.5724 * 32896 / (32896 + 128)) + 2e-6
    assert predict_rows([row], hw)[0]["predicted_s"] == pytest.approx(hand, rel=1e-9)


def test_compare_reads_the_sample() -> None:
    """The sample is in the shared schema: ``perfmodel compare`` predicts it as it stands."""
    from typer.testing import CliRunner

    from perfmodel.cli.app import load_plugins

    out = CliRunner().invoke(load_plugins(), ["compare", str(HERE / "gemm.csv"), "-H", "mi300x",
                                   "--device-filter", "mi300x"])
    assert out.exit_code == 0, out.output
    assert "4 rows predicted on mi300x" in out.output
    assert "3.7%" in out.output    # the fit's median |error| (calibration: fit_median_abs_error)
