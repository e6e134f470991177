"""Write tests/snapshot/estimates.json.gz (today's numbers for every configuration) and
tests/snapshot/ops.json.gz (today's time of single operators, as ``compare`` predicts them).

    python -m tests.snapshot.make_snapshot

Run once, before the core v2 rewrite, on the code it replaces; tests/test_snapshot.py
checks that the rewritten core reproduces every number.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import replace
from pathlib import Path

import perfmodel as pm
from perfmodel import report
from perfmodel.specs import SpecError
from perfmodel.compare import row_op
from perfmodel.roofline import op_time
from tests.snapshot.configs import DEVICES, OP_DEVICES, configs, op_rows, with_operators

OUT = Path(__file__).with_name("estimates.json.gz")
OPS_OUT = Path(__file__).with_name("ops.json.gz")


def device(name: str) -> pm.Hardware:
    path, append_kv = DEVICES[name]
    hw = pm.hardware(path)
    if append_kv:
        hw = replace(hw, efficiency=replace(hw.efficiency, attention_append_kv=True))
    return hw


EXACT_KEYS = ("tpot_s", "e2e_s", "throughput_tokens_per_s", "decode_tokens_per_s", "decode")


def exact_decode(dev: str, model: str, fields: dict, ops: bool) -> dict:
    """The decode numbers with every decode step evaluated (no trapezoid sampling)."""
    est = pm.estimate(device(dev), pm.model(model), pm.Workload(**fields),
                      decode_samples=10**6)
    full = json.loads(report.to_json(est, with_ops=ops))
    out = {k: full[k] for k in EXACT_KEYS}
    if ops:
        out["operators"] = [o for o in full["operators"] if o["phase"] == "decode"]
    return out


def main() -> None:
    records = []
    for i, (model, dev, fields) in enumerate(configs()):
        entry = {"model": model, "device": dev, "workload": fields}
        try:
            est = pm.estimate(device(dev), pm.model(model), pm.Workload(**fields))
            entry["estimate"] = json.loads(report.to_json(est, with_ops=with_operators(i)))
            entry["exact_decode"] = exact_decode(dev, model, fields, with_operators(i))
        except SpecError as exc:
            entry["error"] = str(exc)
        records.append(entry)
    OUT.write_bytes(gzip.compress(json.dumps(records).encode(), mtime=0))
    errors = sum("error" in r for r in records)
    print(f"wrote {OUT} ({len(records)} configurations, {errors} raise SpecError)")
    rows = op_rows()
    times = {dev: [op_time(row_op(r), device(dev), r["timing"]).time_s for r in rows]
             for dev in OP_DEVICES}
    OPS_OUT.write_bytes(gzip.compress(json.dumps({"rows": rows, "time_s": times}).encode(),
                                      mtime=0))
    print(f"wrote {OPS_OUT} ({len(rows)} operator rows x {len(times)} devices)")


if __name__ == "__main__":
    main()
