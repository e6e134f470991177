"""Calibration from measured kernels (validate.kernel_*): the custom all-reduce path, the fit
recovering constants it generated, the held-out folds, the YAML writers. No torch, no
aiconfigurator tables (synthetic kernel sets priced by the model itself)."""

from __future__ import annotations

import importlib.util
from dataclasses import replace

import numpy as np
import pytest
import yaml

import perfmodel as pm
from perfmodel.cost.collectives import all_reduce_parts, custom_all_reduce_parts
from perfmodel.specs.load import load_hardware
from validate.corpus import write as kw
from validate.corpus.fit import fit_device, held_out
from validate.corpus.params import apply
from validate.corpus.sets import attention_sets, collective_set, fold_of, gemm_sets


def _custom(hw, latency=5e-6, fraction=0.25, max_bytes=8 * 2**20):
    link = replace(hw.interconnect, custom_all_reduce_latency_s=latency,
                   custom_all_reduce_fraction=fraction, custom_all_reduce_max_bytes=max_bytes)
    return replace(hw, interconnect=link)


def test_custom_all_reduce_golden() -> None:
    """4 H100s, 128 KB: one stage (< 512 KB at n <= 4), each device reads 3 x 128 KB =
    393,216 B at 450 GB/s x 0.25 = 112.5 GB/s: 3.4953 us + 5 us = 8.4953 us. 1 MB: two
    stages, 2 x 3/4 x 1,048,576 = 1,572,864 B: 13.981 us + 5 us = 18.981 us."""
    hw = _custom(pm.hardware("h100-sxm"))
    got = all_reduce_parts(hw, 4, np.array([131072.0, 1048576.0])).total
    assert got == pytest.approx([8.4953e-6, 18.981e-6], rel=1e-4)


def test_custom_all_reduce_only_where_vllm_runs_it() -> None:
    """At or above max_bytes, over 3 devices, across nodes, or with none set: NCCL."""
    base = _custom(pm.hardware("h100-sxm"), max_bytes=0.0)
    hw = _custom(base)
    nccl = all_reduce_parts(base, np.array([4, 3, 8, 4]), np.array([8 * 2**20, 4096, 4096,
                                                                     4096]),
                            np.array([1, 1, 2, 1])).total
    got = all_reduce_parts(hw, np.array([4, 3, 8, 4]), np.array([8 * 2**20, 4096, 4096, 4096]),
                           np.array([1, 1, 2, 1])).total
    assert got[:3] == pytest.approx(nccl[:3])
    assert got[3] < nccl[3]
    assert custom_all_reduce_parts(base, 4, 4096) is None


def _synthetic(hw):
    """Kernel sets "measured" as the model prices them on ``hw``."""
    rng = np.random.default_rng(1)
    m = rng.choice([1, 8, 32, 128, 512, 2048, 8192], 600)
    n = rng.choice([1024, 4096, 5120, 14336], 600)
    k = rng.choice([1024, 4096, 8192], 600)
    sets = gemm_sets(m, n, k, np.ones(600))
    b = rng.choice([1, 8, 64], 300)
    q = rng.choice([1, 1, 512, 2048], 300)
    kv = np.maximum(q, rng.choice([1, 1024, 8192], 300))
    h = rng.choice([8, 16, 24, 32, 40, 48, 64], 300)
    hd = rng.choice([64, 128, 256], 300)
    sets += attention_sets(b, q, kv, h, h // 8, hd, np.zeros(300),
                           np.full(300, 2.0), np.ones(300))
    sizes = 2.0 ** np.arange(10, 28)
    dev = np.repeat([2, 4, 8], len(sizes))
    sets.append(collective_set(dev, np.tile(sizes, 3), np.arange(len(dev)) % 2,
                               np.ones(len(dev))))
    return [replace(s, measured_s=s.predict(hw)) for s in sets]


TRUE = {"gemm_fraction": 0.85, "gemm_k_half": 64.0, "memory_fraction": 0.8,
        "kernel_latency_s": 3e-6, "attention_fraction": 0.55, "attention_program_keys": 200.0,
        "attention_head_dim_half": 40.0, "memory_fraction.attention": 0.8,
        "kernel_latency_s.attention": 9e-6, "collective_fraction": 0.6,
        "collective_latency_s": 9e-6, "custom_all_reduce_fraction": 0.3,
        "custom_all_reduce_latency_s": 4e-6}


def test_fit_recovers_the_constants_it_generated() -> None:
    """Kernels priced with known constants: the fit finds them (the start is elsewhere)."""
    base = pm.hardware("h100-sxm")
    sets = _synthetic(apply(base, TRUE))
    got = fit_device(base, sets)
    for name, value in TRUE.items():
        assert got[name] == pytest.approx(value, rel=0.03), name


def test_held_out_folds_cover_every_row_once() -> None:
    base = pm.hardware("h100-sxm")
    sets = _synthetic(apply(base, TRUE))
    errors = held_out(base, sets)
    assert {k: len(v) for k, v in errors.items()} == {s.error_class: len(s) for s in sets}
    # a fold may hold a shape family no other fold has (a size decade of the all-reduce):
    # those rows extrapolate, the typical row does not
    assert max(float(np.median(np.abs(v))) for v in errors.values()) < 0.01


def test_folds_are_by_shape_family_and_deterministic() -> None:
    n, k = np.array([4096, 4096, 5120]), np.array([1024, 1024, 1024])
    f = fold_of(n, k)
    assert f[0] == f[1] and np.array_equal(f, fold_of(n, k)) and set(f) <= set(range(5))


BLOCKS = {"efficiency": {"gemm_fraction": 0.9, "kernel_latency_s": 2.5e-6,
                         "kernel_latency_by_kind": {"attention": 1e-5}},
          "interconnect": {"collective_latency_s": 7e-6, "custom_all_reduce_fraction": 0.3,
                           "custom_all_reduce_latency_s": 4.5e-6,
                           "custom_all_reduce_max_bytes": 8388608},
          "calibration": {"source": "test", "engine": "vllm"},
          "uncertainty": {"source": "test", "error_q10": {"gemm": -0.1},
                          "error_q90": {"gemm": 0.1}}}


def test_shipped_text_sets_values_and_keeps_the_rest(tmp_path) -> None:
    text = kw.shipped_path("h100-sxm").read_text()
    path = tmp_path / "h100-sxm.yaml"
    path.write_text(kw.shipped_text(text, BLOCKS))
    hw = load_hardware(path)
    assert hw.efficiency.gemm_fraction == 0.9
    assert hw.efficiency.kernel_latency_s == pytest.approx(2.5e-6)
    assert hw.efficiency.kernel_latency_by_kind == pytest.approx(
        {"attention": 1e-5, "rms_norm": 4.3e-6})
    assert hw.interconnect.custom_all_reduce_max_bytes == 8388608
    assert hw.interconnect.network_latency_s == pytest.approx(2.7e-6)   # untouched
    again = kw.shipped_text(path.read_text(), BLOCKS)       # idempotent
    assert again == path.read_text()
    assert yaml.safe_load(again)["calibration"]["engine"] == "vllm"


def test_variant_text_loads_over_its_base(tmp_path) -> None:
    path = tmp_path / "fit.yaml"
    path.write_text(kw.variant_text("h100-sxm", BLOCKS))
    hw = load_hardware(path)
    assert hw.efficiency.gemm_fraction == 0.9
    assert hw.memory_bytes_per_s == pm.hardware("h100-sxm").memory_bytes_per_s


def test_calibrate_from_mistakes_are_one_line(tmp_path) -> None:
    from typer.testing import CliRunner

    from perfmodel.cli.app import app, load_plugins

    load_plugins(app)
    runner = CliRunner()
    # without the package (CI installs only pyarrow) the device is never looked up: the
    # missing package is the one line
    no_tables = "--hardware: mi300x: no aiconfigurator" \
        if importlib.util.find_spec("aiconfigurator_core") else \
        "package aiconfigurator-core is not installed"
    cases = [
        (["--from", str(tmp_path), "-H", "h100-sxm"], "--from: "),
        (["--from", "aiconfigurator"], "--hardware: expected the shipped device"),
        (["--from", "aiconfigurator", "-H", "h100-sxm", "--write-hardware"],
         "--write-hardware: expected --all"),
        (["--from", "aiconfigurator", "-H", "mi300x"], no_tables),
        (["--from", "aiconfigurator", "-H", "h100-sxm", "--engine", "tgi"], "--engine: "),
    ]
    for args, message in cases:
        result = runner.invoke(app, ["calibrate", *args, "--out", str(tmp_path / "x.yaml")])
        assert result.exit_code == 2, (args, result.output)
        assert message in result.output and "Traceback" not in result.output
