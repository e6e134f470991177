"""Weight-only quantized GEMMs on GPUs: the kernel's dequantization (cost.dequant)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import perfmodel as pm
from perfmodel.cost.dequant import dequant_time
from perfmodel.cost.ops import Gemm
from perfmodel.cost.roofline import op_time
from perfmodel.specs.dtypes import CODE, weight_bytes
from perfmodel.specs.errors import SpecError
from perfmodel.specs.load import load_hardware
from tests.datasheet import datasheet, datasheet_path

H100 = datasheet("h100-sxm")
NO_DEQUANT = dataclasses.replace(H100, efficiency=dataclasses.replace(H100.efficiency,
                                                                      dequant={}))
BF16, INT4, INT8, FP8 = CODE["bf16"], CODE["int4"], CODE["int8"], CODE["fp8"]


def _gemv(wdtype: int, m: float = 1.0, group: int = 64, n: float = 4096.0,
          k: float = 4096.0, dtype: int = BF16) -> Gemm:
    wb = float(weight_bytes(wdtype, group if wdtype == INT4 else 0))
    return Gemm(m=m, n=n, k=k, weight_bytes=wb, act_bytes=2.0, dtype=dtype,
                weight_dtype=wdtype)


def test_golden_int4_gemv_on_h100() -> None:
    """[1, 4096] x [4096, 4096] int4 in groups of 64, by hand: tinygemm's 2.0 issue slots
    per weight over 132 SMs x 128 per clock x 1.98 GHz; no overlap, so the conversion adds
    to the weight stream of 0.53125 B per weight at 90% of 3.35 TB/s."""
    op = _gemv(INT4)
    dq, overlap = dequant_time(op, H100)
    dq_hand = 4096 * 4096 * 2.0 / (132 * 128 * 1.98e9)            # 1.00300 us
    assert float(dq) == pytest.approx(dq_hand, rel=1e-9)
    assert float(dq) == pytest.approx(1.00300e-6, rel=1e-4)
    assert not bool(overlap)
    stream = (4096 * 4096 * 0.53125 + 2 * 4096 * 2.0) / (3.35e12 * 0.9)   # 2.96159 us
    t = op_time(op, H100, "kernel")
    body = float(t.time_s - t.fixed_s)
    assert body == pytest.approx(stream + dq_hand, rel=1e-6)
    assert float(t.memory_s) == pytest.approx(stream, rel=1e-9)


def test_row_tiles_repeat_the_conversion() -> None:
    """Each tile of rows dequantizes the weights again: the small-batch kernel's 16 rows,
    or the device's GEMM tile (128 rows on the H100) once a CTA holds more rows, since a
    mixed-input GEMM converts its weight tile once for all its rows: m = 16 and m = 17
    cost the same as m = 128, and m = 129 twice that."""
    one = float(dequant_time(_gemv(INT4, m=16), H100)[0])
    assert float(dequant_time(_gemv(INT4, m=17), H100)[0]) == pytest.approx(one)
    assert float(dequant_time(_gemv(INT4, m=128), H100)[0]) == pytest.approx(one)
    assert float(dequant_time(_gemv(INT4, m=129), H100)[0]) == pytest.approx(2 * one)


def test_overlapped_conversion_hides_under_the_stream() -> None:
    """int8 (a pipelined Triton kernel on H100): 8 slots per weight take less time than the
    1-byte weight stream at batch 1, and at 1024 rows less than the tensor cores' work
    (8 slots per 128 rows at 33.4 T slots/s against 256 FLOPs at 0.8 x 989 TFLOP/s), so the
    GEMM is unchanged; fp8's 12 slots per weight take longer than that, and bind."""
    small = _gemv(INT8)
    assert float(op_time(small, H100).time_s) == float(op_time(small, NO_DEQUANT).time_s)
    big = _gemv(INT8, m=1024.0)
    assert float(op_time(big, H100).time_s) == float(op_time(big, NO_DEQUANT).time_s)
    fp8 = _gemv(FP8, m=1024.0)
    assert float(op_time(fp8, H100).time_s) > float(op_time(fp8, NO_DEQUANT).time_s)


def test_dequant_never_makes_a_gemm_faster() -> None:
    rng = np.random.default_rng(0)
    m = rng.integers(1, 4096, 400).astype(float)
    n = rng.integers(16, 16384, 400).astype(float)
    k = rng.integers(16, 16384, 400).astype(float)
    wd = rng.choice([BF16, INT4, INT8, FP8], 400)
    op = Gemm(m=m, n=n, k=k, weight_bytes=np.asarray(weight_bytes(wd, 0)), act_bytes=2.0,
              dtype=BF16, weight_dtype=wd)
    for timing in ("kernel", "stream", "host"):
        with_dq = op_time(op, H100, timing).time_s
        without = op_time(op, NO_DEQUANT, timing).time_s
        assert np.all(with_dq >= without)
        assert np.any(with_dq > without)
        assert np.array_equal(with_dq[wd == BF16], without[wd == BF16])


def test_only_narrow_weights_under_16_bit_compute() -> None:
    """bf16 weights, records without a stored dtype and fp8 x fp8 (W8A8) cost nothing."""
    for op in (_gemv(BF16), Gemm(m=1, n=4096, k=4096), _gemv(FP8, dtype=FP8)):
        assert float(dequant_time(op, H100)[0]) == 0.0


@pytest.mark.parametrize("name", ["tpu-v5e", "tpu-v6e", "mi300x"])
def test_devices_without_listed_kernels_unchanged(name: str) -> None:
    """TPUs (and any device whose file lists no dequant kernel, CPUs included) price a
    weight-only GEMM as before."""
    hw = pm.hardware(name)
    assert not hw.efficiency.dequant
    op = _gemv(INT4)
    assert float(dequant_time(op, hw)[0]) == 0.0


def test_int4_weight_bytes_ratio() -> None:
    """bf16 / int4 in groups of 64 with one 16-bit scale: 2 / (0.5 + 2/64) = 3.76."""
    assert 2.0 / float(weight_bytes(INT4, 64)) == pytest.approx(3.7647, rel=1e-4)


TORCHAO = {"bf16": 132.41, "int4": 268.88, "int8": 216.38, "fp8": 213.88}


def _decode(hw: object, weights: str) -> float:
    """Llama-3.1-8B shapes, batch 1, TorchAO's generate.py defaults: "Hello, my name is"
    (about 6 tokens) and 200 new tokens, compiled decode (CUDA graphs)."""
    kw = {"weights_dtype": weights}
    if weights == "int4":
        kw["weight_group_size"] = 64
    wl = pm.Workload(batch=1, prompt_len=6, gen_len=200, cuda_graphs=True, **kw)
    return pm.estimate(hw, pm.model("llama-3-8b"), wl).decode_tokens_per_s


def test_through_the_estimate() -> None:
    """int4 decode pays its conversion (slower than without it, still faster than bf16);
    the TorchAO paper's H100 figures (arXiv 2507.16099) are evaluation, not fitted: the
    ratios to bf16 are checked within 15%."""
    got = {w: _decode(H100, w) for w in TORCHAO}
    assert _decode(NO_DEQUANT, "int4") > got["int4"] > got["bf16"]
    assert _decode(NO_DEQUANT, "int8") == pytest.approx(got["int8"])
    for w in ("int4", "int8", "fp8"):
        ratio = got[w] / got["bf16"]
        assert ratio == pytest.approx(TORCHAO[w] / TORCHAO["bf16"], rel=0.15)


def test_loader_checks(tmp_path: object) -> None:
    text = datasheet_path("h100-sxm").read_text()
    bad = tmp_path / "bad.yaml"
    bad.write_text(text.replace("    int8: {", "    bf16: {"))
    with pytest.raises(SpecError, match=r"dequant\.bf16"):
        load_hardware(bad)
    no_clock = tmp_path / "clock.yaml"
    no_clock.write_text(text.replace("  alu_clock_hz: 1.98e+09\n", ""))
    with pytest.raises(SpecError, match="alu_clock_hz"):
        load_hardware(no_clock)
