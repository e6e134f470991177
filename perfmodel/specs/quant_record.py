"""A checkpoint's quantization record from each linear class's scheme: the one builder the
``quantization_config`` readers (``specs.quantization``, ``specs.quant_groups``) share."""

from __future__ import annotations

from perfmodel.specs.fields import Fields
from perfmodel.specs.formats import format_of
from perfmodel.specs.model import LINEAR_CLASSES, SUBCLASSES, Quantization

Scheme = tuple[str, int | None, float]       # weights dtype, group size, scale bytes per group


def record(where: Fields, method: str, per_class: dict[str, Scheme | None],
           names: dict[str, list[str]], lm_head: bool = False, acts: str | None = None,
           named: bool = True) -> Quantization | None:
    """The record of each class's scheme (None: 16-bit), with an MoE router always at 16
    bits: the engines build it unquantized whatever the config says (vLLM's Mixtral and
    DeepSeek gates: ``quant_config=None``). The main scheme is the experts' where they are
    quantized, else the first quantized class's; the classes stored otherwise go to
    ``Quantization.formats`` by their format's name. None when no class is quantized.
    ``named`` False: the scheme keeps no format name (bitsandbytes' blocks match none)."""
    per_class = {c: (None if c == "router" else s) for c, s in per_class.items()}
    parts = {c: per_class.pop(c) for c in SUBCLASSES if c in per_class}
    quantized = [c for c in LINEAR_CLASSES if per_class.get(c) is not None]
    if not quantized:
        return None
    main = per_class["experts" if "experts" in quantized else quantized[0]]
    fmt = format_of(*main) if named else None
    exact = fmt is not None and fmt.scheme == main
    other = []
    for c in quantized:
        if per_class[c] != main:
            alt = format_of(*per_class[c])
            if alt is None or alt.scheme != per_class[c]:
                raise where.error("", f"the {c} class's weights ({per_class[c][0]}, "
                                  f"groups of {per_class[c][1]}) differ from the others' "
                                  "and are in no weight format (docs/checkpoints.md)")
            other.append((c, alt.name))
    kept = [c for c in LINEAR_CLASSES if c in names and names[c] and per_class.get(c) is None]
    for c, scheme in parts.items():      # a part stored as its class is no part of its own
        if scheme != per_class.get(SUBCLASSES[c]):
            if scheme is None:
                kept.append(c)
            else:
                other.append((c, format_of(*scheme).name))
    return Quantization(method, *main, tuple(kept), lm_head,
                        format=fmt.name if exact else "",
                        scale_dtype=fmt.scale_dtype if exact else "",
                        act_dtype=acts, formats=tuple(other))
