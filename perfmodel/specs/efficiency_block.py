"""The ``efficiency:`` block of a hardware file: every fraction, tile, fixed cost and
per-kind table the roofline rules read (``specs.hardware.Efficiency``), checked field by
field (``specs.fields``). Split from ``specs.load``, which reads the rest of the file."""

from __future__ import annotations

from dataclasses import replace

from perfmodel.specs.dtypes import DENSE_FORMATS, DTYPE_BYTES, DTYPES, MOE_FORMATS, SCAN_CLASSES
from perfmodel.specs.errors import did_you_mean
from perfmodel.specs.fields import Fields
from perfmodel.specs.hardware import DequantKernel, Efficiency
from perfmodel.specs.kinds import OWN_FRACTION, OWN_LATENCY


def read_efficiency(f: Fields, scan_kernel: str) -> Efficiency:
    """The ``efficiency:`` block's figures; ``scan_kernel`` is the default of the file's
    vendor. The caller reads its ``source:`` and finishes the block."""
    hosts: dict[str, dict[str, float]] = {"host_s": {}, "row_s": {}, "k_half": {}}
    out = Efficiency(
        gemm_fraction=f.quantity("gemm_fraction", "number", maximum=1.0),
        memory_fraction=f.quantity("memory_fraction", "number", maximum=1.0),
        collective_fraction=f.quantity("collective_fraction", "number", 0.8, maximum=1.0),
        gemm_tile_m=f.integer("gemm_tile_m", 128),
        gemm_tile_n=f.integer("gemm_tile_n", 128),
        gemm_tiles=_gemm_tiles(f),
        kernel_latency_s=f.quantity("kernel_latency_s", "s", positive=False),
        launch_overhead_s=f.quantity("launch_overhead_s", "s", positive=False),
        gemm_k_half=f.quantity("gemm_k_half", "number", 128.0, positive=False),
        attention_fraction=_optional_fraction(f, "attention_fraction"),
        attention_decode_fraction=_optional_fraction(f, "attention_decode_fraction"),
        attention_tile_q=_tile_steps(f, "attention_tile_q", 128),
        attention_tile_kv=f.integer("attention_tile_kv", 64),
        attention_clip_kv=f.flag("attention_clip_kv", False),
        attention_pack_gqa=f.flag("attention_pack_gqa", True),
        attention_decode_pack_gqa=f.flag("attention_decode_pack_gqa", True),
        attention_program_keys=f.quantity("attention_program_keys", "number", 0.0,
                                          positive=False),
        attention_decode_program_keys=f.quantity("attention_decode_program_keys", "number",
                                                 0.0, positive=False),
        attention_decode_latency_s=f.quantity("attention_decode_latency_s", "s", 0.0,
                                              positive=False),
        attention_decode_head_dim_half=f.quantity("attention_decode_head_dim_half", "number",
                                                  0.0, positive=False),
        attention_decode_splits=f.text("attention_decode_splits", "", ("", "xqa")),
        attention_decode_tile_q=f.integer("attention_decode_tile_q", 0, minimum=0),
        attention_decode_tile_q_latent=f.integer("attention_decode_tile_q_latent", 0,
                                                 minimum=0),
        attention_decode_tile_q_fp8=f.integer("attention_decode_tile_q_fp8", 0, minimum=0),
        attention_decode_min_group=f.integer("attention_decode_min_group", 0, minimum=0),
        attention_decode_max_group=f.integer("attention_decode_max_group", 0, minimum=0),
        attention_fallback_fraction=f.quantity("attention_fallback_fraction", "number", 0.0,
                                               positive=False, maximum=1.0),
        attention_decode_min_waves=f.quantity("attention_decode_min_waves", "number", 0.0,
                                              positive=False),
        attention_fallback_program_steps=f.quantity("attention_fallback_program_steps",
                                                    "number", 0.0, positive=False),
        attention_head_dim_half=f.quantity("attention_head_dim_half", "number", 0.0,
                                           positive=False),
        attention_append_kv=f.flag("attention_append_kv", False),
        attention_q_cast=f.flag("attention_q_cast", False),
        attention_q_cast_fused=f.flag("attention_q_cast_fused", False),
        attention_latent_cta_rows=_tile_steps(f, "attention_latent_cta_rows", 0)
        if f.raw("attention_latent_cta_rows", None) is not None else (),
        attention_latent_sched=f.text("attention_latent_sched", "",
                                      ("", "trtllm_gen", "flashmla")),
        attention_cta_s=f.quantity("attention_cta_s", "s", 0.0, positive=False),
        attention_restream_fraction=f.quantity("attention_restream_fraction", "number", 0.0,
                                               positive=False, maximum=1.0),
        attention_kernels=_attention_kernels(f.sub("attention_kernels", required=False)),
        attention_backend=f.text("attention_backend", ""),
        attention_latent_kernel=f.text("attention_latent_kernel", ""),
        memory_half_bytes=f.quantity("memory_half_bytes", "bytes", 0.0, positive=False),
        gemm_overlap=f.flag("gemm_overlap", True),
        gemm_m_half=f.quantity("gemm_m_half", "number", 0.0, positive=False),
        gemm_n_half=f.quantity("gemm_n_half", "number", 0.0, positive=False),
        gemm_memory_fraction=_optional_fraction(f, "gemm_memory_fraction"),
        gemv_memory_fraction=_optional_fraction(f, "gemv_memory_fraction"),
        gemv_k_half=f.quantity("gemv_k_half", "number", 0.0, positive=False),
        kernel_memory_fraction=_per_kind(f.sub("kernel_memory_fraction", required=False),
                                         "number", memory_only=True),
        kernel_unit_bytes_per_s=_per_kind(f.sub("kernel_unit_bytes_per_s", required=False),
                                          "bytes_per_s", memory_only=True),
        kernel_latency_by_kind=_per_kind(f.sub("kernel_latency_by_kind", required=False), "s",
                                         memory_only=False),
        moe_kernels=_moe_kernels(f.sub("moe_kernels", required=False), MOE_FORMATS),
        gemm_kernels=_moe_kernels(f.sub("gemm_kernels", required=False), DENSE_FORMATS,
                                  hosts),
        gemm_host_s=hosts["host_s"],
        gemm_row_s=hosts["row_s"],
        gemm_kernel_k_half=hosts["k_half"],
        gemm_kernels_split_k=f.flag("gemm_kernels_split_k", False),
        gemm_kernel_tiles=_kernel_tiles(f.sub("gemm_kernel_tiles", required=False)),
        scan_kernels=_scan_kernels(f.sub("scan_kernels", required=False)),
        ep_kernels=_ep_kernels(f.sub("ep_kernels", required=False)),
        parallel_grain_elements=f.integer("parallel_grain_elements", 0, minimum=0),
        launch_mode=f.text("launch_mode", "async", ("async", "sync")),
        layer_overhead_s=f.quantity("layer_overhead_s", "s", 0.0, positive=False),
        scan_kernel=f.text("scan_kernel", scan_kernel, ("fused", "unfused")),
        alu_ops_per_clock_per_unit=f.quantity("alu_ops_per_clock_per_unit", "number", 128.0),
        alu_clock_hz=f.quantity("alu_clock_hz", "number", 0.0, positive=False),
    )
    unknown = sorted(set(out.gemm_kernel_tiles) - set(out.gemm_kernels))
    if unknown:
        raise f.error("gemm_kernel_tiles", f"{unknown[0]}: expected a key of gemm_kernels")
    if out.attention_latent_kernel and out.attention_latent_kernel not in out.attention_kernels:
        raise f.error("attention_latent_kernel",
                      "expected the name of a profile listed under attention_kernels")
    kernels = f.sub("dequant", required=False)
    if kernels is not None:
        table = {}
        for dtype in list(kernels.data):
            if dtype not in DTYPES or DTYPE_BYTES[dtype] >= 2:
                raise kernels.error(dtype, "expected a weight dtype narrower than 16 bits: "
                                    + ", ".join(d for d in DTYPES if DTYPE_BYTES[d] < 2))
            k = kernels.sub(dtype)
            table[dtype] = DequantKernel(
                ops_per_weight=k.quantity("ops_per_weight", "number", positive=False),
                tile_m=k.integer("tile_m", 16), overlap=k.flag("overlap", False))
            k.finish()
        kernels.finish()
        if table and not out.alu_clock_hz:
            raise f.error("alu_clock_hz", "required with dequant: the clock the SMs convert at")
        out = replace(out, dequant=table)
    return out


def _tile_steps(f: Fields, key: str, default: int) -> tuple[tuple[int, int], ...]:
    """A tile size, or a mapping {min q_len: tile} for a kernel that picks it by length."""
    value = f.raw(key, default)
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 1:
            raise f.error(key, f"expected an integer >= 1, got {value}")
        return ((1, value),)
    if isinstance(value, dict) and value:
        steps = []
        for k, v in value.items():
            if isinstance(k, bool) or not isinstance(k, int) or k < 1 or \
                    isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise f.error(key, f"expected integer q_len: tile pairs >= 1, got {k!r}: {v!r}")
            steps.append((k, v))
        return tuple(sorted(steps))
    raise f.error(key, f"expected an integer or a mapping {{min q_len: tile}}, got {value!r}")


def _gemm_tiles(f: Fields) -> tuple[tuple[int, int], ...]:
    """``gemm_tiles``: a list of [rows, columns] output tiles (each at least 1), or none."""
    value = f.raw("gemm_tiles", [])
    pairs = value if isinstance(value, list) else [None]
    for pair in pairs:
        if not (isinstance(pair, list) and len(pair) == 2 and all(
                isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in pair)):
            raise f.error("gemm_tiles", "expected a list of [rows, columns] tiles, integers "
                          f">= 1, e.g. [[128, 256], [128, 128]]; got {value!r}")
    return tuple((m, n) for m, n in pairs)


def _optional_fraction(f: Fields, key: str) -> float | None:
    return f.quantity(key, "number", maximum=1.0) if f.has(key) else f.raw(key, None)


def _per_kind(f: Fields | None, unit: str, memory_only: bool) -> dict[str, float]:
    """A mapping kernel kind -> value (a fraction in (0, 1], or a non-negative time); the
    kinds allowed are the registry's (``specs.kinds``)."""
    if f is None:
        return {}
    # attention streams its KV cache at a fraction of its own (calibrate --from fits it)
    kinds = (*OWN_FRACTION, "attention") if memory_only else OWN_LATENCY
    out = {}
    for kind in list(f.data):
        if kind not in kinds:
            what = "a memory-bound kernel kind or attention" if memory_only \
                else "a kernel kind"
            raise f.error(kind, f"expected {what}: {', '.join(kinds)}")
        out[kind] = f.quantity(kind, unit, maximum=1.0) if unit == "number" \
            else f.quantity(kind, unit, positive=False)
    f.finish()
    return out


def _kernel_tiles(f: Fields | None) -> dict[str, str]:
    """``gemm_kernel_tiles``: ``gemm_kernels`` key -> a kernel of ``specs/kernel_tiles.yaml``
    that picks its own tile (the keys are checked against ``gemm_kernels`` by the
    caller)."""
    if f is None:
        return {}
    from perfmodel.specs.tile_rules import kernels

    names = tuple(sorted(kernels()))
    out = {str(key): f.text(key, choices=names) for key in list(f.data)}
    f.finish()
    return out


def _moe_kernels(f: Fields | None, classes: tuple[str, ...],
                 hosts: dict[str, dict[str, float]] | None = None
                 ) -> dict[str, tuple[float, ...]]:
    """``moe_kernels`` / ``gemm_kernels``: per weight-format class (``cost.moe.FORMATS``)
    the GEMMs' ``gemm_fraction``, ``memory_fraction`` (both in (0, 1]), ``latency_s`` and,
    for expert GEMMs, ``expert_latency_s``, ``programs_per_unit``, ``depth_s``, ``slot_s``
    and ``scan_s`` (defaults 0: off). A dense class may be split by M bucket of the
    engine's dispatch:
    ``<class>@<m_max>`` holds the kernel of GEMMs of at most ``m_max`` rows (the plain
    ``<class>`` row, those above every bucket; ``<class>@unaligned``, shapes DeepGEMM
    cannot run: ``cost.moe.dense_buckets``), and carry the
    engine's eager host path of one call, ``host_s`` (``cost.eager``), and the seconds
    per row its activation quantization adds, ``row_s`` (a plain class row's), and the k
    elements of fixed work of a block of the row's own-tile kernel, ``k_half`` (into
    ``hosts``, so each row keeps its three fields)."""
    if f is None:
        return {}
    out = {}
    for name in list(f.data):
        cls, _, bucket = str(name).partition("@")
        bad = bucket and (classes == MOE_FORMATS or not (
            bucket == "unaligned" or (bucket.isdigit() and int(bucket) >= 1)))
        if cls not in classes or bad:
            raise f.error(name, f"expected a format class: {', '.join(classes)}"
                          + ("" if classes == MOE_FORMATS else
                             ", optionally @<m_max> (a whole number of rows) or "
                             "@unaligned"))
        k = f.sub(name)
        row = (k.quantity("gemm_fraction", "number", maximum=1.0),
               k.quantity("memory_fraction", "number", maximum=1.0),
               k.quantity("latency_s", "s", positive=False))
        if classes == MOE_FORMATS:
            row += (k.quantity("expert_latency_s", "s", 0.0, positive=False),
                    k.quantity("programs_per_unit", "number", 0.0, positive=False),
                    k.quantity("depth_s", "s", 0.0, positive=False),
                    k.quantity("slot_s", "s", 0.0, positive=False),
                    k.quantity("scan_s", "s", 0.0, positive=False))
        elif hosts is not None:
            for extra, table in hosts.items():
                value = k.quantity(extra, "number" if extra == "k_half" else "s", 0.0,
                                   positive=False)
                if value > 0:
                    table[name] = value
        out[name] = row
        k.finish()
    f.finish()
    return out


def _scan_kernels(f: Fields | None) -> dict[str, tuple[float, ...]]:
    """``scan_kernels``: per call class (``SCAN_CLASSES``) ``gemm_fraction`` and
    ``memory_fraction`` (both in (0, 1]), ``latency_s`` (per launch), ``step_s`` (per serial
    step of the state recurrence, default 0), ``launches`` (kernels per call, default 1) and
    ``state_columns`` (value columns of the state one program carries; 0, the default: a
    head's whole state) (``cost.scan_kernels``)."""
    if f is None:
        return {}
    out = {}
    for name in list(f.data):
        if name not in SCAN_CLASSES:
            raise f.error(name, f"expected a scan call class: {', '.join(SCAN_CLASSES)}")
        k = f.sub(name)
        out[name] = (k.quantity("gemm_fraction", "number", maximum=1.0),
                     k.quantity("memory_fraction", "number", maximum=1.0),
                     k.quantity("latency_s", "s", positive=False),
                     k.quantity("step_s", "s", 0.0, positive=False),
                     float(k.integer("launches", 1, minimum=1)),
                     float(k.integer("state_columns", 0, minimum=0)))
        k.finish()
    f.finish()
    return out


EP_KERNELS = ("normal_dispatch", "normal_combine", "ll_dispatch", "ll_combine")   # cost.ep


def _ep_kernels(f: Fields | None) -> dict[str, tuple[float, ...]]:
    """``ep_kernels``: per DeepEP kernel (``cost.ep.KERNELS``) ``latency_s``,
    ``link_fraction`` and ``network_fraction`` (in (0, 1]), ``sm_bytes_per_s``,
    ``network_latency_s`` and ``copy_s`` (defaults 0: off)."""
    if f is None:
        return {}
    out = {}
    for name in list(f.data):
        if name not in EP_KERNELS:
            raise f.error(name, f"expected a DeepEP kernel: {', '.join(EP_KERNELS)}")
        k = f.sub(name)
        out[name] = (k.quantity("latency_s", "s", positive=False),
                     k.quantity("link_fraction", "number", maximum=1.0),
                     k.quantity("network_fraction", "number", 1.0, maximum=1.0),
                     k.quantity("sm_bytes_per_s", "bytes_per_s", 0.0, positive=False),
                     k.quantity("network_latency_s", "s", 0.0, positive=False),
                     k.quantity("copy_s", "s", 0.0, positive=False))
        k.finish()
    f.finish()
    return out


# an attention backend's profile (cost.attention_kernels): field -> (unit for specs.fields,
# upper bound)
PROFILE_FIELDS: dict[str, tuple[str, float]] = {
    "attention_fraction": ("number", 1.0),
    "attention_program_keys": ("number", 4096.0),
    "attention_head_dim_half": ("number", 512.0),
    "memory_fraction": ("number", 1.0),
    "latency_s": ("s", 100e-6),
    "attention_q_cast": ("flag", 1.0),
    "attention_q_cast_fused": ("flag", 1.0),
    "attention_restream_fraction": ("number", 1.0),
    "attention_cta_s": ("s", 100e-6),
}


def _attention_kernels(f: Fields | None) -> dict[str, dict[str, float]]:
    """``attention_kernels``: kernel name -> its profile, a mapping of some of
    ``PROFILE_FIELDS`` (fractions in (0, 1], keys and head_dim
    units >= 0, a fixed cost in seconds, q_cast true / false)."""
    if f is None:
        return {}
    out = {}
    for name in list(f.data):
        k = f.sub(name)
        row: dict[str, float] = {}
        for key in list(k.data):
            if key not in PROFILE_FIELDS:
                raise k.error(key, "expected a profile field: " + ", ".join(PROFILE_FIELDS)
                              + did_you_mean(key, PROFILE_FIELDS))
            unit, top = PROFILE_FIELDS[key]
            row[key] = float(k.flag(key, False)) if unit == "flag" else \
                k.quantity(key, unit, positive=False, maximum=top)
        out[str(name)] = row
        k.finish()
    f.finish()
    return out
