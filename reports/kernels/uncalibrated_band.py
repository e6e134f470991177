"""The 80% band of a device nobody has calibrated: how far the datasheet-era constants of the
calibrated NVIDIA files were from the measured kernels before calibration.

A device with no kernel measurements of its own, and no family with any (AMD, TPU,
Trainium, Gaudi), is priced with datasheet figures and assumed efficiencies, just as the
NVIDIA files were before ``perfmodel calibrate --from aiconfigurator`` replaced theirs. Their
residuals then (reports/kernels/before/errors.csv: per device x engine x class x regime, the
row count and the 90th percentile of |error|) measure what such constants get wrong. Per
error class the band's half-width ``P`` is the row-weighted median over those groups of the
90th percentile of |error|, taken symmetric in log time: ``error_q90 = P``,
``error_q10 = 1 / (1 + P) - 1``. The shipped files' ``uncertainty:`` blocks with
``source: "uncalibrated, ..."`` hold what this prints (tests/test_new_devices.py checks).

    PYTHONPATH=. python reports/kernels/uncalibrated_band.py
"""

from __future__ import annotations

import csv
from pathlib import Path

HERE = Path(__file__).resolve().parent
ERRORS = HERE / "before" / "errors.csv"
ENGINES = ("vllm", "sglang", "trtllm", "nccl")   # aiconfigurator-core's measured kernels
SOURCE = ("uncalibrated, datasheet-constant residuals of the NVIDIA files before calibration "
          "(reports/kernels/uncalibrated_band.py)")


def weighted_median(values: list[float], weights: list[float]) -> float:
    pairs = sorted(zip(values, weights, strict=True))
    half, seen = sum(weights) / 2.0, 0.0
    for value, weight in pairs:
        seen += weight
        if seen >= half:
            return value
    return pairs[-1][0]


def band(path: Path = ERRORS) -> dict[str, dict[str, float]]:
    """{"error_q10": {class: q10}, "error_q90": {class: q90}} from the 'before' residuals."""
    groups: dict[str, tuple[list[float], list[float]]] = {}
    with path.open(newline="") as f:
        for row in csv.DictReader(f):
            if row["engine"] in ENGINES:
                values, weights = groups.setdefault(row["error_class"], ([], []))
                values.append(float(row["p90_abs_error"]))
                weights.append(float(row["n"]))
    half = {c: round(weighted_median(*vw), 3) for c, vw in sorted(groups.items())}
    return {"error_q10": {c: round(1.0 / (1.0 + p) - 1.0, 3) for c, p in half.items()},
            "error_q90": half}


def main() -> None:
    out = band()
    print("uncertainty:")
    print(f'  source: "{SOURCE}"')
    for key in ("error_q10", "error_q90"):
        print(f"  {key}: {{{', '.join(f'{c}: {v}' for c, v in out[key].items())}}}")


if __name__ == "__main__":
    main()
