"""The one colour per operator class, shared by every figure that colours by class: the
roofline and sweep figures (``plots``, ``sweep_plots``) and the harness's measured-against-
predicted figures (``validate/figures.py``). Keys are ``specs.kinds.OP_CLASSES``."""

from __future__ import annotations

CLASS_COLORS = {"gemm": "#1f77b4", "attention": "#ff7f0e", "norm": "#2ca02c",
                "activation": "#d62728", "elementwise": "#9467bd", "embedding": "#8c564b",
                "communication": "#7f7f7f", "framework": "#e377c2", "idle": "#d9d9d9",
                "draft": "#17becf", "dequant": "#bcbd22"}
OTHER_COLOR = "#000000"   # a class missing above
# error classes (``cost.error_class``): the kernel corpus's figures; GEMM-like in the GEMM
# blue family, attention in the attention orange family, collectives grey as above
ERROR_CLASS_COLORS = {"gemv": "#9ecae1", "gemm": "#1f77b4", "moe": "#08306b",
                      "attention_prefill": "#ff7f0e", "attention_decode": "#fdae6b",
                      "collective": "#7f7f7f", "memory": "#2ca02c", "host": "#e377c2"}


def error_class_color(name: str) -> str:
    """The colour of error class ``name`` (black for one the palette does not know)."""
    return ERROR_CLASS_COLORS.get(name, OTHER_COLOR)


def class_color(op_class: str) -> str:
    """The colour of ``op_class`` (black for a class the palette does not know)."""
    return CLASS_COLORS.get(op_class, OTHER_COLOR)
