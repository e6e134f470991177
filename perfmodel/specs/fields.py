"""Reading a YAML or JSON mapping with errors a user can act on.

``read_mapping`` parses a file (a key given twice is an error); ``Fields`` reads it with typed
getters whose ``SpecError`` names ``file: path.field`` and what was expected, and reports
unknown keys, so a typo never silently falls back to a default.
"""

from __future__ import annotations

import difflib
import json
import math
from pathlib import Path
from typing import Any

import yaml

from perfmodel.specs import units
from perfmodel.specs.errors import SafeMessage, SpecError, did_you_mean, quoted, read_user_file

# no device has more: a figure above these is a typo (5e9 for 5e-9), not hardware
_LIMITS = {"bytes": 2.0**50, "bytes_per_s": 1e15, "flops_per_s": 1e19, "s": 1.0}
# nor so little: a rate below these is a unit mistake (1e-30 for 1e30), and would turn every
# time into years
_FLOORS = {"bytes_per_s": 1e6, "flops_per_s": 1e6}


class Fields:
    """A mapping being read: typed getters that name ``file: path.field`` in errors."""

    def __init__(self, data: Any, file: str, path: str = "",
                 allowed: tuple[str, ...] | None = None,
                 renamed: dict[str, str] | None = None) -> None:
        # renamed: key -> the path its errors name (a block taken from elsewhere in the file)
        self.file, self.path, self.renamed = file, path, renamed or {}
        if not isinstance(data, dict):
            raise self.error("", f"expected a mapping, got {type(data).__name__}")
        self.data, self.used, self.allowed = data, set(), allowed
        if allowed is not None:   # report a misspelt key before the field it was meant to be
            self.used = {k for k in data if k in allowed}
            self.finish()
            self.used = set()

    def error(self, key: str, what: str) -> SpecError:
        where = self.renamed.get(key) or ".".join(p for p in (self.path, key) if p) \
            or "(top level)"
        return SpecError(f"{self.file}: {where}: {what}")

    def has(self, key: str) -> bool:
        return key in self.data and self.data[key] is not None

    def raw(self, key: str, default: Any = ..., ) -> Any:
        self.used.add(key)
        if key not in self.data or self.data[key] is None:
            if default is ...:
                raise self.error(key, "missing required field" + self._misspelt(key))
            return default
        return self.data[key]

    def _misspelt(self, key: str) -> str:
        """The hint " (a field given is close to this name: a misspelling?)" when an unread
        given key is close (the key itself is not quoted: it is the file's text)."""
        known = set(self.allowed or ()) | self.used
        close = difflib.get_close_matches(key, [str(k) for k in self.data if k not in known],
                                          n=1)
        return " (a field given is close to this name: a misspelling?)" if close else ""

    def sub(self, key: str, required: bool = True) -> Fields | None:
        """The mapping under ``key`` (None when optional and absent); its own unknown keys
        are reported by its ``finish``."""
        if not required and not self.has(key):
            self.used.add(key)
            return None
        return Fields(self.raw(key), self.file, self.renamed.get(key)
                      or ".".join(p for p in (self.path, key) if p))

    def text(self, key: str, default: Any = ..., choices: tuple[str, ...] | None = None) -> str:
        value = self.raw(key, default)
        if value is None and default is None:
            return value
        if not isinstance(value, str):
            raise self.error(key, f"expected text, got {quoted(value)}")
        if choices and value not in choices:
            raise self.error(key, f"expected one of {', '.join(choices)}, got {quoted(value)}"
                             f"{did_you_mean(value, choices)}")
        return value

    def flag(self, key: str, default: Any = ...) -> bool:
        value = self.raw(key, default)
        if not isinstance(value, bool):
            raise self.error(key, f"expected true or false, got {quoted(value)}")
        return value

    def integer(self, key: str, default: Any = ..., minimum: int = 1,
                maximum: int | None = None) -> int:
        """An integer in [minimum, maximum]; a float (even 4096.0), a bool or text is an
        error, so is a value past ``maximum`` (a bound no real model reaches)."""
        value = self.raw(key, default)
        if value is None:
            return value
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.error(key, f"expected an integer, got {quoted(value)}"
                             f"{_integer_hint(value, self.file.endswith('.json'))}")
        if value < minimum:
            raise self.error(key, f"expected an integer >= {minimum}, got {value}")
        if maximum is not None and value > maximum:
            raise self.error(key, f"expected an integer <= {maximum:,}, got {value:,}")
        return value

    def quantity(self, key: str, kind: str, default: Any = ..., positive: bool = True,
                 maximum: float | None = None) -> float:
        value = self.raw(key, default)
        try:
            out = units.parse_quantity(value, kind)
        except units.UnitError as exc:
            raise self.error(key, str(exc)) from None
        limit = _LIMITS.get(kind, math.inf) if maximum is None else maximum
        if not math.isfinite(out) or out > limit:
            raise self.error(key, f"expected a finite value of at most {limit:g}, got "
                             f"{quoted(value)}")
        if positive and out <= 0:
            raise self.error(key, f"expected a positive value, got {quoted(value)}")
        if 0 < out < _FLOORS.get(kind, 0.0):
            raise self.error(key, f"expected at least {_FLOORS[kind]:g} (or 0 where 0 means "
                             f"none), got {quoted(value)}")
        if not positive and out < 0:
            raise self.error(key, f"expected a non-negative value, got {quoted(value)}")
        return out

    def finish(self) -> None:
        """Refuse keys nobody read, naming the block, the count and the expected names (an
        unknown key is the file's text, never quoted: only "did you mean" our own name)."""
        unknown = sorted(set(self.data) - self.used, key=str)
        if unknown:
            known = sorted(self.allowed if self.allowed is not None else self.used)
            hint = next(filter(None, (did_you_mean(k, known) for k in unknown)), "")
            count = f"{len(unknown)} unknown field{'s' if len(unknown) > 1 else ''}"
            expected = f"expected {', '.join(known)}" if known else "expected none"
            raise self.error("", f"{count}{hint} ({expected}; see the README beside the "
                             "shipped files)")


def _integer_hint(value: Any, is_json: bool = False) -> str:
    """What to write instead of a float (4096.0), of text YAML reads as such (5e9), or of a
    number in quotes ("28")."""
    if isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            return ""
        if not math.isfinite(number):
            return ""
        if is_json or not any(c in value for c in "eE") or "." in value:
            return " (a number in quotes is text; write it without the quotes)"
        return " (YAML reads a number with an exponent and no dot as text; write the " \
            "integer in full)"
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e18:
        return f" (write {int(value)})"
    return ""


class _UniqueKeyLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
    """PyYAML's safe loader (libyaml's C parser where PyYAML has it: 10x faster), refusing a
    key given twice in one mapping (plain PyYAML keeps the last value silently, so a pasted
    second block would override the first unnoticed)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise _DuplicateYamlKey(None, None, "a field given twice", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


class _DuplicateYamlKey(yaml.constructor.ConstructorError, SafeMessage):
    """A YAML mapping names one key twice (the key is not quoted: it is the file's text)."""


class DuplicateKeyError(SafeMessage):
    """A JSON object names one key twice (``json`` itself would keep the last silently)."""


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict:
    """``json.loads`` object hook: the object as a dict, refusing a key given twice."""
    out: dict = {}
    for key, value in pairs:
        if key in out:
            raise DuplicateKeyError("a field given twice")
        out[key] = value
    return out


def read_mapping(path: Path, expected: str = "a YAML or JSON file") -> dict:
    """Parse a YAML or JSON file (by suffix: .json is JSON) into a mapping, or raise a
    one-line SpecError; ``expected`` says what a directory given instead should have been."""
    is_json = path.suffix == ".json"
    data = read_user_file(
        path, f"valid {'JSON' if is_json else 'YAML'}",
        lambda p: json.loads(p.read_text(), object_pairs_hook=_unique_pairs) if is_json
        else yaml.load(p.read_text(), Loader=_UniqueKeyLoader),   # a SafeLoader subclass
        (yaml.YAMLError, json.JSONDecodeError, DuplicateKeyError, UnicodeDecodeError),
        expected)
    if not isinstance(data, dict):
        raise SpecError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    return data
