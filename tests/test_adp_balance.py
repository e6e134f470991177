"""TensorRT-LLM's attention-DP balance (``serving.adp_balance``): new prompts wait until
every rank has one, or until the wait count reaches ``timeout_iters``."""

from collections import deque
from types import SimpleNamespace

import numpy as np

from perfmodel.serving.adp_balance import Balance


def _states(waiting, running, limit=8):
    engine = SimpleNamespace(max_batch_size=limit)
    return [SimpleNamespace(engine=engine, waiting=deque(range(w)), running=list(range(r)))
            for w, r in zip(waiting, running, strict=True)]


def test_hold_golden():
    b = Balance(timeout_iters=3, batching_wait_iters=0)
    lone = _states([1, 0], [2, 2])                  # one rank has a prompt, both decode
    assert [b.hold(lone) for _ in range(4)] == [True, True, False, True]
    assert b.hold(_states([1, 1], [2, 2])) is False     # every rank has one: they run
    assert b.waited == 0
    assert b.hold(_states([1, 0], [2, 0])) is False     # a rank without generation: run
    full = _states([1, 1], [8, 2])                   # a rank without a free seat: wait
    assert b.hold(full) is True


def test_batching_wait_holds_while_every_rank_decodes():
    b = Balance(timeout_iters=50, batching_wait_iters=2)
    both = _states([1, 1], [1, 1])
    assert [b.hold(both) for _ in range(3)] == [True, True, False]


def test_balance_delays_a_lone_prompt_in_simulate():
    """EP2 with data-parallel attention, two users per rank (requests dealt in turn):
    rank 0's first answer is short, so its next prompt (request 4) arrives while every
    rank still decodes and no other rank has a prompt: with balance on it waits."""
    import perfmodel as pm
    from perfmodel.serving.engines.trtllm import TRTLLMConfig
    from perfmodel.serving.requests import Requests
    from perfmodel.serving.simulate import simulate
    from perfmodel.specs.workload import Parallelism

    model, hw = pm.model("qwen3-30b-a3b"), pm.hardware("h100-sxm")
    plan = Parallelism(ep=2, attention_dp=True)
    reqs = Requests.of(np.zeros(6), [64] * 6, [4, 60, 60, 60, 4, 60], closed_loop=4)
    off = simulate(model, hw, reqs, plan, TRTLLMConfig())
    on = simulate(model, hw, reqs, plan, TRTLLMConfig(attention_dp_balance=True,
                                                      attention_dp_timeout_iters=20,
                                                      attention_dp_batching_wait_iters=0))
    assert on.ttft_s[4] - off.ttft_s[4] > 10 * off.tpot_s.min()
    assert np.allclose(on.ttft_s[:4], off.ttft_s[:4])
