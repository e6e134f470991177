"""Shared pieces of the MoE routing-cost tests (``moe_kernels.<class>.slot_s`` / ``scan_s``):
a device whose one class row carries given routing constants, and the expert GEMMs of a
Qwen3-30B-A3B prefill step of 4 x 256 new tokens."""

from dataclasses import replace

import perfmodel as pm


def with_routing(hw: pm.Hardware, cls: str, slot_s: float, scan_s: float = 0.0
                 ) -> pm.Hardware:
    """``hw`` whose ``moe_kernels`` holds only ``cls``, with these routing constants."""
    row = (0.5, 0.8, 10e-6, 0.1e-6, 1.0, 1e-9, slot_s, scan_s)
    return replace(hw, efficiency=replace(hw.efficiency, moe_kernels={cls: row}))


def expert_gemms(hw: pm.Hardware, plan: dict) -> tuple:
    """(up, down) expert GEMM records of Qwen3-30B-A3B, 4 sequences x 256 new tokens, fp8."""
    from perfmodel.cost.step import Dtypes, Step, step_records

    records = step_records(pm.model("qwen3-30b-a3b"), hw, pm.Parallelism(**plan),
                           Step.uniform(4, 256, 256), Dtypes.of(weights="fp8", acts="fp8"))
    gemms = {r.name: r for r in records if r.name.startswith("experts.")}
    return gemms["experts.gate_up_proj"], gemms["experts.down_proj"]
