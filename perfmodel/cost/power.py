"""Power and energy of a step from its roofline utilization.

Per device, a step of ``t`` seconds that keeps the tensor cores busy ``C`` seconds (its
FLOPs at the dense peak of its compute dtype) and the memory ``M`` seconds (its bytes at the
datasheet bandwidth) draws

    P = idle + (TDP - idle) x min(1, w_c x C / t + w_m x M / t)        (watts)
    E = P x t = idle x t + (TDP - idle) x min(t, w_c x C + w_m x M)     (joules)

``idle`` and ``TDP`` are the device's own (its hardware YAML's ``power:`` block; a device
without ``idle_watts`` idles at ``idle_fraction`` x TDP, an assumption the answer states),
``w_c`` and ``w_m`` the model's two weights (``power.yaml``, each with its source). Host time
and an empty engine draw idle power. Energy adds over steps, so a phase's energy is the sum
of its steps' (``phase_energy`` clips once over the phase: exact while no step saturates).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np

from perfmodel.specs.fields import Fields, read_mapping
from perfmodel.specs.hardware import Hardware

TABLE = Path(__file__).with_name("power.yaml")
J_PER_KWH = 3.6e6


@dataclass(frozen=True)
class PowerModel:
    """The weights of compute and memory utilization in the dynamic power, and the idle
    share of TDP assumed where a device publishes no idle figure (``power.yaml``)."""

    compute_weight: float
    memory_weight: float
    idle_fraction: float
    source: str


@cache
def power_model() -> PowerModel:
    """The shipped power model (``power.yaml``)."""
    f = Fields(read_mapping(TABLE, "the power model YAML"), str(TABLE),
               allowed=("version", "compute_weight", "memory_weight", "idle_fraction",
                        "source"))
    f.raw("version")
    out = PowerModel(*(f.quantity(k, "number", maximum=1.0) for k in (
        "compute_weight", "memory_weight", "idle_fraction")), f.text("source"))
    f.finish()
    return out


@dataclass(frozen=True)
class DevicePower:
    """One device's idle and rated power (W); ``idle_assumed``: idle is the model's share of
    TDP, not the device's own figure."""

    name: str
    tdp_w: float
    idle_w: float
    idle_assumed: bool

    @property
    def note(self) -> str:
        """What the figures rest on, in one line."""
        pm = power_model()
        idle = (f"idle {self.idle_w:.0f} W assumed ({pm.idle_fraction:.0%} of TDP: "
                f"{self.name}'s power: block gives no idle_watts)" if self.idle_assumed
                else f"idle {self.idle_w:.0f} W")
        return (f"power: {self.name} TDP {self.tdp_w:.0f} W, {idle}; P = idle + (TDP - idle)"
                f" x min(1, {pm.compute_weight:g} u_compute + {pm.memory_weight:g} u_memory)"
                " (cost/power.yaml)")


def device_power(hw: Hardware) -> DevicePower | None:
    """``hw``'s power figures, None where its YAML has no ``power:`` block (no TDP)."""
    if hw.tdp_watts is None:
        return None
    if hw.idle_watts is not None:
        return DevicePower(hw.name, hw.tdp_watts, hw.idle_watts, False)
    return DevicePower(hw.name, hw.tdp_watts, power_model().idle_fraction * hw.tdp_watts,
                       True)


def busy_seconds(hw: Hardware, flops: np.ndarray | float, nbytes: np.ndarray | float,
                 peak_flops_per_s: np.ndarray | float) -> tuple[np.ndarray, np.ndarray]:
    """(compute, memory) busy seconds of work on one device: FLOPs at ``peak_flops_per_s``
    and bytes at the datasheet bandwidth."""
    return (np.asarray(flops, dtype=float) / peak_flops_per_s,
            np.asarray(nbytes, dtype=float) / hw.memory_bytes_per_s)


def energy_j(dev: DevicePower, time_s: np.ndarray | float, compute_s: np.ndarray | float,
             memory_s: np.ndarray | float) -> np.ndarray:
    """Joules one device spends over ``time_s`` with the given busy seconds (the module's
    formula, elementwise)."""
    pm = power_model()
    t = np.asarray(time_s, dtype=float)
    active = np.minimum(t, pm.compute_weight * np.asarray(compute_s, dtype=float)
                        + pm.memory_weight * np.asarray(memory_s, dtype=float))
    return dev.idle_w * t + (dev.tdp_w - dev.idle_w) * np.maximum(active, 0.0)


def mean_watts(energy: np.ndarray | float, time_s: np.ndarray | float) -> np.ndarray:
    """Mean power (W) of ``energy`` J over ``time_s`` (0 for no time)."""
    t = np.asarray(time_s, dtype=float)
    return np.divide(energy, t, out=np.zeros(np.shape(t * 1.0)), where=t > 0)


__all__ = ["J_PER_KWH", "DevicePower", "PowerModel", "busy_seconds", "device_power",
           "energy_j", "mean_watts", "power_model"]
