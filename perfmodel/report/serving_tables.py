"""A simulated run as text: the summary table, per-request and per-step CSV, JSON, and the
latency-against-load table. Pure: returns strings; the CLI writes them."""

from __future__ import annotations

import csv
import io
import json
import math
from typing import Any

ROWS = (("TTFT", "ttft_s"), ("TPOT", "tpot_s"), ("ITL", "itl_s"), ("E2E", "e2e_s"),
        ("queueing", "queue_s"))


def summary_table(summary: dict, title: str = "") -> str:
    """Means and percentiles in ms, then throughput and the run's counts."""
    lines = [title] if title else []
    lines.append(f"{'':10s} {'mean':>10s} {'p50':>10s} {'p90':>10s} {'p99':>10s}   ms")
    for label, key in ROWS:
        v = summary[key]
        lines.append(f"{label:10s} " + " ".join(f"{v[k] * 1e3:10.2f}"
                                                for k in ("mean", "p50", "p90", "p99")))
    extra = [("throughput", f"{summary['throughput_tokens_per_s']:,.0f} output tokens/s, "
                            f"{summary['requests_per_s']:.3f} requests/s")]
    if "goodput_requests_per_s" in summary:
        extra.append(("goodput", f"{summary['goodput_requests_per_s']:.3f} requests/s within "
                                 "the SLOs"))
    extra += [("requests", f"{summary['n_requests']:,} ({summary['n_preempted']} preempted, "
                           f"{summary['preemptions']} preemptions)"),
              ("prefix hits", f"{summary['prefix_hit_tokens']:,} tokens"),
              ("steps", f"{summary['steps']:,} over {summary['duration_s']:.1f} s"),
              ("peak", f"{summary['peak_running']} running, KV pool "
                       f"{summary['peak_kv_use'] * 100:.1f}% used")]
    lines += [f"{k:10s} {v}" for k, v in extra]
    return "\n".join(lines) + "\n"


def _csv(columns: dict[str, Any]) -> str:
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    names = list(columns)
    w.writerow(names)
    for row in zip(*(columns[n] for n in names), strict=True):
        w.writerow(["" if isinstance(x, float) and math.isnan(x) else
                    (f"{x:.9g}" if isinstance(x, float) else x) for x in
                    (v.item() if hasattr(v, "item") else v for v in row)])
    return out.getvalue()


def requests_csv(result: Any) -> str:
    """One row per request (a blank TPOT for a request of one output token)."""
    return _csv(result.records())


def steps_csv(result: Any) -> str:
    """One row per engine step of the first engine."""
    s = result.steps
    use = s.kv_blocks / max(result.kv_blocks_total, 1)
    return _csv({"start_s": s.start_s, "time_s": s.time_s, "seqs": s.seqs,
                 "tokens": s.tokens, "prefill_tokens": s.prefill_tokens,
                 "kv_blocks": s.kv_blocks, "kv_use": use, "waiting": s.waiting})


def summary_json(summary: dict) -> str:
    """The summary as JSON (no NaN: a non-finite number is an error)."""
    return json.dumps(summary, indent=2, allow_nan=False, default=str)


def load_table(points: list[tuple[float, dict]]) -> str:
    """One row per offered rate."""
    head = (f"{'offered':>9s} {'served':>9s} {'tok/s':>9s} {'TTFT mean':>10s} "
            f"{'TTFT p90':>10s} {'TPOT p90':>10s} {'queue mean':>11s}")
    lines = [head, f"{'req/s':>9s} {'req/s':>9s} {'':9s} {'s':>10s} {'s':>10s} "
                   f"{'ms':>10s} {'s':>11s}"]
    for rate, s in points:
        lines.append(f"{rate:9.3g} {s['requests_per_s']:9.3f} "
                     f"{s['throughput_tokens_per_s']:9.0f} {s['ttft_s']['mean']:10.3f} "
                     f"{s['ttft_s']['p90']:10.3f} {s['tpot_s']['p90'] * 1e3:10.2f} "
                     f"{s['queue_s']['mean']:11.3f}")
    return "\n".join(lines) + "\n"


COLUMNS = (("E2E mean", "e2e_s.mean"), ("E2E p90", "e2e_s.p90"), ("TTFT mean", "ttft_s.mean"),
           ("TTFT p90", "ttft_s.p90"), ("ITL mean", "itl_s.mean"), ("TPOT mean", "tpot_s.mean"),
           ("TPOT p90", "tpot_s.p90"), ("throughput", "throughput_tokens_per_s"))


def _pct(value: float | None) -> str:
    return "" if value is None else f"{value * 100:+.1f}%"


def compare_table(rows: list[dict], markdown: bool = False) -> str:
    """One line per replayed run: its signed error on the headline statistics."""
    head = ["run", *(name for name, _ in COLUMNS)]
    body = [[r["id"], *(_pct(r.get(k)) for _, k in COLUMNS)] if "skipped" not in r else
            [r["id"], f"not replayed: {r['skipped']}", *[""] * (len(COLUMNS) - 1)]
            for r in rows]
    if markdown:
        from perfmodel.report.tables import markdown_table

        return markdown_table(head, body)
    widths = [max(len(str(x[i])) for x in [head, *body]) for i in range(len(head))]
    return "\n".join("  ".join(str(x).ljust(w) for x, w in zip(line, widths, strict=True))
                     for line in [head, *body]) + "\n"


def compare_summary(summary: dict, markdown: bool = False) -> str:
    """Median absolute error over runs, all and by source (a markdown list when asked)."""
    lines = []
    for group, s in summary.items():
        parts = [f"{name} {s[k] * 100:.1f}%" for name, k in
                 (("E2E", "e2e_s.mean"), ("TTFT", "ttft_s.mean"), ("ITL", "itl_s.mean"),
                  ("TPOT", "tpot_s.mean"), ("throughput", "throughput_tokens_per_s"))
                 if k in s]
        lines.append(f"{'- ' if markdown else ''}median |error| over {s['runs']} {group} runs"
                     f"{' (' + str(s['skipped']) + ' not replayed)' if s['skipped'] else ''}"
                     f": {', '.join(parts) if parts else '-'}")
    return "\n".join(lines) + "\n"
