"""Loading hardware specs, model shapes and Hugging Face config.json (read through
``specs.fields``, the only reader of YAML and JSON; the model schema is ``specs.schema``).

Every error is a ``SpecError`` whose one-line message names the file, the field and what was
expected. Unknown keys are errors, so a typo never silently falls back to a default.
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

from perfmodel.specs import engines, places
from perfmodel.specs.composition import read_composition
from perfmodel.specs.dtypes import DTYPES
from perfmodel.specs.efficiency_block import read_efficiency
from perfmodel.specs.errors import SpecError, did_you_mean, quoted
from perfmodel.specs.fields import Fields, read_mapping
from perfmodel.specs.hardware import Efficiency, Hardware, HostLink, Interconnect
from perfmodel.specs.model import Model
from perfmodel.specs.schema import MODEL_KEYS, check_version, model_from_fields
from perfmodel.specs.uncertainty import read_uncertainty

# the shipped specs: package data (``specs.places``: the user's folders come first)
HARDWARE_DIR = places.package_dir("hardware")
MODELS_DIR = places.package_dir("model")


HARDWARE_KEYS = ("version", "name", "vendor", "description", "compute", "memory", "on_chip",
                 "interconnect", "efficiency", "calibration", "price", "engines",
                 "uncertainty", "composition", "power", "host")
# how a vendor's devices run a recurrent layer's chunked scan when the file does not say
# (``efficiency.scan_kernel``): mamba_ssm's and FLA's Triton kernels run on CUDA and ROCm;
# a TPU runs the scan as compiled XLA (or Pallas) programs, no operator dispatched from the
# host, which the fused record approximates; any other device (a CPU) runs the pure-torch
# references operator by operator. Trainium (Neuron) and Gaudi (its graph compiler) also run
# whole compiled graphs, as a TPU does
SCAN_KERNEL = {"nvidia": "fused", "amd": "fused", "google": "fused", "aws": "fused",
               "intel": "fused"}
# US dollars per device-hour: a figure above this is a typo (or a node's price, not a device's)
MAX_USD_PER_HOUR = 1000.0
# watts per device: a figure above this is a typo (or a rack's power, not a device's)
MAX_WATTS = 5000.0


def _sources(block: Fields, key: str, sources: dict[str, str]) -> None:
    sources[key] = block.text("source")
    if block.has("note"):
        sources[key + ".note"] = block.text("note")


HARDWARE_EXPECTED = "a hardware YAML"
MODEL_EXPECTED = "a model YAML or a config.json"
YAML_SUFFIXES = (".yaml", ".yml")


def load_hardware(path: str | Path, engine: str = engines.DEFAULT_ENGINE) -> Hardware:
    """Read one hardware YAML (schema in perfmodel/hardware/README.md; .yaml, .yml, or .json) as
    ``engine`` (vllm, sglang, trtllm) runs it: its ``engines.<engine>`` block laid over the
    top-level figures (``specs.engines``). Every engine's blocks are checked, not only the
    one asked for."""
    engine = engines.check_engine(engine)
    path = _user_path(path, "hardware", f"a path to {HARDWARE_EXPECTED}")
    _check_suffix(path, "a hardware YAML", "the same schema in JSON")
    data = _with_base(read_mapping(path, HARDWARE_EXPECTED), path)
    out = None
    for name in dict.fromkeys([engine, *engines.listed(data, str(path))]):
        view, renamed, warning = engines.view(data, str(path), name)
        hw = _hardware(Fields(view, str(path), allowed=HARDWARE_KEYS, renamed=renamed), name)
        out = out or replace(hw, engine_warning=warning)
    return out


def _hardware(f: Fields, engine: str) -> Hardware:
    """The Hardware of one engine's view of a file (``engines.view``). Its top-level
    ``uncertainty:`` (when read) is already that engine's block, its path in ``f.renamed``."""
    check_version(f)
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
    reserved = mem.quantity("runtime_reserved_bytes", "bytes", 0.0, positive=False)
    if reserved >= capacity:
        raise mem.error("runtime_reserved_bytes", f"expected less than capacity_bytes "
                        f"({capacity:g}), got {reserved:g}: nothing would be left to use")
    _sources(mem, "memory", sources)
    mem.finish()
    chip = f.sub("on_chip")
    l2 = chip.quantity("l2_bytes", "bytes")
    _sources(chip, "on_chip", sources)
    chip.finish()
    link = _interconnect(f.sub("interconnect"), sources)
    vendor = f.text("vendor", "other")
    eff = _efficiency(f.sub("efficiency"), sources, SCAN_KERNEL.get(vendor, "unfused"))
    price = _price(f.sub("price", required=False), sources)
    tdp, idle = _power(f.sub("power", required=False), sources)
    host = _host(f.sub("host", required=False), sources)
    hw = Hardware(
        name=f.text("name"), vendor=vendor,
        description=f.text("description", ""), peak_flops_per_s=peaks,
        memory_bytes=capacity, memory_bytes_per_s=bandwidth, compute_units=units_count,
        l2_bytes=l2, interconnect=link, efficiency=eff, sources=sources,
        calibration=engines.calibration(f.sub("calibration", required=False),
                                        engine if "calibration" in f.renamed else None),
        runtime_reserved_bytes=reserved, price_per_hour=price, engine=engine,
        uncertainty=read_uncertainty(f.sub("uncertainty", required=False)),
        composition=read_composition(f.sub("composition", required=False)),
        tdp_watts=tdp, idle_watts=idle, host=host,
    )
    f.finish()
    return hw


def _with_base(data: dict, path: Path) -> dict:
    """A variant of another device: ``base: NAME`` (a shipped hardware name, or a path
    relative to this file) reads that file and lays this one over it, block by block: a key
    given here replaces the base's, a block (``memory:``) merges key by key. A block changed
    here must carry its own ``source`` (the base's would now describe figures it no longer
    holds), and a base cannot have a base of its own."""
    if "base" not in data:
        return data
    base = data["base"]
    if not isinstance(base, str) or not base:
        raise SpecError(f"{path}: base: expected the name or path of a hardware YAML, "
                        f"got {quoted(base)}")
    local = path.parent / base
    try:
        base_path = local if local.suffix in YAML_SUFFIXES and local.is_file() else \
            _resolve(base, "hardware")
    except SpecError:    # the unknown name is the file's text: not quoted
        names = places.names("hardware")
        raise SpecError(f"{path}: base: not a shipped hardware name{did_you_mean(base, names)}"
                        f" (shipped: {', '.join(names)}; or a hardware YAML's path)") from None
    if base_path.resolve() == path.resolve():
        raise SpecError(f"{path}: base: names this file itself")
    try:
        merged = read_mapping(base_path, HARDWARE_EXPECTED)
    except SpecError:    # its message would quote the path this file gave
        raise SpecError(f"{path}: base: the file it names is not a readable hardware YAML"
                        ) from None
    if "base" in merged:
        raise SpecError(f"{path}: base: the file it names has a base of its own; expected a "
                        f"file without one")
    for key, value in data.items():
        if key in ("engines", "calibration") and isinstance(value, dict):
            # an engine's block replaces the base's of that engine; a calibration, the base's
            merged[key] = (merged.get(key) or {}) | value if key == "engines" else value
        elif isinstance(value, dict) and isinstance(merged.get(key), dict):
            if "source" not in value:
                raise SpecError(f"{path}: {key}.source: a block changed over base {base!r} "
                                f"needs its own source")
            merged[key] = {k: v for k, v in merged[key].items() if k != "note"} | value
        else:
            merged[key] = value
    merged.pop("base")
    return merged


def _price(f: Fields | None, sources: dict[str, str]) -> float | None:
    """The optional ``price:`` block: ``usd_per_hour`` per device, a plain number (the unit
    is in its name, so "$2.99" or "2.99 USD" is refused), and its ``source``."""
    if f is None:
        return None
    value = f.raw("usd_per_hour")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise f.error("usd_per_hour", f"expected a number of US dollars per device-hour, "
                      f"got {value!r}")
    out = f.quantity("usd_per_hour", "number", maximum=MAX_USD_PER_HOUR)
    _sources(f, "price", sources)
    f.finish()
    return out


def _power(f: Fields | None, sources: dict[str, str]) -> tuple[float | None, float | None]:
    """The optional ``power:`` block: ``tdp_watts`` (the board's rated power: TDP, TBP or
    TGP, whichever the vendor publishes) and, where someone measured or published it,
    ``idle_watts`` (at most the TDP), plain numbers of watts, with their ``source``."""
    if f is None:
        return None, None
    tdp = f.quantity("tdp_watts", "number", maximum=MAX_WATTS)
    idle = f.quantity("idle_watts", "number", None, positive=False, maximum=tdp) \
        if f.has("idle_watts") else None
    _sources(f, "power", sources)
    f.finish()
    return tdp, idle


def _host(f: Fields | None, sources: dict[str, str]) -> HostLink | None:
    """The optional ``host:`` block (``HostLink``): the host link's bytes per second per
    direction and its kind, and where given the host memory and NVMe read per device."""
    if f is None:
        return None
    out = HostLink(
        link_bytes_per_s=f.quantity("link_bytes_per_s", "bytes_per_s"),
        link=f.text("link", "pcie5", ("pcie4", "pcie5", "pcie6", "c2c")),
        dram_bytes=f.quantity("dram_bytes", "bytes", 0.0, positive=False),
        nvme_bytes_per_s=f.quantity("nvme_bytes_per_s", "bytes_per_s", 0.0, positive=False))
    _sources(f, "host", sources)
    f.finish()
    return out


def _interconnect(f: Fields, sources: dict[str, str]) -> Interconnect:
    out = Interconnect(
        link_bytes_per_s=f.quantity("link_bytes_per_s", "bytes_per_s"),
        latency_s=f.quantity("latency_s", "s", positive=False),
        topology=f.text("topology", "switch", ("switch", "ring", "torus", "pcie", "none")),
        max_devices=f.integer("max_devices", 8),
        collective_latency_s=f.quantity("collective_latency_s", "s", 0.0, positive=False),
        network_bytes_per_s=f.quantity("network_bytes_per_s", "bytes_per_s", 0.0,
                                       positive=False),
        network_latency_s=f.quantity("network_latency_s", "s", 0.0, positive=False),
        custom_all_reduce_max_bytes=f.quantity("custom_all_reduce_max_bytes", "bytes", 0.0,
                                               positive=False),
        custom_all_reduce_latency_s=f.quantity("custom_all_reduce_latency_s", "s", 0.0,
                                               positive=False),
        custom_all_reduce_fraction=f.quantity("custom_all_reduce_fraction", "number", 1.0,
                                              maximum=1.0),
        devices_per_host=f.integer("devices_per_host", 0, minimum=0),
    )
    _sources(f, "interconnect", sources)
    f.finish()
    return out


def _efficiency(f: Fields, sources: dict[str, str], scan_kernel: str) -> Efficiency:
    """The ``efficiency:`` block (``specs.efficiency_block``) and its source."""
    out = read_efficiency(f, scan_kernel)
    _sources(f, "efficiency", sources)
    f.finish()
    return out


def _with_modelopt(data: dict, path: Path) -> dict:
    """A config.json without ``quantization_config`` beside a ModelOpt
    ``hf_quant_config.json``: that file's ``quantization`` block as a ``modelopt`` config,
    as vLLM's ModelOpt configs and TensorRT-LLM read it."""
    beside = path.with_name("hf_quant_config.json")
    if "quantization_config" in data or not beside.is_file():
        return data
    block = read_mapping(beside, "a ModelOpt hf_quant_config.json").get("quantization")
    if not isinstance(block, dict):
        raise SpecError(f"{beside}: expected a 'quantization' mapping (ModelOpt's "
                        f"hf_quant_config.json)")
    return {**data, "quantization_config": {"quant_method": "modelopt", **block}}


def load_model(path: str | Path) -> Model:
    """Read a model YAML (perfmodel/models/README.md; .yaml or .yml) or a .json file: a Hugging Face
    config.json, or the perfmodel/models/README.md schema in JSON when it has ``version`` and no
    ``model_type``."""
    path = _user_path(path, "model", f"a path to {MODEL_EXPECTED}")
    _check_suffix(path, "a model YAML", "a Hugging Face config.json")
    data = read_mapping(path, MODEL_EXPECTED)
    if path.suffix == ".json" and ("model_type" in data or "version" not in data):
        from perfmodel.specs.hf import model_from_hf_config

        return model_from_hf_config(_with_modelopt(data, path), str(path))
    f = Fields(data, str(path), allowed=MODEL_KEYS)
    check_version(f)
    model = model_from_fields(f)
    f.finish()
    return model


def _user_path(value: object, kind: str, expected: str) -> Path:
    """``value`` as a Path; anything but text or a Path is a one-line SpecError."""
    if isinstance(value, Path):
        return value
    if isinstance(value, str) and value:
        return Path(value)
    raise SpecError(f"{kind}: expected {expected}, got {value!r}")


def _probe(path: Path, test: str) -> bool:
    """``path.exists()`` or ``path.is_dir()``, False where the OS refuses to look (the
    read that follows reports it)."""
    try:
        return getattr(path, test)()
    except OSError:
        return False


def _check_suffix(path: Path, yaml_what: str, json_what: str) -> None:
    """The suffix picks the reader: .yaml/.yml YAML, .json JSON; any other is refused (a
    .txt read as YAML would be a guess)."""
    if path.suffix.lower() not in (*YAML_SUFFIXES, ".json") and not _probe(path, "is_dir"):
        if _HUB_ID.fullmatch(str(path)) and not _probe(path, "exists"):
            raise SpecError(f"{path}: looks like a Hugging Face repo id; expected a path to "
                            f"its config.json (download it first: nothing is fetched here)")
        got = f"suffix {path.suffix!r}" if path.suffix else "no suffix"
        raise SpecError(f"{path}: {got}, expected .yaml or .yml ({yaml_what}) or .json "
                        f"({json_what})")


# a Hugging Face repository id: owner/name, no further separator
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*")


def _resolve(name_or_path: object, kind: str) -> Path:
    """A name (a file stem in the user's spec folders, then the shipped ones:
    ``specs.places``), else a path; an unknown name lists the known ones with the closest
    first ("did you mean")."""
    path = _user_path(name_or_path, kind, "a shipped model name or a path" if kind == "model"
                      else "a shipped hardware name or a path")
    text = str(name_or_path)
    if "," in text and not _probe(path, "exists"):
        lists = "sweep, roofline and plan" if kind == "hardware" else "sweep and report"
        raise SpecError(f"--{kind}: {text!r}: expected one {kind} name or path, got a "
                        f"comma-separated list ({lists} take lists; this command takes one)")
    if "/" not in text and "\\" not in text:
        found = places.find(text, kind)
        if found is not None:
            return found
    # a path: a separator, an existing file or folder, or a file-like suffix (".txt")
    if "/" in text or "\\" in text or _probe(path, "exists") \
            or re.fullmatch(r"\.[A-Za-z]+", path.suffix):
        return path
    raise unknown_name(text, kind)


def unknown_name(text: str, kind: str) -> SpecError:
    """"--model: unknown model 'x'; did you mean 'y'? (known: ...)": a name in no spec
    folder (the text is the user's argument, not a file's)."""
    names = places.names(kind)
    return SpecError(f"--{kind}: unknown {kind} {text!r}{did_you_mean(text, names)} "
                     f"(known: {', '.join(names)}; or give a path to a file, or a folder "
                     f"of specs with --specs or {places.ENV})")


def unique_names(names: list[str]) -> list[str]:
    """``names`` with repeats made unique by "-2", "-3", ... (in order; a suffixed name that
    is itself taken moves on to the next number)."""
    taken, out = set(names), []
    count: dict[str, int] = {}
    for name in names:
        count[name] = count.get(name, 0) + 1
        if count[name] == 1:
            out.append(name)
            continue
        n = count[name]
        while f"{name}-{n}" in taken:
            n += 1
        count[name] = n
        taken.add(f"{name}-{n}")
        out.append(f"{name}-{n}")
    return out


def shipped(directory: Path) -> list[str]:
    """Stems of the YAML files in ``directory`` (``HARDWARE_DIR``, ``MODELS_DIR``: the
    shipped ones)."""
    return places.stems(directory)


def known(kind: str) -> list[str]:
    """Every name ``hardware()`` ("hardware") or ``model()`` ("model") resolves: the user's
    spec folders' and the shipped ones (``specs.places``)."""
    return places.names(kind)


def hardware(name_or_path: str | Path, engine: str = engines.DEFAULT_ENGINE) -> Hardware:
    """A hardware name (a file stem in the user's spec folders or the shipped
    ``perfmodel/hardware/``: ``specs.places``) or a path to a hardware YAML, as ``engine``
    (vllm, sglang, trtllm) runs it (``load_hardware``)."""
    return load_hardware(_resolve(name_or_path, "hardware"), engine)


def model(name_or_path: str | Path) -> Model:
    """A model name (the user's spec folders, then the shipped ``perfmodel/models/``:
    ``specs.places``), a path to a model YAML, or a path to a HF config.json."""
    return load_model(_resolve(name_or_path, "model"))
