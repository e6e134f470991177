"""A simulated run as text: the summary table, per-request and per-step CSV, JSON, and the
latency-against-load table. Pure: returns strings; the CLI writes them.

Times in ``SimResult.summary()`` are seconds; the tables print latencies in ms (the load
table's TTFT and queueing, which reach seconds past the knee, in s)."""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any

import numpy as np

from perfmodel.report.tables import columns_csv

if TYPE_CHECKING:
    from perfmodel.serving.results import SimResult

ROWS = (("TTFT", "ttft_s"), ("TPOT", "tpot_s"), ("ITL", "itl_s"), ("E2E", "e2e_s"),
        ("queueing", "queue_s"))
STATS = ("mean", "p50", "p90", "p99")
LABEL = 12                 # width of the row labels


def summary_table(summary: dict, title: str = "") -> str:
    """``SimResult.summary()`` as text: means and percentiles in ms, then throughput,
    goodput (when the summary has it) and the run's counts."""
    lines = [title] if title else []
    lines.append(f"{'':{LABEL}s} " + " ".join(f"{k:>10s}" for k in STATS) + "   ms")
    for label, key in ROWS:
        v = summary[key]
        lines.append(f"{label:{LABEL}s} " + " ".join(f"{v[k] * 1e3:10.2f}" for k in STATS))
        for edge in ("low", "high") if f"{STATS[0]}_low" in v else ():
            lines.append(f"{'  80% ' + edge:{LABEL}s} " + " ".join(
                f"{v[f'{k}_{edge}'] * 1e3:10.2f}" for k in STATS))
    lines += [f"{k:{LABEL}s} {v}" for k, v in _summary_extras(summary)]
    return "\n".join(lines) + "\n"


def _summary_extras(summary: dict) -> list[tuple[str, str]]:
    extra = [("throughput", f"{summary['throughput_tokens_per_s']:,.0f} output tokens/s, "
                            f"{summary['requests_per_s']:.3f} requests/s" + (
                                f" (80%: {summary['throughput_tokens_per_s_low']:,.0f} to "
                                f"{summary['throughput_tokens_per_s_high']:,.0f} tokens/s)"
                                if "throughput_tokens_per_s_low" in summary else ""))]
    if "band" in summary:
        extra.append(("band", summary["band"]))
    if "goodput_requests_per_s" in summary:
        extra.append(("goodput", f"{summary['goodput_requests_per_s']:.3f} requests/s within "
                                 "the SLOs"))
    extra += [("requests", f"{summary['n_requests']:,} ({summary['n_preempted']} preempted, "
                           f"{summary['preemptions']} preemptions)"),
              ("prefix hits", f"{summary['prefix_hit_tokens']:,} tokens"
                              + (f" ({summary['prefix_hit_rate']:.1%} of prompt tokens)"
                                 if summary.get("prefix_hit_tokens") else "")),
              ("steps", f"{summary['steps']:,} over {summary['duration_s']:.1f} s"),
              ("peak KV use", f"{summary['peak_kv_use'] * 100:.1f}% of "
                              f"{summary['kv_blocks_total']:,} blocks"),
              ("peak running", f"{summary['peak_running']} sequences")]
    if "lora" in summary:
        q = summary["lora"]
        extra.append(("lora", f"{q['adapters']} adapters over {q['max_loras']} slots of rank "
                              f"{q['max_lora_rank']}: {q['loads']:,} loads "
                              f"({q['load_s'] * 1e3:.1f} ms), {q['evictions']:,} evictions, "
                              f"{q['disk_loads']:,} from disk"))
    t = summary.get("engine_time")
    if t:
        api = t["api_server_mean_s"] * 1e3
        extra.append(("engine time", f"GPU {t['gpu_s']:.2f} s + host {t['host_s']:.2f} s "
                                     f"(first engine); API server {api:.2f} ms per request "
                                     f"and {t.get('api_output_mean_s', 0.0) * 1e3:.2f} ms "
                                     f"per token, stream {t['stream_s'] * 1e3:.2f} ms"))
    pipe = summary.get("pipeline")
    if pipe:
        busy = ", ".join(f"{u:.0%}" for u in pipe["stage_utilization"])
        extra.append(("pipeline", f"{pipe['stages']} stages busy {busy} of the run (first "
                                  f"engine); sends {pipe['send_s']:.3f} s"))
    spec = summary.get("speculation")
    if spec:
        length = spec["acceptance_length"]
        extra.append(("speculation", f"{spec['method']} k={spec['num_speculative_tokens']}: "
                      f"acceptance length {length or 0:.3f} tokens per verify (expected "
                      f"{spec['expected_tokens_per_verify']:.3f}) over "
                      f"{spec['verify_steps']:,} verifies; ITL between chunks"))
    if "energy" in summary:
        extra += energy_extras(summary["energy"])
    return extra


def energy_extras(e: dict | None) -> list[tuple[str, str]]:
    """The energy rows of ``simulate --energy`` (``serving.energy.sim_energy``)."""
    if e is None:
        return [("energy", "no power: block (tdp_watts) in the hardware YAML, so no figure")]
    out = [("energy", f"{e['j_per_output_token']:.3g} J per output token "
                      f"(prefill {e['prefill_j_per_prompt_token']:.3g} J per prompt token, "
                      f"decode {e['decode_j_per_token']:.3g} J per output token); "
                      f"{e['watts_per_device']:.0f} W per device over the run, "
                      f"{e['devices']} device(s)")]
    cost = e.get("usd_per_million_tokens")
    if cost:
        parts = ", ".join(f"{k} ${v:.3g}" for k, v in cost.items() if k != "total")
        out.append(("cost", f"${cost['total']:.3g} per million output tokens ({parts})"))
    out.append(("power", e["note"].removeprefix("power: ")))
    return out


def requests_csv(result: SimResult) -> str:
    """``result.records()``, one row per request: floats to 10 significant digits, a blank
    cell for a NaN (the TPOT and longest gap of a request of one output token)."""
    return columns_csv(result.records())


def steps_csv(result: SimResult) -> str:
    """One row per engine step (of the first engine): its start and duration (s), the
    sequences and tokens it ran, its prompt tokens, the KV blocks in use after it, their
    share of the pool (``kv_use``, 0 to 1) and the requests waiting; ``gpu_s`` and
    ``host_s`` split ``time_s`` into GPU time and the engine's host time. Under pipeline
    parallelism a row is a micro-batch, ``gpu_s`` its stages' GPU seconds summed, with
    ``stage<i>_s`` each stage's, ``send_s`` its sends between stages and ``wait_s`` its
    time waiting for busy stages (``serving.results.StepLog``)."""
    s = result.steps
    host = s.host_s if s.host_s is not None else 0.0 * s.time_s
    cols = {"start_s": s.start_s, "time_s": s.time_s, "gpu_s": s.gpu_s, "host_s": host}
    if s.stage_s is not None:
        cols |= {f"stage{i}_s": s.stage_s[:, i] for i in range(s.stage_s.shape[1])}
        cols |= {"send_s": s.send_s, "wait_s": np.maximum(
            s.time_s - s.gpu_s - s.send_s - host, 0.0)}
    return columns_csv(cols | {"seqs": s.seqs,
                               "tokens": s.tokens, "prefill_tokens": s.prefill_tokens,
                               "kv_blocks": s.kv_blocks,
                               "kv_use": s.kv_blocks / max(result.kv_blocks_total, 1),
                               "waiting": s.waiting})


def summary_json(summary: dict) -> str:
    """The summary as JSON, keys as they are (indent 2): numpy scalars and arrays as plain
    numbers and lists, a NaN or infinity as null (strict JSON has neither)."""
    return json.dumps(_plain(summary), indent=2, allow_nan=False)


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if hasattr(value, "tolist"):                      # a numpy scalar or array
        return _plain(value.tolist())
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def load_table(points: list[tuple[float, dict]]) -> str:
    """One row per offered rate (``(rate, summary)`` pairs): the rate, the requests/s and
    output tokens/s achieved, mean and p90 TTFT (s), p90 TPOT (ms), mean queueing (s)."""
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
