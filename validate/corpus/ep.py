"""Fit DeepEP's dispatch / combine constants (``efficiency.ep_kernels``, ``cost.ep``) per
device x engine on the kernel corpus's ``ep_dispatch`` / ``ep_combine`` rows, with held-out
and leave-one-device-out errors, and write them into the hardware files (no torch).

Per device x engine, bounded least squares on log(predicted / measured) (scipy
``least_squares``, soft-L1, each kernel weighted equally) of, per kernel present, its fixed
cost, NVLink share, copy rate per SM and cost per token copy, and across nodes (rows with
``nodes`` > 1 only) its NIC share and extra fixed cost. Held out: 5 folds by MoE shape
(hidden, experts, top-k); leave one device out: the family's other devices of the same
engine fitted together; each kernel alone (they share no constant).
Before: the step's earlier formula (``collectives.all_to_all_parts``
over every (token, expert) pair's bytes, spread evenly).

    python -m validate.corpus.ep --from <corpus> -H h100-sxm -H h200-sxm -H b200 -H b300 \
        -H gb200 -H gb300 --report reports/kernels/deepep [--write-hardware]
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import yaml

import perfmodel as pm
from perfmodel.compare import forms
from perfmodel.compare.rows import _column
from perfmodel.cost import ep
from perfmodel.cost.collectives import all_to_all_parts
from perfmodel.kernels.corpus import corpus_files, read_file, split_name
from perfmodel.specs.hardware import Hardware
from validate.corpus import write as kw
from validate.corpus.calibrate import family_of

COMMAND = ("python -m validate.corpus.ep --from <corpus> -H h100-sxm -H h200-sxm -H b200 "
           "-H b300 -H gb200 -H gb300 --write-hardware")
ENGINES = ("vllm", "sglang", "trtllm")
FOLDS = 5
RECORD_FIELDS = ("payload", "link_bytes", "network_bytes", "copies", "nodes", "sms",
                 "kernel", "devices")
# per field: (unit in the parameter vector, lower, upper, start); every one physical:
# a fixed cost of a launch and a flag handshake (0.5 us .. 1 ms), a share of the link or NIC
# (2% .. 100%), a per-SM copy rate (1 .. 100 GB/s: an SM's load/store path), an SM's
# cost per token copy (0 .. 2 us: a few flag writes and queue-slot waits)
BOUNDS = {"latency_s": (1e-6, 0.5, 1000.0, 20.0), "link_fraction": (1.0, 0.02, 1.0, 0.6),
          "network_fraction": (1.0, 0.02, 1.0, 0.8),
          "sm_bytes_per_s": (1e9, 1.0, 100.0, 20.0),
          "network_latency_s": (1e-6, 0.0, 1000.0, 10.0),
          "copy_s": (1e-9, 0.0, 2000.0, 10.0)}

# the second start: a link-bound kernel with fast SMs and a real per-copy cost
STARTS = ({}, {"link_fraction": 0.9, "sm_bytes_per_s": 60.0, "copy_s": 300.0,
               "latency_s": 40.0})


@dataclass
class EpSet:
    """One device x engine's DeepEP rows as records, ready to price many times."""

    name: str
    engine: str
    hw: Hardware
    record: object
    measured: np.ndarray
    kernel: np.ndarray
    shape: np.ndarray
    pairs: np.ndarray           # bytes of every (token, expert) pair (``before``)
    versions: list[str] = field(default_factory=list)

    def subset(self, keep: np.ndarray) -> EpSet:
        r = self.record
        pick = {k: np.asarray(getattr(r, k))[keep] for k in RECORD_FIELDS}
        return replace(self, record=replace(r, **pick), measured=self.measured[keep],
                       kernel=self.kernel[keep], shape=self.shape[keep],
                       pairs=self.pairs[keep])


def load_set(name: str, engine: str, folder: str | Path) -> EpSet | None:
    """``name``'s DeepEP rows under ``engine`` in the corpus ``folder`` (None: none)."""
    import pandas as pd

    frames = [read_file(p) for p in corpus_files(folder, [name], [engine])
              if split_name(p) == (name, engine)]
    frames = [f[f["op"].isin(forms.EP_OPS)] for f in frames]
    frames = [f for f in frames if len(f)]
    if not frames:
        return None
    df = pd.concat(frames, ignore_index=True)
    hw = pm.hardware(name, engine)
    records, measured, shape, pairs = [], [], [], []
    for kind in forms.EP_OPS:
        part = df[df["op"] == kind].to_dict("records")
        if not part:
            continue
        line = list(range(len(part)))

        def col(key: str, part: list = part, line: list = line) -> np.ndarray:
            return _column(part, key, "corpus", line)

        rec = forms.ep_row_parts(kind, part, col, hw, "corpus", line)[0][0]
        records.append(rec)
        measured.append([float(r["measured_s"]) for r in part])
        shape += [f"{r['n']}x{r['experts']}x{r['topk']}" for r in part]
        elem = np.array([ep.PAYLOAD[str(r.get("dtype") or "bf16")] for r in part])
        pairs.append(col("m") * col("topk") * ep.token_bytes(rec.kernel, col("n"), elem,
                                                             col("topk")))
    rec = _concat(records)
    versions = sorted(set(df["engine_version"].astype(str)))
    return EpSet(name, engine, hw, rec, np.concatenate(measured),
                 np.asarray(rec.kernel, dtype=int), np.array(shape), np.concatenate(pairs),
                 versions)


def _concat(records: list) -> object:
    return replace(records[0], **{k: np.concatenate([np.broadcast_to(
        np.asarray(getattr(r, k), dtype=float), np.shape(r.payload)) for r in records])
        for k in RECORD_FIELDS})


def _with(hw: Hardware, table: dict) -> Hardware:
    return replace(hw, efficiency=replace(hw.efficiency, ep_kernels=table))


def predict(s: EpSet, table: dict | None = None) -> np.ndarray:
    """Seconds of every row of ``s`` under ``table`` (None: the shipped file's)."""
    hw = s.hw if table is None else _with(s.hw, table)
    r = s.record
    return ep.ep_parts(hw, r.kernel, ep.Traffic(r.payload, r.link_bytes, r.network_bytes,
                                                r.copies), r.nodes, r.sms).total


def before(s: EpSet) -> np.ndarray:
    """The earlier formula: every (token, expert) pair's bytes spread evenly over the
    devices (``all_to_all_parts``), as the step priced DeepEP before ``cost.ep``."""
    r = s.record
    return all_to_all_parts(s.hw, r.devices, s.pairs, r.nodes).total


def _names(s: EpSet) -> list[tuple[str, str]]:
    """(kernel, field) of the parameters the rows of ``s`` can fix."""
    multi = np.asarray(s.record.nodes) > 1
    out = []
    for code, kernel in enumerate(ep.KERNELS):
        mine = s.kernel == code
        if not mine.any():
            continue
        out += [(kernel, "latency_s"), (kernel, "link_fraction")]
        out += [(kernel, "sm_bytes_per_s"), (kernel, "copy_s")]
        if (mine & multi).any():
            out += [(kernel, "network_fraction"), (kernel, "network_latency_s")]
    return out


def _table(names: list[tuple[str, str]], x: np.ndarray) -> dict:
    values: dict[str, dict[str, float]] = {}
    for (kernel, name), v in zip(names, x, strict=True):
        values.setdefault(kernel, {})[name] = float(v) * BOUNDS[name][0]
    table = {}
    for kernel, v in values.items():
        table[kernel] = tuple(v.get(f, d) for f, d in zip(
            ep.FIELDS, (20e-6, 0.6, 1.0, 0.0, 0.0, 0.0), strict=True))
    return table


def fit(sets: list[EpSet]) -> dict:
    """One ``ep_kernels`` table for ``sets`` together (module doc); the kernels share no
    constant, so each is fitted alone on its rows."""
    table = {}
    for code in range(len(ep.KERNELS)):
        mine = [s.subset(s.kernel == code) for s in sets if (s.kernel == code).any()]
        if mine:
            table |= _fit_kernel(mine)
    return table


def _fit_kernel(sets: list[EpSet]) -> dict:
    """The constants of the one kernel all rows of ``sets`` run, the best of ``STARTS``."""
    from scipy.optimize import least_squares

    names = sorted({n for s in sets for n in _names(s)})
    lo = np.array([BOUNDS[f][1] for _, f in names])
    hi = np.array([BOUNDS[f][2] for _, f in names])
    weights = [np.full(len(s.measured), 1.0 / np.sqrt(len(s.measured) * len(sets)))
               for s in sets]

    def residuals(x: np.ndarray) -> np.ndarray:
        table = _table(names, x)
        return np.concatenate([w * np.log(predict(s, table) / s.measured)
                               for s, w in zip(sets, weights, strict=True)])

    best = None
    for start in STARTS:        # the max() of three terms has local minima: two starts
        x = np.clip([start.get(f, BOUNDS[f][3]) for _, f in names], lo, hi)
        out = least_squares(residuals, x, bounds=(lo, hi), loss="soft_l1", f_scale=0.1,
                            x_scale=np.maximum(np.abs(x), 1e-3))
        if best is None or out.cost < best.cost:
            best = out
    return _table(names, best.x)


def folds(s: EpSet) -> np.ndarray:
    """Fold of each row: its MoE shape's rank among the set's shapes, modulo ``FOLDS``."""
    keys = sorted(set(s.shape))
    rank = {k: i for i, k in enumerate(keys)}
    return np.array([rank[k] % FOLDS for k in s.shape])


def held_out(s: EpSet) -> np.ndarray:
    """Each row predicted by a fit on the other folds' rows."""
    fold = folds(s)
    out = np.empty(len(s.measured))
    for f in sorted(set(fold)):
        test = fold == f
        if test.all():
            out[test] = predict(s, fit([s]))
            continue
        out[test] = predict(s.subset(test), fit([s.subset(~test)]))
    return out


def errors(pred: np.ndarray, s: EpSet) -> np.ndarray:
    return pred / s.measured - 1.0


@dataclass
class Result:
    s: EpSet
    table: dict
    before: np.ndarray
    held: np.ndarray
    lodo: np.ndarray | None = None


def run(names: list[str], folder: str | Path, engines: tuple[str, ...] = ENGINES
        ) -> dict[tuple[str, str], Result]:
    """Every device x engine's fit, held-out and leave-one-device-out errors."""
    sets = {(n, e): s for e in engines for n in names
            if (s := load_set(n, e, folder)) is not None}
    out = {}
    for key, s in sets.items():
        out[key] = Result(s, fit([s]), errors(before(s), s), errors(held_out(s), s))
        print(f"{key[0]} {key[1]}: held-out {np.median(np.abs(out[key].held)):.1%}",
              flush=True)
    for (name, engine), r in out.items():
        others = [o for (n, e), o in sets.items() if e == engine and n != name
                  and family_of(n) == family_of(name)]
        if others:
            r.lodo = errors(predict(r.s, fit(others)), r.s)
    return out


def _median(err: np.ndarray | None) -> str:
    return "-" if err is None or not len(err) else f"{np.median(np.abs(err)):.1%}"


def table_md(results: dict[tuple[str, str], Result]) -> tuple[str, dict]:
    """The per device x engine x kernel table and the medians over its groups."""
    lines = ["| device | engine | kernel | rows | before | held-out | held-out bias | "
             "leave-one-device-out |", "|---|---|---|---:|---:|---:|---:|---:|"]
    groups = {"before": [], "held": [], "lodo": []}
    for (name, engine), r in sorted(results.items()):
        for code, kernel in enumerate(ep.KERNELS):
            mine = r.s.kernel == code
            if not mine.any():
                continue
            lodo = None if r.lodo is None else r.lodo[mine]
            lines.append(f"| {name} | {engine} | {kernel} | {int(mine.sum())} | "
                         f"{_median(r.before[mine])} | {_median(r.held[mine])} | "
                         f"{np.median(r.held[mine]):+.1%} | {_median(lodo)} |")
            groups["before"].append(np.median(np.abs(r.before[mine])))
            groups["held"].append(np.median(np.abs(r.held[mine])))
            if lodo is not None:
                groups["lodo"].append(np.median(np.abs(lodo)))
    return "\n".join(lines), {k: (float(np.median(v)) if v else None, len(v))
                              for k, v in groups.items()} | {
        "held_le_15": int(sum(v <= 0.15 for v in groups["held"]))}


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.1%}"


def _flow(table: dict) -> dict:
    """``ep_kernels`` as the files write it (seconds in us, rates in GB/s)."""
    out = {}
    for kernel, row in table.items():
        v = dict(zip(ep.FIELDS, row, strict=True))
        out[kernel] = {"latency_s": f"{v['latency_s'] * 1e6:.4g} us",
                       "link_fraction": round(v["link_fraction"], 4)}
        if v["sm_bytes_per_s"]:
            out[kernel]["sm_bytes_per_s"] = f"{v['sm_bytes_per_s'] / 1e9:.4g} GB/s"
        if v["copy_s"] >= 1e-12:        # below a picosecond: the fit's lower bound, 0
            out[kernel]["copy_s"] = f"{v['copy_s'] * 1e6:.4g} us"
        if v["network_latency_s"] or v["network_fraction"] != 1.0:
            out[kernel]["network_fraction"] = round(v["network_fraction"], 4)
            out[kernel]["network_latency_s"] = f"{v['network_latency_s'] * 1e6:.4g} us"
    return out


def _note(r: Result) -> str:
    return (f"fit on {len(r.s.measured)} DeepEP dispatch/combine rows "
            f"({', '.join(r.s.versions)}): held-out {_median(r.held)}, leave one device out "
            f"{_median(r.lodo)}; python -m validate.corpus.ep, cost/ep.py")


def _flow_line(table: dict) -> str:
    return yaml.safe_dump({"ep_kernels": _flow(table)}, default_flow_style=True,
                          width=10**6).strip()[1:-1]


def hardware_text(text: str, mine: dict[str, tuple[dict, str]]) -> str:
    """A shipped hardware YAML with each engine's ``ep_kernels`` (engine -> (table, note)),
    written as text so that every other line and comment stays: one flow line in the
    top-level efficiency for vLLM (the engine the top level describes), in
    ``engines.<engine>.efficiency`` for the others, each under a comment with its fit."""
    lines = text.splitlines(keepends=True)
    for engine, (table, note) in mine.items():
        if engine == "vllm":
            start, end, indent = *kw._block_span(lines, "efficiency"), 2
        else:
            start, end, indent = *_engine_efficiency(lines, engine), 6
        pad = " " * indent
        body = [x for x in lines[start:end] if not x.startswith(f"{pad}ep_kernels:")
                and not x.startswith(f"{pad}# ep_kernels:")]
        new = [f"{pad}# ep_kernels: {note}\n", f"{pad}{_flow_line(table)}\n"]
        lines = lines[:start] + new + body + lines[end:]
    return "".join(lines)


def _engine_efficiency(lines: list[str], engine: str) -> tuple[int, int]:
    """(first line after ``engines.<engine>.efficiency:``, end); the block is added after
    ``engines.<engine>:`` (and ``engines:`` at the end) where the file has none."""
    top = next((i for i, x in enumerate(lines) if x.rstrip() == "engines:"), None)
    if top is None:
        lines += ["engines:\n"]
        top = len(lines) - 1
    head = next((i for i in range(top + 1, len(lines)) if lines[i].rstrip() == f"  {engine}:"
                 ), None)
    if head is None:
        lines.insert(top + 1, f"  {engine}:\n")
        head = top + 1
    eff = next((i for i in range(head + 1, len(lines)) if not lines[i].startswith("    ")
                or lines[i].rstrip() == "    efficiency:"), len(lines))
    if eff >= len(lines) or lines[eff].rstrip() != "    efficiency:":
        lines.insert(head + 1, "    efficiency:\n")
        eff = head + 1
    end = next((i for i in range(eff + 1, len(lines)) if lines[i].strip()
                and not lines[i].startswith("      ")), len(lines))
    return eff + 1, end


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--from", dest="source", required=True)
    p.add_argument("-H", "--hardware", action="append", required=True)
    p.add_argument("--engine", action="append", choices=ENGINES)
    p.add_argument("--report", default="reports/kernels/deepep")
    p.add_argument("--write-hardware", action="store_true")
    a = p.parse_args(argv)
    results = run(a.hardware, a.source, tuple(a.engine or ENGINES))
    md, med = table_md(results)
    report = Path(a.report)
    report.mkdir(parents=True, exist_ok=True)
    (report / "calibration.md").write_text(
        "# DeepEP dispatch and combine: per device x engine x kernel\n\n"
        f"Regenerate: `{COMMAND}`\n\nMedian |predicted/measured - 1|: before (the earlier "
        "even all-to-all of every pair's bytes), held out (5 folds by MoE shape), held-out "
        "signed median, leave one device out (the family's other devices, same engine).\n\n"
        f"Median over the {med['held'][1]} groups: before {med['before'][0]:.1%}, held out "
        f"{med['held'][0]:.1%} ({med['held_le_15']} of {med['held'][1]} <= 15%), leave one "
        f"device out {_pct(med['lodo'][0])} ({med['lodo'][1]} groups).\n\n" + md + "\n")
    print(f"groups {med['held'][1]}: before {med['before'][0]:.1%}, held-out "
          f"{med['held'][0]:.1%} ({med['held_le_15']} <= 15%), lodo {_pct(med['lodo'][0])}")
    if a.write_hardware:
        for name in a.hardware:
            path = kw.shipped_path(name)
            mine = {e: (r.table, _note(r)) for (n, e), r in results.items() if n == name}
            path.write_text(hardware_text(path.read_text(), mine))
            print(f"wrote {path}")


if __name__ == "__main__":
    main()
