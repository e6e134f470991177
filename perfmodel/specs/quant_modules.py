"""Which linear class a Hugging Face module name belongs to, and which classes a
checkpoint's skip list or target list names (``specs.quantization`` reads the configs).

Names are matched the way the engines match them: a substring (vLLM
``is_layer_skipped_awq``), a regex matched at the start (transformers
``should_convert_module``), ``re:``-prefixed (compressed-tensors), or a glob with ``*``
matched whole, the module or one inside it (ModelOpt ``exclude_modules``: vLLM's ModelOpt
config turns ``*`` into ``.*`` and full-matches the module's name; gpt-oss's
``model.layers.*.self_attn``). A pattern that keeps only some modules of a
class (one layer, one projection) is an error: one format per class here.
"""

from __future__ import annotations

import re
from fnmatch import fnmatchcase
from typing import Any

from perfmodel.specs.fields import Fields
from perfmodel.specs.model import QUANT_CLASSES

# families whose experts are ``block_sparse_moe.experts.J.w1/w2/w3`` under a
# ``block_sparse_moe.gate`` router (Mixtral's modeling; MiniMax-M2's
# ``MiniMaxM2SparseMoeBlock``), where the others use ``mlp.experts.J.gate_proj`` etc.
W123_FAMILIES = ("mixtral", "minimax_m2")


def patterns(q: Fields, key: str) -> list[str]:
    value = q.raw(key, []) or []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise q.error(key, f"expected a list of module names or patterns, got {value!r}")
    return value


def module_names(out: dict[str, Any]) -> dict[str, list[str]]:
    """The Hugging Face module names of each linear class of a translated config (the
    first and last expert of each MoE layer stand for all of them)."""
    layers, moe, mla = out["n_layers"], out.get("moe"), out.get("mla")
    if mla is not None:
        q = ["q_a_proj", "q_b_proj"] if mla.get("q_lora_rank") else ["q_proj"]
        attn = [*q, "kv_a_proj_with_mqa", "kv_b_proj", "o_proj"]
    else:
        attn = ["q_proj", "k_proj", "v_proj", "o_proj"]
    dense = ["gate_proj", "up_proj", "down_proj"]
    first = moe.get("first_dense_layers", 0) if moe else layers
    step = moe.get("layer_step", 1) if moe else 1
    names: dict[str, list[str]] = {c: [] for c in QUANT_CLASSES}
    for i in range(layers):
        p = f"model.layers.{i}."
        names["attention"] += [f"{p}self_attn.{n}" for n in attn if n != "o_proj"]
        names["o_proj"].append(f"{p}self_attn.o_proj")
        if i < first or (i + 1) % step:
            names["mlp"] += [f"{p}mlp.{n}" for n in dense]
            continue
        block, mats = ("block_sparse_moe", ["w1", "w2", "w3"]) \
            if out["family"] in W123_FAMILIES else ("mlp", dense)
        names["router"].append(f"{p}{block}.gate")
        names["experts"] += [f"{p}{block}.experts.{j}.{n}"
                             for j in sorted({0, moe["n_experts"] - 1}) for n in mats]
        if moe.get("n_shared_experts"):
            names["shared_experts"] += [f"{p}mlp.shared_experts.{n}" for n in dense]
    return names


def matches(pattern: str, name: str) -> bool:
    if pattern == "Linear":                  # compressed-tensors: a module class
        return True
    if pattern.startswith("re:"):
        return re.match(pattern[3:], name) is not None
    if pattern in name:
        return True
    if "*" in pattern:      # a glob: the module itself or one inside it
        return fnmatchcase(name, pattern) or fnmatchcase(name, pattern + ".*")
    try:
        return re.match(pattern, name) is not None
    except re.error:
        return False


def classes(q: Fields, key: str, patterns: list[str],
             names: dict[str, list[str]]) -> dict[str, bool]:
    """For each linear class the model has: whether ``patterns`` name all its modules.
    Naming only some of them is an error."""
    for p in patterns:
        if p.startswith("re:"):
            try:
                re.compile(p[3:])
            except re.error as exc:
                raise q.error(key, f"{p!r} is not a valid regex: {exc}") from None
    result = {}
    for cls, modules in names.items():
        hit = [n for n in modules if any(matches(p, n) for p in patterns)]
        if hit and len(hit) < len(modules):
            raise q.error(key, f"names only some {cls} modules ({len(hit)} of "
                          f"{len(modules)}, e.g. {hit[0]!r}); perfmodel models one dtype "
                          "per linear class (docs/checkpoints.md)")
        if modules:
            result[cls] = bool(hit)
    return result
