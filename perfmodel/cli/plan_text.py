"""The ``plan`` command's words: the plan for a terminal (``text``) and why the winner
(``explain``), against the best alternatives by parallelism, batch, load, precision,
serving mode and device.

Module level: the standard library only (``perfmodel --help`` stays fast).
"""

from typing import Any


def unit(hardware: list[str]) -> str:
    """What the plan counts over these devices: "GPU", "chip" (TPU, Trainium), "HPU", or
    "device" when they differ (``serving.planner.platforms.unit_of``)."""
    from perfmodel.serving.planner.platforms import unit_of
    from perfmodel.specs import load

    return unit_of([load.hardware(name).vendor for name in hardware])


def text(result: Any, report: dict) -> str:
    """The plan for a terminal: the ask, the checked candidates, the choice, why, the
    commands (simulate's, then the engines'), the front and the notes."""
    t, w, p = result.target, result.winner, result.plan
    u = unit(report["hardware"])
    cost = "usd_per_hour" in result.candidates
    ask = f"{t.rate:.2f} req/s" if t.rate else f"as much as the {u}s serve"
    head = [f"{report['model']} on {', '.join(report['hardware'])}, "
            + (f"at most {t.gpus} {u}s" if t.gpus else f"no {u} ceiling")
            + f"; {ask}; prompts {t.input_len:.0f}, outputs {t.output_len:.0f} tokens "
            f"({report['length_dist']}); SLOs: TTFT p90 <= {t.slo_ttft_s:g} s, TPOT p90 <= "
            f"{t.slo_tpot_s * 1e3:g} ms",
            f"{report['candidates']} candidates estimated, {report['feasible']} meet both SLOs "
            f"by the estimate, {len(report['pareto'])} on the Pareto front", ""]
    rows = [("candidate", f"{u}s", *(("$/hour",) if cost else ()), "capacity", "est TTFT p90",
             "est TPOT", "sim TTFT p90 (95%)", "sim TPOT p90 (95%)", "SLOs")]
    rows += [(c["label"], str(result.candidates["gpus"][c["index"]]),
              *((f"{c['estimated_usd_per_hour']:.2f}",) if cost else ()),
              f"{c['capacity_req_s']:.2f} req/s",
              f"{c['estimated_ttft_p90_s']:.2f} s", f"{c['estimated_tpot_s'] * 1e3:.1f} ms",
              f"{c['simulated_ttft_p90_s']:.2f} +- {c['simulated_ttft_p90_band_s']:.2f} s",
              f"{c['simulated_tpot_p90_s'] * 1e3:.1f} +- "
              f"{c['simulated_tpot_p90_band_s'] * 1e3:.1f} ms",
              ("met" if c["sure"] else "met, within noise") if c["meets_slos"] else "missed")
             for c in result.confirmed]
    body = [_aligned(rows), "", f"chosen: {w['label']} ("
            + ("met both SLOs in simulation)" if w["confirmed"] else
               "no simulated candidate met both SLOs: the best estimate)"),
            f"  {p.hardware}, {p.gpus} {u}s on {result.candidates['nodes'][w['index']]} node(s) "
            f"({p.nodes} per replica); "
            f"precision {p.precision.name} (weights {p.precision.weights}, activations "
            f"{p.precision.activations}, KV cache {p.precision.kv})",
            f"  checked: {w['simulated']}", *energy_lines(report), "why:"]
    body += [f"  - {line}" for line in report["reasons"]]
    body += ["reproduce the check:", f"  {w['command']}"]
    if w.get("deployment_command"):
        body += ["the whole deployment (dealt round-robin, so its p90 TTFT is if anything "
                 "lower; slower to run):", f"  {w['deployment_command']}"]
    for name, cmd in report["commands"].items():
        body += [f"{name}:", *(f"  {line}" for line in cmd.splitlines())]
    for a in report["alternatives"]:
        body += [f"best on {a['label'].split()[0]} (estimated, not simulated"
                 + ("" if a["feasible"] else "; misses the SLOs") + f"): {a['label']}, "
                 f"{a['gpus']} {u}s on {a['nodes']} node(s)", f"  {a['command']}",
                 *(f"  {line}" for line in a["commands"].get("vLLM", "").splitlines())]
    body += _front_lines(result, u)
    return "\n".join(head + body + ["searched:", *(f"  - {n}" for n in report["searched"]),
                                    "notes:", *(f"  - {n}" for n in report["notes"])])


def energy_record(cols: dict, i: int) -> dict | None:
    """Candidate ``i``'s energy (``plan --energy``: ``serving.planner.energy``), or None
    when the plan was not asked for it."""
    if "j_per_output_token" not in cols:
        return None
    keys = ("j_per_output_token", "watts_per_device", "j_per_output_token_full",
            "watts_per_device_full", "usd_per_million_tokens",
            "electricity_usd_per_million_tokens")
    return {k: float(cols[k][i]) for k in keys if k in cols}


def energy_lines(report: dict) -> list[str]:
    """The chosen plan's energy line (none without ``--energy``)."""
    e = report.get("energy")
    if e is None:
        return []
    if not e["j_per_output_token"] == e["j_per_output_token"]:        # NaN: no power block
        return ["  energy: no power: block for this device"]
    line = (f"  energy: {e['j_per_output_token']:.3g} J per output token, "
            f"{e['watts_per_device']:.0f} W per device at the planned rate "
            f"({e['j_per_output_token_full']:.3g} J, {e['watts_per_device_full']:.0f} W "
            "with a replica full at its batch)")
    if "usd_per_million_tokens" in e:
        line += f"; ${e['usd_per_million_tokens']:.3g} per million output tokens"
        if "electricity_usd_per_million_tokens" in e:
            line += f" (electricity ${e['electricity_usd_per_million_tokens']:.3g})"
    return [line]


def _front_lines(result: Any, u: str = "GPU", most: int = 8) -> list[str]:
    """The Pareto front as lines, cheapest first."""
    import numpy as np

    cols = result.candidates
    idx = [int(i) for i in np.flatnonzero(cols["pareto"])] if len(cols["pareto"]) else []
    if not idx:
        return []
    cost = "usd_per_hour" in cols
    if result.target.rate is None:
        idx.sort(key=lambda i: -cols["throughput_per_gpu"][i])
        head = f"Pareto front (goodput per {u} against tokens/s per user):"
        rows = [f"  {cols['label'][i]}: {cols['throughput_per_gpu'][i]:.0f} tok/s/{u}, "
                f"{cols['tokens_per_s_per_user'][i]:.0f} tok/s per user" for i in idx]
    else:
        idx.sort(key=lambda i: (cols["usd_per_hour"][i] if cost else cols["gpus"][i]))
        head = "Pareto front (cost against TPOT, TTFT met at the rate):"
        rows = [f"  {cols['label'][i]}: " + (f"${cols['usd_per_hour'][i]:.2f}/hour, "
                                            if cost else "")
                + f"{cols['gpus'][i]} {u}s, TPOT {cols['tpot_s'][i] * 1e3:.1f} ms" for i in idx]
    return [head, *rows[:most], *([f"  ... {len(rows) - most} more in plan.csv"]
                                  if len(rows) > most else [])]


def _per_dollar(tokens: float) -> str:
    """Output tokens per US dollar, as '1.23M'."""
    return f"{tokens / 1e6:.2f}M" if tokens >= 1e5 else f"{tokens:.0f}"


def _aligned(rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(r[k]) for r in rows) for k in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
                     for r in rows)


def explain(result: Any) -> list[str]:
    """Why the winner: its estimate, then its TP, batch, load, weights, serving mode and
    device against the best alternatives meeting the SLOs (output tok/s per GPU)."""
    import numpy as np

    cols, i, t = result.candidates, result.winner["index"], result.target
    hw, ok = cols["hardware"] == cols["hardware"][i], cols["feasible"]
    u = unit(list(dict.fromkeys(cols["hardware"].tolist())))
    out = [f"{result.winner['label']}: {cols['gpus'][i]} {u}s serve "
           f"{cols['rate_req_s'][i]:.2f} req/s within the SLOs by the estimate, up to "
           f"{cols['slo_rate_req_s'][i]:.2f} ({cols['throughput_per_gpu'][i]:.0f} output tok/s "
           f"per {u})" + _fewer(cols, i, t, u),
           f"parallelism (best tok/s/{u} meeting the SLOs; sequences the KV cache holds): "
           + ", ".join(_best(cols, hw & (cols["parallel"] == p), ok, p, kv=True)
                       for p in dict.fromkeys(cols["parallel"][hw].tolist())),
           _batch_reason(cols, i, t, u),
           _load_reason(cols, i, t),
           "precision: " + ", ".join(_best(cols, hw & (cols["precision"] == d), ok, d)
                                     for d in dict.fromkeys(cols["precision"][hw].tolist())),
           "serving: " + ", ".join(_best(cols, hw & ((cols["prefill_replicas"] > 0) == m), ok,
                                         "disaggregated" if m else "aggregated")
                                   for m in (False, True))
           + ("" if not cols["prefill_replicas"][i] else " (KV moved over the network)"
              if cols["link"][i] == "network" else " (KV moved over the in-node link)"),
           "device: " + ", ".join(_best(cols, cols["hardware"] == h, ok, h)
                                  for h in dict.fromkeys(cols["hardware"].tolist()))]
    if "tokens_per_dollar" in cols:
        out.append(f"per dollar (output tokens per USD; --objective {result.objective}): "
                   + ", ".join(
            f"{_best(cols, cols['hardware'] == h, ok, h, key='tokens_per_dollar')} at "
            f"${cols['usd_per_gpu_hour'][cols['hardware'] == h][0]:g}/{u}-hour"
            for h in dict.fromkeys(cols["hardware"].tolist()))
            + f"; the winner {_per_dollar(cols['tokens_per_dollar'][i])}")
    if not np.asarray(ok).any():
        out.insert(1, "no candidate meets both SLOs by the estimate: the nearest is shown")
    return out


def _fewer(cols: dict, i: int, t: Any, u: str = "GPU") -> str:
    """'; no candidate meets the SLOs on fewer GPUs' (with a rate)."""
    if t.rate is None:
        return ""
    fewer = cols["feasible"] & (cols["gpus"] < cols["gpus"][i])
    if not fewer.any():
        return f"; no candidate meets both SLOs on fewer {u}s"
    return f"; {int(fewer.sum())} candidates meet them on fewer {u}s by the estimate"


def _load_reason(cols: dict, i: int, t: Any) -> str:
    """The load planned, and whether the TTFT SLO or the planner's 90% cap set it."""
    share = cols["slo_rate_req_s"][i] / cols["capacity_req_s"][i]
    given = f"the asked {t.rate:.2f} req/s, {cols['load_share'][i]:.0%} of the estimated " \
        f"capacity ({cols['capacity_req_s'][i]:.2f} req/s); " if t.rate else \
        f"load {cols['capacity_req_s'][i] * share:.2f} req/s, of the estimated capacity " \
        f"{cols['capacity_req_s'][i]:.2f}: "
    if share < 0.9 - 1e-9:
        return given + f"TTFT binds at {share:.0%} of capacity (queueing past the SLO beyond)"
    return given + "TTFT has room up to the planner's cap of 90% of capacity"


def _best(cols: dict, mask: Any, ok: Any, name: str, kv: bool = False,
          key: str = "throughput_per_gpu") -> str:
    """'TP4 1234' (the best ``key`` meeting the SLOs), or why there is none."""
    if not mask.any():
        return f"{name} holds no sequence"
    room = f" (KV {cols['kv_max_batch'][mask].max()})" if kv else ""
    if not (mask & ok).any():
        return f"{name} misses the SLOs{room}"
    best = cols[key][mask & ok].max()
    return f"{name} {_per_dollar(best) if key == 'tokens_per_dollar' else f'{best:.0f}'}{room}"


def _batch_reason(cols: dict, i: int, t: Any, u: str = "GPU") -> str:
    """Which limit set the batch: the TPOT SLO, the KV memory, or nothing gained."""
    import numpy as np

    keys = ("hardware", "parallel", "prefill_replicas", "weights_dtype")
    same = np.logical_and.reduce([cols[k] == cols[k][i] for k in keys])
    b = cols["batch"][i]
    bigger = np.flatnonzero(same & (cols["batch"] > b))
    head = f"batch {b} (max_num_seqs), TPOT {cols['tpot_s'][i] * 1e3:.1f} ms"
    if not len(bigger):
        return head + (": all the KV cache holds" if b >= cols["kv_max_batch"][i]
                       else ": the largest searched")
    j = bigger[np.argmin(cols["batch"][bigger])]
    if not cols["meets_tpot"][j]:
        return head + f": TPOT binds, batch {cols['batch'][j]} would take " \
                      f"{cols['tpot_s'][j] * 1e3:.1f} ms > {t.slo_tpot_s * 1e3:g} ms"
    why = "the prefill pool bounds it" if cols["prefill_replicas"][i] else \
        "TTFT's queueing bounds its load"
    return head + f": batch {cols['batch'][j]} serves no more " \
                  f"({cols['throughput_per_gpu'][j]:.0f} tok/s/{u}: {why}) at a longer TPOT"
