"""Fit the linear-attention scan kernels' constants (``cost.scan_kernels``,
``efficiency.scan_kernels``) of shipped devices per engine on aiconfigurator's GDN / KDA
rows (``kernels.aic_linear``) and write them into the hardware files (no torch).

Per device x engine x call class (``specs.dtypes.SCAN_CLASSES``), the rows of the newest
engine version, priced by the model's own ``LinearScan`` record (``compare.forms``
``scan_parts``) and rule: ``gemm_fraction``, ``memory_fraction``, ``latency_s`` and
``step_s`` (``BOUNDS``) by bounded least squares on log(predicted / measured) (scipy,
soft-L1); ``launches`` and ``state_columns`` are the kernels' source's
(``scan_kernels.yaml``). Held out: 5 folds by head layout (value heads, q/k heads,
head dims); leave one device out: the device's family peers among the listed devices
fitted together predict it.

    perfmodel kernels import aiconfigurator --out /tmp/corpus --device h200-sxm ...
    python -m validate.corpus.scan --from /tmp/corpus -H h100-sxm -H h200-sxm -H b200 \
        -H b300 -H gb200 --report reports/kernels/linattn [--write-hardware] [--reuse]
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import yaml

from perfmodel.compare.rows import records
from perfmodel.cost.roofline import op_time
from perfmodel.cost.scan_kernels import call_class
from perfmodel.kernels.compare import device_for
from perfmodel.kernels.corpus import read_file
from perfmodel.specs.dtypes import SCAN_CLASSES
from perfmodel.specs.hardware import Hardware
from validate.corpus import write as kw
from validate.corpus.calibrate import family_of
from validate.corpus.rows import newest
from validate.corpus.sets import fold_of

COMMAND = ("python -m validate.corpus.scan --from <corpus> -H h100-sxm -H h200-sxm -H b200 "
           "-H b300 -H gb200 --write-hardware")
SOURCES = yaml.safe_load((Path(__file__).parent / "scan_kernels.yaml").read_text())
ENGINES = tuple(SOURCES["engines"])
# fitted field -> (lower, upper, start, why that range)
BOUNDS = {
    "gemm_fraction": (0.01, 0.95, 0.05, "the scan's matmuls (64 x 64 x 128 chunk tiles, "
                                       "fp32 accumulation), share of the dtype's peak"),
    "memory_fraction": (0.05, 0.98, 0.5, "its streaming of tokens, intermediates and "
                                         "state, share of HBM peak"),
    "latency_s": (0.5e-6, 30e-6, 3e-6, "fixed cost of one launch (ramp, tail, metadata)"),
    "step_s": (1e-9, 30e-6, 1e-6, "one serial step of the state recurrence (a chunk's "
                                  "dependent matmuls and loads, or a token's)"),
}
FITTED = tuple(BOUNDS)
MAX_ROWS = 1500


class Rows:
    """One class's rows of a device x engine: the record, measured seconds, folds."""

    def __init__(self, rows: list[dict]):
        self.rows = rows
        (_, self.op), = records(rows, "corpus")
        self.measured = np.array([float(r["measured_s"]) for r in rows])
        num = {k: np.array([float(r.get(k) or 0) for r in rows])
               for k in ("n_heads", "n_kv_heads", "head_dim", "v_dim")}
        self.fold = fold_of(*num.values())

    def take(self, index: np.ndarray) -> Rows:
        return Rows([self.rows[i] for i in index])

    def errors(self, hw: Hardware) -> np.ndarray:
        return op_time(self.op, hw, "kernel").time_s / self.measured - 1.0


def load(folder: str, device: str, engine: str) -> dict[str, Rows]:
    """Call class -> rows of ``device`` x ``engine`` (newest version of each table)."""
    path = Path(folder) / f"{device}__{engine}.csv.gz"
    if not path.is_file():
        return {}
    df = read_file(path)
    df = df[(df["op"] == "linear_attention")].reset_index(drop=True)
    if not len(df):
        return {}
    df = newest(df).reset_index(drop=True)
    rows = df.to_dict("records")
    cls = np.ravel(call_class(Rows(rows).op))
    return {SCAN_CLASSES[c]: _sample(Rows([rows[i] for i in np.flatnonzero(cls == c)]))
            for c in sorted(set(cls))}


def _sample(r: Rows) -> Rows:
    if len(r.rows) <= MAX_ROWS:
        return r
    return r.take(np.sort(np.random.default_rng(0).choice(len(r.rows), MAX_ROWS, False)))


def with_class(hw: Hardware, engine: str, cls: str, values: dict[str, float]) -> Hardware:
    """``hw`` with class ``cls``'s figures: ``values`` and the engine's source figures."""
    src = SOURCES["engines"][engine][cls]
    row = (*(values[f] for f in FITTED), float(src["launches"]), float(src["state_columns"]))
    table = dict(hw.efficiency.scan_kernels) | {cls: row}
    return replace(hw, efficiency=replace(hw.efficiency, scan_kernels=table))


def fit(devices: list[tuple[Hardware, Rows]], engine: str, cls: str) -> dict[str, float]:
    """One class's fitted figures shared by ``devices`` (each priced on its own hardware)."""
    from scipy.optimize import least_squares

    def residuals(x: np.ndarray) -> np.ndarray:
        values = dict(zip(FITTED, np.exp(x), strict=True))
        return np.concatenate([np.log1p(r.errors(with_class(hw, engine, cls, values)))
                               for hw, r in devices])

    x0 = np.log([BOUNDS[f][2] for f in FITTED])
    lo, hi = np.log([BOUNDS[f][0] for f in FITTED]), np.log([BOUNDS[f][1] for f in FITTED])
    sol = least_squares(residuals, x0, bounds=(lo, hi), loss="soft_l1", f_scale=0.05,
                        diff_step=1e-3, max_nfev=60)
    return {f: float(math.exp(v)) for f, v in zip(FITTED, sol.x, strict=True)}


def held_out(hw: Hardware, r: Rows, engine: str, cls: str) -> np.ndarray:
    """Each row's error predicted by the fit made without its fold."""
    out = np.full(len(r.rows), np.nan)
    for f in sorted(set(r.fold)):
        test, train = np.flatnonzero(r.fold == f), np.flatnonzero(r.fold != f)
        if not len(train):
            continue
        values = fit([(hw, r.take(train))], engine, cls)
        out[test] = r.take(test).errors(with_class(hw, engine, cls, values))
    return out[np.isfinite(out)]


def stats(e: np.ndarray) -> dict[str, float]:
    return {"n": len(e), "median_abs": float(np.median(np.abs(e))) if len(e) else math.nan,
            "bias": float(np.median(e)) if len(e) else math.nan}


def calibrate(folder: str, names: list[str], engines: tuple[str, ...]) -> list[dict]:
    """One entry per device x engine x class: before, fitted values, held-out, LODO."""
    out = []
    for engine in engines:
        data = {n: load(folder, n, engine) for n in names}
        for name in names:
            hw = device_for(name, engine, {})
            for cls, r in data[name].items():
                if cls not in SOURCES["engines"][engine]:
                    continue
                values = fit([(hw, r)], engine, cls)
                peers = [(device_for(p, engine, {}), data[p][cls]) for p in names
                         if p != name and cls in data[p] and family_of(p) == family_of(name)]
                lodo = None
                if peers:
                    shared = fit(peers, engine, cls)
                    lodo = stats(r.errors(with_class(hw, engine, cls, shared)))
                out.append({"device": name, "engine": engine, "class": cls,
                            "before": stats(r.errors(hw)), "values": values,
                            "held": stats(held_out(hw, r, engine, cls)), "lodo": lodo,
                            "after": stats(r.errors(with_class(hw, engine, cls, values)))})
                print(f"{name} {engine} {cls}: {out[-1]['before']['median_abs']:.1%} -> "
                      f"held-out {out[-1]['held']['median_abs']:.1%}", flush=True)
    return out


def table(results: list[dict]) -> str:
    lines = ["| device | engine | class | rows | before | in-sample | held-out | held-out bias "
             "| leave-one-device-out |", "|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for x in results:
        lodo = f"{x['lodo']['median_abs']:.1%}" if x["lodo"] else "-"
        lines.append(f"| {x['device']} | {x['engine']} | {x['class']} | {x['before']['n']} | "
                     f"{x['before']['median_abs']:.1%} | {x['after']['median_abs']:.1%} | "
                     f"{x['held']['median_abs']:.1%} | {x['held']['bias']:+.1%} | {lodo} |")
    return "\n".join(lines)


def entries(results: list[dict], name: str, engine: str) -> dict[str, dict]:
    """The ``scan_kernels`` mapping of ``name`` x ``engine``."""
    out = {}
    for x in results:
        if x["device"] == name and x["engine"] == engine:
            src = SOURCES["engines"][engine][x["class"]]
            v = x["values"]
            out[x["class"]] = {"gemm_fraction": round(v["gemm_fraction"], 4),
                               "memory_fraction": round(v["memory_fraction"], 4),
                               "latency_s": float(f"{v['latency_s']:.4g}"),
                               "step_s": float(f"{v['step_s']:.4g}"),
                               "launches": src["launches"],
                               "state_columns": src["state_columns"]}
    return out


def hardware_text(text: str, results: list[dict], name: str) -> str:
    """A shipped hardware YAML with each engine's ``scan_kernels`` (top-level efficiency
    for vLLM, the engine the file describes; ``engines.<engine>.efficiency`` else),
    written as text into the block so the file's other lines and comments stay."""
    lines = text.splitlines(keepends=True)
    for engine in ENGINES:
        table_ = entries(results, name, engine)
        if not table_:
            continue
        flow = {c: yaml.safe_dump(v, default_flow_style=True, width=10**6,
                                  sort_keys=False).strip() for c, v in table_.items()}
        at = _efficiency_line(lines, None if engine == "vllm" else engine)
        if at is None:
            continue
        indent = len(lines[at]) - len(lines[at].lstrip()) + 2
        lines = _without(lines, at, indent)
        block = [" " * indent + "scan_kernels:\n"] + [
            " " * (indent + 2) + f"{c}: {v}\n" for c, v in flow.items()]
        lines = lines[:at + 1] + block + lines[at + 1:]
    return "".join(lines)


def _efficiency_line(lines: list[str], engine: str | None) -> int | None:
    """The index of the ``efficiency:`` line of the top level (``engine`` None) or of
    ``engines.<engine>``; None where the file has none."""
    if engine is None:
        return next((i for i, x in enumerate(lines) if x.rstrip() == "efficiency:"), None)
    top = next((i for i, x in enumerate(lines) if x.rstrip() == "engines:"), None)
    if top is None:
        return None
    mine = next((i for i in range(top + 1, len(lines))
                 if lines[i].rstrip() == f"  {engine}:"), None)
    if mine is None:
        return None
    for i in range(mine + 1, len(lines)):
        if lines[i].strip() and len(lines[i]) - len(lines[i].lstrip()) <= 2:
            return None
        if lines[i].rstrip() == "    efficiency:":
            return i
    return None


def _without(lines: list[str], at: int, indent: int) -> list[str]:
    """``lines`` without a ``scan_kernels`` entry of the block whose header is line ``at``."""
    out, i = lines[:at + 1], at + 1
    while i < len(lines):
        x = lines[i]
        depth = len(x) - len(x.lstrip())
        if x.strip() and depth < indent:
            break
        if depth == indent and x.lstrip().startswith("scan_kernels:"):
            i += 1
            while i < len(lines) and (not lines[i].strip()
                                      or len(lines[i]) - len(lines[i].lstrip()) > indent):
                i += 1
            continue
        out.append(x)
        i += 1
    return out + lines[i:]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--from", dest="source", required=True)
    p.add_argument("-H", "--hardware", action="append", required=True)
    p.add_argument("--engine", action="append", choices=ENGINES)
    p.add_argument("--report", default="reports/kernels/linattn")
    p.add_argument("--write-hardware", action="store_true")
    p.add_argument("--reuse", action="store_true",
                   help="write from the report folder's calibration.json, no fit")
    a = p.parse_args(argv)
    report = Path(a.report)
    report.mkdir(parents=True, exist_ok=True)
    saved = report / "calibration.json"
    if a.reuse:
        results = json.loads(saved.read_text())
    else:
        results = calibrate(a.source, a.hardware, tuple(a.engine or ENGINES))
        saved.write_text(json.dumps(results, indent=1) + "\n")
    (report / "calibration.md").write_text(
        "# Linear-attention scan kernels: per device x engine x call class\n\n"
        f"Regenerate: `{COMMAND}`\n\nMedian |predicted/measured - 1| of the collector's "
        "GDN / KDA scan calls: before (the shipped file), in-sample, held out (5 folds by "
        "head layout), held-out signed median, leave one device out.\n\n"
        + table(results) + "\n")
    if a.write_hardware:
        for name in a.hardware:
            path = kw.shipped_path(name)
            path.write_text(hardware_text(path.read_text(), results, name))
            print(f"wrote {path}")


if __name__ == "__main__":
    main()
