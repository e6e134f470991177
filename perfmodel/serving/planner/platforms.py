"""The software platform a device's vendor runs (CUDA, ROCm, TPU, Neuron, Gaudi) and what
it means for a launch: the variable that hands a server its devices, the word the output
counts them by, and per engine the environment it needs or the one line saying why it has
no launch there. The facts are data (``platforms.yaml``), each with its source."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from importlib.resources import files

import yaml

from perfmodel.specs.errors import SpecError


@dataclass(frozen=True)
class EngineRule:
    env: tuple[str, ...] = ()
    refused: str = ""           # non-empty: this engine has no launch on the platform
    source: str = ""


@dataclass(frozen=True)
class Platform:
    name: str
    vendors: tuple[str, ...]
    unit: str
    devices_env: str | None
    engines: dict[str, EngineRule]

    def rule(self, engine: str) -> EngineRule:
        """How ``engine`` runs here (an engine the file does not list is refused)."""
        return self.engines.get(engine, EngineRule(refused=f"{engine} is not known to run "
                                                           f"on {self.name}"))


@cache
def platforms() -> dict[str, Platform]:
    data = yaml.safe_load(files("perfmodel.serving.planner").joinpath("platforms.yaml").read_text())
    return {name: Platform(name, tuple(p["vendors"]), p["unit"], p["devices_env"],
                           {e: EngineRule(tuple(r.get("env", ())), r.get("refused", ""),
                                          r.get("source", ""))
                            for e, r in p["engines"].items()})
            for name, p in data.items()}


def platform(name: str) -> Platform:
    """The platform called ``name`` (``cuda``, ``rocm``, ``tpu``, ``neuron``, ``gaudi``)."""
    known = platforms()
    if name not in known:
        raise SpecError(f"launch: platform: expected one of {', '.join(known)}, got {name!r}")
    return known[name]


def platform_of(vendor: str) -> Platform:
    """The platform a hardware file's ``vendor`` runs (CUDA for an unknown vendor's GPU is
    not assumed: ``other`` is refused)."""
    for p in platforms().values():
        if vendor in p.vendors:
            return p
    raise SpecError(f"launch: vendor {vendor!r} has no serving platform here; expected one "
                    f"of {', '.join(v for p in platforms().values() for v in p.vendors)}")


def unit_of(vendors: list[str] | tuple[str, ...]) -> str:
    """What a plan over devices of ``vendors`` counts: their platforms' one unit, or
    "device" when they differ or a vendor has none."""
    units = set()
    for v in vendors:
        try:
            units.add(platform_of(v).unit)
        except SpecError:
            units.add("device")
    return units.pop() if len(units) == 1 else "device"
