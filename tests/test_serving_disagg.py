"""Disaggregated prefill/decode: the flow of vLLM's proxy with a KV connector, the KV
transfer priced by the core's point-to-point send, one merged result per request."""

import numpy as np
import pytest

from perfmodel.cost.collectives import send_s
from perfmodel.serving import traffic
from perfmodel.serving.disagg import (
    Pool,
    compare_aggregated,
    kv_transfer_s,
    simulate_disaggregated,
)
from perfmodel.serving.engines.vllm import EngineConfig
from perfmodel.serving.requests import Requests
from perfmodel.serving.simulate import simulate
from perfmodel.specs import load
from perfmodel.specs.errors import SpecError
from perfmodel.specs.workload import Parallelism, Workload

MODEL = load.model("llama-3-8b")
H100 = load.hardware("h100-sxm")
ONE = Pool(H100)


def _lone(prompt: int = 1000, out: int = 20) -> Requests:
    return Requests.of([0.5], [prompt], [out])


def test_transfer_is_the_prompt_kv_over_the_nic():
    # llama-3-8b: 32 layers x 2 (K, V) x 8 KV heads x 128 x 2 bytes = 131072 B per token
    seconds = kv_transfer_s(MODEL, ONE, ONE, np.array([1000]), Workload(), "network")
    net = H100.interconnect
    assert seconds[0] == pytest.approx(net.network_latency_s + 1000 * 131072
                                       / net.network_bytes_per_s)
    assert seconds[0] == pytest.approx(send_s(H100, 1000 * 131072, True))
    tp2 = Pool(H100, Parallelism(tp=2))          # each device sends its half at once
    half = kv_transfer_s(MODEL, tp2, tp2, np.array([1000]), Workload(), "network")
    assert half[0] == pytest.approx(send_s(H100, 1000 * 65536, True))
    nvlink = kv_transfer_s(MODEL, ONE, ONE, np.array([1000]), Workload(), "nvlink")
    assert nvlink[0] < seconds[0] / 5


def test_lone_request_timeline():
    req = _lone()
    res = simulate_disaggregated(MODEL, req, ONE, ONE)
    pre, dec = res.info["prefill"], res.info["decode"]
    moved = res.info["transfer_s"][0]
    assert dec.arrival_s[0] == pytest.approx(pre.finish_s[0] + moved)
    # the decode side recomputes only the last prompt token: its first step is a decode
    assert res.steps.prefill_tokens.max() == 0
    assert res.ttft_s[0] == pytest.approx(dec.first_token_s[0] - 0.5)
    assert res.ttft_s[0] > pre.ttft_s[0] + moved
    assert res.ttft_s[0] - pre.ttft_s[0] - moved < 0.02           # one decode step
    assert res.tpot_s[0] == pytest.approx(dec.tpot_s[0])
    assert len(res.token_s) == 20 and np.all(np.diff(res.token_s) > 0)
    assert "network" in res.info["link"]


def test_merged_result_keeps_request_order_and_tokens():
    req = traffic.generate(40, rate=20.0, input_len=800, output_len=30,
                           length_dist="uniform", seed=3)
    res = simulate_disaggregated(MODEL, req, ONE, Pool(H100, Parallelism(dp=2)))
    assert len(res) == 40 and np.all(np.isfinite(res.finish_s))
    assert np.array_equal(res.arrival_s, req.arrival_s)
    for i in (0, 17, 39):           # a request's tokens run from its first to its finish
        toks = res.token_s[res.token_offsets[i]:res.token_offsets[i + 1]]
        assert len(toks) == req.output_tokens[i]
        assert toks[0] == res.first_token_s[i] and toks[-1] == res.finish_s[i]
    assert np.all(res.first_token_s >= res.info["kv_ready_s"])
    assert res.summary()["n_requests"] == 40


def test_decode_pool_runs_no_prompt_compute_and_steadier_tokens():
    req = traffic.generate(60, rate=30.0, input_len=3000, output_len=40, seed=1)
    eng = EngineConfig(max_num_batched_tokens=2048)
    dis = simulate_disaggregated(MODEL, req, ONE, ONE, engine=eng)
    agg = simulate(MODEL, H100, req, Parallelism(dp=2), eng)
    assert dis.steps.prefill_tokens.sum() == 0
    # prompts chunked into running decodes stretch the aggregated engine's token gaps
    assert np.percentile(dis.itl_s, 99) < np.percentile(agg.itl_s, 99)


def test_compare_aggregated_same_gpus():
    req = traffic.generate(30, rate=10.0, input_len=500, output_len=20, seed=2)
    out = compare_aggregated(MODEL, req, ONE, Pool(H100, Parallelism(dp=3)),
                             slo_ttft_s=1.0, slo_tpot_s=0.05)
    assert out["gpus"] == 4 and out["unused_gpus"] == 0
    assert "x 4 replicas" in out["aggregated_plan"]
    for side in ("aggregated", "disaggregated"):
        assert out[side]["n_requests"] == 30 and "goodput_requests_per_s" in out[side]


def test_bad_input():
    req = _lone()
    l40s = Pool(load.hardware("l40s"))
    with pytest.raises(SpecError, match="network_bytes_per_s"):
        simulate_disaggregated(MODEL, req, l40s, l40s)
    with pytest.raises(SpecError, match="link must be one of"):
        simulate_disaggregated(MODEL, req, ONE, ONE, link="pcie")
    with pytest.raises(SpecError, match="exceed"):
        simulate_disaggregated(MODEL, req, Pool(H100, Parallelism(tp=4)),
                               Pool(H100, Parallelism(tp=4, dp=2)), link="nvlink")
    with pytest.raises(SpecError, match="closed-loop"):
        simulate_disaggregated(MODEL, traffic.generate(4, concurrency=2, input_len=10,
                                                       output_len=4), ONE, ONE)
    with pytest.raises(SpecError, match="one device"):
        compare_aggregated(MODEL, req, ONE, Pool(load.hardware("a100-80gb-sxm")))
