"""The data ``serving.planner.launch`` needs, read from the package: which Hugging Face checkpoint
serves a model (``checkpoints.yaml``) and each engine version's accepted flags
(``engines/flags/<engine>-<version>.yaml``, made by ``reports/engines/make_flag_lists.py``
from the engine's source), and the reading back of a launch's flags and YAML keys that the
check against them needs."""

from __future__ import annotations

import re
import shlex
from functools import cache
from pathlib import Path

from perfmodel.serving.planner.launch import Checkpoint, Launch, Step
from perfmodel.specs.model import Model

HERE = Path(__file__).parent
CHECKPOINTS = HERE / "checkpoints.yaml"
FLAGS = HERE.parent / "engines" / "flags"


@cache
def _table() -> dict:
    import yaml

    return yaml.safe_load(CHECKPOINTS.read_text())


def checkpoint(model: Model, chat: bool = True) -> Checkpoint:
    """The checkpoint to serve ``model`` from: the family's instruct/chat one for a chat
    workload (``chat``) where it has one, else the pretrained; a model not in
    ``checkpoints.yaml`` is its ``source:`` repository in its ``quantization:`` format."""
    row = _table().get(model.name)
    if row is None:
        found = re.search(r"huggingface\.co/([^/\s]+/[^/\s;]+?)(?:/blob|/tree|[\s;]|$)",
                          model.source or "")
        q = model.quantization
        fmt = "bf16" if q is None else "mxfp4" if q.method == "mxfp4" else q.weights_dtype
        return Checkpoint(found.group(1) if found else model.name, fmt)
    first, other = (row["chat"], row["base"]) if chat else (row["base"], row["chat"])
    return Checkpoint(first or other, row["format"], row["base"] if chat else None)


@cache
def flag_list(engine: str, version: str) -> dict:
    """The flags ``engine`` ``version`` accepts (flag -> {choices}); TensorRT-LLM's
    ``--extra_llm_api_options`` YAML keys as ``yaml:key`` / ``yaml:key.sub``."""
    import yaml

    path = FLAGS / f"{engine}-{version}.yaml"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no flag list for {engine} {version}")
    return yaml.safe_load(path.read_text())["flags"]


def unknown_flags(launch: Launch) -> list[str]:
    """Every flag (and TensorRT-LLM YAML key) ``launch`` emits that its engine version's
    flag list does not hold, or whose value is not among the choices it lists: 'flag' or
    'flag=value'; empty when all are known."""
    known = flag_list(launch.engine, launch.version)
    pairs = [p for s in launch.steps if s.checked for p in emitted_flags(s)]
    pairs += [(f"yaml:{k}", v or None) for _, body in launch.files for k, v in yaml_keys(body)]
    out = []
    for flag, value in pairs:
        if flag not in known:
            out.append(flag)
        elif value is not None and (known[flag] or {}).get("choices") and \
                value not in known[flag]["choices"]:
            out.append(f"{flag}={value}")
    return out


def emitted_flags(step: Step) -> list[tuple[str, str | None]]:
    """The launcher flags of one step with their values (None: a switch): the tokens
    after the launcher's name (``serve``, ``sglang.launch_server``, ``trtllm-serve``)."""
    tokens = shlex.split(step.command, comments=True)
    for start in ("serve", "sglang.launch_server", "trtllm-serve"):
        if start in tokens:
            tokens = tokens[tokens.index(start) + 1:]
            break
    return [(t, tokens[i + 1] if i + 1 < len(tokens) and not tokens[i + 1].startswith("-")
             else None) for i, t in enumerate(tokens) if t.startswith("-")]


def yaml_keys(body: str) -> list[tuple[str, str]]:
    """The keys of a launch YAML (two levels, ``a.b``) with their values, read without a
    YAML parser (the launch files are flat ``key: value`` lines)."""
    out, parent = [], ""
    for line in body.splitlines():
        key, _, value = line.partition(":")
        if line.startswith("  "):
            out.append((f"{parent}.{key.strip()}", value.strip()))
        elif key:
            parent = key
            out.append((key, value.strip()))
    return out
