"""Sums over operators that do not depend on how many configurations are priced together.

numpy reduces a contiguous axis pairwise (eight partial sums at a time) and a strided one
row by row, so ``a.sum(axis=0)`` of an (operators, N) array rounds differently for one
column than for many: a step priced alone and the same step priced with others would
differ in the last bit. ``sum_rows`` adds the rows in order whatever N is.
"""

from __future__ import annotations

import numpy as np


def sum_rows(a: np.ndarray) -> np.ndarray:
    """``a`` summed over its first axis in order, row by row (shape ``a.shape[1:]``)."""
    out = np.zeros(a.shape[1:])
    for row in a:
        out = out + row
    return out
