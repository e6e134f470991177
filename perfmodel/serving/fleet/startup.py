"""A new replica's start-up time, from launch to serving its first request:

    startup_s = engine_start_s + weights_bytes / storage_bytes_per_s
                + graph_sizes * graph_capture_s_per_size

``weights_bytes``: the replica's weights on all its devices (the KV pool's weights per
device, ``serving.pricing.kv_pool``, times the devices of a replica), read from one node's
storage; ``graph_sizes``: the CUDA graphs vLLM captures by default for ``max_num_seqs``
(none with CUDA graphs off: ``--enforce-eager``). The constants and their sources are in
``startup.yaml`` beside this file; the fixed engine start is an assumption, said as a
warning by the CLI.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from importlib.resources import files

import yaml

MAX_CAPTURE = 512       # vLLM: max_cudagraph_capture_size = min(2 * max_num_seqs, 512)


@dataclass(frozen=True)
class Startup:
    """A replica's start-up, in seconds, by part."""
    engine_s: float
    weights_s: float
    graphs_s: float

    @property
    def total_s(self) -> float:
        return self.engine_s + self.weights_s + self.graphs_s

    def describe(self) -> str:
        return (f"{self.total_s:.1f} s ({self.engine_s:.0f} s container and engine start, "
                f"assumed; {self.weights_s:.1f} s weights; {self.graphs_s:.1f} s CUDA graphs)")


@cache
def constants() -> dict:
    return yaml.safe_load(files("perfmodel.serving.fleet").joinpath("startup.yaml").read_text())


def graph_sizes(max_num_seqs: int) -> int:
    """How many batch sizes vLLM captures by default (``VllmConfig._set_cudagraph_sizes``):
    [1, 2, 4] + range(8, 256, 8) + range(256, M + 1, 16), those up to M = min(2 *
    max_num_seqs, 512)."""
    top = min(2 * max_num_seqs, MAX_CAPTURE)
    sizes = [s for s in (1, 2, 4) if s <= top] + list(range(8, min(top + 1, 256), 8)) + \
        list(range(256, top + 1, 16))
    return len(sizes)


def startup(weights_bytes: float, max_num_seqs: int, cuda_graphs: bool) -> Startup:
    """The start-up of a replica holding ``weights_bytes`` of weights (all its devices)."""
    c = constants()
    graphs = graph_sizes(max_num_seqs) * c["graph_capture_s_per_size"] if cuda_graphs else 0.0
    return Startup(float(c["engine_start_s"]), weights_bytes / c["storage_bytes_per_s"],
                   float(graphs))
