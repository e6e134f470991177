"""SGLang on MI300X / MI355X from AITER's own kernel timings (``aiter.csv``), held out.

SGLang on ROCm runs AITER (``SGLANG_USE_AITER=1``, ``--attention-backend aiter``): its
fp8 block-scaled linears are ``aiter.gemm_a8w8_blockscale`` (CK), its fused MoE is
``aiter.fused_moe`` (CK / assembly, two stages), its MLA decode ``aiter.mla_decode_fwd``
(assembly). ``aiter.csv`` (``extract_aiter.py``, SOURCES.md) holds what AITER's tuners
measured for those kernels, per device, plus ROCm/aiter PR 2039's MLA decode table. One
constant set per device and kernel class is fitted, in the device's ``engines.sglang``
block; the top-level (vLLM) figures stay:

- ``gemm``: ``gemm_kernels.fp8_block`` (the CK block-scale GEMM's best-shape share of the
  fp8 peak, its weight streaming share of HBM peak, its fixed cost);
- ``moe``: ``moe_kernels.fp8_block`` (``cost.moe``'s six constants of a fused-MoE class),
  shipped only where, held out, it beats the files' dense pricing (``ships``: MI355X);
- ``mla``: the decode kernel's MMA share ``attention_decode_fraction`` and the call's fixed
  cost ``kernel_latency_by_kind.attention``. The table's 128 heads are compute-bound (fp8
  KV, 128 x 2 x 1,088 FLOPs per 576-byte position), so it says nothing of the latent
  cache's streaming rate: that stays the device's ``memory_fraction`` (STREAM), and a
  16-head decode (TP8) is priced memory-bound from it, unmeasured. The query-row tile is
  structural, not fitted: the
  assembly kernels tile 16 query heads (``hsa/gfx942/mla/mla_asm.csv``: ``qh16`` kernels
  for 16 heads, ``qh64`` for 64, ``qh128_m32x4`` = 4 x 32 rows for 128), so a KV head's
  heads fill the tile (``attention_decode_tile_q_latent: 16``).

Bounded least squares on log(predicted / measured) (scipy ``least_squares``, soft-L1, as
``validate/corpus/fit.py``; its bounds, and for the MLA decode share 0.1-0.95: AITER's
MI300X fp8 MLA decode peaks at 367 TFLOP/s, 14% of the fp8 peak, ROCm/aiter PR 3188).
Constants are set through ``validate.corpus.params.apply``, the corpus fit's own constructor.
Held out: leave one model's table out (gemm, moe); MLA, one table: leave one context
length out. Leave one device out: each device predicted with the other's constants.

    PYTHONPATH=. python reports/amd_published/aiter_fit.py
"""

from __future__ import annotations

import math
import statistics
from dataclasses import replace
from pathlib import Path

import numpy as np

from perfmodel.compare.errors import predict_rows
from perfmodel.compare.rows import read_measurements
from perfmodel.specs.hardware import Hardware
from perfmodel.specs.load import hardware
from validate.corpus.params import PARAMETERS, START, apply

HERE = Path(__file__).resolve().parent
DEVICES = ("mi300x", "mi355x")
# the fit starts from the top-level figures (what SGLang was priced with before its block;
# the vLLM view), so a rerun reproduces the shipped values whatever the block holds
BASE_ENGINE = "vllm"
# the structural MLA decode tile (module docstring), set before the MLA fit
LATENT_TILE = 16
# CK's blockscale GEMM splits k where its tuner found it faster (the tuned configs' splitK
# column), so the tiling rule's split-K applies to its rows (``gemm_kernels_split_k``)
SPLIT_K = True
CLASSES = {
    "gemm": ("gemm", ("gemm.fp8_block.gemm_fraction", "gemm.fp8_block.memory_fraction",
                      "gemm.fp8_block.latency_s")),
    "moe": ("moe", tuple(f"moe.fp8_block.{n}" for n in (
        "gemm_fraction", "memory_fraction", "latency_s", "expert_latency_s",
        "programs_per_unit", "depth_s"))),
    "mla": ("attention", ("attention_decode_fraction", "kernel_latency_s.attention")),
}
# the classes whose constants the files carry: gemm and mla, and moe where its fit held out
# beats the files' dense pricing of the same rows (``ships``): MI355X 14.7% against 15.9%
# (at decode sizes, m <= 16: 9.2% against 14.4%); not MI300X, 17.1% against 9.4% (its one
# many-expert table, glm-5.1, held out stays -72% at one token: nothing else teaches it)
SHIPPED = ("gemm", "mla")
DECODE_TOKENS = 16
OWN = {"attention_decode_fraction": (0.1, 0.95, 0.3),
       "gemm.fp8_block.gemm_fraction": (0.1, 0.95, 0.5)}


def bounds(name: str) -> tuple[float, float, float]:
    """(lower, upper, start) of a fitted constant."""
    if name in OWN:
        return OWN[name]
    lo, hi, _ = PARAMETERS[name]
    return lo, hi, min(max(START[name], lo), hi)


def rows_of(device: str, cls: str) -> list[dict]:
    op = CLASSES[cls][0]
    return [r for r in read_measurements(HERE / "aiter.csv", devices=[device]) if r["op"] == op]


def structural(hw: Hardware) -> Hardware:
    """``hw`` with the MLA decode tile of AITER's assembly kernels and CK's split-K."""
    return replace(hw, efficiency=replace(hw.efficiency,
                                          attention_decode_tile_q_latent=LATENT_TILE,
                                          gemm_kernels_split_k=SPLIT_K))


def errors(rows: list[dict], hw: Hardware) -> np.ndarray:
    return np.array([r["error"] for r in predict_rows(rows, hw)])


def fit(rows: list[dict], hw: Hardware, names: tuple[str, ...]) -> dict[str, float]:
    """The constants ``names`` minimizing the robust log error of ``rows`` on ``hw``."""
    from scipy.optimize import least_squares

    lo, hi, x0 = (np.log([bounds(n)[i] for n in names]) for i in range(3))

    def residuals(x: np.ndarray) -> np.ndarray:
        trial = apply(hw, {n: float(math.exp(v)) for n, v in zip(names, x, strict=True)})
        return np.log1p(errors(rows, trial))

    sol = least_squares(residuals, x0, bounds=(lo, hi), loss="soft_l1", f_scale=0.05,
                        diff_step=1e-3, max_nfev=60)
    return {n: float(f"{math.exp(v):.4g}") for n, v in zip(names, sol.x, strict=True)}


def folds(rows: list[dict], cls: str) -> list[str]:
    key = "kv_len" if cls == "mla" else "model"
    return [str(r[key]) for r in rows]


def held_out(rows: list[dict], hw: Hardware, cls: str) -> np.ndarray:
    """Each row's error predicted by a fit without its fold."""
    names, labels = CLASSES[cls][1], folds(rows, cls)
    out = np.zeros(len(rows))
    for fold in sorted(set(labels)):
        inside = [i for i, lab in enumerate(labels) if lab == fold]
        train = [r for r, lab in zip(rows, labels, strict=True) if lab != fold]
        trial = apply(hw, fit(train, hw, names))
        out[inside] = errors([rows[i] for i in inside], trial)
    return out


def median_abs(e: np.ndarray) -> float:
    return round(float(statistics.median(np.abs(e))), 3) if len(e) else float("nan")


def ships(cls: str, summary: dict) -> bool:
    """Whether a device's file carries the class's constants (``SHIPPED``)."""
    return cls in SHIPPED or summary["held_out"] < summary["before"]


def device_fit(device: str) -> dict:
    """Per class: rows, fitted constants, median |error| before / fitted / held out."""
    base = hardware(device, BASE_ENGINE)
    hw, out = structural(base), {}
    for cls, (_, names) in CLASSES.items():
        rows = rows_of(device, cls)
        values = fit(rows, hw, names)
        before, kept = errors(rows, base), held_out(rows, hw, cls)
        small = np.array([int(r["m"] or 0) <= DECODE_TOKENS for r in rows]) if cls == "moe" \
            else np.zeros(len(rows), dtype=bool)
        out[cls] = {"rows": len(rows), "values": values, "before": median_abs(before),
                    "fit": median_abs(errors(rows, apply(hw, values))),
                    "held_out": median_abs(kept),
                    "decode_before": median_abs(before[small]),
                    "decode_held_out": median_abs(kept[small])}
    return out


def main() -> None:
    fits = {d: device_fit(d) for d in DEVICES}
    for device, other in zip(DEVICES, reversed(DEVICES), strict=True):
        hw = structural(hardware(device, BASE_ENGINE))
        for cls, s in fits[device].items():
            lodo = median_abs(errors(rows_of(device, cls), apply(hw, fits[other][cls]["values"])))
            print(f"{device} {cls}: {s['rows']} rows; median |error| before {s['before']:.1%}, "
                  f"fit {s['fit']:.1%}, held out {s['held_out']:.1%}, "
                  f"leave one device out ({other}'s constants) {lodo:.1%}")
            if cls == "moe":
                print(f"  at decode sizes (m <= {DECODE_TOKENS}): before {s['decode_before']:.1%}"
                      f", held out {s['decode_held_out']:.1%}")
            print(f"  {'shipped' if ships(cls, s) else 'not shipped'}: {s['values']}")


if __name__ == "__main__":
    main()
