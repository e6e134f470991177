"""Formatting of an Estimate: text table, JSON, CSV, markdown. No computation here."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TextIO

import numpy as np

from perfmodel.schedules.estimate import Estimate, OpSummary
from perfmodel.schedules.weight_paths import class_formats
from perfmodel.specs.dtypes import DTYPE_BYTES, KV_SCALED
from perfmodel.specs.units import fmt_bytes, fmt_count, fmt_rate, fmt_time
from perfmodel.specs.workload import Workload, Workloads


def rows(e: Estimate) -> list[tuple[str, str]]:
    """(quantity, value) lines of the estimate table, values formatted with units."""
    wl, mem = e.workload, e.memory
    needed = mem.weights_bytes + mem.workspace_bytes + mem.kv_cache_bytes
    fit = "yes" if mem.fits else (f"NO: needs {fmt_bytes(needed)} of "
                                  f"{fmt_bytes(mem.usable_bytes)} usable")
    return [
        ("model", f"{e.model.name} ({fmt_count(e.params_total)} params, "
                  f"{fmt_count(e.params_active)} active, {e.model.attention_kind})"),
        ("hardware", f"{e.hardware.name} x{e.plan.devices} ({e.plan.describe()})"
         + (f"; busiest expert device {e.expert_imbalance:.3f}x the mean"
            if e.plan.ep > 1 else "") if e.plan.devices > 1 else e.hardware.name),
        ("workload", f"batch {wl.batch}, prompt {wl.prompt_len}, generate {wl.gen_len}; "
                     f"weights {wl.weights_dtype}{_groups(wl)}, activations {wl.act_dtype}, "
                     f"KV {wl.kv_dtype}{_kv_scales(wl)}"
                     + (f"; expert skew {wl.expert_skew:g}" if wl.expert_skew else "")),
        ("weights by class", "; ".join(f"{what}: {', '.join(c)}" for what, c in
                                       class_formats(e.hardware, e.model, wl))),
        ("weights / device", fmt_bytes(mem.weights_bytes)),
        ("KV cache / token", fmt_bytes(mem.kv_cache_bytes_per_token)),
        ("KV cache (batch)", fmt_bytes(mem.kv_cache_bytes)),
        ("workspace", fmt_bytes(mem.workspace_bytes)),
        ("fits", fit),
        ("max batch", str(mem.max_batch)),
        *(_latency_rows(e) if e.denoise is None else _denoise_rows(e)),
        ("end to end", fmt_time(e.e2e_s) + _band(e, "e2e_s", fmt_time)),
        ("throughput", f"{_rate(e, 'throughput_tokens_per_s')} overall" + (
            "" if e.denoise is not None else
            f", {_rate(e, 'decode_tokens_per_s')} in decode" if e.decode.steps
            else ", no decode steps")),
        ("band", e.band_note),
    ] + [("warning", w) for w in e.warnings if w != e.memory_warning]  # fits covers memory


def _band(e: Estimate, figure: str, fmt: Callable[[float], str]) -> str:
    """" (80%: low to high)" of ``figure`` (``Estimate.edges``), or nothing without a band."""
    edges = e.edges(figure)
    if edges is None:
        return ""
    unc = e.hardware.uncertainty
    flag = ", uncalibrated" if unc is not None and unc.uncalibrated else ""
    return f" (80%: {fmt(edges[0])} to {fmt(edges[1])}{flag})"


def _rate(e: Estimate, figure: str) -> str:
    return fmt_rate(getattr(e, figure), "tok/s") + _band(
        e, figure, lambda x: fmt_rate(x, "tok/s"))


def _latency_rows(e: Estimate) -> list[tuple[str, str]]:
    return [("TTFT (prefill)", f"{fmt_time(e.ttft_s)}{_band(e, 'ttft_s', fmt_time)}  "
                               f"[{e.prefill.bound}-bound, "
                               f"{fmt_count(e.prefill.flops)}FLOP, "
                               f"{fmt_bytes(e.prefill.bytes.total)}]"),
            *_prefix_rows(e), ("TPOT (decode mean)", _tpot(e)), *_speculation_rows(e)]


def _denoise_rows(e: Estimate) -> list[tuple[str, str]]:
    """A diffusion LM's: the whole output at once, then its time per token."""
    d = e.denoise
    return [("TTFT (whole output)", f"{fmt_time(e.ttft_s)}{_band(e, 'ttft_s', fmt_time)}  "
                                    f"[{d.steps} denoising steps, "
                                    f"{d.bound}-bound, {fmt_count(d.flops)}FLOP, "
                                    f"{fmt_bytes(d.bytes.total)}]"),
            ("TPOT (denoise / gen)", f"{fmt_time(e.tpot_s)}{_band(e, 'tpot_s', fmt_time)}  "
                                     f"[a step: first "
                                     f"{fmt_time(d.first_step_s)}, last "
                                     f"{fmt_time(d.last_step_s)}]")]


def _prefix_rows(e: Estimate) -> list[tuple[str, str]]:
    wl = e.workload
    if not wl.shared_prefix:
        return []
    hits = int(Workloads.from_list([wl]).prefix_hits[0])
    return [("prefix cache", f"{wl.shared_prefix} shared prompt tokens, {hits} of {wl.batch} "
                             f"requests hit; TTFT without it "
                             f"{fmt_time(e.ttft_without_prefix_cache_s)}")]


def _speculation_rows(e: Estimate) -> list[tuple[str, str]]:
    s = e.speculation
    if s is None:
        return []
    even = ("" if not s.searched else "; no break-even batch: it still pays at batch 4096"
            if s.break_even_batch is None else "; break-even batch: pays at no batch"
            if s.break_even_batch == 1 else f"; break-even batch {s.break_even_batch}")
    return [("speculation", f"{s.draft} K={s.k}: {s.tokens_per_round:.2f} tokens per round, "
                            f"{s.speedup:.2f}x plain decode (TPOT "
                            f"{fmt_time(s.plain_tpot_s)}){even}")]


def _groups(wl: Workload) -> str:
    notes = [f"{wl.outlier_fraction:.2%} of channels in 16 bits"] if wl.outlier_fraction \
        else []
    if wl.quantize_lm_head and DTYPE_BYTES[wl.weights_dtype] < 2:
        notes.append("LM head too")
    if not wl.weight_group_size:
        return f" ({'; '.join(notes)})" if notes else ""
    return f" (groups of {wl.weight_group_size}, {wl.weight_scale_bytes:g} B of scale each" \
        + "".join(f"; {n}" for n in notes) + ")"


def _kv_scales(wl: Workload) -> str:
    if wl.kv_group_size is None and wl.kv_dtype in KV_SCALED:
        return f" ({wl.kv_scale_bytes:g} B of scale per token and head)"
    if wl.kv_group_size:
        return f" (groups of {wl.kv_group_size}, {wl.kv_scale_bytes:g} B of scale each)"
    return ""


def _tpot(e: Estimate) -> str:
    if not e.decode.steps:
        return f"none (no decode step; the next would take {fmt_time(e.tpot_s)})"
    return (f"{fmt_time(e.tpot_s)}{_band(e, 'tpot_s', fmt_time)}  [{e.decode.bound}-bound; first "
            f"{fmt_time(e.decode.first_step_s)}, last {fmt_time(e.decode.last_step_s)}]")


def table(e: Estimate) -> str:
    lines = rows(e)
    width = max(len(k) for k, _ in lines)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in lines)


def markdown_table(header: Sequence[str], body: Iterable[Sequence[str]]) -> str:
    """A GitHub markdown table of text cells (the one table writer of the package)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in body]
    return "\n".join(lines)


def markdown(e: Estimate) -> str:
    return markdown_table(("quantity", "value"), rows(e))


_BREAKDOWN_COLS = ("phase", "name", "op_class", "count", "flops", "bytes", "intensity",
                   "time_s", "share", "bound")


def _breakdown_cols(e: Estimate) -> tuple[str, ...]:
    return _BREAKDOWN_COLS + (("error_class", "80% band") if e.band is not None else ())


def _breakdown_cells(e: Estimate, o: OpSummary) -> list[str]:
    phase_time = e.phase(o.phase).time_s
    share = o.time_s / phase_time if phase_time else 0.0
    band = [o.error_class, f"{fmt_time(o.band[0])} to {fmt_time(o.band[1])}"] \
        if e.band is not None and o.band is not None else []
    return [o.phase, o.name, o.op_class, f"{o.count:g}", fmt_count(o.flops),
            fmt_bytes(o.bytes.total), f"{o.intensity:.3g}", fmt_time(o.time_s),
            f"{share:.1%}", o.bound, *band]


def breakdown_note(e: Estimate) -> str:
    """What the breakdown's rows add up: each phase's rows are totals over its steps."""
    parts = [f"{p.name}: totals over {p.steps} step{'s' if p.steps != 1 else ''}"
             for p in e.phases]
    if e.speculation is not None:       # the decode phase is rounds: (G - 1) / E of them
        parts = [t if not t.startswith("decode") else
                 f"decode: totals over {e.decode.steps / e.speculation.tokens_per_round:.4g} "
                 f"speculative rounds for {e.decode.steps} tokens" for t in parts]
    dequant = (" The dequant row is the time weight-only GEMMs' in-kernel weight conversion "
               "adds beyond their max(compute, memory) (0 where it hides under them; no "
               "kernel of its own), taken out of the GEMM rows (cost/dequant.py)."
               if any(o.kind == "dequant" for o in e.ops) else "")
    return ("Each row sums the operator over every step of its phase (" + "; ".join(parts)
            + "); count is kernels over all steps. Divide by the steps for one step."
            + dequant)


def breakdown(e: Estimate) -> str:
    """Every operator of both phases: FLOPs, bytes, intensity, time, share and bound."""
    cols = _breakdown_cols(e)
    cells = [list(cols)] + [_breakdown_cells(e, o) for o in e.ops]
    widths = [max(len(row[i]) for row in cells) for i in range(len(cols))]
    return breakdown_note(e) + "\n" + "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in cells)


def breakdown_markdown(e: Estimate) -> str:
    """The breakdown as a markdown table."""
    return breakdown_note(e) + "\n\n" + markdown_table(
        _breakdown_cols(e), (_breakdown_cells(e, o) for o in e.ops))


def to_json(e: Estimate, with_ops: bool = False, energy: object = None) -> str:
    """The estimate's JSON; ``energy`` (an ``EnergySummary``, ``--energy``) adds its block."""
    out = e.to_dict()
    if energy is not None:
        out["energy"] = energy.to_dict()
    if with_ops:
        out["operators"] = [o.to_dict() for o in e.ops]
    return json.dumps(out, indent=2)


def flat_record(e: Estimate) -> dict:
    """One flat row (scalars only) for CSV and sweeps."""
    d = e.to_dict()
    # the calibration's provenance is a block (JSON); a row keeps the engine it names
    row = {k: v for k, v in d.items() if not isinstance(v, (dict, list)) and k != "calibration"}
    row["warnings"] = "; ".join(d["warnings"])
    row["kv_cache_bytes_per_sequence"] = e.memory.kv_cache_bytes_per_sequence
    row["usable_bytes"] = e.memory.usable_bytes
    row.update({f"workload_{k}": v for k, v in d["workload"].items()})
    row.update({f"speculation_{k}": ",".join(map(str, v)) if isinstance(v, list) else v
                for k, v in d.get("speculation", {}).items()})
    row.update(d["parallelism"])
    for phase in e.phases:
        row.update({f"{phase.name}_{k}": v for k, v in d[phase.name].items()
                    if not isinstance(v, dict)})
    return row


def to_csv(e: Estimate, with_ops: bool = False, energy: object = None) -> str:
    """The estimate's row (or its operators'); ``energy`` (an ``EnergySummary``) adds the
    energy columns to the row."""
    buf = io.StringIO()
    rows = [o.to_dict() for o in e.ops] if with_ops else [flat_record(e)]
    if energy is not None and not with_ops:
        d = energy.to_dict()
        rows[0] |= {f"energy_{k}": v for k, v in d.items() if not isinstance(v, dict)
                    and k != "note"}
        rows[0] |= {f"energy_{ph}_{k}": v for ph in (p.name for p in energy.phases)
                    for k, v in d[ph].items()}
        rows[0] |= {f"usd_per_million_tokens_{k}": v for k, v in
                    d.get("usd_per_million_tokens", {}).items()}
    writer = csv.DictWriter(buf, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue()


def column_cells(columns: dict[str, np.ndarray | list]) -> Iterator[list[str]]:
    """The header, then one row of text cells per point of ``columns`` (as ``sweep``
    returns them): floats to 10 significant digits, None and NaN blank, for csv.writer."""
    cells = []
    for values in columns.values():
        if isinstance(values, np.ndarray) and values.dtype.kind == "f":
            text = ["%.10g" % x for x in values.tolist()]  # noqa: UP031 (2x faster)
            for i in np.flatnonzero(np.isnan(values)).tolist():
                text[i] = ""
        else:
            text = ["" if x is None else str(x) for x in np.asarray(values, dtype=object)
                    .tolist()]
        cells.append(text)
    yield list(columns)
    yield from (list(row) for row in zip(*cells, strict=True))


def columns_csv(columns: dict[str, np.ndarray | list]) -> str:
    """CSV text of ``columns`` (``column_cells``; "\n" line ends, quoting as csv.writer)."""
    buf = io.StringIO()
    write_columns(buf, columns)
    return buf.getvalue()


def write_columns(out: TextIO, columns: dict[str, np.ndarray | list],
                  block: int = 65_536, header: bool = True) -> None:
    """Write ``columns_csv(columns)`` to ``out`` a block of ``block`` rows at a time: the
    text cells of one block at most are held (a 10^6-point sweep's cells took 5 GB).
    ``header`` False: the rows only (more rows of a CSV already begun)."""
    writer = csv.writer(out, lineterminator="\n")
    if header:
        writer.writerow(list(columns))
    n = len(next(iter(columns.values()))) if columns else 0
    for start in range(0, n, block):
        cells = column_cells({k: v[start:start + block] for k, v in columns.items()})
        next(cells)                      # the header, written once above
        writer.writerows(cells)
