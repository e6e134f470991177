"""Loading hardware specs, model shapes and Hugging Face config.json (read through
``perfmodel.fields``, the only reader of YAML and JSON).

Every error is a ``SpecError`` whose one-line message names the file, the field and what was
expected. Unknown keys are errors, so a typo never silently falls back to a default.
"""

from __future__ import annotations

from pathlib import Path

from perfmodel.fields import Fields, read_mapping
from perfmodel.specs import (
    DTYPES,
    MLA,
    Efficiency,
    Hardware,
    Interconnect,
    Model,
    MoE,
    SpecError,
)

ROOT = Path(__file__).resolve().parent.parent
HARDWARE_DIR = ROOT / "hardware"
MODELS_DIR = ROOT / "models"


MODEL_KEYS = ("version", "name", "family", "source", "n_layers", "d_model", "n_heads",
              "n_kv_heads", "head_dim", "vocab_size", "intermediate_size", "gated_mlp",
              "activation", "norm", "norms_per_layer", "tie_embeddings", "position",
              "max_position_embeddings", "qkv_bias", "linear_bias", "parallel_block",
              "attention", "mla", "moe", "mtp")
HARDWARE_KEYS = ("version", "name", "vendor", "description", "compute", "memory", "on_chip",
                 "interconnect", "efficiency", "calibration")


def _version(f: Fields) -> None:
    if f.integer("version") != 1:
        raise f.error("version", "expected 1 (the only schema version so far)")


def _sources(block: Fields, key: str, sources: dict[str, str]) -> None:
    sources[key] = block.text("source")
    if block.has("note"):
        sources[key + ".note"] = block.text("note")


def load_hardware(path: str | Path) -> Hardware:
    """Read one hardware YAML (schema in hardware/README.md)."""
    path = Path(path)
    f = Fields(read_mapping(path), str(path), allowed=HARDWARE_KEYS)
    _version(f)
    sources: dict[str, str] = {}
    compute = f.sub("compute")
    peaks_f = compute.sub("peak_flops_per_s")
    peaks = {}
    for dtype in list(peaks_f.data):
        if dtype not in DTYPES:
            raise peaks_f.error(dtype, f"unknown dtype, expected one of {', '.join(DTYPES)}")
        peaks[dtype] = peaks_f.quantity(dtype, "flops_per_s")
    if not peaks:
        raise peaks_f.error("", "expected at least one dtype rate")
    peaks_f.finish()
    units_count = compute.integer("compute_units")
    _sources(compute, "compute", sources)
    compute.finish()
    mem = f.sub("memory")
    capacity = mem.quantity("capacity_bytes", "bytes")
    bandwidth = mem.quantity("bandwidth_bytes_per_s", "bytes_per_s")
    _sources(mem, "memory", sources)
    mem.finish()
    chip = f.sub("on_chip")
    l2 = chip.quantity("l2_bytes", "bytes")
    _sources(chip, "on_chip", sources)
    chip.finish()
    link = _interconnect(f.sub("interconnect"), sources)
    eff = _efficiency(f.sub("efficiency"), sources)
    hw = Hardware(
        name=f.text("name"), vendor=f.text("vendor", "other"),
        description=f.text("description", ""), peak_flops_per_s=peaks,
        memory_bytes=capacity, memory_bytes_per_s=bandwidth, compute_units=units_count,
        l2_bytes=l2, interconnect=link, efficiency=eff, sources=sources,
        calibration=f.raw("calibration", None),
    )
    f.finish()
    return hw


def _interconnect(f: Fields, sources: dict[str, str]) -> Interconnect:
    out = Interconnect(
        link_bytes_per_s=f.quantity("link_bytes_per_s", "bytes_per_s"),
        latency_s=f.quantity("latency_s", "s", positive=False),
        topology=f.text("topology", "switch", ("switch", "ring", "torus", "pcie", "none")),
        max_devices=f.integer("max_devices", 8),
        collective_latency_s=f.quantity("collective_latency_s", "s", 0.0, positive=False),
    )
    _sources(f, "interconnect", sources)
    f.finish()
    return out


def _efficiency(f: Fields, sources: dict[str, str]) -> Efficiency:
    out = Efficiency(
        gemm_fraction=f.quantity("gemm_fraction", "number", maximum=1.0),
        memory_fraction=f.quantity("memory_fraction", "number", maximum=1.0),
        collective_fraction=f.quantity("collective_fraction", "number", 0.8, maximum=1.0),
        gemm_tile_m=f.integer("gemm_tile_m", 128),
        gemm_tile_n=f.integer("gemm_tile_n", 128),
        kernel_latency_s=f.quantity("kernel_latency_s", "s", positive=False),
        launch_overhead_s=f.quantity("launch_overhead_s", "s", positive=False),
        gemm_k_half=f.quantity("gemm_k_half", "number", 128.0, positive=False),
        attention_fraction=_optional_fraction(f, "attention_fraction"),
        attention_tile_q=_tile_steps(f, "attention_tile_q", 128),
        attention_tile_kv=f.integer("attention_tile_kv", 64),
        attention_clip_kv=f.flag("attention_clip_kv", False),
        attention_pack_gqa=f.flag("attention_pack_gqa", True),
        attention_decode_pack_gqa=f.flag("attention_decode_pack_gqa", True),
        attention_append_kv=f.flag("attention_append_kv", False),
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
        parallel_grain_elements=f.integer("parallel_grain_elements", 0, minimum=0),
        launch_mode=f.text("launch_mode", "async", ("async", "sync")),
        layer_overhead_s=f.quantity("layer_overhead_s", "s", 0.0, positive=False),
    )
    _sources(f, "efficiency", sources)
    f.finish()
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


def _optional_fraction(f: Fields, key: str) -> float | None:
    return f.quantity(key, "number", maximum=1.0) if f.has(key) else f.raw(key, None)


def _per_kind(f: Fields | None, unit: str, memory_only: bool) -> dict[str, float]:
    """A mapping kernel kind -> value (a fraction in (0, 1], or a non-negative time)."""
    if f is None:
        return {}
    from perfmodel.ops import OP_CLASS

    excluded = ("gemm", "attention", "all_reduce", "layer_overhead") if memory_only \
        else ("all_reduce", "layer_overhead")
    kinds = [k for k in OP_CLASS if k not in excluded]
    out = {}
    for kind in list(f.data):
        if kind not in kinds:
            what = "a memory-bound kernel kind" if memory_only else "a kernel kind"
            raise f.error(kind, f"expected {what}: {', '.join(kinds)}")
        out[kind] = f.quantity(kind, unit, maximum=1.0) if unit == "number" \
            else f.quantity(kind, unit, positive=False)
    f.finish()
    return out


def load_model(path: str | Path) -> Model:
    """Read a model YAML (models/README.md) or a Hugging Face config.json."""
    path = Path(path)
    data = read_mapping(path)
    if path.suffix == ".json":
        from perfmodel.hf import model_from_hf_config

        return model_from_hf_config(data, str(path), name=path.parent.name or path.stem)
    f = Fields(data, str(path), allowed=MODEL_KEYS)
    _version(f)
    model = model_from_fields(f)
    f.finish()
    return model


def model_from_fields(f: Fields) -> Model:
    """Build a Model from a mapping in the models/README.md schema (YAML or translated HF)."""
    n_heads = f.integer("n_heads")
    d_model = f.integer("d_model")
    attention = f.sub("attention", required=False)
    window, pattern, softcap = None, (), None
    if attention is not None:
        window = attention.integer("sliding_window", None)
        raw_pattern = attention.raw("layer_pattern", [])
        if not isinstance(raw_pattern, list) or any(p not in ("local", "global")
                                                    for p in raw_pattern):
            raise attention.error("layer_pattern", "expected a list of 'local' and 'global'")
        pattern = tuple(raw_pattern)
        if pattern and window is None:
            raise attention.error("sliding_window", "required when layer_pattern is given")
        softcap = attention.raw("logit_softcap", None)
        attention.finish()
    model = Model(
        name=f.text("name"), family=f.text("family", ""), source=f.text("source", ""),
        n_layers=f.integer("n_layers"), d_model=d_model, n_heads=n_heads,
        n_kv_heads=f.integer("n_kv_heads"),
        head_dim=f.integer("head_dim", d_model // n_heads if d_model % n_heads == 0 else ...),
        vocab_size=f.integer("vocab_size"), intermediate_size=f.integer("intermediate_size"),
        gated_mlp=f.flag("gated_mlp", True),
        activation=f.text("activation", "silu", ("silu", "gelu", "gelu_tanh", "relu")),
        norm=f.text("norm", "rms", ("rms", "layer")),
        norms_per_layer=f.integer("norms_per_layer", 2),
        tie_embeddings=f.flag("tie_embeddings", False),
        position=f.text("position", "rope", ("rope", "learned", "alibi")),
        max_position_embeddings=f.integer("max_position_embeddings", 0, minimum=0),
        qkv_bias=f.flag("qkv_bias", False), linear_bias=f.flag("linear_bias", False),
        parallel_block=f.flag("parallel_block", False),
        sliding_window=window, layer_pattern=pattern, logit_softcap=softcap,
        mla=_mla(f.sub("mla", required=False)), moe=_moe(f.sub("moe", required=False)),
        mtp_modules=_mtp(f.sub("mtp", required=False)),
    )
    if model.n_kv_heads > model.n_heads or model.n_heads % model.n_kv_heads:
        raise f.error("n_kv_heads", f"expected a divisor of n_heads ({model.n_heads}), "
                      f"got {model.n_kv_heads}")
    if model.position == "learned" and model.max_position_embeddings < 1:
        raise f.error("max_position_embeddings", "required (>= 1) when position is learned")
    if model.moe and model.moe.first_dense_layers > model.n_layers:
        raise f.error("moe.first_dense_layers", f"expected at most n_layers ({model.n_layers})")
    return model


def _mla(f: Fields | None) -> MLA | None:
    if f is None:
        return None
    out = MLA(q_lora_rank=f.integer("q_lora_rank", None), kv_lora_rank=f.integer("kv_lora_rank"),
              qk_nope_head_dim=f.integer("qk_nope_head_dim"),
              qk_rope_head_dim=f.integer("qk_rope_head_dim"), v_head_dim=f.integer("v_head_dim"))
    f.finish()
    return out


def _moe(f: Fields | None) -> MoE | None:
    if f is None:
        return None
    out = MoE(n_experts=f.integer("n_experts"), top_k=f.integer("top_k"),
              expert_intermediate_size=f.integer("expert_intermediate_size"),
              n_shared_experts=f.integer("n_shared_experts", 0, minimum=0),
              first_dense_layers=f.integer("first_dense_layers", 0, minimum=0))
    if out.top_k > out.n_experts:
        raise f.error("top_k", f"expected at most n_experts ({out.n_experts}), got {out.top_k}")
    f.finish()
    return out


def _mtp(f: Fields | None) -> int:
    if f is None:
        return 0
    out = f.integer("n_modules", 0, minimum=0)
    f.finish()
    return out


def _resolve(name_or_path: str, directory: Path, kind: str, suffixes: tuple[str, ...]) -> Path:
    path = Path(name_or_path)
    if path.suffix in suffixes or "/" in name_or_path or path.is_file():
        return path
    candidate = directory / f"{name_or_path}.yaml"
    if candidate.is_file():
        return candidate
    names = ", ".join(shipped(directory))
    raise SpecError(f"--{kind}: unknown {kind} {name_or_path!r}; shipped: {names} "
                    f"(or give a path to a file)")


def shipped(directory: Path) -> list[str]:
    """Stems of the shipped YAML files in ``directory``."""
    return sorted(p.stem for p in directory.glob("*.yaml"))


def hardware(name_or_path: str) -> Hardware:
    """A shipped hardware name (file stem in hardware/) or a path to a hardware YAML."""
    return load_hardware(_resolve(name_or_path, HARDWARE_DIR, "hardware", (".yaml", ".yml")))


def model(name_or_path: str) -> Model:
    """A shipped model name, a path to a model YAML, or a path to a HF config.json."""
    return load_model(_resolve(name_or_path, MODELS_DIR, "model", (".yaml", ".yml", ".json")))
