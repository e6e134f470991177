"""gemm_fraction of the CDNA 3 files from AMD's published GEMM throughput, with held-out error.

The data (SOURCES.md names each figure's page, table and footnote):

- ``gemm.csv``: single-shape hipBLASLt GEMMs in the shared measurement schema
  (``measured_s = 2 m n k / published rate``): AMD's Max-Achievable FLOPs (MAF) for MI300X
  and MI325X (Feb 2025, trig_float inputs) and MI325X again (Sep 2026, normal inputs).
- ``gemm.csv`` also holds stas00/ml-engineering's Maximum Achievable Matmul FLOPS (torch
  matmul, the best of a shape search) for MI300X, MI325X and MI355X, bf16.
- ``aggregates.csv`` + ``taf_shapes.csv``: AMD's Typical Attained FLOPs (TAF) for MI325X,
  the FLOP-weighted harmonic mean over 10 fixed DeepSeek-V3 GEMM shapes; the model predicts
  it the same way, ``sum(F_i) / sum(predicted t_i)``.

One constant is fitted per device, ``efficiency.gemm_fraction`` (one for every dtype, as
the model has it), by least squares on log(predicted / measured) over its figures (a TAF
figure counts once), a bounded golden-section search in [0.3, 0.95]. Tiles, waves and the
k ramp stay structural (the files' ``gemm_tiles``). Held out: leave one source out (fit on
the other sources, predict this one's figures): MI300X AMD MAF-2025 and stas00's MAMF; MI325X
those two and AMD's MAF-2026 and TAF-2026. The MI355X has one figure: evaluated only (the
CDNA family rule's error), not fitted. Deterministic, a few hundred predictions:

    PYTHONPATH=. python reports/amd_published/fit.py
"""

from __future__ import annotations

import csv
import dataclasses
import math
import statistics
from pathlib import Path

from perfmodel.compare.errors import predict_rows
from perfmodel.compare.rows import read_measurements
from perfmodel.specs.hardware import Hardware
from perfmodel.specs.load import hardware

HERE = Path(__file__).resolve().parent
DEVICES = ("mi300x", "mi325x")
# one published figure, no held-out possible: evaluated, its constants left as they are
EVALUATED = ("mi355x",)
BOUNDS = (0.3, 0.95)


@dataclasses.dataclass(frozen=True)
class Figure:
    """One published figure: its rows (one, or a TAF's shapes) and its measured time."""

    device: str
    source: str
    dtype: str
    rows: tuple[dict, ...]
    measured_s: float


def figures(device: str) -> list[Figure]:
    """The device's published figures, single GEMMs first, then its TAF aggregates."""
    out = [Figure(device, r["source"], r["dtype"], (r,), float(r["measured_s"]))
           for r in read_measurements(HERE / "gemm.csv", devices=[device])]
    with (HERE / "taf_shapes.csv").open(newline="") as f:
        shapes = list(csv.DictReader(f))
    with (HERE / "aggregates.csv").open(newline="") as f:
        for agg in csv.DictReader(f):
            if agg["device"] != device:
                continue
            rows = tuple({"op": "gemm", "dtype": agg["dtype"], "m": s["m"], "n": s["n"],
                          "k": s["k"], "measured_s": "1"}
                         for s in shapes if s["shape_set"] == agg["shape_set"])
            flops = sum(2.0 * int(r["m"]) * int(r["n"]) * int(r["k"]) for r in rows)
            out.append(Figure(device, agg["source"], agg["dtype"], rows,
                              flops / (float(agg["published_tflops"]) * 1e12)))
    return out


def with_fraction(hw: Hardware, fraction: float) -> Hardware:
    return dataclasses.replace(hw, efficiency=dataclasses.replace(hw.efficiency,
                                                                  gemm_fraction=fraction))


def error(fig: Figure, hw: Hardware) -> float:
    """predicted / measured - 1 of one figure (a TAF's shapes summed)."""
    predicted = sum(r["predicted_s"] for r in predict_rows(fig.rows, hw))
    return predicted / fig.measured_s - 1.0


def fit(figs: list[Figure], hw: Hardware) -> float:
    """The gemm_fraction minimizing the squared log errors of ``figs`` (golden section)."""
    def loss(g: float) -> float:
        return sum(math.log1p(error(f, with_fraction(hw, g))) ** 2 for f in figs)

    lo, hi = BOUNDS
    ratio = (math.sqrt(5.0) - 1.0) / 2.0
    for _ in range(40):
        a, b = hi - ratio * (hi - lo), lo + ratio * (hi - lo)
        if loss(a) <= loss(b):
            hi = b
        else:
            lo = a
    return round((lo + hi) / 2.0, 4)


def held_out(device: str) -> list[tuple[str, Figure, float, float]]:
    """(fold, figure, fraction fitted without the fold, held-out error) per figure: folds
    are sources where the device has several, else dtypes."""
    hw, figs = hardware(device), figures(device)
    key = "source" if len({f.source for f in figs}) > 1 else "dtype"
    out = []
    for fold in sorted({getattr(f, key) for f in figs}):
        g = fit([f for f in figs if getattr(f, key) != fold], hw)
        out += [(fold, f, g, error(f, with_fraction(hw, g)))
                for f in figs if getattr(f, key) == fold]
    return out


def summary(device: str) -> dict:
    """The fit on every figure, and the held-out median |error| over the folds."""
    hw, figs = hardware(device), figures(device)
    g = fit(figs, hw)
    rows = held_out(device)
    return {"gemm_fraction": g, "figures": len(figs),
            "rows": sum(len(f.rows) for f in figs),
            "before_median_abs_error": round(statistics.median(
                abs(error(f, with_fraction(hw, BEFORE[device]))) for f in figs), 3),
            "fit_median_abs_error": round(statistics.median(
                abs(error(f, with_fraction(hw, g))) for f in figs), 3),
            "held_out_median_abs_error": round(statistics.median(abs(e) for *_, e in rows), 3),
            "held_out": rows}


# the files' gemm_fraction before this fit: the MI300X's 668 TFLOP/s best-shape figure of
# shared/reference/hardware-facts.md (51%), carried to the MI325X by the CDNA 3 family rule
BEFORE = {"mi300x": 0.51, "mi325x": 0.51}


def main() -> None:
    for device in EVALUATED:
        hw = hardware(device)
        for f in figures(device):
            print(f"{device}: not fitted (one figure); {f.source} {f.dtype} predicted at "
                  f"gemm_fraction {hw.efficiency.gemm_fraction}: error {error(f, hw):+.1%}")
    for device in DEVICES:
        s = summary(device)
        print(f"{device}: gemm_fraction {s['gemm_fraction']} from {s['figures']} figures "
              f"({s['rows']} GEMM shapes); median |error| before {s['before_median_abs_error']:.1%}"
              f", fit {s['fit_median_abs_error']:.1%}, held out "
              f"{s['held_out_median_abs_error']:.1%}")
        for fold, f, g, e in s["held_out"]:
            print(f"  held out {fold:>12}: {f.source} {f.dtype:>4} ({len(f.rows)} shapes) "
                  f"fitted without it {g:.4f}, error {e:+.1%}")


if __name__ == "__main__":
    main()
