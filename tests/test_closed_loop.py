"""A closed loop's round trip (``serving.closed_loop``): a user's next request reaches the
engine after its previous answer's last chunk reached the client and the API server took
the new one in, so it joins a later schedule than the step that finished the old one."""

from dataclasses import replace

import numpy as np
import pytest

from perfmodel.serving import closed_loop, host_time
from perfmodel.serving.engines import engine_config
from perfmodel.serving.requests import Requests


def _run(engine: str, mode: str | None, on: bool = True):
    import perfmodel as pm
    from perfmodel.serving.simulate import simulate

    model, hw = pm.model("llama-3-8b"), pm.hardware("h100-sxm")
    # two users; user 0's first request (3 tokens) finishes in step 2 (prefill is step 0),
    # its next one (request 2) follows while user 1's request (40 tokens) decodes
    reqs = Requests.of(np.zeros(3), [100, 100, 100], [3, 40, 5], closed_loop=2)
    host = host_time.resolve(engine, mode=mode) if on else host_time.HostTime()
    return simulate(model, hw, reqs, engine=replace(engine_config(engine), host=host)), reqs


@pytest.mark.parametrize("engine, mode, step", [
    ("sglang", "overlap", 5),       # event_loop_overlap: launched ahead, two steps wait
    ("sglang", "no-overlap", 4),    # scheduled at the step's start: one step waits
    ("trtllm", None, 4),
])
def test_next_request_joins_a_later_schedule(engine, mode, step):
    res, reqs = _run(engine, mode)
    assert np.nonzero(res.steps.prefill_tokens)[0].tolist() == [0, step]
    host = res.info["host"]
    sent = res.arrival_s[2]
    intake = closed_loop.intake_s(reqs, host)[2]
    assert res.ttft_s[2] > intake + (res.steps.start_s[step] - res.steps.start_s[3])
    # sent once the answer's last chunk reached the client
    assert sent == pytest.approx(res.finish_s[0], abs=1e-4)


def test_without_host_time_the_next_request_joins_at_once():
    res, _ = _run("sglang", "overlap", on=False)
    assert np.nonzero(res.steps.prefill_tokens)[0].tolist() == [0, 3]
