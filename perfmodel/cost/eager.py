"""A quantized linear called eagerly: the engine's host path as a floor on its time.

A framework's linear launched from Python without a CUDA graph cannot run faster than its
host path: the module's forward, the activations' quantization call, the kernel's
dispatch (vLLM's ``W8A8BlockFp8LinearOp.apply`` choosing FlashInfer, DeepGEMM or CUTLASS
per shape; DeepGEMM's JIT lookup). Timed back to back, one call takes
max(device time, host path): the device idles between calls when the host is slower.
aiconfigurator's vLLM collector times its fp8-block linears that way
(``collector/vllm/collect_gemm.py`` run_gemm: ``use_cuda_graph=gemm_type != "fp8_block"``;
the corpus row's ``timing`` is ``stream``); every other quantized row is replayed from a
graph and never pays it, and neither does a graph-replayed serving step.

The host path of one call is ``host_s`` of the linear's ``gemm_kernels`` row (its class
and M bucket: the engine's kernel choice), fitted on the eager rows' floor
(``validate.corpus.fit``); a row without one has no floor beyond ``launch_overhead_s``.
"""

from __future__ import annotations

import numpy as np

from perfmodel.cost.moe import dense_key
from perfmodel.cost.ops import Gemm
from perfmodel.specs.hardware import Hardware


def host_floor(op: Gemm, hw: Hardware) -> np.ndarray | float:
    """Per instance of ``op``: the host path of one eager call of its kernel (its
    ``gemm_kernels`` row's ``host_s``), 0 where the row has none."""
    hosts = hw.efficiency.gemm_host_s
    if not hosts:
        return 0.0
    out = np.zeros(op.shape)
    for mask, key in dense_key(hw, op):
        if key in hosts:
            out = np.where(mask, hosts[key], out)
    return out


def eager_time(device_s: np.ndarray, host_s: np.ndarray | float) -> np.ndarray:
    """One call of a linear timed back to back without a graph: the slower of its device
    time (every kernel it runs) and its host path."""
    return np.maximum(device_s, host_s)
