"""Quantization formats as the kernels store them: KV-cache scales, fp4 block formats
(``--weights-format``) and the outlier-aware mixed scheme, golden bytes derived by hand."""

import json
import subprocess
import sys

import numpy as np
import pytest
from typer.testing import CliRunner

import perfmodel as pm
from perfmodel.cli.app import app
from perfmodel.cost.memory import kv_bytes_per_element, kv_bytes_per_token
from perfmodel.specs.dtypes import CODE, KV_PER_VECTOR, scaled_bytes, weight_bytes
from perfmodel.specs.formats import weight_format

runner = CliRunner()
H100, B200, LLAMA3 = pm.hardware("h100-sxm"), pm.hardware("b200"), pm.model("llama-3-8b")
# llama-3-8b: 32 layers x 2 (K, V) x 8 KV heads x head_dim 128 cached elements per token
KV_ELEMS = 32 * 2 * 8 * 128
# its quantized matmul weights: attention 4096 x (4096 + 2 x 1024 + 4096) + MLP 3 x 4096 x
# 14336, over 32 layers (embedding, LM head and norms stay at 16 bits)
LINEAR = 32 * (4096 * (4096 + 2 * 1024 + 4096) + 3 * 4096 * 14336)


def _est(hw=H100, **fields):
    return pm.estimate(hw, LLAMA3, pm.Workload(batch=4, prompt_len=1000, gen_len=65, **fields))


# --- the one scale formula -----------------------------------------------------------------

def test_int8_kv_with_a_2_byte_scale_per_head_dim():
    assert float(scaled_bytes(CODE["int8"], 128, 2.0)) == 1 + 2 / 128
    got = kv_bytes_per_element(LLAMA3, np.array([CODE["int8"]]), np.array([KV_PER_VECTOR]),
                               np.array([2.0]))
    assert got[0] == 1 + 2 / 128


def test_kv_default_group_follows_the_dtype():
    codes = np.array([CODE[d] for d in ("int8", "int4", "fp8", "bf16")])
    got = kv_bytes_per_element(LLAMA3, codes, np.full(4, KV_PER_VECTOR), np.full(4, 4.0))
    assert got.tolist() == [1 + 4 / 128, 0.5 + 4 / 128, 1.0, 2.0]


def test_llama3_8b_int4_kv_per_token_with_scales():
    # LMDeploy's int4 cache: 0.5 B per element + a 16-bit scale and zero per 128 elements
    per_token = KV_ELEMS * (0.5 + 4 / 128)
    assert per_token == 34_816
    assert _est(kv_dtype="int4").memory.kv_cache_bytes_per_token == per_token
    two = _est(kv_dtype="int4", kv_scale_bytes=2.0).memory.kv_cache_bytes_per_token
    assert two == KV_ELEMS * (0.5 + 2 / 128) == 33_792
    kvb = kv_bytes_per_element(LLAMA3, np.array([CODE["int4"]]), np.array([32]), 4.0)
    assert float(kv_bytes_per_token(LLAMA3, 1, kvb)[0]) == KV_ELEMS * (0.5 + 4 / 32)


@pytest.mark.parametrize("name, per_weight", [
    ("nvfp4", 0.5 + 1 / 16), ("mxfp4", 0.5 + 1 / 32), ("mxfp8", 1 + 1 / 32),
    ("w4a16-g128", 0.5 + 2.5 / 128), ("fp8-block128", 1 + 4 / 16384), ("w8a16", 1.0)])
def test_weight_formats(name, per_weight):
    dtype, group, scale = weight_format(name).scheme
    w = pm.Workload(weights_dtype=dtype, weight_group_size=group, weight_scale_bytes=scale)
    assert w.weight_bytes_per_param == per_weight


def test_outlier_fraction_of_int4_g128():
    mixed = 0.99 * (0.5 + 2 / 128) + 0.01 * 2
    assert float(weight_bytes(CODE["int4"], 128, 2.0, 0.01)) == pytest.approx(mixed, rel=1e-15)
    w = pm.Workload(weights_dtype="int4", weight_group_size=128, outlier_fraction=0.01)
    assert w.weight_bytes_per_param == pytest.approx(0.53046875, rel=1e-15)


# --- through the estimate ------------------------------------------------------------------

def test_kv_scales_reach_memory_and_every_kv_record():
    scaled, bare = _est(kv_dtype="int8"), _est(kv_dtype="int8", kv_group_size=0)
    ratio = 1 + 4 / 128
    assert scaled.memory.kv_cache_bytes == pytest.approx(bare.memory.kv_cache_bytes * ratio)
    for phase in ("prefill", "decode"):
        a, b = getattr(scaled, phase).bytes, getattr(bare, phase).bytes
        assert a.kv_write == pytest.approx(b.kv_write * ratio, rel=1e-12)
        if b.kv_read:
            assert a.kv_read == pytest.approx(b.kv_read * ratio, rel=1e-12)
    assert scaled.decode.bytes.kv_read > 0
    assert any("int8 KV cache: a scale per (token, KV head) of 128" in x
               for x in scaled.warnings)
    assert not any("KV cache" in x for x in bare.warnings)


def test_nvfp4_weights_through_memory_and_decode():
    nv = _est(weights_dtype="fp4", weight_group_size=16, weight_scale_bytes=1.0)
    bare = _est(weights_dtype="fp4")
    assert nv.memory.weights_bytes - bare.memory.weights_bytes == LINEAR / 16
    per_step = (nv.decode.bytes.weights - bare.decode.bytes.weights) / nv.decode.steps
    assert per_step == pytest.approx(LINEAR / 16, rel=1e-12)
    assert nv.decode.flops == bare.decode.flops


def test_outliers_add_bytes_not_flops_and_state_their_kernels():
    mixed = _est(weights_dtype="int4", weight_group_size=128, outlier_fraction=0.01)
    plain = _est(weights_dtype="int4", weight_group_size=128)
    extra = LINEAR * 0.01 * (2 - (0.5 + 2 / 128))
    assert mixed.memory.weights_bytes - plain.memory.weights_bytes == pytest.approx(extra)
    assert mixed.decode.flops == plain.decode.flops
    assert any("LLM.int8()'s decomposition" in x and "separate 16-bit GEMM" in x
               for x in mixed.warnings)


@pytest.mark.parametrize("hw, warned", [(B200, False), (H100, True)])
def test_fp4_activations_run_at_the_fp4_rate_where_listed(hw, warned):
    e = _est(hw, weights_dtype="fp4", weight_group_size=16, weight_scale_bytes=1.0,
             act_dtype="fp4")
    line = "lists no fp4 rate: fp4 matmuls"
    assert any(line in x for x in e.warnings) == warned
    if not warned:      # the compute-bound prefill GEMM: half its fp8 time at twice the rate
        fp8 = _est(hw, weights_dtype="fp8", act_dtype="fp8")
        up4, up8 = (next(o for o in x.prefill.ops if o.name == "gate_up_proj") for x in (e, fp8))
        assert up4.bound == up8.bound == "compute" and up4.flops == up8.flops
        assert up4.time_s < 0.6 * up8.time_s
        assert B200.peak_flops_per_s["fp4"] == 2 * B200.peak_flops_per_s["fp8"]


def test_quantized_only_fields_refuse_16_bit_dtypes():
    with pytest.raises(pm.SpecError, match="kv_group_size 64 needs quantized KV"):
        pm.Workload(kv_group_size=64)
    with pytest.raises(pm.SpecError, match=r"outlier_fraction 0\.01 needs quantized weights"):
        pm.Workload(outlier_fraction=0.01)
    with pytest.raises(pm.SpecError, match=r"outlier_fraction must be a share in \[0, 0\.5\]"):
        pm.Workloads.of(weights_dtype="int4", outlier_fraction=[0.1, 0.6])
    with pytest.raises(pm.SpecError, match="kv_group_size 16 needs quantized KV"):
        pm.Workloads.of(kv_dtype=["int8", "bf16"], kv_group_size=16)


def test_workloads_round_trip_the_new_fields():
    w = pm.Workload(weights_dtype="int4", outlier_fraction=0.01, kv_dtype="int4",
                    kv_group_size=32, kv_scale_bytes=2.0)
    ws = pm.Workloads.from_list([w, pm.Workload(kv_dtype="int8")])
    assert ws.kv_group_size.tolist() == [32, KV_PER_VECTOR]
    assert ws.item(0) == w and ws.item(1).kv_group_size is None
    grid = pm.Workloads.grid(kv_dtype="int8", kv_group_size=[None, 0, 64])
    assert grid.kv_group_size.tolist() == [KV_PER_VECTOR, 0, 64]


# --- the CLI -------------------------------------------------------------------------------

BASE = ["estimate", "-m", "llama-3-8b", "-H", "b200"]


def test_weights_format_sets_dtype_group_and_scale():
    done = runner.invoke(app, [*BASE, "--weights-format", "mxfp4", "-f", "json"])
    assert done.exit_code == 0, done.output
    w = json.loads(done.stdout)["workload"]
    assert (w["weights_dtype"], w["weight_group_size"], w["weight_scale_bytes"]) == \
        ("fp4", 32, 1.0)


def test_kv_and_outlier_flags():
    done = runner.invoke(app, [*BASE, "--kv-dtype", "int4", "--kv-group-size", "32",
                               "--kv-scale-bytes", "2", "--weights-dtype", "int4",
                               "--outlier-fraction", "0.01", "-f", "json"])
    assert done.exit_code == 0, done.output
    data = json.loads(done.stdout)
    assert data["kv_cache_bytes_per_token"] == KV_ELEMS * (0.5 + 2 / 32)
    assert data["workload"]["outlier_fraction"] == 0.01


@pytest.mark.parametrize("args, needle", [
    (["--weights-format", "nvfp4", "--weights-dtype", "fp4"], "drop --weights-dtype"),
    (["--weights-format", "nvfp4", "--group-size", "16"], "drop --group-size"),
    (["--weights-format", "nvfp5"], "unknown weights format 'nvfp5'"),
    (["--kv-group-size", "64"], "kv_group_size 64 needs quantized KV"),
    (["--outlier-fraction", "0.01"], "outlier_fraction 0.01 needs quantized weights"),
    (["--outlier-fraction", "0.6", "--weights-dtype", "int4"], "--outlier-fraction"),
])
def test_mistakes_are_one_line(args, needle):
    done = subprocess.run([sys.executable, "-m", "perfmodel", *BASE, *args],
                          capture_output=True, text=True)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0], lines
