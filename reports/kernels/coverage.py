"""Measured coverage of the 80% uncertainty band (issue 25, item 5): does it hold about 80%?

    PYTHONPATH=. python reports/kernels/coverage.py [--corpus DIR] [--hardware FILE]
        [--max-rows 60000] [--serving DIR] [--no-serving] [--out reports/kernels/coverage.md]

(a) Held-out kernel rows. Each measurement file is predicted through ``perfmodel compare``'s
path (``compare.predict_rows``, each row timed as it was measured), error = predicted /
measured - 1, grouped by ``cost.error_class``. Rows are dealt to 5 folds by the CRC32 of
their shape (all repeats of a shape in one fold); each fold's rows are scored against the
10th-90th percentile band of the other four folds' errors. Files: the kernel corpus's
H100 vLLM and NCCL files (aiconfigurator-core 0.12.0, helper "corpus":
``--corpus``) and Vidur's A100 files (``../shared/measurements``), on the shipped hardware
files (no fitting here: the band of the shipped efficiencies).

(b) End to end. The band the H100 would carry: the ``uncertainty:`` block of ``--hardware``
when it has one (the calibrated band, helper "calib"), else the per-class 10th/90th
percentiles of all of (a)'s H100 rows, with the memory-bound class borrowed from Vidur's A100
rows (the corpus has no memory-bound kernels). With it: TorchAO's four H100 decode figures
(tests/test_torchao.py; tokens/s = 200 / E2E) and the measured vLLM serving runs
(``perfmodel compare-serving``'s replay; every run simulated three times: centre, every
step at its band's low edge, at its high edge, ``serving.bands``): is each run's measured
E2E, TTFT and ITL median inside the simulated band? The band is combined by ``cost.band``'s
rule (classes correlated within, independent across); for TorchAO the linear rule (classes
correlated too) is shown beside it. Nothing is fitted to the end-to-end figures.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
import zlib
from dataclasses import replace
from pathlib import Path

import numpy as np

import perfmodel as pm
from perfmodel.compare import drop_unsupported, predict_rows, read_measurements, shape_key
from perfmodel.compare.rows import records
from perfmodel.cost.band import band
from perfmodel.cost.error_class import error_class
from perfmodel.specs.errors import SpecError
from perfmodel.specs.uncertainty import ERROR_CLASSES, Uncertainty

ROOT = Path(__file__).resolve().parents[2]


def _first(*paths: Path) -> Path:
    return next((p for p in paths if p.exists()), paths[0])


# ../shared from the main checkout, ../../shared from a helper's worktree
SHARED = _first(ROOT.parent / "shared" / "measurements",
                ROOT.parent.parent / "shared" / "measurements")
CORPUS = _first(ROOT / "runs" / "corpus", ROOT.parent / "corpus" / "runs" / "corpus")
FOLDS = 5
SERVING_METRICS = (("E2E", "e2e_s"), ("TTFT", "ttft_s"), ("ITL", "itl_s"))


def residuals(path: Path, hw_name: str, max_rows: int) -> dict:
    """Errors, error classes and folds of the rows of ``path`` predicted on ``hw_name``
    (at most ``max_rows``, a seeded sample)."""
    rows, _ = drop_unsupported(read_measurements(path), str(path))
    if len(rows) > max_rows:
        pick = np.sort(np.random.default_rng(0).choice(len(rows), max_rows, replace=False))
        rows = [rows[i] for i in pick.tolist()]
    hw = pm.hardware(hw_name)
    out = predict_rows(rows, hw, timing="auto", where=str(path))
    classes = np.empty(len(rows), dtype=object)
    for index, op in records(rows, str(path)):
        classes[index] = error_class(op)
    folds = np.array([zlib.crc32(f"{shape_key(r)} tp={r.get('tp', '')}".encode()) % FOLDS
                      for r in rows])
    return {"name": path.name, "device": hw_name, "error": np.array([r["error"] for r in out]),
            "cls": classes.astype(str), "fold": folds,
            "dtype": np.array([r.get("dtype") or "bf16" for r in rows])}


def held_out(res: dict) -> dict[str, tuple[int, float, float, float]]:
    """Per class: (rows, q10, q90 over all rows, share of held-out rows inside the band of
    the other folds)."""
    out = {}
    for c in ERROR_CLASSES:
        mask = res["cls"] == c
        if mask.sum() < 2 * FOLDS:
            continue
        e, f = res["error"][mask], res["fold"][mask]
        inside = []
        for k in range(FOLDS):
            train, test = e[f != k], e[f == k]
            if len(train) and len(test):
                q10, q90 = np.quantile(train, [0.1, 0.9])
                inside.append((test >= q10) & (test <= q90))
        if not inside:          # every row of the class in one fold: nothing held out
            continue
        hits = np.concatenate(inside)
        q10, q90 = np.quantile(e, [0.1, 0.9])
        out[c] = (int(mask.sum()), float(q10), float(q90), float(hits.mean()))
    return out


def derived_band(results: list[dict], memory_from: dict | None) -> Uncertainty:
    """Per class q10/q90 over the bf16 rows of ``results`` (one device; bf16: the dtype every
    end-to-end figure here ran at); ``memory`` borrowed from ``memory_from`` where the device
    has none."""
    bf16 = np.concatenate([r["dtype"] == "bf16" for r in results])
    e = np.concatenate([r["error"] for r in results])[bf16]
    cls = np.concatenate([r["cls"] for r in results])[bf16]
    q10, q90 = {}, {}
    for c in ERROR_CLASSES:
        pool = e[cls == c]
        if c == "memory" and len(pool) < 2 * FOLDS and memory_from is not None:
            pool = memory_from["error"][memory_from["cls"] == c]
        if len(pool) >= 2 * FOLDS:
            q10[c], q90[c] = (float(x) for x in np.quantile(pool, [0.1, 0.9]))
    return Uncertainty("residuals of the shipped hardware file's bf16 kernels (coverage.py)",
                       q10, q90)


def torchao(unc: Uncertainty) -> list[tuple[str, float, float, float, float, float, float]]:
    """(weights, measured tok/s, centre, low, high by quadrature, low, high by linear)."""
    spec = importlib.util.spec_from_file_location("test_torchao",
                                                  ROOT / "tests" / "test_torchao.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    hw = replace(pm.hardware("h100-sxm-meta"), uncertainty=unc)
    model = pm.model("llama-3-8b")
    out = []
    for weights, measured in mod.TORCHAO.items():
        es = pm.estimate_many(hw, model, pm.Workloads.from_list([mod._workload(weights)]))
        per = sum(p.class_seconds() for p in es.phases)
        rate = [200.0 / float(es.e2e_s[0])]
        for rule in ("quadrature", "linear"):
            lo, hi = band(per, unc, rule)
            rate += [200.0 / float(hi[0]), 200.0 / float(lo[0])]
        out.append((weights, measured, *rate))
    return out


def serving(folder: Path, unc: Uncertainty) -> list[dict]:
    """Each replayable run: measured and simulated (centre, low, high) medians."""
    from perfmodel.compare.serving import load_runs
    from perfmodel.serving.bands import banded_summary
    from perfmodel.serving.simulate import simulate

    runs = load_runs(folder / "experiments.csv", folder / "requests.csv")
    out = []
    for run in runs:
        if run.skip:
            continue
        model = pm.model(run.model)
        hw = replace(pm.hardware(run.hardware), uncertainty=unc)
        sims = [simulate(model, hw, run.requests, run.plan, run.engine, label=run.id,
                         edge=edge).summary() for edge in (None, 0, 1)]
        s = banded_summary(*sims, "")
        row = {"id": run.id, "hardware": run.hardware}
        for _, key in SERVING_METRICS:
            m = run.measured.get(key, {}).get("p50")
            if m is not None:
                row[key] = (m, s[key]["p50"], s[key]["p50_low"], s[key]["p50_high"])
        out.append(row)
        print(f"  {run.id}", file=sys.stderr)
    return out


def _pct(x: float) -> str:
    return f"{x:+.1%}"


def report(kernels: list[dict], skipped: list[str], unc: Uncertainty, own: bool, tao: list,
           runs: list[dict], command: str, seconds: float) -> str:
    lines = ["# Coverage of the 80% uncertainty band", "", "Written by", "", "```bash",
             command, "```", "", f"({seconds:.0f} s on the shared two-core machine.) "
             "Error = predicted / measured - 1; a band holds a measurement when its error "
             "lies in [q10, q90] (the measured time in [t / (1 + q90), t / (1 + q10)]).", "",
             "## (a) Held-out kernel rows, 5 folds by shape", "",
             "Each fold scored against the band of the other four; shipped hardware files, "
             "no fitting (the band of the shipped efficiencies, not of a calibration).", "",
             "| file | device | class | rows | q10 | q90 | held-out coverage |",
             "|---|---|---|---|---|---|---|"]
    total = [0, 0.0]
    for res in kernels:
        for c, (n, q10, q90, cov) in held_out(res).items():
            lines.append(f"| {res['name']} | {res['device']} | {c} | {n:,} | {_pct(q10)} | "
                         f"{_pct(q90)} | {cov:.1%} |")
            total[0] += n
            total[1] += n * cov
    if total[0]:
        lines += ["", f"All rows: held-out coverage {total[1] / total[0]:.1%} "
                      f"over {total[0]:,} rows (nominal 80%)."]
    lines += [f"- not scored: {s} (``compare`` has no row form for these ops)" for s in skipped]
    which = ("the calibrated band of --hardware" if own else
             "derived here from (a)'s bf16 H100 rows on the shipped h100-sxm.yaml (no "
             "calibrated band merged yet); memory-bound class borrowed from Vidur's A100 rows")
    lines += ["", "## (b) End to end", "", f"Band used: {which}:", "",
              "| class | q10 | q90 |", "|---|---|---|"]
    lines += [f"| {c} | {_pct(unc.q10[c])} | {_pct(unc.q90[c])} |" for c in unc.q10]
    lines += ["", "Classes not listed count as exact.", "",
              "### TorchAO H100 decode (tests/test_torchao.py, h100-sxm-meta)", "",
              "| weights | measured tok/s | predicted | 80% band (quadrature) | inside | "
              "linear rule | inside |", "|---|---|---|---|---|---|---|"]
    hit = {"quadrature": 0, "linear": 0}
    for w, m, c, lo, hi, llo, lhi in tao:
        a, b = lo <= m <= hi, llo <= m <= lhi
        hit["quadrature"] += a
        hit["linear"] += b
        lines.append(f"| {w} | {m:.1f} | {c:.1f} | {lo:.1f}-{hi:.1f} | {'yes' if a else 'no'} "
                     f"| {llo:.1f}-{lhi:.1f} | {'yes' if b else 'no'} |")
    lines += ["", f"Inside: {hit['quadrature']} of {len(tao)} (quadrature), {hit['linear']} of "
                  f"{len(tao)} (linear)."]
    if runs:
        lines += ["", "### Measured vLLM serving runs (medians per run)", "",
                  "| run | " + " | ".join(f"{n} measured | {n} band | in" for n, _ in
                                         SERVING_METRICS) + " |",
                  "|---|" + "---|---|---|" * len(SERVING_METRICS)]
        counts = {}
        for r in runs:
            cells = [r["id"]]
            for name, key in SERVING_METRICS:
                if key not in r:
                    cells += ["", "", ""]
                    continue
                m, _c, lo, hi = r[key]
                inside = lo <= m <= hi
                group = r["id"].split("/")[0]
                got = counts.setdefault((group, name), [0, 0])
                got[0] += inside
                got[1] += 1
                cells += [f"{m * 1e3:.1f} ms", f"{lo * 1e3:.1f}-{hi * 1e3:.1f}",
                          "yes" if inside else "no"]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
        for (group, name), (k, n) in counts.items():
            lines.append(f"- {group} {name} median inside the band: {k} of {n} ({k / n:.0%})")
        lines.append("- runs on devices other than the H100 (lss/) carry the H100 band "
                     "borrowed (no kernel measurements of those GPUs)")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", type=Path, default=CORPUS)
    ap.add_argument("--hardware", type=Path, default=None,
                    help="an H100 hardware YAML whose uncertainty: block to use in (b)")
    ap.add_argument("--max-rows", type=int, default=60_000)
    ap.add_argument("--serving", type=Path, default=SHARED / "serving")
    ap.add_argument("--no-serving", action="store_true")
    ap.add_argument("--out", type=Path, default=Path(__file__).with_name("coverage.md"))
    args = ap.parse_args()
    start = time.perf_counter()
    sources = [(args.corpus / "h100-sxm__vllm.csv.gz", "h100-sxm"),
               (args.corpus / "h100-sxm__nccl.csv.gz", "h100-sxm"),
               (SHARED / "vidur-a100-layers.csv", "a100-80gb-sxm"),
               (SHARED / "vidur-a100-attention.csv", "a100-80gb-sxm")]
    kernels, skipped = [], []
    for path, hw in sources:
        if path.is_file():
            print(f"predicting {path.name}", file=sys.stderr)
            try:
                kernels.append(residuals(path, hw, args.max_rows))
            except SpecError as exc:
                skipped.append(f"{path.name}: {str(exc).split(' (')[0]}")
    h100 = [r for r in kernels if r["device"] == "h100-sxm"]
    a100 = [r for r in kernels if r["name"] == "vidur-a100-layers.csv"]
    own = args.hardware is not None and pm.hardware(args.hardware).uncertainty is not None
    unc = pm.hardware(args.hardware).uncertainty if own else \
        derived_band(h100 or a100, a100[0] if a100 else None)
    tao = torchao(unc)
    runs = [] if args.no_serving or not args.serving.is_dir() else serving(args.serving, unc)
    command = "PYTHONPATH=. python reports/kernels/coverage.py " + " ".join(sys.argv[1:])
    args.out.write_text(report(kernels, skipped, unc, own, tao, runs, command.strip(),
                               time.perf_counter() - start))
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
