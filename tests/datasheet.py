"""The calibrated devices as they shipped before ``perfmodel calibrate --from`` wrote vLLM's
fitted constants into them (tests/data/datasheet/: the files at 6bdb01e, datasheet and
cited efficiency defaults). Hand-derived goldens of the cost formulas and the old core's
snapshot are priced on these, so each derivation stays true to the constants it names;
tests/test_calibrated_goldens.py derives goldens on the shipped, calibrated files. mi300x.yaml
is the file before its gemm_fraction was fitted to AMD's published GEMM figures
(reports/amd_published/)."""

from __future__ import annotations

from pathlib import Path

import perfmodel as pm
from perfmodel.specs.load import HARDWARE_DIR

FOLDER = Path(__file__).parent / "data" / "datasheet"


def datasheet_path(name: str) -> Path:
    """The datasheet file of ``name`` (the shipped one for an uncalibrated device)."""
    path = FOLDER / f"{name}.yaml"
    return path if path.exists() else HARDWARE_DIR / f"{name}.yaml"


def datasheet(name: str) -> pm.Hardware:
    """``name`` with its datasheet efficiency (see the module docstring)."""
    return pm.load_hardware(datasheet_path(name))
