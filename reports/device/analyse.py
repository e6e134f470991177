"""Predict every lent-GPU probe kernel and whole step with the shipped and the harness-calibrated
hardware files, and write the report (reports/device/README.md).

    python reports/device/analyse.py [--out reports/device/README.md]
    python -m reports.device.analyse                (the same, from the repository root)

No torch and no GPU: the measurements are the committed CSVs (reports/<device>/probe.csv from
validate/probe_cuda.py, reports/<device>/steps.csv from validate/probe_steps.py). Records come
from the cost model's own constructors: ``compare.row_op`` for a row, with the stored weights of
a weight-only GEMM (``Gemm.weight_dtype``, bytes with group scales from ``specs.dtypes``'s
``specs.formats``) as ``cost.instantiate`` builds them, priced by ``roofline.op_time``; steps
are priced as ``validate.report`` prices the harness's steps (``step_seconds``). Nothing is
fitted here and no constant changes: the README reports how far each file is from each kernel.

Timing: the probe times back-to-back eager calls with CUDA events, so a call costs the longer
of its device time and the host's launch (the model's ``stream`` timing) whatever its CSV's
``timing`` column says; the one-element add is priced as measured (eager: ``host``, graph
replay: ``kernel``).
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import math
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

import perfmodel as pm
from perfmodel.compare import read_measurements, row_op
from perfmodel.cost.error_class import error_class
from perfmodel.cost.ops import OpRecord
from perfmodel.cost.roofline import op_time
from perfmodel.specs.dtypes import CODE, compute_codes, scaled_bytes
from perfmodel.specs.formats import weight_format
from validate.report import step_seconds
from validate.suites import Step

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent


@dataclasses.dataclass(frozen=True)
class Device:
    key: str
    label: str
    shipped: str            # a shipped hardware name
    calibrated: str         # the harness-calibrated file (repository path)

    def path(self, name: str) -> Path:
        return ROOT / "reports" / self.key / name


DEVICES = (Device("h200", "NVIDIA H200 (141 GB HBM3e)", "h200-sxm",
                  "reports/h200/full/hardware.yaml"),
           Device("h100", "NVIDIA H100 SXM (80 GB HBM3)", "h100-sxm",
                  "reports/h100/hardware.yaml"))
# the probe's weight formats (validate/probe_cuda.py) as the model names them: tinygemm's
# bf16 scale and bf16 zero per group of 128; int8 with one scale per output row
PROBE_FORMATS = {("int4", "128"): "int4wo-g128", ("int8", ""): "w8a16"}
FAMILIES = ("bf16 GEMM (F.linear)", "fp8 W8A8 GEMM (_scaled_mm)", "fp8 W8A8 + quant pass",
            "fp8 quant pass alone (eager)", "int4 tinygemm (g128)", "int8 weight-only",
            "decode attention (SDPA)", "rms_norm", "silu_and_mul", "add", "launch: eager add_",
            "launch: graph replay")


def family(row: dict) -> str | None:
    """The kernel family a probe row belongs to (None: the quantization pass, which the model
    has no operator for; it is priced inside ``fp8 W8A8 + quant pass``)."""
    op, kernel = row["op"], row.get("kernel") or ""
    if op == "quant_act":
        return None
    if op == "gemm":
        weights = row.get("weight_dtype") or ""
        if weights == "int4":
            return "int4 tinygemm (g128)"
        if weights == "int8":
            return "int8 weight-only"
        return "fp8 W8A8 GEMM (_scaled_mm)" if row["dtype"] == "fp8" else "bf16 GEMM (F.linear)"
    if op == "attention":
        return "decode attention (SDPA)"
    if op == "add" and row["dtype"] == "fp32":
        return "launch: graph replay" if "graph" in kernel else "launch: eager add_"
    return op


def size_of(row: dict) -> tuple[str, int]:
    """(what the size counts, its value): GEMM rows, elementwise rows, attention context."""
    if row["op"] == "attention":
        return "context", int(row["kv_len"])
    return ("m" if row["op"] in ("gemm", "quant_act") else "rows"), int(float(row["m"]))


def probe_record(row: dict) -> OpRecord:
    """The model's record of a probe row: ``row_op``'s, with a weight-only GEMM's stored
    weights (dtype code, bytes per weight with group scales) and compute dtype set as
    ``cost.instantiate`` sets them."""
    if family(row) and family(row).startswith("launch"):
        # as calibrate's launch row (validate.suites.LAUNCH_ROW, fp16): a calibrated file
        # lists no fp32 rate, and 6 bytes against 12 change nothing at one element
        row = row | {"dtype": "fp16"}
    base = row_op(row)
    weights = row.get("weight_dtype") or ""
    if not weights:
        return base
    dtype, group, scale = weight_format(PROBE_FORMATS[(weights, str(row.get("group_size")
                                                                    or ""))]).scheme
    code = CODE[dtype]
    return dataclasses.replace(base, weight_bytes=float(scaled_bytes(code, group or 0, scale)),
                               weight_dtype=code,
                               dtype=int(compute_codes(code, CODE[row["dtype"]])))


def probe_timing(row: dict) -> str:
    """How a probe row is priced (module docstring)."""
    if family(row) == "launch: eager add_":
        return "host"
    return "kernel" if family(row) == "launch: graph replay" else "stream"


def predict(record: OpRecord, hw: pm.Hardware, timing: str) -> float:
    return float(np.sum(op_time(record, hw, timing).time_s))


def probe_table(rows: list[dict], files: dict[str, pm.Hardware]) -> list[dict]:
    """One dict per probe kernel (and per fp8 GEMM with its quantization pass): family, size,
    measured seconds and, per hardware file, predicted seconds."""
    quant = {(r["m"], r["n"]): float(r["measured_s"]) for r in rows if r["op"] == "quant_act"}
    out = []
    for row in rows:
        fam = family(row)
        what, size = size_of(row)
        measured = float(row["measured_s"])
        if fam is None:
            out.append({"family": "fp8 quant pass alone (eager)", "what": what, "size": size,
                        "measured_s": measured, "shape": _shape(row), "class": "memory",
                        "row": row}
                       | {name: math.nan for name in files})
            continue
        record, timing = probe_record(row), probe_timing(row)
        times = {name: predict(record, hw, timing) for name, hw in files.items()}
        out.append({"family": fam, "what": what, "size": size, "measured_s": measured,
                    "shape": _shape(row), "class": str(error_class(record)[0]), "row": row}
                   | times)
        if fam.startswith("fp8 W8A8"):
            # the model has no quantization operator (vLLM fuses it into the norm or
            # activation before the GEMM): the same prediction against GEMM + pass
            out.append(out[-1] | {"family": "fp8 W8A8 + quant pass",
                                  "measured_s": measured + quant[(row["m"], row["k"])]})
    return out


def _shape(row: dict) -> str:
    if row["op"] == "attention":
        return (f"b{row['batch']} h{row['n_heads']}/{row['n_kv_heads']} "
                f"d{row['head_dim']} ctx{row['kv_len']}")
    if row["op"] == "gemm":
        return f"{row['m']}x{row['n']}x{row['k']}"
    return f"{row['m']}x{row['n']}"


# steps: (label, timing) pairs each measured row is priced under
STEP_PRICING = {("decode", "kernel"): (("--cuda-graphs (graph)", "graph"),),
                ("decode", "stream"): (("async launches (stream)", "stream"),
                                       ("sync launches (host)", "host")),
                ("prefill", "stream"): (("async launches (stream)", "stream"),)}


def step_table(rows: list[dict], files: dict[str, pm.Hardware]) -> list[dict]:
    """One dict per (measured step, pricing): the step, measured and predicted seconds."""
    models: dict[str, pm.Model] = {}
    out = []
    for row in rows:
        name = row["model"]
        models.setdefault(name, pm.model(name))
        step = Step.from_row(row, models)
        for label, timing in STEP_PRICING[(row["phase"], row["timing"])]:
            out.append({"model": name, "phase": row["phase"], "batch": step.batch,
                        "kv_len": step.kv_len, "measured": row["timing"], "pricing": label,
                        "measured_s": float(row["measured_s"])}
                       | {n: step_seconds(step, hw, timing) for n, hw in files.items()})
    return out


def errors(table: list[dict], name: str) -> np.ndarray:
    return np.array([r[name] / r["measured_s"] - 1.0 for r in table])


def summary(table: list[dict], names: tuple[str, ...],
            key: Callable[[dict], tuple]) -> list[tuple]:
    """Per group (``key``): count, median measured us, and per file median |error| and
    median signed error."""
    groups: dict[tuple, list[dict]] = {}
    for r in table:
        groups.setdefault(key(r), []).append(r)
    out = []
    for k, part in groups.items():
        cells = [len(part), 1e6 * float(np.median([r["measured_s"] for r in part]))]
        for name in names:
            err = errors(part, name)
            err = err[np.isfinite(err)]
            cells += [float(np.median(np.abs(err))) if len(err) else math.nan,
                      float(np.median(err)) if len(err) else math.nan]
        out.append((*k, *cells))
    return out


def read_steps(path: Path) -> list[dict]:
    """Rows of a steps.csv (validate/probe_steps.py: ``Step.row`` columns, ``measured_s``,
    ``timing``); ``compare.read_measurements`` reads kernel rows only."""
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def files_for(dev: Device) -> dict[str, pm.Hardware]:
    return {"shipped": pm.hardware(dev.shipped),
            "calibrated": pm.load_hardware(ROOT / dev.calibrated)}


def analyse(dev: Device, limit: int | None = None) -> dict:
    """Probe and step tables of ``dev`` (``limit``: the first rows of each CSV only)."""
    files = files_for(dev)
    probe = read_measurements(dev.path("probe.csv"))[:limit]
    steps = read_steps(dev.path("steps.csv"))[:limit]
    return {"device": dev, "files": files, "probe": probe_table(probe, files),
            "steps": step_table(steps, files)}


def main(argv: list[str] | None = None) -> None:
    if not __package__:     # run as a file (python reports/device/analyse.py): the checkout
        sys.path.insert(0, str(ROOT))
    from reports.device.write import write_readme  # the markdown, kept apart

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE / "README.md")
    args = parser.parse_args(argv)
    results = [analyse(dev) for dev in DEVICES]
    args.out.write_text(write_readme(results))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
