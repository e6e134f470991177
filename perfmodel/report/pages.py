"""The documents ``perfmodel report`` writes: markdown and self-contained HTML.

Pure: every function returns text built from estimates and sweep records; the CLI writes the
files. A document is a list of blocks (heading, paragraph, list, table, code, figure) that
render to markdown and to HTML from the same source, so the two never disagree.
"""

from __future__ import annotations

import base64
import html
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from perfmodel.cost.roofline import kind_memory_fraction
from perfmodel.cost.tiling import gemm_tiles
from perfmodel.report import tables as report
from perfmodel.report.levers import lever_lines
from perfmodel.report.plots import decode_context
from perfmodel.schedules.estimate import Estimate
from perfmodel.specs.dtypes import DTYPE_BYTES, compute_dtype
from perfmodel.specs.hardware import Efficiency, Hardware
from perfmodel.specs.units import fmt_bytes, fmt_rate, fmt_time


@dataclass(frozen=True)
class Block:
    """kind: h1 | h2 | p | list | table | code | figure. ``items``: list entries, table rows
    (first row the header) or, for a figure, (file name, caption)."""

    kind: str
    text: str = ""
    items: tuple = field(default_factory=tuple)


def h1(text: str) -> Block:
    return Block("h1", text)


def h2(text: str) -> Block:
    return Block("h2", text)


def para(text: str) -> Block:
    return Block("p", text)


def bullets(items: Sequence[str]) -> Block:
    return Block("list", items=tuple(items))


def table(rows: Sequence[Sequence[str]]) -> Block:
    return Block("table", items=tuple(tuple(str(c) for c in r) for r in rows))


def code(text: str) -> Block:
    return Block("code", text)


def figure(file: str, caption: str) -> Block:
    return Block("figure", items=(file, caption))


# --- rendering ----------------------------------------------------------------------------

def to_markdown(blocks: Sequence[Block]) -> str:
    out = []
    for b in blocks:
        if b.kind in ("h1", "h2"):
            out.append(("# " if b.kind == "h1" else "## ") + b.text)
        elif b.kind == "p":
            out.append(b.text)
        elif b.kind == "list":
            out.append("\n".join(f"- {i}" for i in b.items))
        elif b.kind == "table":
            head, *body = b.items
            out.append(report.markdown_table(head, body))
        elif b.kind == "code":
            out.append(f"```\n{b.text}\n```")
        elif b.kind == "figure":
            file, caption = b.items
            out.append(f"![{file.rsplit('.', 1)[0]}]({file})\n\n*{caption}*")
    return "\n\n".join(out) + "\n"


def _inline(text: str) -> str:
    """Escape, then `code` and **bold** as in the markdown."""
    text = html.escape(text)
    text = re.sub(r"`([^`]+)`", r"<code>\1</code>", text)
    return re.sub(r"\*\*([^*]+)\*\*", r"<b>\1</b>", text)


_STYLE = ("body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;"
          "padding:0 1em;line-height:1.45;color:#222}table{border-collapse:collapse;"
          "margin:1em 0;font-size:.9em}td,th{border:1px solid #ccc;padding:.25em .6em;"
          "text-align:left}th{background:#f3f3f3}pre{background:#f7f7f7;padding:.8em;"
          "overflow-x:auto;font-size:.8em}img{max-width:100%}figcaption{font-style:italic;"
          "color:#555;font-size:.9em}code{background:#f3f3f3;padding:0 .2em}")


def to_html(blocks: Sequence[Block], images: dict[str, bytes], title: str) -> str:
    """One self-contained HTML page: figures embedded as data URIs (PNG or SVG)."""
    out = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}"
           f"</title><style>{_STYLE}</style></head><body>"]
    for b in blocks:
        if b.kind in ("h1", "h2"):
            out.append(f"<{b.kind}>{_inline(b.text)}</{b.kind}>")
        elif b.kind == "p":
            out.append(f"<p>{_inline(b.text)}</p>")
        elif b.kind == "list":
            out.append("<ul>" + "".join(f"<li>{_inline(i)}</li>" for i in b.items) + "</ul>")
        elif b.kind == "table":
            head, *body = b.items
            rows = "".join("<tr>" + "".join(f"<td>{_inline(c)}</td>" for c in r) + "</tr>"
                           for r in body)
            out.append("<table><tr>" + "".join(f"<th>{_inline(c)}</th>" for c in head)
                       + f"</tr>{rows}</table>")
        elif b.kind == "code":
            out.append(f"<pre>{html.escape(b.text)}</pre>")
        elif b.kind == "figure":
            file, caption = b.items
            mime = "image/svg+xml" if file.endswith(".svg") else "image/png"
            data = base64.b64encode(images[file]).decode("ascii")
            out.append(f"<figure><img alt='{html.escape(caption, quote=True)}' "
                       f"src='data:{mime};base64,{data}'><figcaption>{_inline(caption)}"
                       f"</figcaption></figure>")
    out.append("</body></html>")
    return "\n".join(out) + "\n"


# --- content ------------------------------------------------------------------------------

def definitions() -> list[str]:
    """What the reported quantities mean and how decode is summed."""
    return [
        "**TTFT** (time to first token) = the prefill step: the whole batch of prompts in one "
        "forward pass, which also emits the first generated token.",
        "**TPOT** (time per output token) = the mean decode step over the G - 1 remaining "
        "tokens; each step generates one token for every sequence of the batch.",
        "**Throughput** in decode = batch / TPOT; overall = batch x G / (TTFT + decode time).",
        "Decode sum: the step that emits token i + 1 runs at context S + i, so decode reads "
        "contexts S+1 ... S+G-1. Every table and figure sums those steps exactly: a step's time "
        "is piecewise linear in the context, so it is priced where it bends (key-tile and "
        "window boundaries, where compute meets memory or the launch overhead) and summed "
        "in closed form between (perfmodel/schedules/decode.py).",
        "Roofline points: one operator (all layers) of ONE step; prefill is the step over the "
        "whole prompt, decode one step at context prompt + gen/2. x = FLOPs / bytes moved to "
        "or from device memory, y = FLOPs / modelled time (overheads included). Achievable "
        "roofs = peak x gemm_fraction and bandwidth x memory_fraction.",
        "Operator time = max(FLOPs / (peak x compute efficiency), bytes / (bandwidth x memory "
        "efficiency)) + kernel latency, and at least the host launch overhead unless decode "
        "runs as a CUDA graph (perfmodel/cost/roofline.py).",
        "Memory: usable = capacity (the total the driver reports) x usable fraction - the "
        "runtime's reserve (CUDA/ROCm context and library workspaces), at least 0; batch "
        "ceiling = floor((usable - weights) / (KV per sequence at prompt + gen, rounded to "
        "whole paged blocks + workspace per sequence)) (perfmodel/cost/memory.py).",
        "Units are decimal SI: 1 GB = 1e9 bytes, 1 TFLOP/s = 1e12 FLOP/s.",
    ]


def assumptions(e: Estimate) -> list[Block]:
    """Every assumption behind ``e``: dtypes, hardware figures and sources, efficiencies."""
    hw, wl = e.hardware, e.workload
    eff = hw.efficiency
    mm = compute_dtype(wl.weights_dtype, wl.act_dtype)
    dtypes = [
        f"Weights {wl.weights_dtype}"
        + (f" (group size {wl.weight_group_size}, {wl.weight_scale_bytes:g} B of scale per "
           f"group)" if wl.weight_group_size else "")
        + f", activations {wl.act_dtype}, KV cache {wl.kv_dtype}; matmuls run at {mm} "
        f"({fmt_rate(hw.peak(mm), 'FLOP/s')} dense peak on {hw.name}).",
        f"Parallelism: {e.plan.describe() or 'one device'} ({e.plan.devices} device"
        f"{'s' if e.plan.devices > 1 else ''}); usable memory {wl.usable_memory_fraction:.0%} of "
        f"capacity less the {fmt_bytes(hw.runtime_reserved_bytes)} runtime reserve; paged "
        f"KV blocks of {wl.kv_block_tokens} tokens; decode "
        + ("as a CUDA graph (no host launch cost)." if wl.cuda_graphs
           else "launched kernel by kernel (host launch overhead applies)."),
        *lever_lines(e),
        *(f"Assumed: {w}." for w in e.warnings),
    ]
    hw_rows = [["figure", "value"]]
    hw_rows += [[f"peak {d}", fmt_rate(v, "FLOP/s")] for d, v in hw.peak_flops_per_s.items()]
    hw_rows += [["memory", fmt_bytes(hw.memory_bytes)],
                ["runtime reserve", fmt_bytes(hw.runtime_reserved_bytes)],
                ["bandwidth", fmt_rate(hw.memory_bytes_per_s)],
                ["compute units", str(hw.compute_units)],
                ["interconnect (per direction)", fmt_rate(hw.interconnect.link_bytes_per_s)]]
    eff_rows = [["efficiency", "value"],
                ["gemm_fraction (best-shape GEMM / dense peak)", f"{eff.gemm_fraction:g}"],
                ["memory_fraction (streaming / peak bandwidth)", f"{eff.memory_fraction:g}"],
                ["collective_fraction", f"{eff.collective_fraction:g}"],
                ["GEMM tiles (wave quantization; the device's own first)",
                 ", ".join(f"{m} x {n}" for m, n in gemm_tiles(eff))],
                ["attention_fraction (FlashAttention MMA / peak)", f"{eff.attention:g}"],
                ["attention prefill tile (query rows x keys)", _attention_tile(eff)],
                ["kernel_latency (per kernel, device)", fmt_time(eff.kernel_latency_s)],
                ["launch_overhead (per kernel, host)", fmt_time(eff.launch_overhead_s)],
                ["gemm_k_half (k-depth ramp, 0 = off)", f"{eff.gemm_k_half:g}"],
                ["memory_half_bytes (size ramp, 0 = off)", f"{eff.memory_half_bytes:g}"]]
    if eff.parallel_grain_elements:
        eff_rows.append(["parallel_grain_elements (elementwise kernels: one thread per "
                         "this many elements)", f"{eff.parallel_grain_elements}"])
    eff_rows += _per_kind_rows(hw)
    sources = [f"`{k}`: {v}" for k, v in hw.sources.items()]
    return [h2("Assumptions"), bullets(dtypes), table(hw_rows), table(eff_rows),
            para(f"Sources of the {hw.name} figures (perfmodel/hardware/{hw.name}.yaml):"),
            bullets(sources or ["(none given)"]), h2("Definitions"),
            bullets(definitions())]


def _per_kind_rows(hw: Hardware) -> list[list[str]]:
    """One row per kernel kind with its own streaming rate or fixed cost."""
    eff = hw.efficiency
    kinds = sorted(set(eff.kernel_memory_fraction) | set(eff.kernel_unit_bytes_per_s)
                   | set(eff.kernel_latency_by_kind))
    rows = []
    for kind in kinds:
        parts = []
        if kind in eff.kernel_memory_fraction or kind in eff.kernel_unit_bytes_per_s:
            frac = kind_memory_fraction(kind, hw)
            rate = eff.kernel_unit_bytes_per_s.get(kind)
            unit = "thread" if eff.parallel_grain_elements else "SM"
            parts.append(f"streams at {fmt_rate(frac * hw.memory_bytes_per_s)} ({frac:.3g} of "
                         "peak" + (f"; {fmt_rate(rate)} per {unit} x {hw.compute_units})"
                                   if rate else ")"))
        if kind in eff.kernel_latency_by_kind:
            parts.append(f"fixed cost {fmt_time(eff.kernel_latency_by_kind[kind])}")
        rows.append([f"{kind} kernels", ", ".join(parts)])
    return rows


def _class_share(phase_ops: Sequence, cls: str) -> float:
    total = sum(o.time_s for o in phase_ops)
    return sum(o.time_s for o in phase_ops if o.op_class == cls) / total if total else 0.0


def findings(e: Estimate) -> list[str]:
    """Headline sentences, each computed from the estimate."""
    wl, mem = e.workload, e.memory
    dec_bytes = e.decode.bytes
    steps = max(e.decode.steps, 1)
    out = [
        f"Prefill is {e.prefill.bound}-bound: {_class_share(e.prefill.ops, 'gemm'):.0%} of "
        f"TTFT ({fmt_time(e.ttft_s)}) is GEMMs at {e.prefill.flops / e.ttft_s / 1e12:.0f} "
        f"TFLOP/s on average.",
        f"Decode is {e.decode.bound}-bound: a step moves {fmt_bytes(dec_bytes.total / steps)} "
        f"({fmt_bytes(dec_bytes.weights / steps)} of weights, "
        f"{fmt_bytes(dec_bytes.kv_read / steps)} of KV cache) for "
        f"{e.decode.flops / steps / 1e9:.0f} GFLOP, so TPOT is {fmt_time(e.tpot_s)} at "
        f"batch {wl.batch}.",
        f"Memory: weights take {fmt_bytes(mem.weights_bytes)} of {fmt_bytes(mem.usable_bytes)} "
        f"usable; each sequence of {wl.final_len} tokens needs "
        f"{fmt_bytes(mem.kv_cache_bytes_per_sequence)} of KV cache, so at most "
        f"{mem.max_batch} sequences fit"
        + ("." if mem.fits else f"; batch {wl.batch} does NOT fit."),
    ]
    return out


def single_report(e: Estimate, command: str, figures: Sequence[tuple[str, str]],
                  batch_rows: Sequence[dict]) -> list[Block]:
    """The report of one model on one device: table, findings, figures, breakdown,
    assumptions. ``figures``: (file name, caption); ``batch_rows``: sweep over batch."""
    blocks = [h1(f"{e.model.name} on {e.hardware.name}: predicted inference performance"),
              para("Generated with:"), code(command),
              h2("Estimate"), table([("quantity", "value"), *report.rows(e)]),
              h2("Findings"), bullets(findings(e)), h2("Figures")]
    blocks += [figure(f, c) for f, c in figures]
    rows = [["batch", "fits", "TTFT", "TPOT", "decode tok/s", "overall tok/s"]]
    rows += [[str(r["workload_batch"]), "yes" if r["fits"] else "no", fmt_time(r["ttft_s"]),
              fmt_time(r["tpot_s"]), f"{r['decode_tokens_per_s']:,.0f}",
              f"{r['throughput_tokens_per_s']:,.0f}"] for r in batch_rows]
    blocks += [h2("Against batch"), para(
        f"Prompt {e.workload.prompt_len}, generate {e.workload.gen_len}; the memory ceiling "
        f"is {e.memory.max_batch} sequences."), table(rows)]
    blocks += [h2("Per-operator breakdown"), para(
        f"Batch {e.workload.batch}. Prefill rows are the one prefill step; decode rows are "
        "summed over all decode steps (share = of the phase time)."),
        code(report.breakdown(e)),
        para(f"Model shape of {e.model.name} from: {e.model.source or 'the model file'}.")]
    return blocks + assumptions(e)


def roofline_caption(model: str, hardware: str, batches: Sequence[int], e: Estimate) -> str:
    wl = e.workload
    return (f"Roofline of {model} on {hardware} at batch {', '.join(map(str, batches))}: "
            f"each marker one operator (all layers) of one step, area = share of the step "
            f"time; prefill = the {wl.prompt_len}-token prompt, decode = one step at context "
            f"{decode_context(wl)}.")


def _kv_formula(e: Estimate) -> str:
    m = e.model
    nbytes = f"{DTYPE_BYTES[e.workload.kv_dtype]:g} B ({e.workload.kv_dtype})"
    recurrent = m.mamba_layers + m.layer_count("linear")     # Falcon-H1: beside attention
    state = " + a constant recurrent state" if recurrent else ""
    if m.mla is not None:          # the MLA layers: all, or the global ones (Kimi-Linear)
        return (f"({m.mla.kv_lora_rank} latent + {m.mla.qk_rope_head_dim} rope) x "
                f"{m.cache_layers} layers x {nbytes}{state}")
    caches = m.attention_layers + m.shared_invocations     # Zamba2: one per invocation
    return (f"2 (K, V) x {m.n_kv_heads} KV heads x {m.head_dim} x {caches} "
            f"layers x {nbytes}{state}")


def kv_findings(estimates: Sequence[Estimate], whole: dict[str, float],
                batch_rows: Sequence[dict], at_ceiling: Sequence[Estimate] = ()) -> list[str]:
    """Sentences comparing KV cost, each computed from the numbers. ``whole``: model ->
    KV bytes per token for the whole model (TP 1); ``at_ceiling``: the same workloads at
    each model's batch ceiling."""
    by_size = sorted(estimates, key=lambda e: whole[e.model.name])
    small = by_size[0]
    out = [f"Per token, {small.model.name} ({small.model.attention_kind}) stores "
           f"{whole[small.model.name] / 1e3:,.1f} kB of KV cache; "
           + "; ".join(f"{e.model.name} ({e.model.attention_kind}) "
                       f"{whole[e.model.name] / 1e3:,.1f} kB, "
                       f"{whole[e.model.name] / whole[small.model.name]:.1f}x as much"
                       for e in by_size[1:]) + "."]
    out += [f"{e.model.name}: {_kv_formula(e)} = {whole[e.model.name]:,.0f} B per token."
            for e in estimates]
    tp = estimates[0].plan.tp
    if tp > 1:
        out.append(_tp_sentence(estimates, whole))
    wl = estimates[0].workload
    where = estimates[0].hardware.name
    where = f"{tp} x {where} (TP {tp})" if tp > 1 else where
    out.append(f"At {wl.final_len:,} tokens per sequence (prompt {wl.prompt_len:,} + "
               f"{wl.gen_len:,} generated) on {where}: "
               + "; ".join(f"{e.model.name} fits {e.memory.max_batch} sequences "
                           f"({fmt_bytes(e.memory.weights_bytes)} of weights, "
                           f"{fmt_bytes(e.memory.usable_bytes - e.memory.weights_bytes)} "
                           "left for KV and workspace per device)" for e in estimates) + ".")
    if batch_rows:
        longest = max(r["context"] for r in batch_rows)
        at = {r["model"]: r["max_batch"] for r in batch_rows if r["context"] == longest}
        out.append(f"At {longest:,} tokens: " + ", ".join(
            f"{n} {b} sequence{'s' if b != 1 else ''}" for n, b in at.items()) + ".")
        out += _native_context(estimates, longest)
    out += [f"{e.model.name}, decode at batch {e.workload.batch}: TPOT {fmt_time(e.tpot_s)}, "
            f"{e.decode_tokens_per_s:,.0f} tokens/s; the KV cache is "
            f"{e.decode.bytes.kv_read / max(e.decode.bytes.total, 1):.0%} of the bytes a "
            "decode step moves." for e in [*estimates, *at_ceiling]]
    return out


def _tp_sentence(estimates: Sequence[Estimate], whole: dict[str, float]) -> str:
    """What tensor parallelism does to each model's KV bytes per token per device."""
    tp = estimates[0].plan.tp
    parts = []
    for e in estimates:
        dev = e.memory.kv_cache_bytes_per_token
        share = ("all of it: replicated on every device" if abs(dev - whole[e.model.name]) < 1
                 else f"1/{whole[e.model.name] / dev:.0f} of the model's")
        parts.append(f"{e.model.name} {dev / 1e3:,.1f} kB ({share})")
    text = (f"Per device under tensor parallelism {tp}, KV heads split across the devices "
            "(never below one per device) while an MLA latent, shared by all heads, is kept "
            "whole on each: " + "; ".join(parts) + ".")
    replicated = [e.model.name for e in estimates if e.model.mla is not None]
    if replicated:
        text += (f" So at TP {tp} the per-device saving of {', '.join(replicated)} is smaller "
                 "than the per-token comparison suggests; data-parallel MLA attention avoids "
                 "the copies, each device caching its own sequences (--ep N --attention-dp).")
    return text


def _native_context(estimates: Sequence[Estimate], longest: int) -> list[str]:
    return [f"{e.model.name}'s native context is {e.model.max_position_embeddings:,} tokens; "
            "longer contexts (dotted in the figure) show the KV arithmetic only."
            for e in estimates if 0 < e.model.max_position_embeddings < longest]


def comparison_report(estimates: Sequence[Estimate], whole: dict[str, float], command: str,
                      figures: Sequence[tuple[str, str]], batch_rows: Sequence[dict],
                      at_ceiling: Sequence[Estimate] = ()) -> list[Block]:
    """KV-cache economics of several models on one device and workload; ``at_ceiling``:
    the same workloads at each model's batch ceiling (for the throughput lines)."""
    names = " vs ".join(f"{e.model.name} ({e.model.attention_kind})" for e in estimates)
    hw, wl, tp = estimates[0].hardware, estimates[0].workload, estimates[0].plan.tp
    rows = [["model", "attention", "KV B/token (model)", f"KV B/token per device (TP {tp})",
             "weights / device", f"max batch at {wl.final_len} tokens",
             f"TPOT at batch {wl.batch}"]]
    rows += [[e.model.name, e.model.attention_kind, f"{whole[e.model.name]:,.0f}",
              f"{e.memory.kv_cache_bytes_per_token:,.0f}", fmt_bytes(e.memory.weights_bytes),
              str(e.memory.max_batch), fmt_time(e.tpot_s)] for e in estimates]
    blocks = [h1(f"KV-cache economics on {hw.name}: {names}"), para("Generated with:"),
              code(command), h2("Numbers"), table(rows), h2("What the numbers say"),
              bullets(kv_findings(estimates, whole, batch_rows, at_ceiling)), h2("Figures")]
    blocks += [figure(f, c) for f, c in figures]
    blocks += [h2("Model shapes"), bullets([f"{e.model.name}: {e.model.source or 'model file'}"
                                            for e in estimates])]
    return blocks + assumptions(estimates[0])


def _attention_tile(eff: Efficiency) -> str:
    """``128 x 64``, the query steps spelt out when the kernel picks rows by length, and
    whether a KV group's heads share a block's rows."""
    steps = eff.attention_tile_q
    rows = str(steps[0][1]) if len(steps) == 1 else \
        "/".join(f"{t} (q_len >= {q})" for q, t in steps)
    return f"{rows} x {eff.attention_tile_kv}" + (", GQA packed" if eff.attention_pack_gqa else "")
