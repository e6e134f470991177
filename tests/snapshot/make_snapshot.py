"""Write tests/snapshot/estimates.json.gz (the old core's numbers for every configuration)
and tests/snapshot/ops.json.gz (its time of single operators, as ``compare`` predicted them).

Run once, before the core v2 rewrite, on the code it replaced (commit e375a66):

    git worktree add /tmp/old e375a66 && cd /tmp/old && python -m tests.snapshot.make_snapshot

It uses that core's API (``perfmodel.report``, ``perfmodel.roofline``, ``decode_samples``),
so it does not run on the current code; tests/test_snapshot.py checks that the current core
reproduces every number.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import perfmodel as pm
from perfmodel.compare import row_op
from perfmodel.specs import SpecError
from tests.snapshot.configs import OP_DEVICES, configs, device, op_rows, with_operators

OUT = Path(__file__).with_name("estimates.json.gz")
OPS_OUT = Path(__file__).with_name("ops.json.gz")


EXACT_KEYS = ("tpot_s", "e2e_s", "throughput_tokens_per_s", "decode_tokens_per_s", "decode")


def exact_decode(dev: str, model: str, fields: dict, ops: bool) -> dict:
    """The decode numbers with every decode step evaluated (no trapezoid sampling)."""
    from perfmodel import report  # the old core's module (see the docstring)

    est = pm.estimate(device(dev), pm.model(model), pm.Workload(**fields),
                      decode_samples=10**6)
    full = json.loads(report.to_json(est, with_ops=ops))
    out = {k: full[k] for k in EXACT_KEYS}
    if ops:
        out["operators"] = [o for o in full["operators"] if o["phase"] == "decode"]
    return out


def main() -> None:
    from perfmodel.roofline import op_time

    from perfmodel import report  # the old core's modules (see the docstring)

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
