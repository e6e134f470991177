"""Attention backends as profiles, and the FP8 rate and query cast they run an FP8 cache at.

One engine runs different attention kernels on different devices, and a collector may time
several on one (aiconfigurator's SGLang collector: fa3 on Hopper, trtllm_mha on Blackwell,
and FlashInfer and Triton beside them; ai-dynamo/aiconfigurator
``collector/sglang/collect_attn.py`` ``run_attention_torch``, mirroring SGLang 0.5.14
``server_args._get_default_attn_backend``). The structure of ``cost.attention`` (tiles,
GQA packing, key splits, waves) is shared; what differs per kernel is a handful of
constants, each with a physical meaning and the range ``PROFILE_FIELDS`` gives:

- ``attention_fraction``: the kernel's MMA share of the dense peak of the dtype it
  computes in;
- ``attention_program_keys``: a program's fixed work, in key positions;
- ``attention_head_dim_half``: its per-score softmax work, in head_dim units;
- ``memory_fraction``: its KV streaming, share of the HBM peak;
- ``latency_s``: the call's fixed cost (metadata, cache write launch, kernel, combine);
- ``attention_q_cast``: 1 where the backend casts a 16-bit query to an FP8 cache's dtype
  and computes in FP8 (``Efficiency.attention_q_cast``); ``attention_q_cast_fused``: 1 where
  an earlier kernel of the step does that cast (no cast kernel of its own);
- ``attention_restream_fraction``: the share of a further CTA's stream of a latent cache
  that reaches HBM (``cost.latent_tiles``).

A kernel's FP8-compute instantiation is a profile of its own, ``<kernel>@fp8``: FP8 is
another kernel build with other tiles and work (FlashAttention-3's sm90 FP8 forward takes
kBlockN 192-224 keys a tile for head_dim 128 where 16-bit takes 128, and transposes V in
registers, since FP8 WGMMA wants V k-major: hopper/tile_size.h ``tile_size_fwd_sm90``,
Shah et al. 2024 section 3.3), so it reaches another share of its (doubled) peak; a call
computes in FP8 when its query is FP8, or its cache is and the backend casts the query
(``fp8_compute``).

An engine block's own attention constants are those of its ``attention_backend`` (the
engine's default on the device: what serving runs); ``efficiency.attention_kernels`` lists
the others, and ``for_kernel`` lays one over the block to price a call timed on it.
"""

from __future__ import annotations

from dataclasses import fields, replace

import numpy as np

from perfmodel.cost.timebase import OpTimes, peak
from perfmodel.specs.dtypes import CODE
from perfmodel.specs.hardware import Hardware

_FP8 = CODE["fp8"]


def for_kernel(hw: Hardware, kernel: str, fp8: bool = False) -> Hardware:
    """``hw`` as attention kernel ``kernel`` (``fp8``: its FP8-compute profile
    ``<kernel>@fp8`` where one is listed) runs on it: the profile laid over the efficiency
    block; ``hw`` itself for the block's own backend, an unnamed kernel, or any kernel on a
    block naming no backend; another kernel without a profile gets the block's constants
    without the backend's query cast and FP8 build. Cached on ``hw`` (each view keeps its
    own memo)."""
    eff = hw.efficiency
    name = f"{kernel}@fp8" if fp8 and f"{kernel}@fp8" in eff.attention_kernels else kernel
    profile = eff.attention_kernels.get(name)
    if name == eff.attention_backend or not name or not (profile or eff.attention_backend):
        return hw
    # another named kernel without a profile: the block's constants, without the backend's
    # own query cast and FP8 build (``laid`` with nothing to lay)
    views = hw.memo.setdefault("attention_kernels", {})
    if name not in views:
        views[name] = replace(hw, efficiency=laid(eff, profile or {}, name))
    return views[name]


def fp8_view(hw: Hardware) -> Hardware:
    """``hw`` as its own backend computes in FP8: the ``<attention_backend>@fp8`` profile
    laid over it, or ``hw`` where there is none (then FP8 calls run the block's constants
    at the FP8 peak)."""
    backend = hw.efficiency.attention_backend
    return for_kernel(hw, backend, fp8=True) if backend else hw


def blend(mask: np.ndarray, a: OpTimes, b: OpTimes) -> OpTimes:
    """Per instance, ``a``'s times where ``mask`` holds and ``b``'s elsewhere."""
    return OpTimes(*(np.where(mask, x, y) for x, y in zip(astuple_shallow(a),
                                                         astuple_shallow(b), strict=True)))


def astuple_shallow(t: OpTimes) -> tuple:
    return tuple(getattr(t, f.name) for f in fields(t))


# the block's own decode kernel's constants (``Efficiency.attention_decode_*``), unset: a
# view of another kernel prices its decode on its own constants
DECODE_KERNEL_OFF = {"attention_decode_fraction": None, "attention_decode_program_keys": 0.0,
                     "attention_decode_head_dim_half": 0.0, "attention_decode_latency_s": 0.0,
                     "attention_decode_splits": ""}


def laid(eff, profile: dict[str, float], kernel: str):
    """Efficiency block ``eff`` with ``profile`` (``PROFILE_FIELDS``) laid over it."""
    own = {k: v for k, v in profile.items() if k.startswith("attention_")}
    # whether the backend casts the query is its own: another kernel's profile does not
    # inherit the block's, the block backend's FP8 build does
    build = kernel.startswith(f"{eff.attention_backend}@")
    for flag in ("attention_q_cast", "attention_q_cast_fused"):
        own[flag] = bool(own.get(flag, getattr(eff, flag) and build))
    if not kernel.startswith(f"{eff.attention_backend}@"):
        own |= DECODE_KERNEL_OFF    # the block's own decode kernel is not this kernel
    fraction, latency = dict(eff.kernel_memory_fraction), dict(eff.kernel_latency_by_kind)
    if "memory_fraction" in profile:
        fraction["attention"] = profile["memory_fraction"]
    if "latency_s" in profile:
        latency["attention"] = profile["latency_s"]
    return replace(eff, **own, kernel_memory_fraction=fraction,
                   kernel_latency_by_kind=latency, attention_backend=kernel)


def fp8_compute(hw: Hardware, act_bytes: np.ndarray, kv_bytes: np.ndarray) -> np.ndarray:
    """Whether each call computes in FP8: an FP8 query, or an FP8 cache whose backend casts
    the query to it (``attention_q_cast``)."""
    fp8 = np.asarray(act_bytes) == 1
    if hw.efficiency.attention_q_cast:
        fp8 = fp8 | (np.asarray(kv_bytes) == 1)
    return fp8


def rate(hw: Hardware, dtype: np.ndarray | int, act_bytes: np.ndarray,
         kv_bytes: np.ndarray) -> np.ndarray:
    """Peak FLOP/s an attention call's MMAs run at: its dtype's, or FP8's where it computes
    in FP8 (``fp8_compute``: a query the backend casts to its FP8 cache)."""
    base = peak(hw, dtype)
    if not hw.efficiency.attention_q_cast:
        return base
    return np.where(fp8_compute(hw, act_bytes, kv_bytes), peak(hw, _FP8), base)


def q_cast_bytes(hw: Hardware, q_elems: np.ndarray, act_bytes: np.ndarray,
                 kv_bytes: np.ndarray) -> np.ndarray:
    """Bytes of the query cast a backend with ``attention_q_cast`` runs before an FP8-cache
    call with a 16-bit query: the query read at its width and written in FP8 (0 elsewhere)."""
    if not hw.efficiency.attention_q_cast or hw.efficiency.attention_q_cast_fused:
        return np.zeros(np.shape(q_elems))
    cast = (np.asarray(act_bytes) > 1) & (np.asarray(kv_bytes) == 1)
    return np.where(cast, q_elems * (np.asarray(act_bytes) + 1.0), 0.0)
