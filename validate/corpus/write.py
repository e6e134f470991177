"""Write a kernel calibration: a variant hardware YAML, the shipped YAML edited in place,
and the report (no torch).

``variant_text`` makes ``base: <device>`` plus the fitted efficiency and interconnect
values (``--out``). ``shipped_text`` rewrites a shipped file's fitted keys in place, line by
line, so its comments and sources stay, and replaces its top-level ``calibration:`` (and,
where the loader knows them, ``uncertainty:`` and ``engines:``) blocks
(``--write-hardware``). Blocks the loader does not know yet go to the report folder.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from perfmodel.specs.load import HARDWARE_DIR, HARDWARE_KEYS

TOP_BLOCKS = ("calibration", "uncertainty", "engines")
NOTE = ("vLLM kernel fit (aiconfigurator-core measurements; see calibration:) for {keys}; "
        "the other figures: ")


def _dump(doc: dict) -> str:
    return yaml.safe_dump(doc, sort_keys=False, width=100, default_flow_style=None)


def variant_text(name: str, blocks: dict) -> str:
    """A hardware YAML laid over the shipped ``name`` with the fitted blocks."""
    eff = dict(blocks["efficiency"])
    kinds = eff.pop("kernel_latency_by_kind", {})
    base_kinds = {}
    if kinds:
        import perfmodel as pm

        base_kinds = dict(pm.hardware(name).efficiency.kernel_latency_by_kind)
        eff["kernel_latency_by_kind"] = base_kinds | kinds
    doc = {"version": 1, "base": name, "name": f"{name}-calibrated",
           "efficiency": eff | {"source": blocks["calibration"]["source"]}}
    if blocks["interconnect"]:
        doc["interconnect"] = blocks["interconnect"] | {
            "source": blocks["calibration"]["source"]}
    for key in TOP_BLOCKS:
        if key in blocks and key in HARDWARE_KEYS:
            doc[key] = blocks[key]
    return _dump(doc)


def _block_span(lines: list[str], block: str) -> tuple[int, int]:
    """(first line after ``block:``, end) of a top-level block."""
    start = lines.index(f"{block}:\n") + 1
    end = start
    while end < len(lines) and (lines[end].startswith(" ") or not lines[end].strip()):
        end += 1
    return start, end


def _set(lines: list[str], block: str, key: str, value: object, indent: int = 2) -> None:
    """Set ``key: value`` in ``block`` (kept comment; inserted before ``source:`` if new)."""
    start, end = _block_span(lines, block)
    pad = " " * indent
    pattern = re.compile(rf"^{pad}{re.escape(key)}:\s*[^#\n]*?(\s*#.*)?$")
    shown = _shown(key, value)
    for i in range(start, end):
        match = pattern.match(lines[i].rstrip("\n"))
        if match:
            lines[i] = f"{pad}{key}: {shown}{match.group(1) or ''}\n"
            return
    at = next((i for i in range(start, end) if lines[i].startswith(f"{pad}source:")), end)
    lines.insert(at, f"{pad}{key}: {shown}\n")


def _shown(key: str, value: object) -> object:
    """Seconds as microseconds text (the files' style); other values as they are."""
    if key.endswith("_s") and isinstance(value, float):
        return f"{value * 1e6:.4g} us"
    return value


def _kind_value(key: str, value: object) -> object:
    return _shown("kernel_latency_s", value) if key == "kernel_latency_by_kind" else value


def _set_kind(lines: list[str], key: str, kind: str, value: object) -> None:
    start, end = _block_span(lines, "efficiency")
    head = next((i for i in range(start, end) if lines[i] == f"  {key}:\n"), None)
    if head is None:
        _set(lines, "efficiency", key, f"{{{kind}: {_kind_value(key, value)}}}")
        return
    i = head + 1
    while i < end and lines[i].startswith("    "):
        if lines[i].startswith(f"    {kind}:"):
            lines[i] = f"    {kind}: {_kind_value(key, value)}\n"
            return
        i += 1
    lines.insert(head + 1, f"    {kind}: {_kind_value(key, value)}\n")


def _note_source(lines: list[str], block: str, keys: list[str]) -> None:
    start, end = _block_span(lines, block)
    for i in range(start, end):
        if lines[i].startswith('  source: "'):
            body = lines[i][len('  source: "'):]
            body = re.sub(r"^vLLM kernel fit \(.*?\) for [^;]*; the other figures: "
                          r"(custom_all_reduce_max_bytes: [^;]*; )?", "", body)
            fitted = [k for k in keys if k != "custom_all_reduce_max_bytes"]
            note = NOTE.format(keys=", ".join(fitted))
            if len(fitted) < len(keys):
                note += ("custom_all_reduce_max_bytes: vLLM's CustomAllreduce max_size, 8192 "
                         "* 1024 (distributed/device_communicators/custom_all_reduce.py); ")
            lines[i] = '  source: "' + note + body
            return


def _strip_top(lines: list[str], key: str) -> list[str]:
    """``lines`` without the top-level block ``key`` (block or one-line flow style)."""
    start = next((i for i, line in enumerate(lines) if line.startswith(f"{key}:")), None)
    if start is None:
        return lines
    end = start + 1
    while end < len(lines) and lines[end].startswith(" "):
        end += 1
    return lines[:start] + lines[end:]


def shipped_text(text: str, blocks: dict, engines: dict | None = None) -> str:
    """``text`` (a shipped hardware YAML) with the fitted values and blocks written in."""
    lines = text.splitlines(keepends=True)
    for key, value in blocks["efficiency"].items():
        if isinstance(value, dict):
            for kind, v in value.items():
                _set_kind(lines, key, kind, v)
        else:
            _set(lines, "efficiency", key, value)
    for key, value in blocks["interconnect"].items():
        _set(lines, "interconnect", key, value)
    _note_source(lines, "efficiency", sorted(blocks["efficiency"]))
    if blocks["interconnect"]:
        _note_source(lines, "interconnect", sorted(blocks["interconnect"]))
    for key in TOP_BLOCKS:
        lines = _strip_top(lines, key)
    out = "".join(lines).rstrip("\n") + "\n"
    extra = {k: blocks[k] for k in ("calibration", "uncertainty") if k in HARDWARE_KEYS}
    if engines and "engines" in HARDWARE_KEYS:
        extra["engines"] = {name: {k: v for k, v in block.items()
                                   if k != "uncertainty" or k in HARDWARE_KEYS}
                            for name, block in engines.items()}
    return out + (_dump(extra) if extra else "")


def band_text(text: str, uncertainty: dict) -> str:
    """``text`` (a shipped hardware YAML of a device without its own fit) with its
    top-level ``uncertainty:`` block replaced by ``uncertainty``."""
    lines = _strip_top(text.splitlines(keepends=True), "uncertainty")
    return "".join(lines).rstrip("\n") + "\n" + _dump({"uncertainty": uncertainty})


def engine_efficiency(name: str, engine: str) -> dict:
    """The ``engines.<engine>.efficiency`` block of the shipped ``name`` file ({} if none)."""
    import yaml

    doc = yaml.safe_load(shipped_path(name).read_text()) or {}
    return dict(((doc.get("engines") or {}).get(engine) or {}).get("efficiency") or {})


def shipped_path(name: str) -> Path:
    return HARDWARE_DIR / f"{name}.yaml"


def pending_blocks(blocks: dict, engines: dict | None = None) -> dict:
    """The blocks the loader does not accept yet (kept in the report until it does)."""
    out = {k: blocks[k] for k in ("uncertainty",) if k not in HARDWARE_KEYS}
    if engines and "engines" not in HARDWARE_KEYS:
        out["engines"] = engines
    elif engines and "uncertainty" not in HARDWARE_KEYS:
        out["engines.*.uncertainty"] = {n: b.get("uncertainty") for n, b in engines.items()}
    return out
