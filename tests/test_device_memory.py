"""Device memory: driver-reported capacities and the one usable-memory rule (issue: capacity).

usable = max(capacity x usable fraction - runtime reserve, 0); golden values derived by hand.
"""

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import perfmodel as pm
from perfmodel.cost.memory import memory_estimate, usable_bytes
from perfmodel.specs import Parallelism, Workload, Workloads
from perfmodel.specs.load import HARDWARE_DIR, load_hardware

MiB = 2**20
LLAMA_7B_WEIGHTS = 6_738_415_616 * 2                         # bf16
# llama-2-7b, prompt 512 + 128 generated: KV of 640 tokens (40 whole blocks of 16) and one
# row of fp32 logits per sequence, beside one full step's activations (8,192 tokens, the
# chunked-prefill budget) once
LLAMA_7B_PER_SEQ = 640 * 32 * 2 * 32 * 128 * 2 + 32000 * 4
LLAMA_7B_STEP = (2 * 4096 + 3 * 11008) * 2 * 8192


def one(model, hw, **workload):
    w = Workloads.from_list([Workload(**workload)])
    return memory_estimate(model, hw, Parallelism(), w).item(0)


@pytest.mark.parametrize(("name", "mib"), [
    ("a100-80gb-sxm", 81920), ("a100-40gb-sxm", 40960), ("h100-sxm", 81559),
    ("h200-sxm", 143771), ("b200", 183359), ("l4", 23034), ("l40s", 46068),
    ("mi300x", 196592), ("rtx-4090", 24564), ("rtx-pro-6000", 97887),
    ("b300", 275040), ("gb200", 189471), ("gb300", 284208), ("a30", 24258),
])
def test_capacity_is_the_driver_total(name, mib):
    """nvidia-smi / rocm-smi totals in MiB (sources in perfmodel/hardware/README.md), not
    datasheet GB."""
    assert pm.hardware(name).memory_bytes == mib * MiB


def test_tpu_capacity_is_the_runtime_limit_and_reserves_nothing():
    v6e = pm.hardware("tpu-v6e")
    assert v6e.memory_bytes == 33_550_237_696 and v6e.runtime_reserved_bytes == 0


def test_a100_usable_by_hand():
    hw = pm.hardware("a100-80gb-sxm")
    assert hw.runtime_reserved_bytes == 1833 * MiB                # vLLM's 1.79 GiB non-torch
    # 0.9 x 85,899,345,920 - 1,922,039,808 = 77,309,411,328 - 1,922,039,808
    assert usable_bytes(hw, 0.9) == pytest.approx(75_387_371_520, rel=1e-15)
    assert usable_bytes(hw, 0.5) == pytest.approx(42_949_672_960 - 1_922_039_808, rel=1e-15)


def test_max_batch_by_hand_on_a100():
    est = one(pm.model("llama-2-7b"), pm.hardware("a100-80gb-sxm"), prompt_len=512, gen_len=128)
    # (75,387,371,520 - 13,476,831,232 - 675,282,944) / 335,672,320 = 182.4
    assert LLAMA_7B_PER_SEQ == 335_672_320 and LLAMA_7B_STEP == 675_282_944
    assert est.usable_bytes == pytest.approx(75_387_371_520, rel=1e-15)
    assert est.max_batch == 182 and est.fits


def test_max_batch_by_hand_on_a_toy_device():
    # 20 GB, 1 GB reserved, 90%: usable 17e9; 9 sequences' prompts (4,608 tokens) fill no
    # step, so each brings its activations: (17e9 - 13,476,831,232) / 377,877,504 = 9.3
    hw = replace(pm.hardware("a100-80gb-sxm"), memory_bytes=20e9, runtime_reserved_bytes=1e9)
    est = one(pm.model("llama-2-7b"), hw, prompt_len=512, gen_len=128, batch=10)
    assert est.usable_bytes == pytest.approx(17e9)
    assert est.max_batch == 9 and not est.fits


def test_reserve_above_the_budget_gives_zero_not_negative():
    hw = replace(pm.hardware("l4"), runtime_reserved_bytes=30e9)   # > 24.15 GB x 0.9
    est = one(pm.model("llama-2-7b"), hw)
    assert est.usable_bytes == 0.0
    assert est.max_batch == 0 and est.fits is False


def test_hardware_built_in_python_reserves_nothing():
    hw = pm.hardware("h100-sxm")
    bare = pm.Hardware(name="bare", peak_flops_per_s=hw.peak_flops_per_s,
                       memory_bytes=80e9, memory_bytes_per_s=hw.memory_bytes_per_s,
                       compute_units=hw.compute_units, l2_bytes=hw.l2_bytes,
                       interconnect=hw.interconnect)
    assert bare.runtime_reserved_bytes == 0.0 and usable_bytes(bare, 0.9) == pytest.approx(72e9)


def test_reserve_is_optional_in_yaml_and_never_negative(tmp_path):
    text = (HARDWARE_DIR / "h100-sxm.yaml").read_text()
    path = tmp_path / "spec.yaml"
    path.write_text(text.replace("  runtime_reserved_bytes: 1833 MiB\n", ""))
    assert load_hardware(path).runtime_reserved_bytes == 0.0
    path.write_text(text.replace("runtime_reserved_bytes: 1833 MiB",
                                 "runtime_reserved_bytes: -1 GiB"))
    with pytest.raises(pm.SpecError, match="runtime_reserved_bytes"):
        load_hardware(path)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.floats(0.01, 1.0), st.floats(0.01, 1.0), st.floats(0.0, 200e9), st.floats(1e9, 300e9))
def test_usable_grows_with_fraction_and_is_never_negative(f1, f2, reserve, capacity):
    hw = replace(pm.hardware("h100-sxm"), memory_bytes=capacity, runtime_reserved_bytes=reserve)
    lo, hi = sorted((f1, f2))
    assert 0.0 <= usable_bytes(hw, lo) <= usable_bytes(hw, hi)
    if reserve >= capacity * hi:
        assert usable_bytes(hw, hi) == 0.0
        est = one(pm.model("llama-2-7b"), hw, usable_memory_fraction=hi)
        assert est.max_batch == 0 and not est.fits
