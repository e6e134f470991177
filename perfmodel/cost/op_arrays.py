"""Records as arrays of instances: a record's fields laid along one axis (``flatten``) and
records of one type joined into one (``concat``), as the validation samples batch them."""

from __future__ import annotations

import numpy as np

from perfmodel.cost.ops import Grouped, OpRecord


def grouped_fields(op: OpRecord) -> tuple[str, ...]:
    """Fields of ``op`` with a trailing axis of sequence groups (a ``Grouped`` record's)."""
    return op._GROUPED if isinstance(op, Grouped) else ()


def flatten(op: OpRecord) -> dict[str, np.ndarray]:
    """``op``'s fields broadcast to its instances and laid along one axis (grouped fields
    keep their groups axis): the columns of a one-axis record of the same instances."""
    shape, grouped = op.shape, grouped_fields(op)
    n = int(np.prod(shape))
    out = {}
    for name in op._instance():
        value = np.asarray(getattr(op, name))
        if name in grouped:
            out[name] = np.broadcast_to(value, shape + value.shape[-1:]).reshape(n, -1)
        else:
            out[name] = np.broadcast_to(value, shape).reshape(n)
    return out


def concat(ops: list[OpRecord]) -> OpRecord:
    """One record of every instance of ``ops`` (all of one type; ``Attention`` records with
    the same number of groups), along one axis."""
    parts = [flatten(op) for op in ops]
    return type(ops[0])(**{k: np.concatenate([p[k] for p in parts]) for k in parts[0]})
