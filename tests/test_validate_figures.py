"""validate.figures draws without touching matplotlib's process-wide backend."""

import matplotlib
import pandas as pd

import perfmodel as pm
from validate import figures

PNG = b"\x89PNG\r\n\x1a\n"


def _predictions() -> pd.DataFrame:
    return pd.DataFrame({
        "measured_s": [1e-5, 2e-4, 3e-3], "predicted_s": [1.2e-5, 1.8e-4, 3.3e-3],
        "error": [0.2, -0.1, 0.1], "op_class": ["gemm", "attention", "gemm"],
        "flops": [1e9, 5e9, 2e11], "bytes": [1e6, 1e8, 1e8],
        "intensity": [1e3, 50.0, 2e3], "dtype": ["fp16", "fp16", "fp16"]})


def test_figures_write_pngs_without_switching_the_backend(tmp_path, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("validate.figures switched the process-wide backend")

    monkeypatch.setattr(matplotlib, "use", refuse)
    df = _predictions()
    figures.predicted_vs_measured(df, tmp_path / "pvm.png")
    figures.error_by_class(df, tmp_path / "ebc.png", by="op_class")
    figures.roofline(df, pm.hardware("a100-80gb-sxm"), tmp_path / "roof.png")
    for name in ("pvm.png", "ebc.png", "roof.png"):
        assert (tmp_path / name).read_bytes()[:8] == PNG
