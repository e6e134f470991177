"""Time whole model steps of real-sized dense models on a CUDA GPU (random weights).

``python -m validate.probe_steps --out DIR [--models llama-3-8b,llama-2-13b]`` builds each
shipped model's shape as ``validate.tinymodel.TinyLlama`` (the operators
``perfmodel.cost.step.step_records`` lists, eager PyTorch: SDPA attention, unfused norms and
activations) and times prefill and decode steps two ways:

- ``timing=stream``: eager, back-to-back launches timed with CUDA events (what the harness's
  validation steps do);
- ``timing=kernel``: decode steps captured once in a CUDA graph and replayed (no host
  launch cost: what ``perfmodel estimate --cuda-graphs`` prices).

DIR/steps.csv has the harness's step columns (``validate.suites.Step.row``) plus
``measured_s``, ``measured_std_s`` and ``timing``. These are end-to-end steps of the
harness's own kernels, never used to fit a constant: evaluation data for the model's
composition of kernels and for its uncertainty band.
"""

from __future__ import annotations

import argparse
import csv
import time
from pathlib import Path

import torch

import perfmodel as pm
from validate.device import open_device
from validate.suites import Step
from validate.timers import measure
from validate.tinymodel import TinyLlama

DECODE = ((1, 512), (1, 4096), (8, 2048), (32, 1024), (32, 4096), (64, 2048))
PREFILL = ((1, 512), (1, 2048), (4, 1024))
MAX_CACHE_BYTES = 60e9      # with the weights, well inside an H100's or H200's memory


def _graph(net: TinyLlama, ids: torch.Tensor, start: int) -> torch.cuda.CUDAGraph:
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            net.step(ids, start)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        net.step(ids, start)
    return graph


def model_rows(name: str, dev, decode: tuple, prefill: tuple) -> list[dict]:
    model = pm.model(name)
    rows = []
    gen = torch.Generator(device="cuda").manual_seed(1)
    per_token = 4 * model.n_layers * model.n_kv_heads * model.head_dim   # K and V, bf16
    for batch, ctx in decode:
        if batch * ctx * per_token > MAX_CACHE_BYTES:
            continue
        step = Step("model", model, batch, 1, ctx, "bf16")
        with torch.inference_mode():
            net = TinyLlama(model, "bf16", dev.torch_device, batch, ctx)
            ids = net.random_ids(1, gen)
            eager = measure(lambda i, n=net, x=ids, s=ctx - 1: n.step(x, s), dev, budget_s=0.5)
            graph = _graph(net, ids, ctx - 1)
            replay = measure(lambda i, g=graph: g.replay(), dev, budget_s=0.5)
        rows.append(step.row() | {"measured_s": eager.median_s, "measured_std_s": eager.std_s,
                                  "timing": "stream"})
        rows.append(step.row() | {"measured_s": replay.median_s,
                                  "measured_std_s": replay.std_s, "timing": "kernel"})
        del net, graph
        torch.cuda.empty_cache()
    for batch, length in prefill:
        step = Step("model", model, batch, length, length, "bf16")
        with torch.inference_mode():
            net = TinyLlama(model, "bf16", dev.torch_device, batch, length)
            ids = net.random_ids(length, gen)
            t = measure(lambda i, n=net, x=ids: n.step(x, 0), dev, budget_s=0.5)
        rows.append(step.row() | {"measured_s": t.median_s, "measured_std_s": t.std_s,
                                  "timing": "stream"})
        del net
        torch.cuda.empty_cache()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--models", default="llama-3-8b,llama-2-13b")
    parser.add_argument("--dry-run", action="store_true", help="toy sizes (still needs CUDA)")
    args = parser.parse_args()
    dev = open_device("cuda")
    args.out.mkdir(parents=True, exist_ok=True)
    decode, prefill = (((1, 64),), ((1, 32),)) if args.dry_run else (DECODE, PREFILL)
    t0, rows = time.time(), []
    for name in args.models.split(","):
        rows += [r | {"device": dev.name} for r in model_rows(name, dev, decode, prefill)]
        print(f"{name}: {len(rows)} rows after {time.time() - t0:.0f} s", flush=True)
    with open(args.out / "steps.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


if __name__ == "__main__":
    main()
