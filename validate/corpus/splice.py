"""Carry a few rewritten keys of a YAML text into the original, line by line (no torch).

A writer that re-dumps a whole block (``corpus.moe.hardware_text`` dumps ``engines:``
again) drops every comment in it: the sources and reasons other fits wrote beside their
constants. ``splice`` takes the original text and the rewritten one and replaces, in the
original, only the text of the keys named by their paths (``("engines", "trtllm",
"efficiency", "moe_kernels")``), so everything else stays byte for byte. A key is its line
``<indent>name:`` (two spaces a level) and the lines after it indented deeper.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def _span(lines: Sequence[str], path: Sequence[str]) -> tuple[int, int] | None:
    """(first line, end) of the key at ``path`` in ``lines`` (None: not there)."""
    start, end = 0, len(lines)
    for depth, name in enumerate(path):
        pad = "  " * depth
        head = next((i for i in range(start, end) if lines[i].startswith(f"{pad}{name}:")
                     and lines[i][len(pad) + len(name) + 1:][:1] in ("", " ", "\n")), None)
        if head is None:
            return None
        stop = head + 1
        while stop < end and (not lines[stop].strip() or _indent(lines[stop]) > len(pad)):
            stop += 1
        while stop > head + 1 and not lines[stop - 1].strip():
            stop -= 1           # blank lines after a key belong to what follows
        start, end = head, stop
    return start, end


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def splice(original: str, rewritten: str, paths: Iterable[Sequence[str]]) -> str:
    """``original`` with the text of each key in ``paths`` taken from ``rewritten``; where
    a key is missing from either text, ``rewritten`` whole (nothing to keep it beside)."""
    old = original.splitlines(keepends=True)
    new = rewritten.splitlines(keepends=True)
    for path in paths:
        here, there = _span(old, path), _span(new, path)
        if here is None or there is None:
            return rewritten
        old = old[:here[0]] + new[there[0]:there[1]] + old[here[1]:]
    return "".join(old)
