"""Weight-only decode against the TorchAO paper's H100 figures (arXiv 2507.16099), on the
GPU they were measured on and with the bytes TorchAO stores: evaluation, never fitted.

- The device: TorchAO's roofline code names its H100 "Meta's H100 variant" at 2.4 TB/s
  (``hardware/h100-sxm-meta.yaml`` cites it); the stock SXM's 3.35 TB/s is what left every
  row ~20% fast (tests/test_dequant.py keeps the ratio check on it).
- The bytes: tinygemm's int4 groups carry a bf16 scale and a bf16 zero (``int4wo-g64``).
- The rate: generate.py's tokens/s is 200 tokens over the prefill and 199 decode steps.
"""

from __future__ import annotations

import pytest

import perfmodel as pm
from perfmodel.cli.common import WEIGHT_FORMATS
from perfmodel.specs.dtypes import weight_bytes

TORCHAO = {"bf16": 132.41, "int4wo-g64": 268.88, "int8": 216.38, "fp8": 213.88}


def _workload(weights: str) -> pm.Workload:
    """TorchAO generate.py defaults: "Hello, my name is" (6 tokens with BOS), 200 new
    tokens, batch 1, compiled decode (CUDA graphs)."""
    kw: dict = {"weights_dtype": weights}
    if weights in WEIGHT_FORMATS:
        dtype, group, scale = WEIGHT_FORMATS[weights]
        kw = {"weights_dtype": dtype, "weight_group_size": group, "weight_scale_bytes": scale}
    return pm.Workload(batch=1, prompt_len=6, gen_len=200, cuda_graphs=True, **kw)


def _tokens_per_s(hw: str, weights: str) -> float:
    e = pm.estimate(pm.hardware(hw), pm.model("llama-3-8b"), _workload(weights))
    return 200.0 / e.e2e_s


def test_tinygemm_bytes() -> None:
    """bf16 over int4 with a bf16 scale and zero per 64: 2 / (0.5 + 4/64) = 3.5556, the
    issue's "about 3.5x with scales included"."""
    _, group, scale = WEIGHT_FORMATS["int4wo-g64"]
    assert 2.0 / float(weight_bytes(pm.specs.dtypes.CODE["int4"], group, scale)) == \
        pytest.approx(32 / 9, rel=1e-12)


def test_variant_differs_only_in_bandwidth() -> None:
    """Every decode row is memory-bound at batch 1, so the stock part is faster by less than
    the bandwidth ratio 3.35 / 2.4 (fixed kernel costs do not scale) and by more than 1."""
    for w in TORCHAO:
        ratio = _tokens_per_s("h100-sxm", w) / _tokens_per_s("h100-sxm-meta", w)
        assert 1.15 < ratio < 3.35 / 2.4


@pytest.mark.parametrize("weights", list(TORCHAO))
def test_against_torchao(weights: str) -> None:
    """Within 10% of the paper on its own GPU. Measured: bf16 -6.8%, int4 -4.0%, int8 -5.1%,
    fp8 -4.0%; the common short-fall is the non-GEMM kernels priced unfused (Inductor fuses
    the norms and rotary into their neighbours) and, for int4, TorchAO also quantizing the
    LM head, which the model keeps at 16 bits."""
    got = _tokens_per_s("h100-sxm-meta", weights)
    assert got == pytest.approx(TORCHAO[weights], rel=0.10)
