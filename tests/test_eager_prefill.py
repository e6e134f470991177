"""The host's dispatch of an eagerly run step (``serving.eager``): the queue rule by hand,
the SGLang figure against its whole step, which steps run eagerly (SGLang's piecewise CUDA
graph by version, its token cap, the cases it is off), and what it adds to a priced prefill
step."""

from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest

import perfmodel as pm
from perfmodel.serving import eager, host_time
from perfmodel.serving.engines import engine_config
from perfmodel.serving.engines.state import Batch
from perfmodel.serving.pricing import StepPricer
from perfmodel.specs.workload import Parallelism, Workload


def test_excess_by_hand():
    """Three operators: 2 instances of 5 us, 1 of 20 us, one not run: 3 instances, 30 us of
    device time. Dispatched at 12 us each (36 us) the host outlasts the device by 6 us; at
    8 us (24 us) the host runs ahead during the long one and adds nothing; a per-operator
    floor would have added 6 us there."""
    cost = SimpleNamespace(count=np.array([[2], [1], [0]]),
                           time_s=np.array([[10e-6], [20e-6], [0.0]]))
    assert eager.excess_s(cost, 12e-6) == pytest.approx([6e-6])
    assert eager.excess_s(cost, 8e-6) == pytest.approx([0.0])
    assert eager.excess_s(cost, 0.0)[0] == 0.0


def test_sglang_op_s_reproduces_its_whole_step():
    """The shipped SGLang eager_op_s prices sglang PR 12160's eager one-token DeepSeek-V3
    prefill at its measured 82.64 ms (reports/host/eager_sglang.py): the step is the host's,
    far longer than the device's; re-derive the figure if the model's operators change."""
    from reports.host.eager_sglang import EAGER_STEP_S, measured_step

    cost, pricer = measured_step()
    device = float(cost.time_s.sum())
    host = float(cost.count.sum()) * pricer.host.eager_op_s
    assert device < 0.3 * EAGER_STEP_S
    assert device + float(eager.excess_s(cost, pricer.host.eager_op_s)[0]) == \
        pytest.approx(EAGER_STEP_S, rel=0.01)
    assert host == pytest.approx(EAGER_STEP_S, rel=0.01)


def test_which_steps_run_eagerly():
    rows = eager.eager_rows([True, True, False], [2048, 2049, 64], graphs=True, graph_upto=2048)
    assert rows.tolist() == [False, True, False]
    assert eager.eager_rows([False], [8], graphs=False, graph_upto=0).tolist() == [True]


@pytest.mark.parametrize("version,graph", [("0.5.9", False), ("0.4.0", False),
                                           ("0.5.10", True), ("0.5.12", True)])
def test_sglang_versions(version, graph):
    """Piecewise CUDA graph of prefill off by default up to 0.5.9, on from 0.5.10."""
    h = host_time.resolve("sglang", version)
    assert h.prefill_graph is graph and h.eager_op_s == pytest.approx(56.8e-6)
    assert "eager_op_s" in h.sources


def test_graph_token_cap():
    """2048 tokens with MLA, the chunked-prefill size otherwise; none under DP attention, on
    AMD, or without the graph."""
    on = host_time.resolve("sglang", "0.5.12")
    ds, llama = pm.model("deepseek-v3"), pm.model("llama-3-8b")
    h200, mi300x = pm.hardware("h200-sxm"), pm.hardware("mi300x")
    eng = engine_config("sglang", host=on, chunked_prefill_size=8192)
    tp8 = Parallelism(tp=8)
    assert eager.graph_tokens(ds, h200, tp8, eng, on) == 2048
    assert eager.graph_tokens(llama, h200, tp8, eng, on) == 8192
    assert eager.graph_tokens(ds, h200, Parallelism(ep=8, attention_dp=True), eng, on) == 0
    assert eager.graph_tokens(ds, mi300x, tp8, eng, on) == 0
    assert eager.graph_tokens(ds, h200, tp8, eng, replace(on, prefill_graph=False)) == 0


def _prefill_s(version: str, tokens: int) -> float:
    m, hw = pm.model("deepseek-v3"), pm.hardware("h200-sxm", engine="sglang")
    host = replace(host_time.resolve("sglang", version), step_s=0.0, seq_s=0.0)
    eng = engine_config("sglang", host=host)
    w = Workload.for_model(m)
    pricer = StepPricer(m, hw, Parallelism(tp=8), w, eng)
    one = np.zeros(1, np.int64)
    batch = Batch(one, np.array([tokens]), np.array([tokens]), True, False, 0)
    return float(pricer.times([batch])[0])


def test_eager_prefill_costs_more_only_where_eager():
    """A 1000-token prefill of DeepSeek-V3: eager under 0.5.9, a graph under 0.5.12, so 0.5.9
    pays the floor; at 3000 tokens (past the MLA cap) both run eagerly and agree."""
    assert _prefill_s("0.5.9", 1000) > _prefill_s("0.5.12", 1000)
    assert _prefill_s("0.5.9", 3000) == pytest.approx(_prefill_s("0.5.12", 3000), rel=1e-12)


def test_profile_file_keeps_eager_fields(tmp_path):
    h = host_time.HostTime(step_s=1e-3, overlap=True, eager_op_s=2e-5, prefill_graph=True,
                           name="mine")
    path = tmp_path / "p.yaml"
    host_time.write_profile(path, h, {})
    assert host_time.load_profile(path) == h
    path.write_text(path.read_text().replace("eager_op_s: 2.0e-05", "eager_op_s: -1"))
    with pytest.raises(pm.SpecError, match="eager_op_s"):
        host_time.load_profile(path)


def test_trtllm_context_steps_run_eagerly():
    """TensorRT-LLM graphs only generation-only steps (ScheduledRequests.can_run_cuda_graph:
    no context requests): every step with a prompt pays the floor, whatever its length."""
    h = host_time.resolve("trtllm")
    assert not h.prefill_graph and h.eager_op_s == pytest.approx(7.40e-6)
    m, hw = pm.model("llama-3-8b"), pm.hardware("h100-sxm")
    eng = engine_config("trtllm", host=h)
    assert eager.graph_tokens(m, hw, Parallelism(), eng, h) == 0
