"""The memory speculative decoding adds on the target's devices: the draft's weights and
its cache.

- A draft model on the target's devices (``Speculation.draft_hw`` unset): its own weights
  and KV cache at the workload's dtypes under its plan (``memory_estimate`` of the draft),
  beside the target's. Given a device of its own it adds nothing here (a warning says so).
- MTP: the target's MTP modules (``params.ParamCounts.mtp``) at the weight dtype, and one
  layer's KV cache per module used (each drafts at one extra decoder layer).
- EAGLE heads: the head's decoder layer, its fc ([2d or 3d] x d) and, for EAGLE-3, its own
  LM head of the draft vocabulary, at the weight dtype, and one layer's KV cache.
- Medusa-style heads: K residual blocks of d x d, and K LM heads of vocab x d unless they
  share the target's, at the activation dtype.

The batch ceiling is recomputed from the target's: the room left after both sets of
weights, over the KV of both per sequence plus the target's workspace per sequence (the
draft and the target do not run at once, so their activations do not add).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from perfmodel.cost.memory import (
    MemoryEstimate,
    activation_terms,
    fitting_batch,
    memory_estimate,
)
from perfmodel.cost.params import param_counts
from perfmodel.schedules.speculative import Speculation, eagle_head
from perfmodel.specs.dtypes import BYTES
from perfmodel.specs.hardware import Hardware
from perfmodel.specs.model import Model
from perfmodel.specs.workload import Parallelism, Workloads


def draft_bytes(model: Model, hw: Hardware, plan: Parallelism, w: Workloads,
                spec: Speculation) -> tuple[np.ndarray, np.ndarray]:
    """(weight bytes, KV bytes per sequence) the draft adds on one target device."""
    zero = np.zeros(len(w))
    if spec.draft == "model":
        if spec.draft_hw is not None:       # given its own device: counted there
            return zero, zero
        mem = memory_estimate(spec.draft_model, hw, spec.draft_plan or plan, w)
        return mem.weights_bytes * np.ones(len(w)), mem.kv_cache_bytes_per_sequence * \
            np.ones(len(w))
    if spec.draft == "mtp":
        target = memory_estimate(model, hw, plan, w)
        weights = param_counts(model, plan.tp).mtp * w.weight_bytes_per_param
        per_layer = target.kv_cache_bytes_per_sequence / model.n_layers
        return weights, per_layer * min(spec.k, max(model.mtp_modules, 1))
    if spec.draft in ("eagle", "eagle3"):
        return eagle_bytes(model, hw, plan, w, spec.draft)
    d, heads = model.d_model, spec.k
    per_head = d * d + (0 if spec.shared_lm_head else model.vocab_size * d)
    return heads * per_head * BYTES[w.act_dtype] / plan.tp, zero


def eagle_bytes(model: Model, hw: Hardware, plan: Parallelism, w: Workloads, kind: str
                ) -> tuple[np.ndarray, np.ndarray]:
    """(weight bytes, KV bytes per sequence) of an EAGLE head on one target device: its
    decoder layer (``eagle_head``: attention, MLP, norms), its fc ([2d or 3d] x d) and, for
    EAGLE-3, its LM head of the draft vocabulary (EAGLE-1/2 share the target's), at the
    weight dtype; the KV of one of the target's layers per sequence."""
    head = eagle_head(model, kind)
    c = param_counts(head, plan.tp)
    own_lm = c.lm_head if kind == "eagle3" else 0.0
    fc = (3 if kind == "eagle3" else 2) * model.d_model ** 2
    weights = (c.attention + c.mlp + c.norms + own_lm + fc) * w.weight_bytes_per_param
    per_layer = memory_estimate(model, hw, plan, w).kv_cache_bytes_per_sequence / model.n_layers
    return weights * np.ones(len(w)), per_layer


def with_draft(mem: MemoryEstimate, model: Model, hw: Hardware, plan: Parallelism,
               w: Workloads, spec: Speculation) -> MemoryEstimate:
    """``mem`` (the target's) with the draft's weights and cache added (module docstring)."""
    weights, kv_seq = draft_bytes(model, hw, plan, w, spec)
    batch = np.ceil(w.batch / plan.attention_ways)
    total_weights = mem.weights_bytes + weights
    per_seq = mem.kv_cache_bytes_per_sequence + kv_seq
    room = mem.usable_bytes - total_weights
    max_batch = fitting_batch(room, per_seq, *activation_terms(model, plan.tp, w),
                              plan.pp) * plan.attention_ways
    return replace(mem, weights_bytes=total_weights, kv_cache_bytes_per_sequence=per_seq,
                   kv_cache_bytes=mem.kv_cache_bytes + kv_seq * batch,
                   max_batch=max_batch, fits=w.batch <= max_batch)
