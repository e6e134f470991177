"""The accuracy gate (perfmodel.kernels.gate): the committed corpus sample and the shared
measurement files scored with the shipped hardware files on every run, each group's median
|error| held to the figure the docs quote (tests/data/accuracy_gate.yaml) plus a margin.
A worse hardware file must fail it.

After a deliberate change of the hardware files:
``PYTHONPATH=. python reports/kernels/make_sample.py figures`` rewrites the figures and the
tables (docs/kernels.md's, the README's headline table).
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from perfmodel.kernels import gate
from perfmodel.specs.load import hardware

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "tests" / "data" / "kernel_sample"
FIGURES = yaml.safe_load((ROOT / "tests" / "data" / "accuracy_gate.yaml").read_text())
# ../shared beside the checkout (CI's layout); PERFMODEL_SHARED names another place
SHARED = Path(os.environ.get("PERFMODEL_SHARED", ROOT.parent / "shared")) / "measurements"


@pytest.fixture(scope="module")
def sample() -> dict:
    return gate.sample_medians(SAMPLE)


def _fail(lines: list[str]) -> None:
    if lines:
        pytest.fail("accuracy gate: " + "; ".join(lines), pytrace=False)


def test_sample_within_the_quoted_figures(sample: dict) -> None:
    _fail(gate.failures(FIGURES["sample"], sample))


@pytest.mark.skipif(not SHARED.exists(), reason="../shared/measurements not present")
def test_shared_files_within_the_quoted_figures() -> None:
    _fail(gate.failures(FIGURES["shared"], gate.shared_medians(SHARED)))


def test_every_sample_group_is_gated(sample: dict) -> None:
    """Each device x engine x class of the sample with enough rows has a figure (a new file
    or class is not silently ungated), and every figure's group is still scored."""
    assert set(FIGURES["sample"]) == {k for k, v in sample.items() if v["n"] >= gate.MIN_ROWS}
    assert len(FIGURES["sample"]) >= 7 * 6          # 7 files x 6 error classes


def test_docs_and_readme_quote_the_gate_figures() -> None:
    """Both tables are the figures file's, as reports/kernels/make_sample.py tables writes
    them."""
    assert gate.gate_table(FIGURES) in (ROOT / "docs" / "kernels.md").read_text()
    for page in ("README.md", "docs/index.md"):
        assert gate.headline_table(FIGURES) in (ROOT / page).read_text(), page


def test_headline_table_holds_every_figure_once() -> None:
    table = gate.headline_table(FIGURES)
    cells = [c.strip() for line in table.splitlines()[3:-1] for c in line.split("|")[2:-1]]
    figures = [*FIGURES["sample"].values(), *FIGURES["shared"].values()]
    assert sorted(c for c in cells if c) == sorted(f"{f:.0%}" for f in figures)
    gemm = FIGURES["sample"]["h100-sxm vllm gemm"]
    assert f"| aiconfigurator-core h100-sxm vllm | {gemm:.0%} |" in table    # GEMM first


def test_margin_is_the_larger_of_points_and_relative() -> None:
    assert FIGURES["margin"] == {"points": gate.MARGIN_POINTS,
                                 "relative": gate.MARGIN_RELATIVE}
    assert gate.margin(0.05) == pytest.approx(0.015)     # 10% of 5% = 0.5 point < 1.5
    assert gate.margin(0.40) == pytest.approx(0.04)      # 10% of 40% = 4 points > 1.5
    figures = {"a": 0.10, "b": 0.40, "c": 0.05}
    medians = {"a": {"median": 0.114, "n": 50}, "b": {"median": 0.45, "n": 50}}
    out = gate.failures(figures, medians)
    assert out == ["b: median |error| 45.0% over 50 rows exceeds the limit 44.0% "
                   "(figure 40.0% + margin)", "c: no rows scored (figure 5.0%)"]


def test_a_worse_hardware_file_fails_the_gate() -> None:
    """Every GEMM kernel's best-shape fraction halved on H100 (the 16-bit one and each
    quantized kernel's, ``gemm_kernels``): its vLLM GEMM rows (compute bound at the
    calibrated fractions) come out about twice as slow, far past the margin. (Halving
    the 16-bit fraction alone no longer moves the class's median: its quantized rows run
    kernels of their own, and the eager fp8-block rows sit on their host path.)"""
    hw = hardware("h100-sxm")
    eff = hw.efficiency
    worse = replace(hw, efficiency=replace(
        eff, gemm_fraction=eff.gemm_fraction / 2,
        gemm_kernels={k: (row[0] / 2, *row[1:]) for k, row in eff.gemm_kernels.items()}))
    path = SAMPLE / "h100-sxm__vllm.csv.gz"
    good = gate.file_medians(path, hw)
    assert not gate.failures({k: FIGURES["sample"][k] for k in good}, good)
    bad = gate.failures({k: FIGURES["sample"][k] for k in good}, gate.file_medians(path, worse))
    assert any(line.startswith("h100-sxm vllm gemm:") for line in bad), bad
