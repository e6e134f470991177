"""The page's questions answered by the CLI's own functions: what can be chosen, one
estimate (the JSON of ``perfmodel estimate --format json --breakdown``, plus the roofline's
points), and the estimate against batch. No formula lives here: each number is the CLI's.
"""

from __future__ import annotations

import json
import math
from typing import Any

from perfmodel.ui.options import Uploads, arguments, line, parse

NOT_OPTIONS = ("fmt", "breakdown", "energy", "prices")    # output options, not the estimate's
CURVE_MAX_BATCH = 1024


def choices() -> dict[str, Any]:
    """Shipped models and devices (with a one-line description), dtypes, weight formats
    and engines: the page's pick lists."""
    from perfmodel.specs import load
    from perfmodel.specs.dtypes import DTYPES
    from perfmodel.specs.engines import ENGINES
    from perfmodel.specs.formats import format_names

    return {"models": load.known("model"),
            "hardware": [{"name": n, "description": load.hardware(n).description}
                         for n in load.known("hardware")],
            "dtypes": list(DTYPES), "weights_formats": list(format_names()),
            "engines": list(ENGINES)}


def _estimate(settings: dict[str, Any], uploads: Uploads) -> tuple[Any, list[str], list[str]]:
    """(the Estimate, the arguments shown, dropped settings) of the page's settings."""
    from perfmodel.cli.errors import raising
    from perfmodel.cli.estimate import compute

    args, shown, dropped = arguments("estimate", settings, uploads)
    params = parse("estimate", args, uploads)
    with raising():
        result = compute(**{k: v for k, v in params.items() if k not in NOT_OPTIONS})
    return result, shown, dropped


def estimate(settings: dict[str, Any], uploads: Uploads) -> dict[str, Any]:
    """``perfmodel estimate --format json --breakdown`` of the settings (``estimate``),
    the roofline's operators and roofs, and the command lines of both views."""
    from perfmodel.report import plots, tables

    result, shown, dropped = _estimate(settings, uploads)
    points = plots.roofline_points(result.model, result.hardware, result.workload,
                                   ("prefill", "decode"), result.plan)
    dtypes = list(dict.fromkeys(p["dtype"] for p in points if p["plotted"])) or ["bf16"]
    _, roof_shown, roof_dropped = arguments("roofline", settings, uploads)
    return {"estimate": json.loads(tables.to_json(result, with_ops=True)),
            "command": line("estimate", shown, "--format", "json", "--breakdown"),
            "dropped": dropped,
            "roofline": {"points": [_finite(p) for p in points if p["plotted"]],
                         "roofs": plots.roof_lines(result.hardware, dtypes),
                         "command": line("roofline", roof_shown, "--out", "roofline.svg"),
                         "dropped": [f for f in roof_dropped if f not in dropped]}}


def _finite(row: dict) -> dict:
    """JSON has no infinity: an operator with no bytes gets intensity None."""
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v)
            for k, v in row.items()}


def curve(settings: dict[str, Any], uploads: Uploads) -> dict[str, Any]:
    """The estimate at batch 1, 2, 4, ... up to the largest that fits (at most
    ``CURVE_MAX_BATCH``) and the settings' own batch: TTFT, TPOT, throughput (and their
    bands where the device has one), each exactly ``perfmodel estimate`` at that batch."""
    from perfmodel.report import tables

    base = dict(settings)
    first = _estimate(base, uploads)[0]
    top = max(1, min(first.memory.max_batch or 1, CURVE_MAX_BATCH))
    batches = sorted({*(2 ** k for k in range(11) if 2 ** k <= top),
                      int(base.get("batch") or 1)})
    rows = []
    for b in batches:
        result = first if b == int(base.get("batch") or 1) else \
            _estimate(dict(base, batch=b), uploads)[0]
        record = json.loads(tables.to_json(result))
        rows.append({"batch": b, "fits": record["fits"],
                     **{k: v for k, v in record.items()
                        if k.startswith(("ttft_s", "tpot_s", "throughput_tokens_per_s",
                                         "decode_tokens_per_s", "e2e_s"))}})
    sweep_settings = {k: v for k, v in base.items() if k not in ("batch", "prompt")}
    _, sweep_shown, dropped = arguments("sweep", sweep_settings, uploads)
    return {"rows": rows,
            "command": line("sweep", sweep_shown, "--batch", ",".join(map(str, batches)),
                            "--prompt", str(base.get("prompt") or 512), "--out", "sweep",
                            "--no-figures"),
            "dropped": dropped}
