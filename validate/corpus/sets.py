"""Measured kernels of one device and engine as columns the fitter prices at once (no torch).

A ``KernelSet`` holds one error class's measured kernels (``cost.error_class``: gemv,
gemm, attention_prefill, attention_decode, collective) as numpy columns, the fold each row
belongs to (k-fold by shape), and prices them on a ``Hardware`` the way the collector timed
them:

- GEMM (``torch.nn.functional.linear`` on 16-bit operands, aiconfigurator's
  ``collect_gemm.py``): one ``Gemm`` record, kernel timing (CUDA-graph replayed).
- Attention (``collect_attn.py``): the backend's ``impl.forward``, which first writes the
  new tokens' K/V into the paged cache (``reshape_and_cache_flash``) and then attends:
  priced as the ``Attention`` record plus a ``KvWrite`` of batch x q_len tokens. Prefill
  rows have q_len = kv_len = isl (no cached prefix, causal); decode rows one new token on a
  cache of ``step`` positions.
- All-reduce (vLLM's custom all-reduce ``collect_allreduce``, NCCL's nccl-tests): the
  model's all-reduce of ``message_size`` bytes over ``num_gpus`` devices of one node
  (``cost.collectives.all_reduce_parts``, or the custom kernel's path).

The fold of a row is the CRC32 of its *shape family* mod 5: a GEMM's weight (n, k), an
attention row's heads (n_heads, n_kv_heads, head_dim), a collective's device count and
size decade, so a held-out fold holds weights, head layouts and sizes the fit never saw.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from perfmodel.cost.collectives import all_reduce_parts
from perfmodel.cost.ops import Attention, Gemm, KvWrite
from perfmodel.cost.roofline import op_time
from perfmodel.specs.dtypes import CODE
from perfmodel.specs.hardware import Hardware

FOLDS = 5
GEMV_ROWS = 64          # cost.error_class.GEMV_ROWS: a GEMM of fewer rows is a gemv


@dataclass(frozen=True)
class KernelSet:
    """One error class's measured kernels: ``columns`` (name -> array), ``measured_s``,
    the ``fold`` of each row and the function that prices them (``price(columns, hw)``)."""

    error_class: str
    columns: dict[str, np.ndarray]
    measured_s: np.ndarray
    fold: np.ndarray
    price: Callable[[dict[str, np.ndarray], Hardware], np.ndarray]
    source: str = ""

    def __len__(self) -> int:
        return len(self.measured_s)

    def take(self, index: np.ndarray) -> KernelSet:
        return replace(self, columns={k: v[index] for k, v in self.columns.items()},
                       measured_s=self.measured_s[index], fold=self.fold[index])

    def predict(self, hw: Hardware) -> np.ndarray:
        return self.price(self.columns, hw)

    def errors(self, hw: Hardware) -> np.ndarray:
        """predicted / measured - 1 per row."""
        return self.predict(hw) / self.measured_s - 1.0


def fold_of(*keys: np.ndarray) -> np.ndarray:
    """Deterministic fold (0..FOLDS-1) of each row from its shape-family key columns."""
    text = [" ".join(str(int(v)) for v in row) for row in zip(*keys, strict=True)]
    cache: dict[str, int] = {}
    return np.array([cache.setdefault(t, zlib.crc32(t.encode()) % FOLDS) for t in text],
                    dtype=np.int64)


def price_gemm(c: dict[str, np.ndarray], hw: Hardware) -> np.ndarray:
    op = Gemm(m=c["m"], n=c["n"], k=c["k"], weight_bytes=c["bytes"], act_bytes=c["bytes"],
              dtype=c["dtype"])
    return op_time(op, hw, "kernel").time_s


def price_attention(c: dict[str, np.ndarray], hw: Hardware) -> np.ndarray:
    """The collector's attention call: cache write of the new tokens, then the kernel."""
    hd = c["head_dim"]
    att = Attention(batch=c["batch"][:, None], q_len=c["q_len"][:, None],
                    kv_len=c["kv_len"][:, None], n_heads=c["n_heads"],
                    n_kv_heads=c["n_kv_heads"], qk_dim=hd, v_dim=hd, cache_elems=2 * hd,
                    window=c["window"], act_bytes=2.0, kv_bytes=c["kv_bytes"],
                    dtype=CODE["bf16"])
    write = KvWrite(rows=c["batch"] * c["q_len"], n=2 * c["n_kv_heads"] * hd, act_bytes=2.0,
                    kv_bytes=c["kv_bytes"], dtype=CODE["bf16"])
    return op_time(att, hw, "kernel").time_s + op_time(write, hw, "kernel").time_s


def price_all_reduce(c: dict[str, np.ndarray], hw: Hardware) -> np.ndarray:
    """The all-reduce each row measured: NCCL's (``algorithm`` 0: the device priced without
    its custom all-reduce) or the engine's (1: the model's own choice, custom below its
    size limit, NCCL above, as the engine's communicator falls back)."""
    engine = all_reduce_parts(hw, c["devices"], c["bytes"]).total
    plain = replace(hw, interconnect=replace(hw.interconnect, custom_all_reduce_max_bytes=0.0))
    nccl = all_reduce_parts(plain, c["devices"], c["bytes"]).total
    return np.where(c["algorithm"] == 1, engine, nccl)


def gemm_sets(m: np.ndarray, n: np.ndarray, k: np.ndarray, seconds: np.ndarray,
              dtype: str = "bf16", source: str = "") -> list[KernelSet]:
    """The gemv (m < 64) and gemm sets of dense GEMMs at ``dtype``."""
    m, n, k = (np.asarray(x, dtype=float) for x in (m, n, k))
    from perfmodel.specs.dtypes import BYTES

    cols = {"m": m, "n": n, "k": k, "dtype": np.full(len(m), CODE[dtype]),
            "bytes": np.full(len(m), float(BYTES[CODE[dtype]]))}
    whole = KernelSet("gemm", cols, np.asarray(seconds, dtype=float), fold_of(n, k),
                      price_gemm, source)
    narrow = m < GEMV_ROWS
    return [replace(whole.take(np.flatnonzero(narrow)), error_class="gemv"),
            whole.take(np.flatnonzero(~narrow))]


def attention_sets(batch: np.ndarray, q_len: np.ndarray, kv_len: np.ndarray,
                   n_heads: np.ndarray, n_kv_heads: np.ndarray, head_dim: np.ndarray,
                   window: np.ndarray, kv_bytes: np.ndarray, seconds: np.ndarray,
                   source: str = "") -> list[KernelSet]:
    """The attention_decode (q_len 1) and attention_prefill sets."""
    cols = {name: np.asarray(v, dtype=float) for name, v in (
        ("batch", batch), ("q_len", q_len), ("kv_len", kv_len), ("n_heads", n_heads),
        ("n_kv_heads", n_kv_heads), ("head_dim", head_dim), ("window", window),
        ("kv_bytes", kv_bytes))}
    whole = KernelSet("attention_prefill", cols, np.asarray(seconds, dtype=float),
                      fold_of(cols["n_heads"], cols["n_kv_heads"], cols["head_dim"]),
                      price_attention, source)
    decode = cols["q_len"] <= 1
    return [replace(whole.take(np.flatnonzero(decode)), error_class="attention_decode"),
            whole.take(np.flatnonzero(~decode))]


def collective_set(devices: np.ndarray, nbytes: np.ndarray, algorithm: np.ndarray,
                   seconds: np.ndarray, source: str = "") -> KernelSet:
    """All-reduces: ``algorithm`` 0 NCCL, 1 the engine's custom all-reduce."""
    cols = {"devices": np.asarray(devices, dtype=float), "bytes": np.asarray(nbytes, dtype=float),
            "algorithm": np.asarray(algorithm, dtype=np.int64)}
    decade = np.floor(np.log2(np.maximum(cols["bytes"], 1.0)) / 2)
    return KernelSet("collective", cols, np.asarray(seconds, dtype=float),
                     fold_of(cols["devices"], decade, cols["algorithm"]),
                     price_all_reduce, source)


def price_moe(c: dict[str, np.ndarray], hw: Hardware) -> np.ndarray:
    """The collector's fused MoE layer (``compare.moe_forms.moe_layer``: both grouped GEMMs,
    the gated activation, the activations' quantization), every kernel device-timed."""
    from perfmodel.compare.moe_forms import moe_layer

    args = {k: c[k] for k in MOE_INPUTS}
    for name in ("stored", "dtype"):
        args[name] = args[name].astype(np.int64)
    parts = moe_layer(**args)
    return sum(op_time(op, hw, "kernel").time_s for op, _ in parts)


MOE_INPUTS = ("tokens", "topk", "hidden", "width", "pairs", "groups", "wb", "stored", "dtype",
              "mode", "gated", "padded", "local_combine", "local_experts")


def moe_set(rows: list[dict], seconds: np.ndarray, source: str = "") -> KernelSet:
    """Fused MoE layer rows (corpus rows of op ``moe``): folds by expert shape (hidden,
    width, experts, top-k), so a held-out fold holds MoE models the fit never saw."""
    from perfmodel.compare.moe_forms import moe_inputs, moe_layer
    from perfmodel.compare.rows import _column, _dtypes
    from perfmodel.cost.moe import format_class

    line = list(range(2, len(rows) + 2))
    dtype = _dtypes(rows, "moe rows", line)
    cols = moe_inputs(rows, lambda key: _column(rows, key, "moe rows", line), dtype,
                      "moe rows", line)
    up = moe_layer(**cols)[0][0]
    cols = {k: np.asarray(v, dtype=float) for k, v in cols.items()}
    cols["format"] = np.broadcast_to(format_class(up), len(rows)).astype(float)
    experts = np.array([float(r["experts"]) for r in rows])
    topk = np.array([float(r["topk"]) for r in rows])
    return KernelSet("moe", cols, np.asarray(seconds, dtype=float),
                     fold_of(cols["hidden"], cols["width"], experts, topk), price_moe, source)


def price_linear(c: dict[str, np.ndarray], hw: Hardware) -> np.ndarray:
    """A quantized linear as the collector timed it (``compare.forms.linear``: the GEMM
    and its activations' quantization): device-timed, or where it ran eagerly (column
    ``eager``) at least its host path (``cost.eager``)."""
    from perfmodel.compare.forms import linear
    from perfmodel.cost.eager import eager_time, host_floor

    args = {k: c[k] for k in LINEAR_INPUTS}
    for name in ("stored", "dtype"):
        args[name] = args[name].astype(np.int64)
    parts = linear(**args)
    device = sum(op_time(op, hw, "kernel").time_s for op, _ in parts)
    return np.where(c["eager"] > 0, eager_time(device, host_floor(parts[0][0], hw)), device)


LINEAR_INPUTS = ("m", "n", "k", "wb", "stored", "dtype", "mode")


def linear_set(rows: list[dict], seconds: np.ndarray, source: str = "") -> KernelSet:
    """Quantized dense GEMM rows (fp8, fp8 blocks, nvfp4), folds by weight (n, k), the
    format class of each in column ``format`` (``cost.moe.format_class``)."""
    from perfmodel.compare.forms import gemm_inputs, linear
    from perfmodel.compare.rows import _column, _dtypes
    from perfmodel.cost.moe import format_class

    line = list(range(2, len(rows) + 2))
    dtype = _dtypes(rows, "gemm rows", line)
    cols = gemm_inputs(rows, lambda key: _column(rows, key, "gemm rows", line), dtype,
                       "gemm rows", line)
    main = linear(**cols)[0][0]
    cols = {k: np.asarray(v, dtype=float) for k, v in cols.items()}
    cols["format"] = np.broadcast_to(format_class(main), len(rows)).astype(float)
    cols["eager"] = np.array([r.get("timing") == "stream" for r in rows], dtype=float)
    return KernelSet("gemm_quantized", cols, np.asarray(seconds, dtype=float),
                     fold_of(cols["n"], cols["k"]), price_linear, source)
