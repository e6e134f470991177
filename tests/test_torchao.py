"""Weight-only decode against the TorchAO paper's H100 figures (arXiv 2507.16099), on the
GPU they were measured on and with the bytes TorchAO stores: evaluation, never fitted.

- The device: TorchAO's roofline code names its H100 "Meta's H100 variant" at 2.4 TB/s
  (``perfmodel/hardware/h100-sxm-meta.yaml`` cites it); the stock SXM's 3.35 TB/s is what left every
  row ~20% fast (tests/test_dequant.py keeps the ratio check on it).
- The bytes: tinygemm's int4 groups carry a bf16 scale and a bf16 zero (``int4wo-g64``).
- The head: ``quantize_`` takes every ``nn.Linear``, the output layer included (its int4wo-64
  Llama-3.1-8B is 4.22 GB: 7.50e9 linear weights x 0.5625 B), so ``quantize_lm_head``.
- The rate: generate.py's tokens/s is 200 tokens over the prefill and 199 decode steps.
"""

from __future__ import annotations

import pytest

import perfmodel as pm
from perfmodel.specs.dtypes import weight_bytes
from perfmodel.specs.formats import format_names, weight_format

TORCHAO = {"bf16": 132.41, "int4wo-g64": 268.88, "int8": 216.38, "fp8": 213.88}


def _workload(weights: str) -> pm.Workload:
    """TorchAO generate.py defaults: "Hello, my name is" (6 tokens with BOS), 200 new
    tokens, batch 1, compiled decode (CUDA graphs); the LM head quantized as the rest."""
    kw: dict = {"weights_dtype": weights}
    if weights in format_names():
        dtype, group, scale = weight_format(weights).scheme
        kw = {"weights_dtype": dtype, "weight_group_size": group, "weight_scale_bytes": scale}
    return pm.Workload(batch=1, prompt_len=6, gen_len=200, cuda_graphs=True,
                       quantize_lm_head=True, **kw)


def _tokens_per_s(hw: str, weights: str) -> float:
    e = pm.estimate(pm.hardware(hw), pm.model("llama-3-8b"), _workload(weights))
    return 200.0 / e.e2e_s


def test_torchao_model_size() -> None:
    """TorchAO's int4wo-64 model size, 4.22 GB, is every linear weight (the head included)
    at 0.5625 B: the weights less the 16-bit embedding and norms."""
    e = pm.estimate(pm.hardware("h100-sxm-meta"), pm.model("llama-3-8b"),
                    _workload("int4wo-g64"))
    embedding_and_norms = 128_256 * 4_096 * 2 + (32 * 2 + 1) * 4_096 * 2
    assert (e.memory.weights_bytes - embedding_and_norms) / 1e9 == pytest.approx(4.22,
                                                                                 abs=0.005)


def test_tinygemm_bytes() -> None:
    """bf16 over int4 with a bf16 scale and zero per 64: 2 / (0.5 + 4/64) = 3.5556, the
    issue's "about 3.5x with scales included"."""
    _, group, scale = weight_format("int4wo-g64").scheme
    assert 2.0 / float(weight_bytes(pm.specs.dtypes.CODE["int4"], group, scale)) == \
        pytest.approx(32 / 9, rel=1e-12)


def test_variant_differs_only_in_bandwidth() -> None:
    """Every decode row is memory-bound at batch 1, so the stock part is faster by less than
    the bandwidth ratio 3.35 / 2.4 (fixed kernel costs do not scale) and by more than 1."""
    for w in TORCHAO:
        ratio = _tokens_per_s("h100-sxm", w) / _tokens_per_s("h100-sxm-meta", w)
        assert 1.15 < ratio < 3.35 / 2.4


# Not met since h100-sxm carries vLLM's fitted constants (calibrate --from): bf16 -14.3%,
# int8 -10.8% (int4 -8.0%, fp8 -9.8% still within). The variant inherits the stock part's
# streaming fraction, 0.86 of 3.35 TB/s fitted to vLLM's cuBLAS GEMMs of m < 64 (they reach
# 0.89 only above 256 MB), where TorchAO's roofline code states about 2.2 TB/s, 92% of the
# 2.4 TB/s variant's memory: the fraction of a lower HBM clock is not the stock part's.
# Strict: the marks fail the run if these rows come back within 10%.
# fp8: -14.5% since the H100's fp8 GEMMs price vLLM's measured CUTLASS W8A8 kernels
# (gemm_kernels, inherited by the variant: at M <= 16 77% of HBM peak and 3.0 us against
# the 16-bit 86% and 2.3 us, and the per-tensor quantization's cost per token), not the
# kernel TorchAO's Float8 config compiles (-9.8% before, within).
NOT_MET = {"bf16": -0.143, "int8": -0.108, "fp8": -0.145}


@pytest.mark.parametrize("weights", [
    pytest.param(w, marks=pytest.mark.xfail(strict=True, reason=f"{NOT_MET[w]:+.1%} since "
                                             "the vLLM calibration (see NOT_MET)"))
    if w in NOT_MET else w for w in TORCHAO])
def test_against_torchao(weights: str) -> None:
    """Within 10% of the paper on its own GPU. Measured with the datasheet constants: bf16
    -6.8%, int4 +4.6%, int8 -0.1%, fp8 +1.0%; with vLLM's fitted ones (NOT_MET): bf16
    -14.3%, int4 -8.0%, int8 -10.8%, fp8 -9.8%. With the head quantized as TorchAO
    quantizes it, the quantized rows rose by 5-9% and the errors no longer share a sign:
    bf16 is short (the non-GEMM kernels priced unfused, where Inductor fuses the norms and
    rotary into their neighbours, would explain a short-fall on every row), int4 now
    over-predicts (datasheet constants), so its speed-up over bf16 is 2.28x against
    TorchAO's 2.03x (not measured here: no GPU)."""
    got = _tokens_per_s("h100-sxm-meta", weights)
    assert got == pytest.approx(TORCHAO[weights], rel=0.10)
