"""Write the list of every flag a serving engine's launcher accepts, read from the engine's
own source at one version, to ``perfmodel/serving/engines/flags/<engine>-<version>.yaml``;
``perfmodel.serving.planner.launch``'s tests check every flag the plan emits against it.

    python reports/engines/make_flag_lists.py vllm   SOURCE [--ref REF] [--out DIR]
    python reports/engines/make_flag_lists.py sglang SOURCE
    python reports/engines/make_flag_lists.py trtllm SOURCE

SOURCE is a directory holding the package's source: a git checkout, or an unpacked wheel
(``pip download --no-deps --only-binary :all: vllm==0.24.0 && unzip -q vllm-*.whl``); or a
bare git directory with ``--ref`` (a tag or commit; files are read with ``git show``).

The source is parsed (``ast``), never imported, so no engine dependency is needed:

- vllm: every ``add_argument`` in ``vllm/engine/arg_utils.py``'s ``add_cli_args`` (and
  ``vllm/entrypoints/openai/cli_args.py``'s ``make_arg_parser``); the frontend dataclass
  fields (``--kebab-case``); a flag whose config field is a bool also has its ``--no-``
  form (vLLM registers bools with ``argparse.BooleanOptionalAction``); ``Literal`` choices.
- sglang: ``ServerArgs`` fields annotated ``A[T, "help"]`` / ``A[T, Arg(...)]``
  (``--kebab-case``, ``cli_name``, ``aliases``, ``choices`` or ``Literal`` values; bools
  are ``store_true``) and the explicit ``add_argument`` calls of
  ``python/sglang/srt/server_args.py``.
- trtllm: the YAML keys ``--extra_llm_api_options`` accepts, the fields of
  ``TorchLlmArgs`` and its bases in ``tensorrt_llm/llmapi/llm_args.py`` (a field typed
  with another config class there also lists ``field.subfield``), and ``trtllm-serve``'s
  click options in ``tensorrt_llm/commands/serve.py``.
"""

from __future__ import annotations

import argparse
import ast
import re
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "perfmodel" / "serving" / "engines" / "flags"
PREFIXES = {"vllm": ("",), "sglang": ("python/", ""), "trtllm": ("",)}


class Source:
    """Files of one package version: a directory, or a git directory at ``ref``."""

    def __init__(self, engine: str, where: Path, ref: str | None) -> None:
        self.engine, self.where, self.ref = engine, where, ref

    def read(self, path: str) -> str | None:
        for prefix in PREFIXES[self.engine]:
            if self.ref is not None:
                out = subprocess.run(["git", "-C", str(self.where), "show",
                                      f"{self.ref}:{prefix}{path}"], capture_output=True,
                                     text=True)
                if out.returncode == 0:
                    return out.stdout
            elif (self.where / prefix / path).is_file():
                return (self.where / prefix / path).read_text()
        return None

    def need(self, path: str) -> ast.Module:
        text = self.read(path)
        if text is None:
            sys.exit(f"error: {self.where}: {path}: not found (is this {self.engine}'s source?)")
        return ast.parse(text)

    def describe(self) -> str:
        if self.ref is None:
            return str(self.where.name)
        out = subprocess.run(["git", "-C", str(self.where), "rev-parse", self.ref],
                             capture_output=True, text=True)
        return f"git {self.ref} ({out.stdout.strip()})"


def _strings(node: ast.AST | None) -> list[str] | None:
    """The string constants of a list / tuple literal, else None."""
    if isinstance(node, (ast.List, ast.Tuple)) and all(
            isinstance(e, ast.Constant) for e in node.elts):
        return [str(e.value) for e in node.elts]
    return None


def _literal(node: ast.AST, aliases: dict[str, list[str]]) -> list[str] | None:
    """The values of the first ``Literal[...]`` in an annotation (or an alias of one)."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.Subscript) and getattr(sub.value, "id", "") == "Literal":
            inner = sub.slice.elts if isinstance(sub.slice, ast.Tuple) else [sub.slice]
            vals = [str(e.value) for e in inner if isinstance(e, ast.Constant)]
            return vals or None
        if isinstance(sub, ast.Name) and sub.id in aliases:
            return aliases[sub.id]
    return None


def _aliases(tree: ast.Module) -> dict[str, list[str]]:
    """Module-level ``Name = Literal[...]`` (or ``Name: TypeAlias = ...``)."""
    out = {}
    for node in tree.body:
        target, value = (node.targets[0], node.value) if isinstance(node, ast.Assign) else \
            (node.target, node.value) if isinstance(node, ast.AnnAssign) else (None, None)
        if isinstance(target, ast.Name) and value is not None:
            vals = _literal(value, {})
            if vals:
                out[target.id] = vals
    return out


def _fields(tree: ast.Module) -> dict[str, tuple[list[str], dict[str, ast.AST]]]:
    """Class name -> (base names, {field: annotation}) for every class of a module."""
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            fields = {s.target.id: s.annotation for s in node.body
                      if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)}
            out[node.name] = ([getattr(b, "id", getattr(b, "attr", "")) for b in node.bases],
                              fields)
    return out


def _all_fields(classes: dict, name: str) -> dict[str, ast.AST]:
    """A class's fields with its bases' (those defined in ``classes``), bases first."""
    if name not in classes:
        return {}
    bases, own = classes[name]
    out: dict[str, ast.AST] = {}
    for base in bases:
        out.update(_all_fields(classes, base))
    return out | own


def _names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)} | \
        {str(n.value) for n in ast.walk(node) if isinstance(n, ast.Constant)
         and n.value is None}


def _vllm_bool(annotation: ast.AST) -> bool:
    """vLLM's rule (``arg_utils._compute_kwargs``): a bool field gets
    ``BooleanOptionalAction``, except ``bool | str | None`` (an optional-valued flag)."""
    names = _names(annotation)
    return "bool" in names and not (names <= {"bool", "str", "None", "Optional", "Union"}
                                     and "str" in names)


def _add_argument_calls(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
            yield node


def _put(flags: dict, names: list[str], boolean: bool, choices: list[str] | None) -> None:
    for name in names:
        if not name.startswith("-"):
            continue
        flags[name] = {"choices": choices} if choices else {}
        if boolean and name.startswith("--"):
            flags["--no-" + name[2:]] = {}


def vllm(src: Source) -> tuple[dict, str, list[str]]:
    files = ["vllm/engine/arg_utils.py", "vllm/entrypoints/openai/cli_args.py"]
    configs = [p for p in ("vllm/config/" + f for f in _vllm_config_files(src))]
    classes, aliases = {}, {}
    for path in configs + files:
        tree = ast.parse(src.read(path) or "")
        classes |= _fields(tree)
        aliases |= _aliases(tree)
    flags: dict = {}
    engine = src.need(files[0])
    for fn in ast.walk(engine):
        if not (isinstance(fn, ast.FunctionDef) and fn.name == "add_cli_args"):
            continue
        kw_class = {}       # model_kwargs = get_kwargs(ModelConfig)
        for node in ast.walk(fn):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and \
                    getattr(node.value.func, "id", "") == "get_kwargs" and node.value.args:
                kw_class[node.targets[0].id] = getattr(node.value.args[0], "id", "")
        for call in _add_argument_calls(fn):
            _put(flags, *_vllm_call(call, kw_class, classes, aliases))
    frontend = src.need(files[1])
    for fn in ast.walk(frontend):
        if isinstance(fn, ast.FunctionDef) and fn.name == "make_arg_parser":
            for call in _add_argument_calls(fn):
                _put(flags, *_vllm_call(call, {}, classes, aliases))
    for field, ann in _all_fields(classes, "FrontendArgs").items():
        _put(flags, ["--" + field.replace("_", "-")], _vllm_bool(ann), _literal(ann, aliases))
    version = _version(src, "vllm/_version.py", "vllm/version.py")
    commit = re.search(r"commit_id\s*=\s*'([^']+)'", src.read("vllm/_version.py") or "")
    return flags, version, files + (["commit " + commit.group(1)] if commit else [])


def _vllm_config_files(src: Source) -> list[str]:
    if src.ref is None:
        folder = src.where / "vllm" / "config"
        return sorted(p.name for p in folder.glob("*.py")) if folder.is_dir() else []
    out = subprocess.run(["git", "-C", str(src.where), "ls-tree", "--name-only",
                          f"{src.ref}:vllm/config"], capture_output=True, text=True)
    return [n for n in out.stdout.split() if n.endswith(".py")]


def _vllm_call(call: ast.Call, kw_class: dict, classes: dict, aliases: dict
               ) -> tuple[list[str], bool, list[str] | None]:
    names = [a.value for a in call.args if isinstance(a, ast.Constant)
             and isinstance(a.value, str)]
    boolean, choices = False, None
    for kw in call.keywords:
        if kw.arg == "action":
            boolean = "BooleanOptionalAction" in ast.unparse(kw.value)
        elif kw.arg == "choices":
            choices = _strings(kw.value)
        elif kw.arg is None:            # **cfg_kwargs["x"], or **{**cfg_kwargs["x"], ...}
            spread = [kw.value] if isinstance(kw.value, ast.Subscript) else [
                v for k, v in zip(kw.value.keys, kw.value.values, strict=True) if k is None
                and isinstance(v, ast.Subscript)] if isinstance(kw.value, ast.Dict) else []
            for sub in spread:
                owner = kw_class.get(getattr(sub.value, "id", ""), "")
                ann = _all_fields(classes, owner).get(getattr(sub.slice, "value", None))
                if ann is not None:
                    boolean = boolean or _vllm_bool(ann)
                    choices = choices or _literal(ann, aliases)
    return names, boolean, choices


def sglang(src: Source) -> tuple[dict, str, list[str]]:
    path = "sglang/srt/server_args.py"
    tree = src.need(path)
    consts = {n.targets[0].id: _strings(n.value) for n in tree.body
              if isinstance(n, ast.Assign) and isinstance(n.targets[0], ast.Name)
              and _strings(n.value)}
    aliases = _aliases(tree)
    flags: dict = {}
    server = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ServerArgs")
    for stmt in server.body:
        if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.annotation, ast.Subscript)
                and getattr(stmt.annotation.value, "id", "") in ("A", "Annotated")):
            continue
        parts = stmt.annotation.slice.elts
        kind, meta = parts[0], parts[1] if len(parts) > 1 else None
        kw = {k.arg: k.value for k in meta.keywords} if isinstance(meta, ast.Call) else {}
        if meta is None or (isinstance(meta, ast.Call) and
                            getattr(kw.get("no_cli"), "value", False)):
            continue
        name = getattr(kw.get("cli_name"), "value", None) or \
            "--" + stmt.target.id.replace("_", "-")
        choices = _strings(kw.get("choices")) or consts.get(getattr(kw.get("choices"), "id", "")) \
            or _literal(kind, aliases)
        _put(flags, [name, *(_strings(kw.get("aliases")) or [])], False, choices)
    for call in _add_argument_calls(tree):
        names = [a.value for a in call.args if isinstance(a, ast.Constant)
                 and isinstance(a.value, str)]
        ch = next((k.value for k in call.keywords if k.arg == "choices"), None)
        _put(flags, names, False, _strings(ch) or consts.get(getattr(ch, "id", "")))
    return flags, _version(src, "sglang/_version.py", "sglang/version.py"), [path]


def trtllm(src: Source) -> tuple[dict, str, list[str]]:
    args_path, serve_path = "tensorrt_llm/llmapi/llm_args.py", "tensorrt_llm/commands/serve.py"
    classes = _fields(src.need(args_path))
    keys: dict = {}
    for field, ann in _all_fields(classes, "TorchLlmArgs").items():
        keys[field] = {}
        nested = [n for n in _names(ann) if n in classes and n != "TorchLlmArgs"]
        for cls in nested[:1]:
            for sub in _all_fields(classes, cls):
                keys[f"{field}.{sub}"] = {}
    flags: dict = {}
    for node in ast.walk(src.need(serve_path)):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "option":
            for a in node.args:
                if isinstance(a, ast.Constant) and isinstance(a.value, str):
                    _put(flags, a.value.split("/"), False, None)
    version = _version(src, "tensorrt_llm/version.py")
    return flags | {"yaml:" + k: v for k, v in keys.items()}, version, [args_path, serve_path]


def _version(src: Source, *paths: str) -> str:
    for path in paths:
        found = re.search(r"__version__\s*=\s*(?:version\s*=\s*)?['\"]([^'\"]+)['\"]",
                          src.read(path) or "")
        if found:
            return found.group(1)
    if src.ref is not None:
        out = subprocess.run(["git", "-C", str(src.where), "describe", "--tags", src.ref],
                             capture_output=True, text=True)
        if out.returncode == 0:
            return out.stdout.strip().lstrip("v")
    sys.exit(f"error: {src.where}: version: found no {' or '.join(paths)}; give --version")


READERS = {"vllm": vllm, "sglang": sglang, "trtllm": trtllm}
COMMANDS = {"vllm": "vllm serve", "sglang": "python -m sglang.launch_server",
            "trtllm": "trtllm-serve (flags) and --extra_llm_api_options YAML (keys as yaml:)"}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("engine", choices=sorted(READERS))
    ap.add_argument("source", type=Path, help="checkout, unpacked wheel or git directory")
    ap.add_argument("--ref", help="with a git directory: the tag or commit to read")
    ap.add_argument("--version", help="the version, where the source does not name it")
    ap.add_argument("--origin", default="", help="where the source came from (recorded)")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    src = Source(args.engine, args.source, args.ref)
    flags, version, read = READERS[args.engine](src)
    version = args.version or version
    doc = {"engine": args.engine, "version": version, "command": COMMANDS[args.engine],
           "source": f"{args.origin or src.describe()}: {', '.join(read)}",
           "generated_by": "reports/engines/make_flag_lists.py", "count": len(flags),
           "flags": {k: flags[k] for k in sorted(flags)}}
    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out / f"{args.engine}-{version}.yaml"
    out.write_text(yaml.safe_dump(doc, sort_keys=False, width=100))
    print(f"wrote {out} ({len(flags)} flags)")


if __name__ == "__main__":
    main()
