"""Time the GPU kernels the model is least sure of, on a real CUDA device.

``python -m validate.probe_cuda --out DIR`` writes DIR/probe.csv in the measurement schema
(plus ``kernel``, ``weight_dtype``, ``group_size``, ``timing``), one row per configuration:

- GEMV and small GEMMs (m = 1 .. 128) of decode-sized layers at bf16 (``F.linear``, cuBLAS),
  fp8 W8A8 (``torch._scaled_mm``, per-tensor scales; the activations' quantization pass timed
  as its own row, ``kernel=quant_act_fp8``), int4 weight-only (tinygemm,
  ``aten._weight_int4pack_mm``, group 128) and int8 weight-only
  (``aten._weight_int8pack_mm``, per-channel scales);
- decode attention (one new token per sequence, GQA) through PyTorch SDPA;
- elementwise passes (RMSNorm, SiLU-and-mul, add) from one row to 16K rows, where the fixed
  cost per kernel shows;
- a one-element add eager and replayed from a CUDA graph: launch overhead against device time.

Each kernel runs on input sets rotated to exceed twice the L2 (``validate.timers``), timed
with CUDA events by ``validate.timers.measure``. A kernel the local torch build lacks is
recorded in DIR/probe_skipped.txt, not guessed.
"""

from __future__ import annotations

import argparse
import csv
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F

from validate.device import open_device
from validate.timers import measure, rotation_sets

BF16 = torch.bfloat16
GRID = {"layers": ((4096, 4096), (14336, 4096), (4096, 14336), (8192, 8192), (28672, 8192)),
        "m": (1, 2, 4, 8, 16, 32, 64, 128),
        "heads": ((32, 8, 128), (64, 8, 128), (32, 32, 128)), "batch": (1, 8, 32, 128),
        "ctx": (128, 1024, 4096, 16384),
        "width": (4096, 8192), "rows": (1, 4, 16, 64, 256, 1024, 4096, 16384)}
# --dry-run: the same code on the CPU at toy sizes
TOY = {"layers": ((256, 256),), "m": (1, 16), "heads": ((4, 2, 64),), "batch": (1, 2),
       "ctx": (64,), "width": (256,), "rows": (1, 8)}
COLUMNS = ("device", "source", "model", "tp", "op", "dtype", "m", "n", "k", "batch", "q_len",
           "kv_len", "n_heads", "n_kv_heads", "head_dim", "measured_s", "measured_std_s",
           "kernel", "weight_dtype", "group_size", "timing")


def _sets(set_bytes: float, l2: float) -> int:
    return rotation_sets(set_bytes, l2, max_total_bytes=4e9)


def _time(make: Callable[[], tuple], l2: float, set_bytes: float, run: Callable) -> tuple:
    sets = [make() for _ in range(_sets(set_bytes, l2))]
    t = measure(lambda i: run(*sets[i % len(sets)]), DEV, budget_s=0.3)
    return t.median_s, t.std_s


def _fp8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    scale = w.abs().max().float() / 448.0
    return (w / scale).to(torch.float8_e4m3fn), scale


def _rand(*shape: int, scale: float = 1.0) -> torch.Tensor:
    return torch.randn(*shape, device=DEVICE, dtype=BF16) * scale


def _bf16_set(m: int, n: int, k: int) -> tuple:
    return _rand(m, k), _rand(n, k, scale=k**-0.5)


def _fp8_set(m: int, n: int, k: int) -> tuple:
    x, w = _bf16_set(m, n, k)
    return (_fp8(x)[0], *_fp8(w))


def _scaled_mm(a: torch.Tensor, b: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    return torch._scaled_mm(a, b.t(), s, s, out_dtype=BF16)


def gemm_rows(l2: float) -> list[dict]:
    out = []
    for n, k in GRID["layers"]:
        for m in GRID["m"]:
            base = {"op": "gemm", "m": m, "n": n, "k": k}
            out.append(_row(base | {"dtype": "bf16", "kernel": "F.linear"},
                            partial(_bf16_set, m, n, k), l2, 2 * (m * k + n * k), F.linear))
            out.append(_row(base | {"dtype": "fp8", "kernel": "torch._scaled_mm"},
                            partial(_fp8_set, m, n, k), l2, m * k + n * k, _scaled_mm))
            out.append(_row({"op": "quant_act", "m": m, "n": k, "dtype": "bf16",
                             "kernel": "quant_act_fp8"}, partial(_one, m, k), l2, 3 * m * k,
                            _quant))
            out.append(_int4(base, m, n, k, l2))
            out.append(_int8(base, m, n, k, l2))
    return [r for r in out if r]


def _one(m: int, n: int, c: int = 1) -> tuple:
    return (_rand(m, c * n),)


def _two(m: int, n: int) -> tuple:
    return _rand(m, n), _rand(m, n)


def _quant(a: torch.Tensor) -> torch.Tensor:
    return _fp8(a)[0]


def _int4(base: dict, m: int, n: int, k: int, l2: float) -> dict | None:
    group = 128

    def make() -> tuple:
        q = torch.randint(0, 16, (n, k), dtype=torch.int32, device=DEVICE)
        packed = ((q[:, ::2] << 4) | q[:, 1::2]).to(torch.uint8)
        w = torch.ops.aten._convert_weight_to_int4pack(packed, 8)
        sz = torch.randn(k // group, n, 2, device=DEVICE, dtype=BF16)
        return torch.randn(m, k, device=DEVICE, dtype=BF16), w, sz

    return _row(base | {"dtype": "bf16", "weight_dtype": "int4", "group_size": group,
                        "kernel": "aten._weight_int4pack_mm"}, make, l2,
                n * k / 2 + 2 * m * k,
                lambda a, w, sz: torch.ops.aten._weight_int4pack_mm(a, w, group, sz))


def _int8(base: dict, m: int, n: int, k: int, l2: float) -> dict | None:
    def make() -> tuple:
        w = torch.randint(-128, 127, (n, k), dtype=torch.int8, device=DEVICE)
        return (torch.randn(m, k, device=DEVICE, dtype=BF16), w,
                torch.rand(n, device=DEVICE, dtype=BF16))

    return _row(base | {"dtype": "bf16", "weight_dtype": "int8",
                        "kernel": "aten._weight_int8pack_mm"}, make, l2, n * k + 2 * m * k,
                lambda a, w, s: torch.ops.aten._weight_int8pack_mm(a, w, s))


def _attention_set(b: int, c: int, h: int, g: int, d: int) -> tuple:
    return _rand(b, g, h // g, d), _rand(b, g, c, d), _rand(b, g, c, d)


def attention_rows(l2: float) -> list[dict]:
    out = []
    for heads, kv, d in GRID["heads"]:
        for batch in GRID["batch"]:
            for ctx in GRID["ctx"]:
                if batch * ctx > 2**19:
                    continue
                row = {"op": "attention", "dtype": "bf16", "batch": batch, "q_len": 1,
                       "kv_len": ctx, "n_heads": heads, "n_kv_heads": kv, "head_dim": d,
                       "kernel": "F.scaled_dot_product_attention"}
                out.append(_row(row, partial(_attention_set, batch, ctx, heads, kv, d), l2,
                                4 * batch * kv * ctx * d, F.scaled_dot_product_attention))
    return [r for r in out if r]


def _silu_and_mul(a: torch.Tensor) -> torch.Tensor:
    n = a.shape[-1] // 2
    return F.silu(a[:, :n]) * a[:, n:]


def elementwise_rows(l2: float) -> list[dict]:
    out = []
    for n in GRID["width"]:
        w = torch.ones(n, device=DEVICE, dtype=BF16)
        norm = partial(F.rms_norm, normalized_shape=(n,), weight=w, eps=1e-6)
        for m in GRID["rows"]:
            passes = (("rms_norm", partial(_one, m, n), 4 * m * n, norm),
                      ("silu_and_mul", partial(_one, m, n, 2), 6 * m * n, _silu_and_mul),
                      ("add", partial(_two, m, n), 6 * m * n, torch.add))
            for op, make, nbytes, run in passes:
                out.append(_row({"op": op, "dtype": "bf16", "m": m, "n": n,
                                 "kernel": "torch eager"}, make, l2, nbytes, run))
    return [r for r in out if r]


def launch_rows() -> list[dict]:
    a = torch.ones(1, device=DEVICE)
    eager = measure(lambda i: a.add_(1.0), DEV, budget_s=0.3)
    graph = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        a.add_(1.0)
    torch.cuda.current_stream().wait_stream(s)
    with torch.cuda.graph(graph):
        for _ in range(100):
            a.add_(1.0)
    replay = measure(lambda i: graph.replay(), DEV, budget_s=0.3)
    base = {"op": "add", "dtype": "fp32", "m": 1, "n": 1}
    return [base | {"kernel": "eager add_ (launch-bound)", "timing": "host",
                    "measured_s": eager.median_s, "measured_std_s": eager.std_s},
            base | {"kernel": "cuda graph replay, per kernel", "timing": "kernel",
                    "measured_s": replay.median_s / 100, "measured_std_s": replay.std_s / 100}]


SKIPPED: list[str] = []


def _row(row: dict, make: Callable[[], tuple], l2: float, set_bytes: float,
         run: Callable) -> dict | None:
    try:
        median, std = _time(make, l2, set_bytes, run)
    except (RuntimeError, TypeError, AttributeError, NotImplementedError) as exc:
        SKIPPED.append(f"{row}: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
        return None
    # events around back-to-back eager calls: the longer of device time and host launch
    return row | {"measured_s": median, "measured_std_s": std, "timing": DEV.timing}


def main() -> None:
    global DEV
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--parts", default="launch,elementwise,attention,gemm")
    parser.add_argument("--dry-run", action="store_true", help="on the CPU, to test the script")
    args = parser.parse_args()
    global DEVICE
    DEVICE = "cpu" if args.dry_run else "cuda"
    if args.dry_run:
        GRID.update(TOY)
    DEV = open_device("cpu" if args.dry_run else "cuda")
    args.out.mkdir(parents=True, exist_ok=True)
    l2 = DEV.llc_bytes
    t0, rows = time.time(), []
    makers = {"launch": list if args.dry_run else launch_rows,
              "elementwise": lambda: elementwise_rows(l2),
              "attention": lambda: attention_rows(l2), "gemm": lambda: gemm_rows(l2)}
    for part in args.parts.split(","):
        rows += makers[part]()
        print(f"{part}: {len(rows)} rows after {time.time() - t0:.0f} s", flush=True)
    source = f"perfmodel validate.probe_cuda, torch {torch.__version__}"
    with open(args.out / "probe.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, COLUMNS)
        writer.writeheader()
        for r in rows:
            writer.writerow({"device": DEV.name, "source": source, "tp": 1} | r)
    (args.out / "probe_skipped.txt").write_text("\n".join(SKIPPED) + "\n")
    print(f"{len(rows)} rows, {len(SKIPPED)} skipped, {time.time() - t0:.0f} s", flush=True)


DEV = None
DEVICE = "cuda"
if __name__ == "__main__":
    main()
