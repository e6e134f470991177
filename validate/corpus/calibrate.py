"""``perfmodel calibrate --from``: a shipped device's constants from measured kernels.

For one device and engine: read its measured kernels (``corpus.rows``: a kernel corpus, or
aiconfigurator-core's tables read in memory by the same reader), price them with the
shipped YAML (before), fit the constants (``corpus.fit``), measure the fit on shapes it
never saw (5 folds by shape family) and, for a family of devices, on a device it never saw
(leave one device out: the family's other devices fitted together predict it). The result
becomes a variant hardware YAML (``--out``) or is written into the shipped file
(``--write-hardware``, ``hardware_text``). No torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

import perfmodel as pm
from perfmodel.specs.errors import SpecError
from perfmodel.specs.hardware import Hardware
from perfmodel.specs.kinds import ERROR_CLASSES
from validate.corpus.fit import fit_device, fit_devices, held_out, summary
from validate.corpus.params import INTERCONNECT, PARAMETERS, apply
from validate.corpus.rows import Rows, load_sets
from validate.corpus.sets import KernelSet

FAMILIES = {
    "ampere": ("a100-80gb-sxm", "a100-80gb-pcie", "a30"),
    "hopper": ("h100-sxm", "h100-pcie", "h100-nvl", "h200-sxm"),
    "blackwell": ("b200", "b300", "gb200", "gb300"),
    "ada": ("l40s", "l4"),
}
METHOD = ("bounded least squares on log(predicted/measured) (scipy least_squares, soft-L1, "
          "error classes weighted equally), in three stages (GEMMs; attention; all-reduce); "
          "held out: 5 folds by shape family (GEMM weight n x k, attention heads x head_dim, "
          "all-reduce devices x size), deterministic")


def family_of(name: str) -> str | None:
    return next((f for f, names in FAMILIES.items() if name in names), None)


@dataclass
class Calibration:
    """One device's fit: its kernels, the shipped and fitted hardware, the errors."""

    name: str
    engine: str
    sets: list[KernelSet]
    provenance: dict
    base: Hardware
    values: dict[str, float]
    before: dict[str, dict] = field(default_factory=dict)
    held: dict[str, dict] = field(default_factory=dict)
    lodo: dict[str, dict] = field(default_factory=dict)
    lodo_errors: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def fitted(self) -> Hardware:
        return apply(self.base, self.values)


def shipped(rows: Rows) -> list[str]:
    """The devices ``rows`` covers that have a hardware YAML in this checkout (rows of a
    device another branch adds are not fitted here)."""
    out = []
    for name in rows.devices():
        try:
            pm.hardware(name)
        except SpecError:
            continue
        out.append(name)
    return out


def calibrate(name: str, engine: str = "vllm", rows: Rows | None = None, folds: int = 5,
              sets: tuple[list[KernelSet], dict] | None = None) -> Calibration:
    """Fit ``name``'s constants to its ``engine`` kernels (``sets``: already loaded), with
    the held-out errors; ValueError when there are none (aiconfigurator-core 0.12.0 has
    empty folders for a100_pcie, a30, h100_pcie and l4)."""
    sets, prov = sets or load_sets(name, engine, rows)
    if not sets:
        raise ValueError(f"{name}: no {engine} kernels to fit")
    # the engine's own view: its kernels' mechanisms (decode tiles, the fallback kernel) are
    # the structure its constants are fitted in
    base = pm.hardware(name, engine)
    values = fit_device(base, sets)
    cal = Calibration(name, engine, sets, prov, base, values)
    cal.before = {s.error_class: summary(s.errors(base)) for s in sets}
    cal.held = {k: summary(v) for k, v in held_out(base, sets, folds).items()}
    return cal


def leave_one_out(cals: dict[str, Calibration]) -> None:
    """Fill each calibration's ``lodo``: its family's other calibrated devices fitted
    together predict it (nothing for a device alone in its family here)."""
    for name, cal in cals.items():
        family = family_of(name)
        others = [c for n, c in cals.items()
                  if n != name and family_of(n) == family and c.engine == cal.engine]
        if family is None or not others:
            continue
        values = fit_devices([(c.base, c.sets) for c in others])
        trial = apply(cal.base, values)
        cal.lodo_errors = {s.error_class: s.errors(trial) for s in cal.sets}
        cal.lodo = {k: summary(v) | {"fitted_on": sorted(c.name for c in others)}
                    for k, v in cal.lodo_errors.items()}


def family_bands(cals: dict[str, Calibration]) -> dict[str, dict]:
    """The ``uncertainty:`` block of each shipped device of a family with no measurements of
    its own: q10 / q90 of the leave-one-device-out residuals of the family's calibrated
    devices pooled (each predicted by the others' fit, as this device is by its file), per
    error class; none where the family has no leave-one-device-out residuals."""
    out = {}
    for family, names in FAMILIES.items():
        done = [cals[n] for n in names if n in cals and cals[n].lodo_errors]
        if not done:
            continue
        classes = dict.fromkeys(k for c in done for k in c.lodo_errors if k in ERROR_CLASSES)
        pooled = {k: np.concatenate([c.lodo_errors[k] for c in done if k in c.lodo_errors])
                  for k in classes}
        block = {
            "source": f"leave-one-device-out, {family}",
            "note": (f"no {done[0].engine} kernel measurements of this device: residuals of "
                     f"{', '.join(c.name for c in done)}, each predicted by a fit on the "
                     f"family's others; "
                     f"{done[0].provenance['source'].split(':')[0]} {done[0].engine}"),
            "error_q10": {k: round(float(np.quantile(v, 0.1)), 3) for k, v in pooled.items()},
            "error_q90": {k: round(float(np.quantile(v, 0.9)), 3) for k, v in pooled.items()},
        }
        for name in names:
            if name not in cals:
                out[name] = block
    return out


TABLE_PREFIXES = ("moe.", "gemm.")
TABLES = {"moe": "moe_kernels", "gemm": "gemm_kernels"}


def kernel_tables(values: dict[str, float]) -> dict[str, dict]:
    """The ``efficiency.moe_kernels`` / ``gemm_kernels`` mappings of fitted values
    (``moe.<class>.<field>``, ``gemm.<class>.<field>``; seconds as microsecond text),
    each class's fields in ``kernel_fit.MOE_FIELDS`` order."""
    from validate.corpus.params import MOE_FIELDS
    from validate.corpus.write import _shown

    out: dict[str, dict] = {}
    for key, value in sorted(values.items()):
        if key.startswith(TABLE_PREFIXES):
            prefix, cls, what = key.split(".")
            row = out.setdefault(TABLES[prefix], {}).setdefault(cls, {})
            row[what] = _shown(what, float(f"{value:.4g}"))
    return {t: {c: {f: row[f] for f in (*MOE_FIELDS, "host_s", "row_s", "k_half")
                    if f in row}
                for c, row in classes.items()}
            for t, classes in out.items()}


def _round(value: float) -> float:
    return float(f"{value:.4g}")


def blocks(cal: Calibration, source: str | None = None) -> dict:
    """The YAML blocks of a calibration: efficiency and interconnect values, the
    ``calibration:`` provenance and the ``uncertainty:`` band (q10/q90 of held-out
    residuals)."""
    eff, link = dict(kernel_tables(cal.values)), {}
    for name, value in cal.values.items():
        if name.startswith(TABLE_PREFIXES):
            continue
        if name in INTERCONNECT:
            link[name] = _round(value)
        elif "." in name:
            base, kind = name.split(".")
            table = "kernel_latency_by_kind" if base == "kernel_latency_s" \
                else "kernel_memory_fraction"
            eff.setdefault(table, {})[kind] = _round(value)
        else:
            eff[name] = _round(value)
    if any(k.startswith("custom_all_reduce") for k in link):
        link["custom_all_reduce_max_bytes"] = int(cal.fitted.interconnect
                                                  .custom_all_reduce_max_bytes)
    versions = cal.provenance["versions"]
    source = source or cal.provenance["source"]

    def per_class(table: dict) -> str:
        return ", ".join(f"{k} {v['median_abs']:.1%}" for k, v in table.items())

    note = (f"median |predicted/measured - 1| before (the file's constants when the fit ran): "
            f"{per_class(cal.before)}; bounds: "
            + "; ".join(f"{n} {PARAMETERS[n][0]:.3g}-{PARAMETERS[n][1]:.3g}"
                        for n in sorted(cal.values)))
    if cal.lodo:
        fitted_on = next(iter(cal.lodo.values()))["fitted_on"]
        note += (f"; leave one device out (fitted on {', '.join(fitted_on)} only): "
                 f"{per_class(cal.lodo)}")
    calibration = {
        "source": f"{source} ({', '.join(f'{k} {v}' for k, v in versions.items())})",
        "engine": cal.engine,
        "engine_version": versions.get("gemm") or versions.get("attention") or "",
        "method": METHOD,
        "fitted": {n: float(f"{v:.4g}") for n, v in sorted(cal.values.items())
                   if not n.startswith(TABLE_PREFIXES)},
        "rows": {k: v for k, v in cal.provenance["rows"].items() if k in ERROR_CLASSES},
        "held_out_median_abs_error": {k: round(v["median_abs"], 3) for k, v in
                                      cal.held.items() if k in ERROR_CLASSES},
        "command": "perfmodel calibrate --from aiconfigurator --all --write-hardware",
        "note": note,
    }
    uncertainty = {
        "source": f"held-out residuals, 5-fold by shape, {source} {cal.engine}",
        "error_q10": {k: round(v["q10"], 3) for k, v in cal.held.items()
                      if k in ERROR_CLASSES},
        "error_q90": {k: round(v["q90"], 3) for k, v in cal.held.items()
                      if k in ERROR_CLASSES},
    }
    return {"efficiency": eff, "interconnect": link, "calibration": calibration,
            "uncertainty": uncertainty}


def table(cals: dict[str, Calibration]) -> str:
    """Markdown: per device x class, before / held-out / leave-one-device-out median
    |error| (and the held-out signed median)."""
    lines = ["| device | engine | class | rows | before | held-out | held-out bias | "
             "leave-one-device-out |", "|---|---|---|---:|---:|---:|---:|---:|"]
    for name, cal in cals.items():
        for cls, b in cal.before.items():
            h = cal.held.get(cls, {})
            lodo = cal.lodo.get(cls, {}).get("median_abs")
            lines.append(
                f"| {name} | {cal.engine} | {cls} | {b['n']} | {b['median_abs']:.1%} | "
                f"{h.get('median_abs', np.nan):.1%} | {h.get('median', np.nan):+.1%} | "
                + (f"{lodo:.1%}" if lodo is not None else "-") + " |")
    return "\n".join(lines)
