"""The accuracy gate: median |error| per group of a committed corpus sample and of the shared
measurement files, held against the figures the docs quote (tests/data/accuracy_gate.yaml).

A group is ``<device> <engine> <error class>`` of the sample (tests/data/kernel_sample/, a
seeded, stratified draw of the kernel corpus: reports/kernels/make_sample.py), or
``<file> <device> <error class>`` of a shared measurement file scored with its shipped
hardware file. Groups of fewer than ``MIN_ROWS`` rows are not gated (their median is noise).

A group fails when its median exceeds its figure plus ``margin(figure)``: the larger of 1.5
points and 10% of the figure. 1.5 points covers a small refit of the constants on the low
figures (a GEMM at 6%); 10% relative covers the same refit on the high ones (decode
attention at 40%), where one point is within the fit's fold-to-fold spread.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from perfmodel.kernels.compare import compare_files, score, usable
from perfmodel.kernels.importer import CSV_DEVICES
from perfmodel.specs.errors import SpecError

MIN_ROWS = 20
MARGIN_POINTS = 0.015
MARGIN_RELATIVE = 0.10
# shared measurement files (../shared/measurements) -> how their rows were timed: Vidur's
# profiler timed CUDA events around each kernel; LLMCompass timed the host call
SHARED_FILES = {"vidur-a100-layers.csv": "kernel", "vidur-a100-attention.csv": "kernel",
                "vidur-a40-layers.csv": "kernel", "llmcompass-kernels.csv": "host"}


def margin(figure: float) -> float:
    """How far above ``figure`` a median may go before the gate fails."""
    return max(MARGIN_POINTS, MARGIN_RELATIVE * figure)


def _medians(frame, keys: list[str], prefix: str = "") -> dict[str, dict]:
    """{group name: {"median": median |error|, "n": rows}} of a scored frame."""
    out = {}
    errors = np.abs(frame["error"].to_numpy(dtype=float))
    for key, index in frame.groupby(keys).indices.items():
        name = " ".join([prefix, *map(str, key)]).strip()
        out[name] = {"median": float(np.median(errors[index])), "n": len(index)}
    return out


def file_medians(path: str | Path, hw) -> dict[str, dict]:
    """Median |error| per device x engine x error class of one corpus file, every row the
    model can price scored on ``hw`` (a Hardware: e.g. a deliberately worse one)."""
    import pandas as pd

    from perfmodel.kernels.corpus import read_file

    df = read_file(Path(path))
    ok, _ = usable(df)
    scored = pd.DataFrame(score(df[ok].to_dict("records"), hw))
    return _medians(scored, ["device", "engine", "error_class"])


def sample_medians(folder: str | Path) -> dict[str, dict]:
    """Median |error| per device x engine x error class of the sample, every row scored with
    the shipped hardware file as that engine runs it."""
    scored = compare_files(folder, sample=0)["rows"]
    return _medians(scored, ["device", "engine", "error_class"])


def shared_medians(folder: str | Path) -> dict[str, dict]:
    """Median |error| per file x device x error class of the shared measurement files in
    ``folder`` (those of ``SHARED_FILES`` present), each device's shipped hardware file."""
    import pandas as pd

    from perfmodel.kernels.compare import device_for

    out: dict[str, dict] = {}
    cache: dict = {}
    for name, timing in SHARED_FILES.items():
        path = Path(folder) / name
        if not path.exists():
            continue
        df = pd.read_csv(path, dtype=str, keep_default_na=False)
        df["device"] = df["device"].map(lambda d: CSV_DEVICES.get(d, d))
        df["timing"] = timing
        ok, _ = usable(df)
        for device, part in df[ok].groupby("device"):
            hw = device_for(str(device), "", cache)
            if hw is None:
                raise SpecError(f"{path}: device {device}: no hardware file")
            scored = pd.DataFrame(score(part.to_dict("records"), hw))
            out |= _medians(scored, ["device", "error_class"], prefix=path.stem)
    return out


def failures(figures: dict[str, float], medians: dict[str, dict]) -> list[str]:
    """One line per gated group whose median exceeds its figure + margin, or that the
    figures list but the scoring no longer produces."""
    out = []
    for group, figure in sorted(figures.items()):
        got = medians.get(group)
        if got is None:
            out.append(f"{group}: no rows scored (figure {figure:.1%})")
        elif got["median"] > figure + margin(figure):
            out.append(f"{group}: median |error| {got['median']:.1%} over {got['n']} rows "
                       f"exceeds the limit {figure + margin(figure):.1%} "
                       f"(figure {figure:.1%} + margin)")
    return out


def gated(medians: dict[str, dict]) -> dict[str, float]:
    """The figures to commit: each group of at least ``MIN_ROWS`` rows, its median rounded
    to 0.1 point."""
    return {k: round(v["median"], 3) for k, v in sorted(medians.items())
            if v["n"] >= MIN_ROWS}


BEGIN, END = "<!-- accuracy-gate:begin -->", "<!-- accuracy-gate:end -->"
# the README's headline table: the same figures, a row per measured set, a column per class
HEADLINE_BEGIN = "<!-- accuracy-headline:begin -->"
HEADLINE_END = "<!-- accuracy-headline:end -->"
CLASSES = {"gemm": "GEMM", "gemv": "GEMV", "attention_prefill": "attention prefill",
           "attention_decode": "attention decode", "moe": "MoE", "collective": "collective",
           "memory": "memory"}


def gate_table(data: dict) -> str:
    """The gate's full table (docs/kernels.md, between its markers) of the figures file's
    mapping: every group, its figure and the limit CI holds it to."""
    lines = [BEGIN, "| group | median abs error (figure) | CI fails above |", "|---|---:|---:|"]
    for part in ("sample", "shared"):
        for group, figure in data[part].items():
            lines.append(f"| {group} | {figure:.1%} | {figure + margin(figure):.1%} |")
    return "\n".join([*lines, END])


def headline_table(data: dict) -> str:
    """The README's table (between its markers) of the same figures: a row per measured set
    (device and engine of the corpus sample; device of a shared file), a column per error
    class, each cell the median |error| the gate holds."""
    rows: dict[str, dict[str, float]] = {}
    for part, label in (("sample", "aiconfigurator-core {} {}"), ("shared", "{} ({})")):
        for group, figure in data[part].items():
            first, second, kind = group.rsplit(" ", 2)
            rows.setdefault(label.format(first, second), {})[kind] = figure
    kinds = [k for k in CLASSES if any(k in r for r in rows.values())]
    lines = [HEADLINE_BEGIN, "| measured kernels | " + " | ".join(CLASSES[k] for k in kinds)
             + " |", "|---|" + "---:|" * len(kinds)]
    for name, row in rows.items():
        cells = [f"{row[k]:.0%}" if k in row else "" for k in kinds]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join([*lines, HEADLINE_END])


def replace_between(text: str, table: str, begin: str, end: str) -> str:
    """``text`` with the block from ``begin`` to ``end`` replaced by ``table`` (which holds
    both markers); ValueError when the markers are missing."""
    start, stop = text.find(begin), text.find(end)
    if start < 0 or stop < start:
        raise ValueError(f"markers {begin} ... {end} not found")
    return text[:start] + table + text[stop + len(end):]
