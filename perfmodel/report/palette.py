"""The one colour per operator class, shared by every figure that colours by class: the
roofline and sweep figures (``plots``, ``sweep_plots``) and the harness's measured-against-
predicted figures (``validate/figures.py``). Keys are ``specs.kinds.OP_CLASSES``."""

from __future__ import annotations

CLASS_COLORS = {"gemm": "#1f77b4", "attention": "#ff7f0e", "norm": "#2ca02c",
                "activation": "#d62728", "elementwise": "#9467bd", "embedding": "#8c564b",
                "communication": "#7f7f7f", "framework": "#e377c2", "idle": "#d9d9d9",
                "draft": "#17becf", "dequant": "#bcbd22"}
OTHER_COLOR = "#000000"   # a class missing above


def class_color(op_class: str) -> str:
    """The colour of ``op_class`` (black for a class the palette does not know)."""
    return CLASS_COLORS.get(op_class, OTHER_COLOR)
