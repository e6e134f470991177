"""Weight formats: the vocabulary of ``--weights-format`` and of a model YAML's
``quantization: format:``, read from ``weight_formats.yaml`` (one record per format).

A format is what a kernel needs to know of the stored weights: their dtype, the weights per
scale (a group, or a block of rows x cols), the scale's dtype and bytes per group, and the
activations the engines quantize a linear's input to on a device with their tensor-core
rate (W8A8 / W4A4; none: weight-only). ``specs.matmul_path`` decides per device which path
a format takes; this module only reads the table.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path

from perfmodel.specs.errors import SpecError, did_you_mean
from perfmodel.specs.model import Model, Quantization

TABLE = Path(__file__).with_name("weight_formats.yaml")
SCALE_DTYPES = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8-e4m3": 1.0, "e8m0": 1.0}


@dataclass(frozen=True)
class WeightFormat:
    """One weight format (``weight_formats.yaml``). ``group_size``: weights per scale
    (rows x cols of ``block`` when blocked; None: one scale per tensor or output row);
    ``scale_bytes``: bytes of scale and zero point per group; ``act_dtype`` / ``act_group``:
    what the engines quantize the activations to where the device has that rate (None:
    weight-only; group 0: one scale per token or tensor)."""

    name: str
    weights: str
    group_size: int | None = None
    block: tuple[int, int] | None = None
    scale_dtype: str = "fp32"
    scale_bytes: float = 4.0
    act_dtype: str | None = None
    act_group: int = 0
    source: str = ""

    @property
    def scheme(self) -> tuple[str, int | None, float]:
        """(weights dtype, group size, scale bytes per group): what a Workload stores."""
        return self.weights, self.group_size, self.scale_bytes

    def describe(self) -> str:
        """'fp8-block128 (fp8, 128x128 blocks, fp32 scales; W8A8 fp8 activations per 128)'."""
        grain = (f"{self.block[0]}x{self.block[1]} blocks" if self.block else
                 f"groups of {self.group_size}" if self.group_size else "per tensor/channel")
        acts = "weight-only" if self.act_dtype is None else \
            f"{self.act_dtype} activations " + (f"per {self.act_group}" if self.act_group
                                                else "per token/tensor")
        return f"{self.name} ({self.weights}, {grain}, {self.scale_dtype} scales; {acts})"


@cache
def _read() -> tuple[dict[str, WeightFormat], dict[str, str], dict[str, str]]:
    import yaml

    data = yaml.safe_load(TABLE.read_text())
    formats = {}
    for name, row in data["formats"].items():
        block = tuple(row["block"]) if "block" in row else None
        group = block[0] * block[1] if block else row.get("group")
        acts = row.get("acts") or {}
        formats[name] = WeightFormat(
            name, row["weights"], group, block, row["scale_dtype"], float(row["scale_bytes"]),
            acts.get("dtype"), int(acts.get("group", 0)), row.get("source", ""))
    return formats, dict(data.get("aliases", {})), dict(data.get("dtype_defaults", {}))


def weight_formats() -> dict[str, WeightFormat]:
    """Every format by name, aliases included (their record keeps the format's name)."""
    formats, aliases, _ = _read()
    return {**formats, **{a: formats[t] for a, t in aliases.items()}}


def format_names() -> tuple[str, ...]:
    """The accepted names: the formats, then their aliases."""
    return tuple(weight_formats())


def weight_format(name: str, where: str = "--weights-format") -> WeightFormat:
    """The format ``name``; SpecError naming ``where`` and the accepted names if unknown."""
    found = weight_formats().get(name)
    if found is None:
        raise SpecError(f"{where}: unknown {name!r}, expected one of "
                        f"{', '.join(format_names())}{did_you_mean(name, format_names())}")
    return found


def format_of(weights: str, group_size: int | None,
              scale_bytes: float | None = None) -> WeightFormat | None:
    """The format a weights dtype stored in groups of ``group_size`` (None: ungrouped) with
    ``scale_bytes`` per group runs as: the first format of that dtype, group and scale
    bytes, else of that dtype and group, else the dtype's default (``dtype_defaults``);
    None for a 16-bit (or unknown) dtype."""
    formats, _, defaults = _read()
    same = [f for f in formats.values()
            if f.weights == weights and (f.group_size or None) == (group_size or None)]
    exact = [f for f in same if scale_bytes is None or f.scale_bytes == scale_bytes]
    return (exact or same or [formats.get(defaults.get(weights, ""))])[0]


def with_weights_format(model: Model, name: str | None) -> Model:
    """``model`` with its checkpoint's main weights in format ``name`` (None: as is): the
    classes it keeps at 16 bits or in another format keep theirs; an unquantized model
    gets every linear class but the router (which the engines build 16-bit) in it. What
    ``plan --weights-format`` searches with."""
    if name is None:
        return model
    f = weight_format(name)
    q = model.quantization
    kept = q.unquantized if q is not None else ("router",) if model.moe else ()
    new = Quantization(f"--weights-format {f.name}", f.weights, f.group_size, f.scale_bytes,
                       kept, q.lm_head if q is not None else False, f.name, f.scale_dtype,
                       f.act_dtype, q.formats if q is not None else ())
    return replace(model, quantization=new)
