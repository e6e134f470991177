"""The checks of ``specs.workload``'s fields: the limits each is held to (past them a value
is a typo that would overflow int64 sums or allocate petabytes), the ranges of the
fractions, the column of each field as a checked array, and the checks across fields
(group scales on unquantized weights, a shared prefix as long as the prompt, a sequence
past the token cap). Each raises a SpecError naming the field and the first bad value.
"""

from __future__ import annotations

import numpy as np

from perfmodel.specs.dtypes import BYTES, CODE, DTYPE_BYTES, DTYPES, KV_PER_VECTOR, dtype_code
from perfmodel.specs.errors import SpecError

_INT_FIELDS = ("batch", "prompt_len", "gen_len", "kv_block_tokens")
_BOOL_FIELDS = ("cuda_graphs", "quantize_lm_head")
_DTYPE_FIELDS = ("weights_dtype", "act_dtype", "kv_dtype")
_GROUP_NONE = {"weight_group_size": 0, "kv_group_size": KV_PER_VECTOR}   # None in arrays
# Upper bounds, checked before anything is allocated or multiplied: past them a value is a
# typo, and it would overflow int64 sums (10^30 sequences) or allocate per-token arrays of
# petabytes (a 10^18-token prompt). Tokens: per sequence, beyond any model's context (the
# longest published is 10M); sequences: per replica; a group: no matrix is wider.
MAX_TOKENS = 1_000_000_000
MAX_BATCH = 10_000_000
MAX_GROUP = 2**24
MAX_DEVICES = 1_000_000        # a plan's devices (tp x pp x dp, or ep): 10x the largest fleets
MAXIMUM = {"batch": MAX_BATCH, "prompt_len": MAX_TOKENS, "gen_len": MAX_TOKENS,
           "kv_block_tokens": MAX_TOKENS, "shared_prefix": MAX_TOKENS,
           "weight_group_size": MAX_GROUP, "kv_group_size": MAX_GROUP}


def _positive_int(value: object, where: str, maximum: int | None = None) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) \
            or value < 1:
        raise SpecError(f"{where} must be a positive integer, got {value!r}")
    if maximum is not None and value > maximum:
        raise SpecError(f"{where}: expected at most {maximum:,}, got {value:,}")
    return int(value)


_QUANTIZED = (("weight_group_size", "weights_dtype", "weights", "drop the group size"),
              ("kv_group_size", "kv_dtype", "KV caches", "drop the group size"),
              ("outlier_fraction", "weights_dtype", "weights", "set it to 0"))


def _check_groups(arrays: dict[str, np.ndarray]) -> None:
    """SpecError for group scales, or 16-bit outlier channels, on weights or a KV cache that
    are not quantized (16 or 32 bits wide): they only exist for fp8, int8, int4 and fp4."""
    for name, dtype, what, fix in _QUANTIZED:
        value, codes = (np.asarray(arrays[k]).reshape(-1) for k in (name, dtype))
        value, codes = np.broadcast_arrays(value, codes)
        bad = (value > 0) & (BYTES[codes] >= 2)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            quantized = ", ".join(d for d in DTYPES if DTYPE_BYTES[d] < 2)
            raise SpecError(f"workload: {name} {value[i]:g} needs quantized {what} "
                            f"({quantized}), but {dtype} is {DTYPES[int(codes[i])]}; {fix}")


def _check_prefix(prefix: np.ndarray, prompt: np.ndarray) -> None:
    """SpecError for a shared prefix as long as the prompt: the last prompt token is always
    computed (its logits give the first generated token), so at most prompt_len - 1 hit."""
    bad = prefix >= prompt
    if bad.any():
        i = int(np.flatnonzero(bad.reshape(-1))[0])
        raise SpecError(f"workload: shared_prefix {int(prefix.reshape(-1)[i])} must be shorter "
                        f"than prompt_len {int(prompt.reshape(-1)[i])}")


def _check_length(prompt: np.ndarray, gen: np.ndarray) -> None:
    """SpecError for a sequence (prompt + generated) past MAX_TOKENS."""
    bad = prompt + gen > MAX_TOKENS
    if bad.any():
        i = int(np.flatnonzero(bad.reshape(-1))[0])
        total = int(prompt.reshape(-1)[i] + gen.reshape(-1)[i])
        raise SpecError(f"workload: prompt_len + gen_len: expected at most {MAX_TOKENS:,} "
                        f"tokens a sequence, got {total:,}")


_FLOAT_RANGES = {"usable_memory_fraction": (0.0, 1.0, "in (0, 1]", False),
                 "weight_scale_bytes": (0.0, 16.0, "a number of bytes in (0, 16]", False),
                 "kv_scale_bytes": (0.0, 16.0, "a number of bytes in (0, 16]", False),
                 "outlier_fraction": (0.0, 0.5, "a share in [0, 0.5]", True),
                 "prefix_hit_rate": (0.0, 1.0, "in [0, 1]", True),
                 "expert_skew": (0.0, 10.0, "a Zipf exponent in [0, 10]", True)}


def _column(name: str, value: object) -> np.ndarray:
    """One field as a checked array (names the field and the first bad value)."""
    where = f"workload: {name}"
    if np.size(value) == 0:     # grid(batch=[]) raised an IndexError
        raise SpecError(f"{where}: an empty list, expected at least one value")
    if name in _DTYPE_FIELDS and isinstance(value, np.ndarray) and value.dtype.kind in "iu":
        if value.size and (value.min() < 0 or value.max() >= len(DTYPES)):
            raise SpecError(f"{where}: dtype codes must be in 0..{len(DTYPES) - 1}")
        return value.astype(np.int8)
    if name in _DTYPE_FIELDS:
        flat = (names := np.asarray(value, dtype=object)).reshape(-1)
        for item in dict.fromkeys(flat.tolist()):
            dtype_code(item if isinstance(item, str) else repr(item), where)
        return np.array([CODE[x] for x in flat.tolist()], dtype=np.int8).reshape(names.shape)
    arr = np.asarray(value)
    if name in _BOOL_FIELDS:
        if arr.dtype != bool:
            raise SpecError(f"{where} must be true or false, got {value!r}")
        return arr
    if name in _FLOAT_RANGES:
        low, high, what, closed = _FLOAT_RANGES[name]
        above = (arr >= low) if closed else (arr > low)
        if arr.dtype.kind not in "fiu" or not np.all(above & (arr <= high)):
            raise SpecError(f"{where} must be {what}, got {value!r}")
        return arr.astype(float)
    minimum = {"weight_group_size": 0, "shared_prefix": 0, "kv_group_size": -1}.get(name, 1)
    if arr.dtype.kind == "O" and all(isinstance(v, (int, np.integer)) and not isinstance(
            v, (bool, np.bool_)) for v in arr.reshape(-1)):    # 10**30: past int64
        raise SpecError(f"{where}: expected at most {MAXIMUM[name]:,}, got "
                        f"{max(arr.reshape(-1).tolist()):,}")
    if arr.dtype.kind not in "iu" or np.any(arr < minimum):
        bad = arr.reshape(-1)[0] if arr.dtype.kind not in "iu" else arr[arr < minimum][0]
        what = {0: "a non-negative integer (0: none)", 1: "a positive integer",
                -1: "a non-negative integer (0: none) or -1 (the KV dtype's default)"}[minimum]
        raise SpecError(f"{where} must be {what}, got {bad!r}")
    if name in MAXIMUM and np.any(arr > MAXIMUM[name]):
        raise SpecError(f"{where}: expected at most {MAXIMUM[name]:,}, got "
                        f"{int(arr.max()):,}")
    return arr.astype(np.int64)
