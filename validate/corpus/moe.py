"""Fit the kernel constants of quantized and grouped GEMMs (``cost.moe``; stages 4 and 5
of ``kernel_fit``: fused MoE layers per format class, ``efficiency.moe_kernels``, and fp8 /
fp8-block / nvfp4 dense linears, ``efficiency.gemm_kernels``) of shipped devices per
engine, alone, and write them into the hardware files (no torch).

The other stages' constants (16-bit GEMMs, attention, all-reduce) stay as shipped: stages
4 and 5 fit parameters no other stage reads, on rows no other stage prices, starting from
the engine's shipped GEMM constants, so fitting them alone gives what a full rerun of
``perfmodel calibrate --from aiconfigurator --all --write-hardware`` gives them. Per
device x engine: held-out error (5 folds by shape: a MoE's hidden, width, experts and
top-k; a linear's n x k) and, within a family, leave one device out (the family's other
listed devices fitted together).

    python -m validate.corpus.moe --from /tmp/corpus -H h100-sxm -H h200-sxm -H b200 \
        --report reports/kernels/moe [--class moe] [--write-hardware]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import yaml

import perfmodel as pm
from validate.corpus import write as kw
from validate.corpus.calibrate import Calibration, family_of
from validate.corpus.calibrate import kernel_tables as tables_of
from validate.corpus.fit import fit_device, fit_devices, held_out, summary
from validate.corpus.params import PARAMETERS, apply, param_entry
from validate.corpus.rows import ENGINES, Rows, load_sets
from validate.corpus.splice import splice

COMMAND = ("python -m validate.corpus.moe --from <corpus> -H h100-sxm -H h200-sxm -H b200 "
           "--write-hardware")


CLASSES = ("moe", "gemm_quantized")


def calibrate_moe(name: str, engine: str, rows: Rows, classes: tuple[str, ...] = CLASSES
                  ) -> Calibration | None:
    """``name``'s stage-4/5 fit under ``engine`` with its held-out errors (None: no rows
    of ``classes``)."""
    sets, prov = load_sets(name, engine, rows)
    sets = [s for s in sets if s.error_class in classes]
    if not sets:
        return None
    base = pm.hardware(name, engine)
    cal = Calibration(name, engine, sets, prov, base, fit_device(base, sets))
    cal.before = {s.error_class: summary(s.errors(base)) for s in sets}
    cal.held = {k: summary(v) for k, v in held_out(base, sets).items()}
    return cal


def leave_one_out(cals: dict[str, Calibration]) -> None:
    """Each calibration's ``lodo``: the family's other devices' fit predicts it."""
    for name, cal in cals.items():
        others = [c for n, c in cals.items() if n != name
                  and family_of(n) == family_of(name)]
        if not others:
            continue
        values = fit_devices([(c.base, c.sets) for c in others])
        cal.lodo_errors = {s.error_class: s.errors(apply(cal.base, values)) for s in cal.sets}
        cal.lodo = {k: summary(v) | {"fitted_on": sorted(c.name for c in others)}
                    for k, v in cal.lodo_errors.items()}


def kernel_tables(cal: Calibration) -> dict[str, dict]:
    """The ``efficiency.moe_kernels`` / ``gemm_kernels`` mappings of a fit."""
    return tables_of(cal.values)


def _note(cal: Calibration) -> str:
    bound = [k for k, v in cal.values.items()
             if np.isclose(v, PARAMETERS[param_entry(k)][0], rtol=1e-3, atol=0.0)
             or np.isclose(v, PARAMETERS[param_entry(k)][1], rtol=1e-3, atol=0.0)]
    parts = []
    for cls, table in (("moe", "moe_kernels"), ("gemm_quantized", "gemm_kernels")):
        if cls in cal.held:
            text = (f"{table}: fit on {cal.provenance['rows'].get(cls, 0)} rows "
                    f"({cal.provenance['versions'].get(cls, '')}), held-out "
                    f"{cal.held[cls]['median_abs']:.1%}")
            if cls in cal.lodo:
                text += f", leave one device out {cal.lodo[cls]['median_abs']:.1%}"
            mine = sorted(k for k in bound if k.startswith(table.split("_")[0] + "."))
            if mine:
                text += f", at a bound: {', '.join(mine)}"
            parts.append(text + f" ({COMMAND})")
    return "; ".join(parts)


def hardware_text(text: str, cals: dict[str, Calibration]) -> str:
    """A shipped hardware YAML with each engine's ``moe_kernels`` (the top-level efficiency
    for the engine it describes, vLLM; ``engines.<engine>.efficiency`` for the others),
    the MoE rows, held-out error and band added to that engine's calibration and
    uncertainty blocks."""
    doc = yaml.safe_load(text)
    lines = text.splitlines(keepends=True)
    engines = doc.get("engines") or {}
    tops = {k: doc.get(k) for k in ("calibration", "uncertainty")}
    for engine, cal in cals.items():
        tables = kernel_tables(cal)
        if engine == "vllm":
            for key, table in tables.items():
                start, end = kw._block_span(lines, "efficiency")
                lines = lines[:start] + [x for x in lines[start:end]
                                         if not x.startswith(f"  {key}:")] + lines[end:]
                flow = yaml.safe_dump({key: table}, default_flow_style=True,
                                      width=10**6).strip()[1:-1]
                kw._set(lines, "efficiency", key, flow.split(": ", 1)[1])
            _add(tops, cal)
        else:
            block = engines.setdefault(engine, {})
            block.setdefault("efficiency", {}).update(tables)
            _add(block, cal)
    for key in kw.TOP_BLOCKS:
        lines = kw._strip_top(lines, key)
    out = "".join(lines).rstrip("\n") + "\n"
    extra = {k: v for k, v in tops.items() if v} | ({"engines": engines} if engines else {})
    return out + kw._dump(extra)


def written_keys(cals: dict[str, Calibration]) -> list[tuple[str, ...]]:
    """The keys ``hardware_text`` rewrites for each engine of ``cals`` (``splice`` carries
    them alone into the file, so the comments around them stay)."""
    out: list[tuple[str, ...]] = []
    for engine, cal in cals.items():
        at = () if engine == "vllm" else ("engines", engine)
        out += [(*at, "efficiency", key) for key in kernel_tables(cal)]
        out += [(*at, "calibration", key) for key in ("rows", "held_out_median_abs_error",
                                                     "note") if "moe" in cal.held
                or key == "note"]
        if "moe" in cal.held:
            out += [(*at, "uncertainty", key) for key in ("error_q10", "error_q90")]
    return out


def _add(block: dict, cal: Calibration) -> None:
    """The MoE figures into a calibration / uncertainty pair of blocks."""
    c = block.get("calibration")
    if c is not None:
        if "moe" in cal.held:
            c.setdefault("rows", {})["moe"] = cal.held["moe"]["n"]
            c.setdefault("held_out_median_abs_error", {})["moe"] = round(
                cal.held["moe"]["median_abs"], 3)
        kept = [p for p in str(c.get("note", "")).split("; ")
                if not any(p.startswith(f"{t}:") for t in kernel_tables(cal))]
        c["note"] = "; ".join([*kept, _note(cal)])
    u = block.get("uncertainty")
    if u is not None and "moe" in cal.held:
        u.setdefault("error_q10", {})["moe"] = round(cal.held["moe"]["q10"], 3)
        u.setdefault("error_q90", {})["moe"] = round(cal.held["moe"]["q90"], 3)


def table(by_engine: dict[str, dict[str, Calibration]]) -> str:
    lines = ["| device | engine | class | rows | before | held-out | held-out bias | "
             "leave-one-device-out |", "|---|---|---|---:|---:|---:|---:|---:|"]
    for engine, cals in by_engine.items():
        for name, cal in cals.items():
            for cls, b in cal.before.items():
                h = cal.held[cls]
                lodo = cal.lodo.get(cls, {}).get("median_abs")
                lines.append(f"| {name} | {engine} | {cls} | {b['n']} | "
                             f"{b['median_abs']:.1%} | {h['median_abs']:.1%} | "
                             f"{h['median']:+.1%} | "
                             + (f"{lodo:.1%}" if lodo is not None else "-") + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--from", dest="source", required=True)
    p.add_argument("-H", "--hardware", action="append", required=True)
    p.add_argument("--engine", action="append", choices=ENGINES)
    p.add_argument("--report", default="reports/kernels/moe")
    p.add_argument("--class", dest="classes", action="append", choices=CLASSES)
    p.add_argument("--write-hardware", action="store_true")
    a = p.parse_args(argv)
    rows = Rows(a.source)
    by_engine: dict[str, dict[str, Calibration]] = {}
    for engine in a.engine or ENGINES:
        cals = {}
        for name in a.hardware:
            cal = calibrate_moe(name, engine, rows, tuple(a.classes or CLASSES))
            if cal is not None:
                cals[name] = cal
                print(f"{name} {engine}: held-out " + ", ".join(
                    f"{k} {v['median_abs']:.1%}" for k, v in cal.held.items()), flush=True)
        leave_one_out(cals)
        by_engine[engine] = cals
    report = Path(a.report)
    report.mkdir(parents=True, exist_ok=True)
    name = "calibration.md" if not a.classes else f"calibration_{'_'.join(a.classes)}.md"
    (report / name).write_text(
        "# Fused MoE layers and quantized linears: per device x engine\n\n"
        f"Regenerate: `{COMMAND}`\n\nMedian |predicted/measured - 1| of the collector's "
        "fused MoE layers: before (the shipped file), held out (5 folds by expert shape), "
        "held-out signed median, leave one device out.\n\n" + table(by_engine) + "\n")
    if a.write_hardware:
        for name in a.hardware:
            path = kw.shipped_path(name)
            mine = {e: c[name] for e, c in by_engine.items() if name in c}
            text = path.read_text()
            path.write_text(splice(text, hardware_text(text, mine), written_keys(mine)))
            print(f"wrote {path}")


if __name__ == "__main__":
    main()
