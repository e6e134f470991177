"""The simulator prices steps ahead (``serving.lookahead``: a fork of the engine state run
forward, priced in one call, the steps no arrival changed kept, a cut one resumed from the
fork's last mark). Priced one step at a time (``LOOKAHEAD`` 1: nothing can be cut) every
run must come out the same: each request's times and every step's log, over the engines,
the loads, preemption, prefixes, conversations, closed loops, client caps and routers. And
a fork saves only the requests in flight, so a look-ahead's cost does not grow with the
trace."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

import perfmodel as pm
from perfmodel.serving import engine_loop, host_time, lookahead, traffic
from perfmodel.serving import simulate as sim
from perfmodel.serving.engines import engine_config
from perfmodel.serving.engines.state import EngineState
from perfmodel.serving.engines.vllm import EngineConfig
from perfmodel.serving.pricing import kv_pool
from perfmodel.specs.workload import Parallelism, Workload

LLAMA, H100 = pm.model("llama-3-8b"), pm.hardware("h100-sxm")


def _blocks(n: int) -> EngineConfig:
    """vLLM with a KV pool of ``n`` blocks (its --gpu-memory-utilization solved for)."""
    engine = EngineConfig()
    p = kv_pool(LLAMA, H100, Parallelism(), Workload.for_model(LLAMA), engine)
    util = (H100.runtime_reserved_bytes + p.weights_bytes + p.activation_bytes
            + (n + 0.5) * p.bytes_per_block) / H100.memory_bytes
    return replace(engine, gpu_memory_utilization=util)


def _small(name: str, n: int, **flags: object) -> object:
    """SGLang's or TensorRT-LLM's settings with a KV pool of ``n`` blocks (its memory
    fraction solved for, by the engine's rule: ``kv_bytes``)."""
    p = kv_pool(LLAMA, H100, Parallelism(), Workload.for_model(LLAMA),
                engine_config(name, **flags))
    kv = (n + 0.5) * p.bytes_per_block
    if name == "sglang":
        flags["mem_fraction_static"] = (p.weights_bytes + kv) / H100.memory_bytes
    else:
        flags["kv_cache_free_gpu_memory_fraction"] = kv / (
            p.usable_bytes - p.weights_bytes - p.activation_bytes)
    out = engine_config(name, **flags)
    assert kv_pool(LLAMA, H100, Parallelism(), Workload.for_model(LLAMA), out).blocks == n
    return out


def _gen(n: int, rate: float | None = None, **kw: object) -> object:
    args = {"input_len": 200, "output_len": 16, "length_dist": "lognormal", "seed": 7, **kw}
    return traffic.generate(n, rate=rate, **args)


CASES = {
    "vllm half load": lambda: ({}, _gen(60, 12)),
    "vllm overload, preemption": lambda: ({"engine": _blocks(100)}, _gen(80, 200)),
    "vllm no chunked prefill": lambda: (
        {"engine": EngineConfig(chunked_prefill=False, max_num_batched_tokens=1024)},
        _gen(80, 60)),
    "static batching": lambda: (
        {"engine": EngineConfig(scheduler="static", max_num_seqs=8)}, _gen(40, 30)),
    "shared prefix, preemption": lambda: (
        {"engine": _blocks(110)}, _gen(80, 200, shared_prefix=96)),
    "host time": lambda: ({"engine": EngineConfig(host=host_time.resolve("vllm"))},
                          _gen(80, 20)),
    "host time, overload, preemption": lambda: (
        {"engine": replace(_blocks(100), host=host_time.resolve("vllm"))}, _gen(80, 200)),
    "host time, sessions": lambda: ({"engine": EngineConfig(host=host_time.resolve("vllm"))},
                                    _gen(60, 15, turns=3, think_time=0.5)),
    "sessions": lambda: ({}, _gen(60, 15, turns=3, think_time=0.5)),
    "closed loop, think time": lambda: ({}, replace(
        _gen(60, concurrency=6), arrival_s=np.random.default_rng(3).exponential(0.1, 60))),
    "closed loop, some think times 0": lambda: ({}, replace(
        _gen(40, concurrency=4), arrival_s=np.where(np.arange(40) % 2, 0.05, 0.0))),
    "client cap": lambda: ({}, replace(_gen(80, 200), client_cap=6)),
    "sglang lpm, retraction": lambda: (
        {"engine": _small("sglang", 80, schedule_policy="lpm", page_size=16)},
        _gen(24, 200, shared_prefix=64, output_len=100)),
    "sglang mixed chunk": lambda: (
        {"engine": engine_config("sglang", enable_mixed_chunk=True,
                                 chunked_prefill_size=256)}, _gen(80, 40)),
    "sglang overlap, retraction": lambda: (
        {"engine": replace(_small("sglang", 80, schedule_policy="lpm", page_size=16),
                           host=host_time.resolve("sglang"))},
        _gen(24, 200, shared_prefix=64, output_len=100)),
    "sglang overlap, mixed chunk": lambda: (
        {"engine": engine_config("sglang", enable_mixed_chunk=True, chunked_prefill_size=256,
                                 host=host_time.resolve("sglang"))}, _gen(80, 40)),
    "trtllm no evict": lambda: ({"engine": engine_config("trtllm")}, _gen(80, 40)),
    "trtllm max utilization, chunked": lambda: (
        {"engine": _small("trtllm", 50, capacity_scheduler_policy="MAX_UTILIZATION",
                          enable_chunked_prefill=True, max_num_tokens=512)},
        _gen(24, 200, shared_prefix=64, output_len=100)),
    "dp 2 round-robin": lambda: ({"plan": Parallelism(dp=2)}, _gen(70, 40)),
    "dp 2 least-requests": lambda: (
        {"plan": Parallelism(dp=2), "router": "least-requests"}, _gen(60, 40)),
}


def _one_step_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    init = lookahead.Guess.__init__

    def one(self: lookahead.Guess) -> None:
        init(self)
        self.lookahead = 1
    monkeypatch.setattr(engine_loop, "LOOKAHEAD", 1)
    monkeypatch.setattr(lookahead.Guess, "__init__", one)


@pytest.mark.parametrize("name", list(CASES))
def test_priced_ahead_equals_one_step_at_a_time(name, monkeypatch):
    kw, reqs = CASES[name]()
    plan = kw.pop("plan", None)
    ahead = sim.simulate(LLAMA, H100, reqs, plan, **kw)
    steps = len(ahead.steps.start_s)
    assert ahead.info["price_calls"] < steps      # priced ahead: more than a step a call
    _one_step_at_a_time(monkeypatch)
    alone = sim.simulate(LLAMA, H100, reqs, plan, **kw)
    assert alone.info["price_calls"] >= len(alone.steps.start_s)
    for f in ("arrival_s", "scheduled_s", "first_token_s", "finish_s", "token_s"):
        np.testing.assert_allclose(getattr(ahead, f), getattr(alone, f), rtol=1e-12,
                                   err_msg=f)
    for f in ("preemptions", "prefix_hit_tokens"):
        np.testing.assert_array_equal(getattr(ahead, f), getattr(alone, f), err_msg=f)
    a, b = ahead.steps, alone.steps
    for f in ("seqs", "tokens", "prefill_tokens", "kv_blocks", "waiting"):
        np.testing.assert_array_equal(getattr(a, f), getattr(b, f), err_msg=f)
    for f in ("start_s", "time_s", "host_s"):
        np.testing.assert_allclose(getattr(a, f), getattr(b, f), rtol=1e-12, err_msg=f)


def test_the_cases_preempt_and_hit_where_they_say():
    """The cases above exercise what they are named for."""
    for name in ("vllm overload, preemption", "shared prefix, preemption",
                 "host time, overload, preemption",
                 "sglang lpm, retraction", "trtllm max utilization, chunked"):
        kw, reqs = CASES[name]()
        res = sim.simulate(LLAMA, H100, reqs, **kw)
        assert res.preemptions.any(), name
    for name in ("sessions", "host time, sessions"):
        kw, reqs = CASES[name]()
        assert sim.simulate(LLAMA, H100, reqs, **kw).prefix_hit_tokens.any(), name


def test_a_rollback_and_a_return_to_a_mark_restore_every_array(monkeypatch):
    """Every fork the simulator rolls back leaves the real state's arrays exactly as they
    were, and every return to a mark leaves them as they were at the mark: both checked
    against full copies."""
    fork, rollback = EngineState.fork, EngineState.rollback
    mark, back_to, checked = EngineState.mark, EngineState.back_to, []

    def copying_fork(self: EngineState) -> EngineState:
        self.full = {f: getattr(self, f).copy() for f in self.MUTABLE}
        return fork(self)

    def checking_rollback(self: EngineState, dry: EngineState) -> None:
        rollback(self, dry)
        for f, a in self.full.items():
            np.testing.assert_array_equal(getattr(self, f), a, err_msg=f)
        checked.append("rollback")

    def copying_mark(self: EngineState) -> tuple:
        return (*mark(self), {f: getattr(self, f).copy() for f in self.MUTABLE})

    def checking_back_to(self: EngineState, at: tuple) -> EngineState:
        here = back_to(self, at[:2])
        for f, a in at[2].items():
            np.testing.assert_array_equal(getattr(here, f), a, err_msg=f)
        checked.append("mark")
        return here
    for name, f in (("fork", copying_fork), ("rollback", checking_rollback),
                    ("mark", copying_mark), ("back_to", checking_back_to)):
        monkeypatch.setattr(EngineState, name, f)
    for name in ("vllm overload, preemption", "sglang lpm, retraction",
                 "trtllm max utilization, chunked", "sessions"):
        kw, reqs = CASES[name]()
        sim.simulate(LLAMA, H100, reqs, **kw)
    sim.simulate(LLAMA, H100, _gen(300, 15, output_len=100))   # long look-aheads, cut
    assert checked.count("rollback") >= 3 and checked.count("mark") >= 3


def test_a_fork_saves_only_the_requests_in_flight(monkeypatch):
    """The rows a fork saves (admitted, not finished) stay few however long the trace: the
    look-ahead's cost follows the requests in flight, not all requests."""
    fork, saved = EngineState.fork, []

    def measuring_fork(self: EngineState) -> EngineState:
        new = fork(self)
        saved.append(len(self.saved[0]))
        return new
    monkeypatch.setattr(EngineState, "fork", measuring_fork)
    reqs = _gen(1500, 60, output_len=40)
    res = sim.simulate(LLAMA, H100, reqs)
    in_flight = np.searchsorted(res.arrival_s, res.finish_s) - np.arange(len(res))
    assert max(saved) <= in_flight.max() + 64 < 500
