"""A MoE layer's expert GEMMs in the estimate path fall in the ``moe_kernels`` class the
corpus rows of the same checkpoint are fitted in (``cost.moe.format_class``): weights stored
at the compute width carry no stored dtype (``specs.dtypes.narrower_code``). A bf16
checkpoint's experts were once classed w8a16, a class no hardware file lists, so they were
priced as dense GEMMs and never with the fitted ``moe_kernels.bf16``."""

import numpy as np
import pytest

import perfmodel as pm
from perfmodel.cost.moe import FORMATS, format_class
from perfmodel.cost.step import Dtypes, Step, step_records
from perfmodel.specs.dtypes import CODE, narrower_code


def test_narrower_code_by_hand():
    bf16, fp8, int4 = CODE["bf16"], CODE["fp8"], CODE["int4"]
    stored = np.array([bf16, fp8, int4, -1, fp8])
    compute = np.array([bf16, bf16, bf16, bf16, fp8])
    assert narrower_code(stored, compute).tolist() == [-1, fp8, int4, -1, -1]


@pytest.mark.parametrize("device, dtypes, expected", [
    ("h100-sxm", dict(weights="bf16", acts="bf16"), "bf16"),
    ("h100-sxm", dict(weights="fp8", acts="fp8"), "fp8"),
    # Hopper runs an fp8 checkpoint as W8A8 (specs.matmul_path); an A100 converts it
    ("h100-sxm", dict(weights="fp8", acts="bf16"), "fp8"),
    ("a100-80gb-sxm", dict(weights="fp8", acts="bf16"), "w8a16"),
    ("h100-sxm", dict(weights="int4", acts="bf16", group_size=128, scale_bytes=2), "w4a16"),
])
def test_expert_gemms_fall_in_the_checkpoints_class(device, dtypes, expected):
    model = pm.model("qwen3-30b-a3b")
    records = step_records(model, pm.hardware(device), pm.Parallelism(),
                           Step.uniform(4, 256, 256), Dtypes.of(**dtypes))
    experts = [r for r in records if r.name.startswith("experts.") and hasattr(r, "experts")]
    assert len(experts) == 2
    for r in experts:
        assert {FORMATS[int(c)] for c in np.ravel(format_class(r))} == {expected}


def test_bf16_experts_are_priced_by_the_fitted_moe_kernels():
    """The engine's fitted bf16 MoE constants move a bf16 MoE estimate; before the fix a
    change to them moved nothing."""
    from dataclasses import replace

    model = pm.model("qwen3-30b-a3b")
    hw = pm.hardware("h100-sxm", "vllm")
    table = dict(hw.efficiency.moe_kernels)
    slow = list(table["bf16"])
    slow[0] = slow[0] / 2                         # half the fitted gemm_fraction
    half = replace(hw, efficiency=replace(hw.efficiency,
                                          moe_kernels={**table, "bf16": tuple(slow)}))
    w = pm.Workload.for_model(model, batch=8, prompt_len=1024)
    assert pm.estimate(half, model, w).ttft_s > 1.2 * pm.estimate(hw, model, w).ttft_s


@pytest.mark.parametrize("engine", ["vllm", "sglang", "trtllm"])
@pytest.mark.parametrize("tokens", [256, 4096])
def test_estimate_prices_a_bf16_moe_layer_as_its_corpus_rows(engine, tokens):
    """Qwen3-30B-A3B's expert GEMMs in a prefill step of ``tokens`` (every one of the 128
    experts touched) cost what ``compare.moe_forms.moe_layer`` prices a corpus row of the same
    shape at: the estimate and the fit see one kernel class and one formula."""
    from perfmodel.compare.moe_forms import moe_layer
    from perfmodel.cost.roofline import op_time

    model, hw = pm.model("qwen3-30b-a3b"), pm.hardware("h100-sxm", engine)
    records = step_records(model, hw, pm.Parallelism(), Step.uniform(1, tokens, tokens),
                           Dtypes.of(weights="bf16", acts="bf16"))
    estimate = sum(float(np.sum(op_time(r, hw, "graph").time_s)) for r in records
                   if r.name.startswith("experts.") and hasattr(r, "experts"))
    one = np.array([1.0])
    parts = moe_layer(tokens=tokens * one, topk=8 * one, hidden=2048 * one, width=768 * one,
                      pairs=8 * tokens * one, groups=128 * one, wb=2 * one,
                      stored=np.array([-1]), dtype=np.array([CODE["bf16"]]),
                      mode=np.array([-1]), local_combine=one * (engine == "trtllm"),
                      local_experts=128 * one)
    row = sum(float(np.sum(op_time(op, hw, "kernel").time_s)) for op, _ in parts
              if hasattr(op, "experts") and np.any(op.experts))
    assert estimate / model.n_layers == pytest.approx(row, rel=1e-6)
