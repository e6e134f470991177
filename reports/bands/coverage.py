"""Coverage of the 80% band on the end-to-end data the repository has (issue 32, item 5).

    python reports/bands/coverage.py [--serving DIR] [--no-serving] [--every K] [--out DIR]

writes DIR/before.md (the band of the kernel classes alone) and DIR/README.md (with the
composition term), default reports/bands/.

Three data sets, nothing fitted to any of them:

- whole-step probes: every step in ``reports/<device>/steps.csv`` (graph-replayed decode,
  eager decode and prefill; ``validate/probe_steps.py``), priced as the harness ran it
  (``reports/composition/fit.py``: the model's records and the harness's unfused kernels),
  each operator's time in its error class, the band by ``cost.band`` from the device's own
  ``uncertainty:`` block: is the measured step inside?
- TorchAO's four H100 batch-1 decode figures (``tests/test_torchao.py``, h100-sxm-meta):
  tokens/s inside the estimate's band?
- the shared vLLM serving runs (``../shared/measurements/serving``, replayed as
  ``perfmodel compare-serving`` replays them, with the engines' host time): each run's
  measured E2E, TTFT and ITL medians inside the simulated band
  (``serving.bands.edge_summaries``, as ``simulate`` draws it)?
"""

from __future__ import annotations

import argparse
import csv
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import perfmodel as pm  # noqa: E402
from perfmodel.cost.band import band, class_seconds  # noqa: E402
from perfmodel.cost.error_class import error_code  # noqa: E402
from perfmodel.cost.ops import Pointwise  # noqa: E402
from perfmodel.cost.roofline import op_time  # noqa: E402
from perfmodel.specs.composition import Composition  # noqa: E402
from perfmodel.specs.kinds import POINTWISE  # noqa: E402
from reports.composition.fit import DEVICES, HARNESS_EXTRA  # noqa: E402
from validate.suites import Step  # noqa: E402

SHARED = next((p for p in (ROOT.parent / "shared" / "measurements",
                           ROOT.parent.parent / "shared" / "measurements") if p.exists()),
              ROOT.parent / "shared" / "measurements")
METRICS = (("E2E", "e2e_s"), ("TTFT", "ttft_s"), ("ITL", "itl_s"))
PRICING = {"kernel": "graph", "stream": "stream"}


def step_band(row: dict, hw: pm.Hardware, models: dict, terms: bool = True
              ) -> tuple[float, float, float]:
    """(centre, low, high) seconds of one measured step as the harness ran it; ``terms``:
    with the band's composition term (``cost.band``), else the kernel classes alone."""
    models.setdefault(row["model"], pm.model(row["model"]))
    step = Step.from_row(row, models)
    timing = PRICING[row["timing"]]
    times, codes, fixed = [], [], 0.0
    for op in step.records(hw, timing):
        t = op_time(op, hw, timing)
        times.append(np.sum(t.time_s))
        codes.append(int(np.ravel(error_code(op))[0]))
        fixed += float(np.sum(t.fixed_s * op.count))
    if row["phase"] == "decode":        # the harness's unfused kernels: no modelled work
        extra = Pointwise(rows=np.array([1]), n=np.array([1]), code=POINTWISE.index("add"),
                          count=np.array([HARNESS_EXTRA * models[row["model"]].n_layers]))
        t = op_time(extra, hw, timing)
        times.append(np.sum(t.time_s))
        codes.append(int(np.ravel(error_code(extra))[0]))
        fixed += float(np.sum(t.fixed_s * extra.count))
    per = class_seconds(np.array(times)[:, None], np.array(codes)[:, None])
    hw = hw if terms else kernel_only(hw)
    composed = hw.composition.edges(np.array([fixed])) if timing == "graph" else None
    lo, hi = band(per, hw.uncertainty, composed=composed)
    return float(per.sum()), float(lo[0]), float(hi[0])


def steps(terms: bool = True) -> list[dict]:
    out = []
    for key, name in DEVICES:
        hw, models = pm.hardware(name), {}
        with (ROOT / "reports" / key / "steps.csv").open(newline="") as f:
            for row in csv.DictReader(f):
                c, lo, hi = step_band(row, hw, models, terms)
                m = float(row["measured_s"])
                out.append({"device": name, "step": f"{row['model']} {row['phase']} "
                            f"b{row['batch']} ctx{row['kv_len']}",
                            "timing": "graph replay" if row["timing"] == "kernel" else "eager",
                            "measured": m, "centre": c, "low": lo, "high": hi,
                            "inside": lo <= m <= hi})
    return out


def torchao(terms: bool = True) -> list[dict]:
    from tests.test_torchao import TORCHAO, _workload
    hw, model = pm.hardware("h100-sxm-meta"), pm.model("llama-3-8b")
    hw = hw if terms else kernel_only(hw)
    out = []
    for weights, measured in TORCHAO.items():
        e = pm.estimate(hw, model, _workload(weights))
        lo, hi = 200.0 / e.band["e2e_s"][1], 200.0 / e.band["e2e_s"][0]
        out.append({"weights": weights, "measured": measured, "centre": 200.0 / e.e2e_s,
                    "low": lo, "high": hi, "inside": lo <= measured <= hi})
    return out


def kernel_only(hw: pm.Hardware) -> pm.Hardware:
    """``hw`` whose band has no composition term on the fast side (the band before it;
    the slow side keeps overlap / (1 - overlap) of the graph fixed cost: 0 on the H100)."""
    c = hw.composition
    return replace(hw, composition=Composition(c.graph_overlap, c.source, c.graph_overlap))


def serving(folder: Path, every: int) -> tuple[list[dict], list[dict]]:
    """(before, after): per replayed run (every ``every``-th), measured and simulated
    (centre, low, high) medians, the band without and with the composition term."""
    from perfmodel.compare.serving import load_runs
    from perfmodel.serving.bands import banded_summary, edge_summaries
    from perfmodel.serving.simulate import simulate

    out: tuple[list[dict], list[dict]] = ([], [])
    runs = [r for r in load_runs(folder / "experiments.csv", folder / "requests.csv")
            if not r.skip]
    for run in runs[::every]:
        model, full = pm.model(run.model), pm.hardware(run.hardware)
        if full.uncertainty is None:
            continue
        centre = simulate(model, full, run.requests, run.plan, run.engine)
        for side, hw in zip(out, (kernel_only(full), full), strict=True):
            def at(q, edge, hw=hw, run=run, model=model):
                return simulate(model, hw, q, run.plan, run.engine, edge=edge)

            s = banded_summary(centre.summary(), *edge_summaries(run.requests, centre, at),
                               "")
            row = {"id": run.id, "hardware": run.hardware}
            for _, key in METRICS:
                m = run.measured.get(key, {}).get("p50")
                if m is not None:
                    row[key] = (m, s[key]["p50"], s[key]["p50_low"], s[key]["p50_high"])
            side.append(row)
        print(f"  {run.id}", file=sys.stderr, flush=True)
    return out


def _share(flags: list[bool]) -> str:
    return f"{sum(flags)} of {len(flags)} ({sum(flags) / max(len(flags), 1):.0%})"


def report(step_rows: list[dict], tao: list[dict], runs: list[dict], command: str,
           seconds: float) -> str:
    lines = ["# Coverage of the 80% band where nobody calibrated", "",
             f"Written by `{command}` ({seconds:.0f} s on the shared two-core machine). "
             "How each band is drawn: `docs/bands.md`. Nothing here was fitted to these "
             "data.", "", "## Summary", "", "| data set | inside the 80% band |", "|---|---|"]
    graph = [r["inside"] for r in step_rows if r["timing"] == "graph replay"]
    eager = [r["inside"] for r in step_rows if r["timing"] == "eager"]
    lines += [f"| whole-step probes, graph-replayed decode (H200, H100) | {_share(graph)} |",
              f"| whole-step probes, eager steps (the harness's PyTorch eager kernels) | "
              f"{_share(eager)} |",
              f"| TorchAO H100 batch-1 decode, tokens/s | "
              f"{_share([r['inside'] for r in tao])} |"]
    for name, key in METRICS:
        flags = [r[key][2] <= r[key][0] <= r[key][3] for r in runs if key in r]
        if flags:
            lines.append(f"| shared vLLM serving runs, {name} median | {_share(flags)} |")
    lines += ["", "## Whole-step probes", "", "| device | step | measured as | measured ms | "
              "centre ms | 80% band ms | inside |", "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['device']} | {r['step']} | {r['timing']} | {r['measured'] * 1e3:.2f} | "
              f"{r['centre'] * 1e3:.2f} | {r['low'] * 1e3:.2f}-{r['high'] * 1e3:.2f} | "
              f"{'yes' if r['inside'] else 'no'} |" for r in step_rows]
    lines += ["", "## TorchAO (tokens/s)", "", "| weights | measured | centre | 80% band | "
              "inside |", "|---|---|---|---|---|"]
    lines += [f"| {r['weights']} | {r['measured']:.1f} | {r['centre']:.1f} | "
              f"{r['low']:.1f}-{r['high']:.1f} | {'yes' if r['inside'] else 'no'} |"
              for r in tao]
    if runs:
        lines += ["", "## Serving runs (medians)", "",
                  "| run | " + " | ".join(f"{n} measured | {n} band | in" for n, _ in METRICS)
                  + " |", "|---|" + "---|---|---|" * len(METRICS)]
        for r in runs:
            cells = [r["id"]]
            for _, key in METRICS:
                if key not in r:
                    cells += ["", "", ""]
                    continue
                m, _c, lo, hi = r[key]
                cells += [f"{m * 1e3:.1f}", f"{lo * 1e3:.1f}-{hi * 1e3:.1f}",
                          "yes" if lo <= m <= hi else "no"]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--serving", type=Path, default=SHARED / "serving")
    ap.add_argument("--no-serving", action="store_true")
    ap.add_argument("--every", type=int, default=1, help="every k-th serving run only")
    ap.add_argument("--out", type=Path, default=Path(__file__).parent)
    args = ap.parse_args(argv)
    start = time.perf_counter()
    before, after = ([], []) if args.no_serving else serving(args.serving, args.every)
    command = "python reports/bands/coverage.py" + (
        " --no-serving" if args.no_serving else f" --every {args.every}")
    took = time.perf_counter() - start
    for name, terms, runs in (("before.md", False, before), ("README.md", True, after)):
        text = report(steps(terms), torchao(terms), runs, command, took)
        head = ("the band before the composition term (kernel classes only)" if not terms
                else "the band with the composition term")
        (args.out / name).write_text(text.replace("\n\n## Summary", f"\n\nThis file: {head}."
                                                  "\n\n## Summary", 1))
        print(f"wrote {args.out / name}")


if __name__ == "__main__":
    main()
