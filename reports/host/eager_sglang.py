"""SGLang's host time per operator of an eagerly run step (``eager_op_s``), from a whole step.

    python reports/host/eager_sglang.py

The measurement (sgl-project/sglang PR 12160, "support prefill-cuda-graph based on
cuda-graph-runner", 2025-10-26, DeepSeek-V3 under SGLang): the scheduler's "forward cost"
of a prefill batch of one new token (one cached) run eagerly is 82.64 ms
(``forward cost-82.6406478881836 ms``); replayed as a CUDA graph, one new token (six
cached) takes 23.10 ms. The GPU model and the tensor-parallel size are not stated; TP8 is
SGLang's documented DeepSeek-V3 launch on one node, and the GPU hardly matters here: the
eager step is the host's, 3.6x the graph-replayed one.

A one-token step's device time is far below its dispatch, so the step is the host's
(``serving.eager``: max(instances x eager_op_s, device time)), and eager_op_s is the step
divided by the operator instances the cost model counts in it. The figure is per instance of
this model's operators (``cost.step``), not per kernel launch; ``tests/test_eager_prefill``
checks the shipped value still prices the step at 82.64 ms.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import perfmodel as pm  # noqa: E402
from perfmodel.serving.engines import engine_config  # noqa: E402
from perfmodel.serving.engines.state import Batch  # noqa: E402
from perfmodel.serving.host_time import resolve  # noqa: E402
from perfmodel.serving.pricing import StepPricer  # noqa: E402
from perfmodel.specs.workload import Parallelism, Workload  # noqa: E402

EAGER_STEP_S = 82.64e-3     # PR 12160: one new token, one cached, eager
GRAPH_STEP_S = 23.10e-3     # PR 12160: one new token, six cached, the prefill CUDA graph


def measured_step(version: str = "0.5.9", hardware: str = "h200-sxm"):
    """(the StepCost of PR 12160's eager step as the model prices it, its pricer)."""
    model = pm.model("deepseek-v3")
    hw = pm.hardware(hardware, engine="sglang")
    pricer = StepPricer(model, hw, Parallelism(tp=8), Workload.for_model(model),
                        engine_config("sglang", host=resolve("sglang", version)))
    batch = Batch(np.zeros(1, np.int64), np.array([1]), np.array([2]), True, False, 0)
    _, cost, _ = pricer.gpu([batch])
    return cost, pricer


def main() -> None:
    cost, pricer = measured_step()
    n = int(cost.count.sum())
    device = float(cost.time_s.sum())
    op_s = EAGER_STEP_S / n
    print(f"DeepSeek-V3, 8x H200 TP8, one-token eager prefill: {n} operator instances, "
          f"device {device * 1e3:.2f} ms (graph-replayed, measured {GRAPH_STEP_S * 1e3:.2f} ms)")
    print(f"eager_op_s = {EAGER_STEP_S * 1e3:.2f} ms / {n} = {op_s * 1e6:.1f} us")
    print(f"shipped: {pricer.host.eager_op_s * 1e6:.1f} us")


if __name__ == "__main__":
    main()
