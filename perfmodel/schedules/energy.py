"""Energy and cost of one estimate: each phase's joules from its roofline utilization
(``cost.power``), joules per token, and US dollars per million output tokens from a device-
hour price and, optionally, an electricity price.

A phase's FLOPs and bytes are one device's (the step is priced per device), its compute
seconds at the dense peak of the workload's matmul compute dtype; every device of the plan
draws that power for the phase's time. Per token: prefill per prompt token computed, decode
per token it generates (``batch x (gen_len - 1)`` a replica), and the request's per output
token (``batch x gen_len``, the first token from the prefill).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from perfmodel.cost.power import J_PER_KWH, DevicePower, busy_seconds, device_power, energy_j
from perfmodel.cost.timebase import peak
from perfmodel.schedules.estimate import Estimate
from perfmodel.schedules.estimates import Estimates
from perfmodel.specs.dtypes import CODE, compute_codes
from perfmodel.specs.hardware import Hardware

SECONDS_PER_HOUR = 3600.0


@dataclass(frozen=True)
class PhaseEnergy:
    """One phase on one replica: joules over its devices, mean watts per device, the tokens
    it computes and joules per token (0 tokens: 0)."""

    name: str
    time_s: float
    joules: float
    watts_per_device: float
    tokens: float

    @property
    def j_per_token(self) -> float:
        return self.joules / self.tokens if self.tokens else 0.0

    def to_dict(self) -> dict:
        return {"time_s": self.time_s, "joules": self.joules,
                "watts_per_device": self.watts_per_device, "tokens": self.tokens,
                "j_per_token": self.j_per_token}


@dataclass(frozen=True)
class EnergySummary:
    """One replica's energy per request batch, and its cost where priced."""

    power: DevicePower
    devices: int                       # one replica's
    phases: tuple[PhaseEnergy, ...]
    output_tokens: float               # one replica's batch x gen_len
    usd_per_device_hour: float | None = None
    usd_per_kwh: float | None = None

    @property
    def joules(self) -> float:
        return sum(p.joules for p in self.phases)

    @property
    def time_s(self) -> float:
        return sum(p.time_s for p in self.phases)

    @property
    def j_per_output_token(self) -> float:
        return self.joules / self.output_tokens

    @property
    def watts_per_device(self) -> float:
        return self.joules / (self.time_s * self.devices)

    def usd_per_million_tokens(self) -> dict[str, float]:
        """$ per million output tokens: the devices' hours, the electricity, and the sum of
        those given (empty without any price)."""
        out = {}
        if self.usd_per_device_hour is not None:
            hours = self.devices * self.time_s / SECONDS_PER_HOUR
            out["devices"] = self.usd_per_device_hour * hours / self.output_tokens * 1e6
        if self.usd_per_kwh is not None:
            out["electricity"] = self.usd_per_kwh * self.joules / J_PER_KWH \
                / self.output_tokens * 1e6
        if out:
            out["total"] = sum(out.values())
        return out

    def to_dict(self) -> dict:
        out = {"tdp_watts": self.power.tdp_w, "idle_watts": self.power.idle_w,
               "idle_assumed": self.power.idle_assumed, "devices": self.devices,
               "joules": self.joules, "watts_per_device": self.watts_per_device,
               "j_per_output_token": self.j_per_output_token,
               **{f"{p.name}": p.to_dict() for p in self.phases}, "note": self.power.note}
        cost = self.usd_per_million_tokens()
        if cost:
            out["usd_per_million_tokens"] = cost
            out["usd_per_device_hour"] = self.usd_per_device_hour
            out["usd_per_kwh"] = self.usd_per_kwh
        return out


def _tokens(e: Estimate, name: str) -> float:
    w = e.workload
    if name == "prefill":
        return float(w.batch * w.prompt_len)
    if name == "decode":
        return float(w.batch * max(w.gen_len - 1, 0))
    return float(w.batch * w.gen_len)            # a diffusion LM's denoising


def phase_joules(dev: DevicePower, hw: Hardware, time_s: np.ndarray | float,
                 flops: np.ndarray | float, nbytes: np.ndarray | float,
                 weights: np.ndarray | int, acts: np.ndarray | int) -> np.ndarray:
    """Joules one device spends on a phase of ``time_s`` seconds doing ``flops`` at the
    matmul compute dtype of (``weights``, ``acts``) codes and moving ``nbytes``."""
    rate = peak(hw, compute_codes(np.asarray(weights), np.asarray(acts)))
    return energy_j(dev, time_s, *busy_seconds(hw, flops, nbytes, rate))


def estimates_energy(e: Estimates) -> dict[str, np.ndarray] | None:
    """Per configuration of ``e``: ``joules`` of one replica's request batch, ``watts`` per
    device over it and ``j_per_output_token`` (``batch x gen_len``), and the device's
    ``idle_watts``; None without a ``power:`` block."""
    dev = device_power(e.hardware)
    if dev is None:
        return None
    w = e.workloads
    devices = e.plan.devices // e.plan.dp
    joules = sum(phase_joules(dev, e.hardware, p.time, p.total_flops, p.total_bytes.total,
                              w.weights_dtype, w.act_dtype) for p in e.phases) * devices
    time = sum(p.time for p in e.phases)
    return {"joules": joules, "watts": joules / (time * devices),
            "j_per_output_token": joules / (w.batch * w.gen_len), "idle_watts": dev.idle_w}


def estimate_energy(e: Estimate, usd_per_device_hour: float | None = None,
                    usd_per_kwh: float | None = None) -> EnergySummary | None:
    """The energy of ``e`` (None: its device's YAML has no ``power:`` block)."""
    dev = device_power(e.hardware)
    if dev is None:
        return None
    w = e.workload
    devices = e.plan.devices // e.plan.dp
    phases = []
    for p in e.phases:
        joules = float(phase_joules(dev, e.hardware, p.time_s, p.flops, p.bytes.total,
                                    CODE[w.weights_dtype], CODE[w.act_dtype])) * devices
        watts = joules / (p.time_s * devices) if p.time_s > 0 else dev.idle_w
        phases.append(PhaseEnergy(p.name, p.time_s, joules, watts, _tokens(e, p.name)))
    return EnergySummary(dev, devices, tuple(phases), float(w.batch * w.gen_len),
                         usd_per_device_hour, usd_per_kwh)


__all__ = ["EnergySummary", "PhaseEnergy", "estimate_energy", "estimates_energy",
           "phase_joules"]
