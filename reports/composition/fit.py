"""Fit how kernels compose into a CUDA-graph step (``specs.composition``) on whole-step
measurements only, and score it cross-validated by shape (issue 32, item 4).

    python reports/composition/fit.py [--out reports/composition/README.md] [--write-hardware]

Data (committed, measured on lent GPUs; nothing else is read): every decode step replayed
from a CUDA graph in ``reports/<device>/steps.csv`` (``validate/probe_steps.py``: whole
Llama-3-8B / Llama-2-13B steps, ``timing = kernel``), fitted; and, as a check never
fitted, the probe's graph of 100 one-element adds in ``reports/<device>/probe.csv``
(``validate/probe_cuda.py`` ``launch_rows``: the per-kernel cost of kernels that do no
work; ``docs/composition.md`` says why it is not fitted). No serving run, no published
figure and no eager step is used.

Each step is priced as the harness ran it: the model's records of the step (``validate.
suites.Step.records``, as ``validate.report.step_seconds`` prices them) plus the harness's
kernels the model fuses (``HARNESS_EXTRA``, from ``validate/tinymodel.py`` and
``validate/kernels.py``), each a decode-sized kernel of no modelled work at the device's
generic fixed cost. A step's predicted time under timing ``graph`` is its kernels' bodies
plus ``(1 - graph_overlap)`` x their fixed costs, so one constant is fitted per device:
least squares on log(predicted / measured), on a grid over ``[0, MAX_OVERLAP]``. Scores:
median |predicted / measured - 1| before (overlap 0: the sum of isolated kernels), fitted
on all steps, leave-one-shape-out (each step shape, model x batch x context, predicted by
a fit without it) and leave-one-device-out (the other device's fit).
``--write-hardware`` writes each device's fit into its hardware YAML's ``composition:``
block and the family rule (the mean of the measured devices) into every other NVIDIA file.
"""

from __future__ import annotations

import argparse
import csv
import re
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import perfmodel as pm  # noqa: E402
from perfmodel.cost.roofline import op_time  # noqa: E402
from perfmodel.specs.composition import MAX_OVERLAP  # noqa: E402
from validate.suites import Step  # noqa: E402

DEVICES = (("h200", "h200-sxm"), ("h100", "h100-sxm"))
# kernels per decoder layer the harness launches beyond the model's records
# (validate/kernels.py): rotary as three (x.float(), the complex multiply, .to(bf16): +2),
# the KV-cache write as two slice copies (+1), SiLU-and-mul as two (silu, mul: +1), and the
# query reshape of the packed-GQA SDPA call from a transposed view, a copy (+1)
HARNESS_EXTRA = 5
FLOOR = "cuda graph replay, per kernel"
GRID = np.linspace(0.0, MAX_OVERLAP, 1801)


def step_rows(key: str, hw: pm.Hardware) -> list[dict]:
    """Per graph-replayed step: shape, measured seconds, modelled body and fixed seconds."""
    models: dict = {}
    out = []
    with (ROOT / "reports" / key / "steps.csv").open(newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["timing"] == "kernel"]
    for r in rows:
        step = Step.from_row(r, models | {r["model"]: models.setdefault(
            r["model"], pm.model(r["model"]))})
        total = fixed = 0.0
        for op in step.records(hw, "kernel"):
            t = op_time(op, hw, "kernel")
            total += float(np.sum(t.time_s))
            fixed += float(np.sum(t.fixed_s * op.count))
        extra = HARNESS_EXTRA * models[r["model"]].n_layers * hw.efficiency.kernel_latency_s
        out.append({"shape": f"{r['model']} b{r['batch']} ctx{r['kv_len']}",
                    "measured_s": float(r["measured_s"]), "body_s": total - fixed,
                    "fixed_s": fixed + extra})
    with (ROOT / "reports" / key / "probe.csv").open(newline="") as f:
        floor = [r for r in csv.DictReader(f) if r["kernel"] == FLOOR][:1]
    for r in floor:     # one element: no body; the add's fixed cost is the generic one
        out.append({"shape": "graph of 100 one-element adds (per kernel)",
                    "measured_s": float(r["measured_s"]), "body_s": 0.0,
                    "fixed_s": hw.efficiency.latency_for("add")})
    return out


def is_floor(row: dict) -> bool:
    return row["shape"].startswith("graph of")


def predicted(rows: list[dict], overlap: float | np.ndarray) -> np.ndarray:
    body = np.array([r["body_s"] for r in rows])
    fixed = np.array([r["fixed_s"] for r in rows])
    return body[..., :] + (1.0 - np.asarray(overlap))[..., None] * fixed


def errors(rows: list[dict], overlap: float) -> np.ndarray:
    return predicted(rows, np.array([overlap]))[0] / np.array(
        [r["measured_s"] for r in rows]) - 1.0


def fit(rows: list[dict]) -> float:
    """The overlap on ``GRID`` of least squared log error over ``rows``."""
    measured = np.array([r["measured_s"] for r in rows])
    loss = np.sum(np.log(predicted(rows, GRID) / measured) ** 2, axis=1)
    return float(GRID[int(np.argmin(loss))])


def leave_one_out(rows: list[dict]) -> np.ndarray:
    return np.array([errors([r], fit(rows[:i] + rows[i + 1:]))[0]
                     for i, r in enumerate(rows)])


def analyse() -> dict:
    """Per device: the fit on its whole decode steps, and the scores (the floor row is a
    check, never fitted: ``docs/composition.md`` says why)."""
    out = {}
    for key, name in DEVICES:
        both = step_rows(key, pm.hardware(name))
        rows = [r for r in both if not is_floor(r)]
        floor = [r for r in both if is_floor(r)]
        phi = fit(rows)
        out[key] = {"name": name, "rows": rows, "overlap": phi, "floor": floor,
                    "before": errors(rows, 0.0), "fitted": errors(rows, phi),
                    "cv": leave_one_out(rows),
                    "floor_before": errors(floor, 0.0), "floor_after": errors(floor, phi)}
    for key, _ in DEVICES:
        other = next(k for k, _ in DEVICES if k != key)
        out[key]["lodo"] = errors(out[key]["rows"], out[other]["overlap"])
        out[key]["lodo_overlap"] = out[other]["overlap"]
    return out


def _pct(x: float) -> str:
    return f"{100 * x:+.1f}%"


def _med(e: np.ndarray) -> str:
    return f"{100 * float(np.median(np.abs(e))):.1f}%"


def torchao(overlap: dict) -> list[tuple]:
    """TorchAO's batch-1 Llama-3-8B decode (tests/test_torchao.py): evaluation only."""
    from tests.test_torchao import TORCHAO, _tokens_per_s
    return [(w, _tokens_per_s("h100-sxm-meta", w) / TORCHAO[w] - 1.0) for w in TORCHAO]


def readme(res: dict) -> str:
    lines = ["# How kernels compose into a CUDA-graph step: the fit",
             "",
             "Generated by `python reports/composition/fit.py` (no GPU, no torch). Mechanism "
             "and sources: `docs/composition.md`. Fitted only on whole steps replayed from "
             "CUDA graphs (`reports/<device>/steps.csv`), each priced as the harness ran it "
             f"(the model's records plus {HARNESS_EXTRA} unfused harness kernels per layer); "
             "error = predicted / measured - 1, priced with the shipped hardware files' "
             "kernel constants (before: `graph_overlap` 0).",
             "",
             "| device | rows | fitted graph_overlap | graph_overlap_max (the band's fast "
             "edge) | before (overlap 0) | fitted, in sample | leave one shape out | leave one "
             "device out (its overlap) |",
             "|---|---|---|---|---|---|---|---|"]
    for key, _ in DEVICES:
        r = res[key]
        lines.append(f"| {r['name']} | {len(r['rows'])} | {r['overlap']:.3f} | "
                     f"{overlap_max(r):.3f} | {_med(r['before'])} | {_med(r['fitted'])} | "
                     f"{_med(r['cv'])} | "
                     f"{_med(r['lodo'])} ({r['lodo_overlap']:.3f}) |")
    both = {k: np.concatenate([res[d][k] for d, _ in DEVICES])
            for k in ("before", "fitted", "cv", "lodo")}
    rows = [x for d, _ in DEVICES for x in res[d]["rows"]]
    lines.append(f"| both | {len(rows)} | | | {_med(both['before'])} | {_med(both['fitted'])} "
                 f"| {_med(both['cv'])} | {_med(both['lodo'])} |")
    lines += ["", "Check, not fitted: the probe's graph of 100 one-element adds, per kernel "
              "(the fixed cost of a kernel of no work inside a graph): "
              + "; ".join(f"{res[k]['name']} measured {res[k]['floor'][0]['measured_s'] * 1e6:.2f}"
                          f" us, predicted {_pct(res[k]['floor_before'][0])} before, "
                          f"{_pct(res[k]['floor_after'][0])} after" for k, _ in DEVICES
                          if res[k]["floor"]) + ".", ""]
    lines += ["## Per row", "", "| device | step | measured ms | before | leave one shape "
              "out |", "|---|---|---|---|---|"]
    for key, _ in DEVICES:
        r = res[key]
        for row, b, c in zip(r["rows"], r["before"], r["cv"], strict=True):
            lines.append(f"| {r['name']} | {row['shape']} | {row['measured_s'] * 1e3:.4g} | "
                         f"{_pct(b)} | {_pct(c)} |")
    return "\n".join(lines) + "\n"


BLOCK = re.compile(r"\ncomposition:\n(?:[ ].*\n)*")


def block(overlap: float, top: float, source: str, note: str) -> str:
    return (f"composition:\n  graph_overlap: {overlap:.3f}\n  graph_overlap_max: {top:.3f}\n"
            f"  source: \"{source}\"\n  note: \"{note}\"\n")


def overlap_max(r: dict) -> float:
    """The largest overlap the device's whole-step data allow: a graph of empty kernels
    pays its per-kernel time of the isolated fixed cost (1 - measured / predicted)."""
    floor = r["floor"][0]
    return float(np.clip(1.0 - floor["measured_s"] / floor["fixed_s"], r["overlap"],
                         MAX_OVERLAP))


def write_hardware(res: dict) -> list[Path]:
    """Each measured device's fit, and the family rule into every other NVIDIA file."""
    cmd = "python reports/composition/fit.py --write-hardware"
    written = []
    measured = {res[k]["name"]: res[k] for k, _ in DEVICES}
    family = float(np.mean([r["overlap"] for r in measured.values()]))
    family_max = float(np.mean([overlap_max(r) for r in measured.values()]))
    for path in sorted((ROOT / "perfmodel" / "hardware").glob("*.yaml")):
        text = path.read_text()
        if "vendor: nvidia" not in text or re.search(r"^base:", text, re.M):
            continue        # a variant (base:) inherits its base's block
        name = path.stem
        if name in measured:
            r = measured[name]
            src = (f"whole-step fit: {len(r['rows'])} decode steps replayed from CUDA "
                   f"graphs (reports/{next(k for k, n in DEVICES if n == name)}/steps.csv), "
                   "measured on this device; "
                   f"{cmd}")
            note = (f"median |error| of the steps: before {_med(r['before'])}, "
                    f"leave one shape out {_med(r['cv'])}, leave one device out "
                    f"{_med(r['lodo'])}; bounds 0-{MAX_OVERLAP}; graph_overlap_max (the band's "
                    "fast edge): 1 - the probe's per-kernel time in a graph of 100 "
                    "one-element adds (probe.csv) / the isolated fixed cost; "
                    "reports/composition/")
            value, top = r["overlap"], overlap_max(r)
        else:
            src = ("family rule: the mean of the NVIDIA devices fitted on whole steps "
                   f"({', '.join(sorted(measured))}), not measured on this device; {cmd}")
            note = ("CUDA graphs compose kernels the same way on every NVIDIA GPU (the front "
                    "end sets up the next kernel while one drains); the share hidden is "
                    "carried, not measured here")
            value, top = family, family_max
        new = block(value, top, src, note)
        text = BLOCK.sub("\n", text) if BLOCK.search(text) else text
        path.write_text(text.rstrip("\n") + "\n" + new)
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE / "README.md")
    parser.add_argument("--write-hardware", action="store_true")
    args = parser.parse_args(argv)
    res = analyse()
    if args.write_hardware:
        for p in write_hardware(res):
            print(f"wrote {p.relative_to(ROOT)}")
    args.out.write_text(readme(res))
    print(f"wrote {args.out}")
    for key, _ in DEVICES:
        r = res[key]
        print(f"{r['name']}: overlap {r['overlap']:.3f}; before {_med(r['before'])}, "
              f"CV {_med(r['cv'])}, LODO {_med(r['lodo'])}")


if __name__ == "__main__":
    main()
