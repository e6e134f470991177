"""The model's error over a corpus: every device's rows predicted with its shipped hardware
file, grouped by device x engine x error class x regime.

Rows are drawn per device x engine x stratum (the error class a row's op and shape put it
in) with a seeded generator, at most ``sample`` of each, so that a run over every device
stays within minutes and every class is represented however many rows of it the source
holds. Each row is predicted as the kernels its measured call ran (``compare.forms``),
timed as the row says it was measured (column ``timing``). Its error class is
``cost.error_class`` of its primary record (a MoE layer row: ``moe`` even where the experts
one device touches average under two); its regime is compute or memory (``compare.errors``)
and, for collectives, the algorithm and the message size.

Rows with no formula (an op the registry has no row form for), an unknown dtype or a shape
column below 1 are counted per device x engine x op, never dropped silently.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np

from perfmodel.compare.errors import predict_rows
from perfmodel.compare.rows import SUPPORTED_OPS, records
from perfmodel.cost.attention_kernels import for_kernel
from perfmodel.cost.error_class import GEMV_ROWS, error_class
from perfmodel.kernels.corpus import corpus_files, read_file, split_name
from perfmodel.specs.dtypes import CODE
from perfmodel.specs.errors import SpecError
from perfmodel.specs.kinds import KINDS

# message-size buckets of collective rows (bytes per device)
SIZE_EDGES = (64 * 2**10, 2**20, 16 * 2**20)
SIZE_NAMES = ("<64KiB", "64KiB-1MiB", "1-16MiB", ">=16MiB")
COLLECTIVES = ("all_reduce", "all_to_all")
EP_OPS = ("ep_dispatch", "ep_combine")        # DeepEP's kernels (``cost.ep``)


def strata(df) -> np.ndarray:
    """The error class each row's op and shape put it in (``cost.error_class``'s rules on
    the row's columns: sampling strata)."""
    op = df["op"].to_numpy(dtype=object)
    m = _num(df["m"])
    q = _num(df["q_len"])
    out = np.where(np.isin(op, (*COLLECTIVES, *EP_OPS)), "collective", "memory").astype(object)
    out = np.where(op == "moe", "moe", out)
    out = np.where(op == "gemm", np.where(m < GEMV_ROWS, "gemv", "gemm"), out)
    return np.where(op == "attention", np.where(q <= 1, "attention_decode",
                                                "attention_prefill"), out)


def _num(column) -> np.ndarray:
    import pandas as pd

    return pd.to_numeric(column, errors="coerce").to_numpy(dtype=float)


def usable(df) -> tuple[np.ndarray, Counter]:
    """(mask of rows the model can predict, counts of the others by reason and op)."""
    skipped: Counter = Counter()
    op = df["op"].to_numpy(dtype=object)
    ok = np.isin(op, SUPPORTED_OPS)
    for name in sorted(set(op[~ok])):
        skipped[f"{name}: no formula"] += int((op == name).sum())
    dtype_ok = df["dtype"].replace("", "bf16").isin(list(CODE)).to_numpy()
    for name in sorted(set(op[ok & ~dtype_ok])):
        skipped[f"{name}: unknown dtype"] += int((ok & ~dtype_ok & (op == name)).sum())
    ok &= dtype_ok
    for kind in sorted(set(op[ok])):
        mine = ok & (op == kind)
        good = np.ones(len(df), dtype=bool)
        for column in KINDS[kind].row:
            good &= np.nan_to_num(_num(df[column]), nan=0.0) >= 1
        if (bad := mine & ~good).any():
            skipped[f"{kind}: a shape column below 1"] += int(bad.sum())
        ok &= ~mine | good
    return ok, skipped


def sample_rows(df, sample: int, seed: int):
    """At most ``sample`` rows of each stratum (all when ``sample`` is 0), seeded."""
    if not sample:
        return df
    rng = np.random.default_rng(seed)
    keys = strata(df)
    picked = []
    for key in sorted(set(keys)):
        index = np.flatnonzero(keys == key)
        if len(index) > sample:
            index = np.sort(rng.choice(index, sample, replace=False))
        picked.append(index)
    return df.iloc[np.concatenate(picked)] if picked else df.iloc[0:0]


def regimes(rows: list[dict]) -> list[str]:
    """compute | memory, a collective's ``algorithm size-bucket``, a DeepEP kernel's ``deepep
    <mode> <phase>``; `` eager`` added
    where the row was not timed as device time alone (timing stream or host: launched from
    Python one call at a time, so its floor is the framework's host time per call)."""
    out = []
    for r in rows:
        if r["op"] in EP_OPS:
            name = f"deepep {r.get('mode') or ''} {r['op'].removeprefix('ep_')}"
        elif r["op"] in COLLECTIVES:
            size = SIZE_NAMES[int(np.searchsorted(SIZE_EDGES, float(r["message_bytes"]), "right"))]
            name = f"{r.get('algorithm') or 'nccl'} {size}"
        else:
            name = r["regime"]
        out.append(name if r.get("timing") in ("", "kernel", None) else f"{name} eager")
    return out


def score(rows: list[dict], hw) -> list[dict]:
    """``rows`` predicted on ``hw`` with ``error_class`` and ``regime`` set; an attention
    row on the profile of the kernel it timed (``cost.attention_kernels.for_kernel``; its
    FP8 instantiation where the call computes in FP8)."""
    views = [for_kernel(hw, _kernel(r)) if r["op"] == "attention" else hw for r in rows]
    if all(v is hw for v in views):
        return _score(rows, hw)
    out: list[dict] = [{} for _ in rows]
    for view in {id(v): v for v in views}.values():
        index = [i for i, v in enumerate(views) if v is view]
        for i, row in zip(index, _score([rows[i] for i in index], view), strict=True):
            out[i] = row
    return out


def _kernel(row: dict) -> str:
    value = row.get("kernel")
    return value if isinstance(value, str) else ""


def _score(rows: list[dict], hw) -> list[dict]:
    out = predict_rows(rows, hw, timing="auto", where="corpus")
    for index, op in records(rows, "corpus"):
        classes = error_class(op)
        for j, i in enumerate(index):
            out[i]["error_class"] = "moe" if rows[i]["op"] == "moe" else str(classes[j])
    for r, regime in zip(out, regimes(out), strict=True):
        r["regime"] = regime
    return out


def device_for(device: str, engine: str, cache: dict):
    """``perfmodel/hardware/<device>.yaml`` as ``engine`` runs it (its ``engines.<engine>``
    block for vllm, sglang and trtllm; the top-level figures for any other source, e.g. nccl or
    vidur); None when the device has no hardware file. Cached in ``cache``."""
    from perfmodel.specs.engines import DEFAULT_ENGINE, ENGINES
    from perfmodel.specs.load import hardware

    view = engine if engine in ENGINES else DEFAULT_ENGINE
    if (device, view) not in cache:
        try:
            cache[(device, view)] = hardware(device, view)
        except SpecError:
            cache[(device, view)] = None
    return cache[(device, view)]


def compare_files(folder: str | Path, devices: Iterable[str] | None = None,
                  engines: Iterable[str] | None = None, sample: int = 3000, seed: int = 0,
                  progress: Callable[[str], None] = lambda s: None) -> dict:
    """Score the corpus under ``folder``: {"rows": scored rows (pandas), "skipped": counts
    by (device, engine, reason), "no_hardware": devices without a hardware file,
    "available": rows the model could predict per (device, engine)}."""
    import pandas as pd

    files = corpus_files(folder, devices, engines)
    scored, skipped, missing, available = [], {}, [], {}
    loaded: dict[tuple[str, str], object] = {}
    for path in files:
        device, engine = split_name(path)
        hw = device_for(device, engine, loaded)
        if hw is None:
            if device not in missing:
                missing.append(device)
            progress(f"{path.name}: no perfmodel/hardware/{device}.yaml: not scored")
            continue
        df = read_file(path)
        ok, why = usable(df)
        skipped[(device, engine)] = why
        available[(device, engine)] = int(ok.sum())
        part = sample_rows(df[ok], sample, seed)
        rows = score(part.to_dict("records"), hw)
        scored.append(pd.DataFrame(rows))
        progress(f"{path.name}: {len(rows)} of {int(ok.sum())} rows scored")
    if not scored:
        raise SpecError(f"{folder}: no corpus file of a device with a hardware file "
                        f"(without one: {', '.join(missing)})")
    rows = pd.concat(scored, ignore_index=True)
    rows["measured_s"] = pd.to_numeric(rows["measured_s"])
    return {"rows": rows, "skipped": skipped,
            "no_hardware": missing, "available": available}
