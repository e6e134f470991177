"""Fit one attention backend's profile (cost/attention_kernels.py) to its corpus rows.

    PYTHONPATH=. python reports/kernels/sglattn/fit.py CORPUS DEVICE ENGINE KERNEL \
        [--params a,b,...] [--lodo OTHER_DEVICE] [--sample N]

CORPUS: a folder ``perfmodel kernels import aiconfigurator`` wrote. The rows: the context
and generation attention tables (MLA's are another class) of KERNEL, at most N per
table x dtype x cache dtype (seeded). Bounded least squares (scipy, soft-L1) on
log(predicted / measured), each table weighted equally; held out: 5 folds by shape family
(heads x KV heads x head_dim), deterministic. ``--lodo``: the same profile fitted on
OTHER_DEVICE's rows, scored on DEVICE's. Prints the profile (YAML) and the figures.
Kernel rows only: never end-to-end figures.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace

import numpy as np
import pandas as pd
from scipy.optimize import least_squares

from perfmodel.compare.errors import predict_rows
from perfmodel.cost.attention_kernels import laid
from perfmodel.kernels.compare import device_for, usable
from perfmodel.kernels.corpus import read_file

# parameter -> (lower, upper, start): the physical ranges of validate/corpus/fit.py
BOUNDS = {"attention_fraction": (0.3, 0.95, 0.7), "attention_program_keys": (1.0, 4096.0, 200.0),
          "attention_head_dim_half": (1.0, 512.0, 64.0), "memory_fraction": (0.6, 0.98, 0.8),
          "latency_s": (0.5e-6, 30e-6, 5e-6)}
TABLES = ("context_attention_perf", "generation_attention_perf")
LOG = ("attention_program_keys", "attention_head_dim_half", "latency_s")


def rows(corpus: str, device: str, engine: str, kernel: str, sample: int,
         q_cast: bool = False) -> pd.DataFrame:
    """KERNEL's rows (``<kernel>@fp8``: those that compute in FP8, the query FP8 or, with
    ``q_cast``, the cache; else the others)."""
    df = read_file(f"{corpus}/{device}__{engine}.csv.gz")
    name, _, fp8 = kernel.partition("@")
    df = df[df["table"].isin(TABLES) & (df["kernel"] == name)]
    computes = (df["dtype"] == "fp8") | (q_cast & (df["kv_dtype"] == "fp8"))
    df = df[computes == bool(fp8)]
    df = df[usable(df)[0]]
    top = max(df["engine_version"].astype(str), key=lambda v: [int(p) if p.isdigit() else -1
                                                              for p in v.split(".")])
    df = df[df["engine_version"].astype(str) == top]
    parts = [g.sample(min(sample, len(g)), random_state=0)
             for _, g in df.groupby(["table", "dtype", "kv_dtype"])]
    out = pd.concat(parts).reset_index(drop=True)
    family = out["n_heads"].astype(str) + "x" + out["n_kv_heads"].astype(str) + "x" \
        + out["head_dim"].astype(str)
    names = sorted(set(family))
    out["fold"] = family.map({n: i % 5 for i, n in enumerate(names)})
    return out


def view(hw, kernel: str, profile: dict):
    return replace(hw, efficiency=laid(hw.efficiency, profile, kernel))


def errors(df: pd.DataFrame, hw) -> np.ndarray:
    out = predict_rows(df.to_dict("records"), hw, timing="auto", where="corpus")
    return np.array([r["predicted_s"] for r in out]) / df["measured_s"].to_numpy(float) - 1


def fit(df: pd.DataFrame, hw, kernel: str, params: list[str], fixed: dict) -> dict:
    weight = 1.0 / np.sqrt(df.groupby("table")["table"].transform("size").to_numpy(float))

    def unpack(x):
        return fixed | {p: float(np.exp(v) if p in LOG else v) for p, v in zip(params, x,
                                                                                   strict=True)}

    def lo_hi(i):
        b = BOUNDS[params[i]]
        return (np.log(b[0]), np.log(b[1])) if params[i] in LOG else b[:2]

    x0 = [np.log(fixed.get(p, BOUNDS[p][2])) if p in LOG else fixed.get(p, BOUNDS[p][2])
          for p in params]
    lo, hi = zip(*(lo_hi(i) for i in range(len(params))), strict=True)
    x0 = np.clip(x0, np.array(lo) + 1e-9, np.array(hi) - 1e-9)
    res = least_squares(lambda x: weight * np.log1p(errors(df, view(hw, kernel, unpack(x)))),
                        x0, bounds=(lo, hi), loss="soft_l1", f_scale=0.1, diff_step=1e-3,
                        max_nfev=60)
    return unpack(res.x)


def summary(df: pd.DataFrame, err: np.ndarray) -> str:
    d = df.assign(e=err)
    g = d.groupby(["table", "dtype", "kv_dtype"])["e"]
    t = d.groupby("table")["e"]
    lines = [f"  {k}: |e| {v.abs().median():.1%} bias {v.median():+.1%} (n {len(v)})"
             for k, v in g]
    lines += [f"  {k}: |e| {v.abs().median():.1%} bias {v.median():+.1%}" for k, v in t]
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser()
    for name in ("corpus", "device", "engine", "kernel"):
        ap.add_argument(name)
    ap.add_argument("--params", default=",".join(BOUNDS))
    ap.add_argument("--fixed", default="", help="k=v,... held at that value")
    ap.add_argument("--lodo", default="")
    ap.add_argument("--bounds", default="", help="k=lo:hi,... a kernel's own physical range "
                    "where it differs from FlashAttention's")
    ap.add_argument("--sample", type=int, default=300)
    ap.add_argument("--no-folds", action="store_true")
    ap.add_argument("--q-cast", action="store_true", help="the backend casts Q to an FP8 cache")
    a = ap.parse_args(argv)
    params = [p for p in a.params.split(",") if p]
    fixed = {k: float(v) for k, v in (kv.split("=") for kv in a.fixed.split(",") if kv)}
    for k, lo_hi in (kv.split("=") for kv in a.bounds.split(",") if kv):
        lo, hi = (float(x) for x in lo_hi.split(":"))
        BOUNDS[k] = (lo, hi, min(max(BOUNDS[k][2], lo), hi))
    hw = device_for(a.device, a.engine, {})
    df = rows(a.corpus, a.device, a.engine, a.kernel, a.sample, a.q_cast)
    base = {p: v for p, v in hw.efficiency.attention_kernels.get(a.kernel, {}).items()
            if p not in params} | fixed
    print(f"{a.device} {a.engine} {a.kernel}: {len(df)} rows")
    print("before:\n" + summary(df, errors(df, view(hw, a.kernel, base))))
    full = fit(df, hw, a.kernel, params, base)
    print("profile: {" + ", ".join(f"{k}: {v:.4g}" for k, v in full.items()) + "}")
    print("in-sample:\n" + summary(df, errors(df, view(hw, a.kernel, full))))
    if not a.no_folds:
        held = np.zeros(len(df))
        for k in range(5):
            test = (df["fold"] == k).to_numpy()
            if test.any():
                p = fit(df[~test], hw, a.kernel, params, base)
                held[test] = errors(df[test], view(hw, a.kernel, p))
        print("held out (5 folds by shape family):\n" + summary(df, held))
    if a.lodo:
        other = rows(a.corpus, a.lodo, a.engine, a.kernel, a.sample, a.q_cast)
        p = fit(other, device_for(a.lodo, a.engine, {}), a.kernel, params, base)
        print(f"leave one device out (fitted on {a.lodo}):\n"
              + summary(df, errors(df, view(hw, a.kernel, p))))


if __name__ == "__main__":
    main(sys.argv[1:])
