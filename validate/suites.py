"""What to measure: kernel configurations (shared-schema rows) and whole steps.

Kernel rows of the validation suites come from ``perfmodel.cost.step.step_records`` of the
small local models, so the harness times exactly the shapes the model predicts. The
calibration suites are separate sweeps (streaming adds, square and skinny GEMMs, a tiny
kernel for launch overhead) whose shapes do not occur in the validation suites: what is fitted
is never what is evaluated.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from perfmodel.compare import op_row, shape_key
from perfmodel.cost import step as cost
from perfmodel.cost.ops import OpRecord
from perfmodel.specs import Hardware, Model, Parallelism

SUITES = ("quick", "full")


def _llama(name: str, layers: int, d: int, heads: int, kv: int, head_dim: int, mlp: int,
           vocab: int, source: str) -> Model:
    return Model(name=name, n_layers=layers, d_model=d, n_heads=heads, n_kv_heads=kv,
                 head_dim=head_dim, vocab_size=vocab, intermediate_size=mlp, family="llama",
                 source=source)


# the local models (validate.tinymodel builds them with random weights)
_LOCAL = "validate.tinymodel: random weights, built locally"
TINY_LLAMA = _llama("tiny-llama", 4, 512, 8, 2, 64, 1536, 8192, _LOCAL)
SMALL_LLAMA = _llama("small-llama", 2, 1024, 16, 4, 64, 2816, 16384, _LOCAL)
# GPU widths: a 1B-class and a 13B-class layer (128-wide heads, GQA), so that GEMMs reach
# the tensor-core roof and attention runs FlashAttention's head_dim-128 tiles
GPU_2K = _llama("gpu-llama-2k", 4, 2048, 16, 4, 128, 5632, 32000, _LOCAL)
GPU_5K = _llama("gpu-llama-5k", 2, 5120, 40, 8, 128, 13824, 32000, _LOCAL)
MODELS = {m.name: m for m in (TINY_LLAMA, SMALL_LLAMA, GPU_2K, GPU_5K)}
# calibration-only shapes: widths that neither validation model uses, so fitting the
# per-kernel-kind streaming fractions and the attention fraction never sees a held-out shape
CALIB_CPU = _llama("calib-cpu", 1, 768, 12, 4, 64, 2048, 12288, "calibration shapes only")
CALIB_CUDA = _llama("calib-cuda", 1, 4096, 32, 8, 128, 11008, 32000, "calibration shapes only")
# (cpu: the 16- and 32-token prefills give kernels of 8K-33K elements, which PyTorch runs
# on one thread, so calibrate sees each kind's per-thread rate; see TORCH_CPU_GRAIN)
_CALIB_STEPS = {"cpu": [(1, 192, 192), (1, 1024, 1024), (2, 1, 640), (1, 1, 96),
                        (1, 16, 16), (1, 32, 32)],
                "cuda": [(1, 1024, 1024), (16, 1, 2048), (64, 1, 512), (1, 1, 256)]}
CALIB_MODELS = {"cpu": CALIB_CPU, "cuda": CALIB_CUDA}
# a narrow calibration-only model for the framework glue per layer: the same operators and
# Python as any Llama layer, but kernels of ~2-20 us, so the glue is not the difference of
# two millisecond-long noisy times (at calib-cpu's width the layer-minus-kernels gap moved
# from 0.09 to 0.55 ms between four calibrations of the same VM; profiled, the host time
# outside the kernels was about 0.25 ms at both widths)
GLUE_CPU = _llama("glue-cpu", 1, 64, 4, 2, 16, 128, 256, "calibration shapes only")
OUTSIDE_LAYERS = ("embed", "pos_embed_add", "final_norm", "lm_head")


def _kind(device: str) -> str:
    """The calibration tables' key for ``device``: "cuda", or "cpu" for anything else."""
    return "cuda" if device == "cuda" else "cpu"


LAUNCH_ROW = {"op": "add", "dtype": "fp32", "m": 1, "n": 1, "name": "launch"}


@dataclass(frozen=True)
class Step:
    """A whole decoder layer or model step: ``batch`` sequences, ``q_len`` new tokens each,
    ``kv_len`` positions after the step (prefill: q_len = kv_len; decode: q_len = 1)."""

    scope: str          # layer | model
    model: Model
    batch: int
    q_len: int
    kv_len: int
    dtype: str = "fp32"

    @property
    def phase(self) -> str:
        return "decode" if self.q_len == 1 else "prefill"

    @classmethod
    def from_row(cls, row: dict, models: dict[str, Model]) -> Step:
        """The step a steps.csv row describes (``models``: name -> Model)."""
        return cls(row["scope"], models[row["model"]], int(row["batch"]), int(row["q_len"]),
                   int(row["kv_len"]), row["dtype"])

    def row(self) -> dict:
        return {"scope": self.scope, "phase": self.phase, "model": self.model.name,
                "batch": self.batch, "q_len": self.q_len, "kv_len": self.kv_len,
                "dtype": self.dtype}

    def records(self, hw: Hardware | None = None, timing: str = "host") -> list[OpRecord]:
        """The step's operators as one-instance records (``cost.step.step_records``),
        the per-layer framework glue (``layer_overhead``) included where ``hw`` prices it
        under ``timing`` (None: the kernels only); for a layer, those of one decoder layer
        (a 1-layer model's, less the operators outside layers)."""
        model = self.model if self.scope == "model" else replace(self.model, n_layers=1)
        dtypes = cost.Dtypes.of(weights=self.dtype, acts=self.dtype, kv=self.dtype)
        step = cost.Step.uniform(self.batch, self.q_len, self.kv_len)
        recs = cost.step_records(model, hw, Parallelism(tp=1), step, dtypes, timing)
        return [r for r in recs if self.scope == "model" or r.name not in OUTSIDE_LAYERS]

    def ops(self) -> list[OpRecord]:
        """The model's kernels for this step (no framework glue); for a layer, those of
        one decoder layer."""
        return self.records()


@dataclass(frozen=True)
class Suite:
    name: str
    kernels: tuple[dict, ...]   # shared-schema rows (+ model, name) without measurements
    steps: tuple[Step, ...]


def kernel_rows(model: Model, steps: list[tuple[int, int, int]], dtype: str) -> list[dict]:
    """Unique kernel rows of ``model`` over whole-model steps (batch, q_len, kv_len)."""
    return layer_kernel_rows([Step("model", model, batch, q_len, kv_len, dtype)
                              for batch, q_len, kv_len in steps])


def _dedupe(rows: list[dict]) -> tuple[dict, ...]:
    seen: dict[str, dict] = {}
    for row in rows:
        seen.setdefault(shape_key(row), row)
    return tuple(seen.values())


@dataclass(frozen=True)
class Plan:
    """One model's part of a validation suite: the kernels of its ``steps`` (batch, q_len,
    kv_len) at ``dtype``, and (``timed_steps``) those steps as whole layers and model steps."""

    model: Model
    steps: tuple[tuple[int, int, int], ...]
    dtype: str
    timed_steps: bool = True


_QUICK_TINY = ((1, 128, 128), (1, 512, 512), (1, 1, 512), (8, 1, 1024))
_QUICK_SMALL = ((1, 256, 256), (4, 1, 1024))
_FULL_TINY = ((1, 64, 64), (1, 128, 128), (4, 128, 128), (1, 512, 512), (1, 1024, 1024),
              (1, 1, 256), (1, 1, 1024), (4, 1, 1024), (16, 1, 512), (8, 1, 2048))
_FULL_SMALL = ((1, 128, 128), (1, 512, 512), (1, 1, 512), (8, 1, 2048))
_GPU_2K_QUICK = ((1, 512, 512), (1, 1536, 1536), (1, 1, 1024), (16, 1, 2048), (64, 1, 1024))
_GPU_5K_QUICK = ((1, 1024, 1024), (8, 1, 2048), (32, 1, 1024))
_GPU_2K_FULL = (*_GPU_2K_QUICK, (4, 1024, 1024), (1, 4096, 4096), (1, 1, 4096),
                (128, 1, 1024))
_GPU_5K_FULL = (*_GPU_5K_QUICK, (1, 4096, 4096), (64, 1, 2048))

# device kind -> suite -> plans. CPU: fp32 (the dtype its BLAS is built for; full adds bf16
# kernels). CUDA: bf16, the serving dtype (full adds fp16 kernels); both are dtypes that
# ``perfmodel calibrate --device cuda`` measures a GEMM peak for (``SWEEPS``)
VALIDATION = {
    "cpu": {"quick": (Plan(TINY_LLAMA, _QUICK_TINY, "fp32"),
                      Plan(SMALL_LLAMA, _QUICK_SMALL, "fp32", timed_steps=False)),
            "full": (Plan(TINY_LLAMA, _FULL_TINY, "fp32"), Plan(SMALL_LLAMA, _FULL_SMALL, "fp32"),
                     Plan(TINY_LLAMA, _QUICK_TINY, "bf16", timed_steps=False))},
    "cuda": {"quick": (Plan(GPU_2K, _GPU_2K_QUICK, "bf16"),
                       Plan(GPU_5K, _GPU_5K_QUICK, "bf16")),
             "full": (Plan(GPU_2K, _GPU_2K_FULL, "bf16"), Plan(GPU_5K, _GPU_5K_FULL, "bf16"),
                      Plan(GPU_2K, _GPU_2K_QUICK, "fp16", timed_steps=False))},
}


def validation_suite(name: str, device: str = "cpu") -> Suite:
    """``quick`` (about two minutes on two CPU cores) or ``full`` (more shapes, a second
    dtype) for ``device`` (cpu: the tiny and small local models; cuda: GPU-width ones)."""
    if name not in SUITES:
        raise ValueError(f"--suite: expected one of {', '.join(SUITES)}, got {name!r}")
    plans = VALIDATION[_kind(device)][name]
    rows = [r for p in plans for r in kernel_rows(p.model, list(p.steps), p.dtype)]
    steps = [Step(scope, p.model, *s, p.dtype) for p in plans if p.timed_steps
             for s in p.steps for scope in ("layer", "model")]
    return Suite(name, _dedupe(rows), tuple(steps))


# decode layers of the narrow glue model: the framework glue per layer
# (``Efficiency.layer_overhead_s``) is what they take beyond their measured operators
# (eight of them: each gap is still the difference of two noisy times)
_CALIB_LAYER_STEPS = {"cpu": [(1, 1, 16), (2, 1, 16), (1, 1, 64), (4, 1, 32), (1, 1, 128),
                              (2, 1, 64), (3, 1, 16), (1, 1, 32)],
                      "cuda": []}


def calibration_steps(device: str) -> tuple[Step, ...]:
    """Whole decoder layers timed by ``perfmodel calibrate`` to fit ``layer_overhead_s``:
    decode layers of the narrow calibration-only model ``GLUE_CPU`` (never a validation
    model). None on CUDA, where host glue overlaps device work and is not applied."""
    return tuple(Step("layer", GLUE_CPU, *s) for s in _CALIB_LAYER_STEPS[_kind(device)])


def layer_kernel_rows(steps: tuple[Step, ...] | list[Step]) -> list[dict]:
    """Unique kernel rows (first-seen order) of the operators of ``steps`` (collectives,
    which have no kernel row, left out); ``name`` lists every operator sharing the shape."""
    rows: dict[str, dict] = {}
    for step in steps:
        for op in step.ops():
            if op.kind == "all_reduce":
                continue
            row = op_row(op) | {"model": step.model.name, "name": op.name}
            key = shape_key(row)
            if key in rows:
                names = rows[key]["name"].split("+")
                if op.name not in names:
                    rows[key]["name"] = "+".join([*names, op.name])
            else:
                rows[key] = row
    return list(rows.values())


@dataclass(frozen=True)
class Sweep:
    """The calibration sweep's sizes on one device kind."""

    dtypes: tuple[str, ...]                 # GEMM peaks measured (the first: other kernels)
    squares: tuple[int, ...]                # square GEMMs (full adds 1.5x and 2x the last)
    skinny_nk: tuple[tuple[int, int], ...]  # (n, k) of GEMMs at m = 1, 8, 32, 96
    add_rows: tuple[int, ...]               # rows of the streaming adds, ``width`` wide
    width: int


SWEEPS = {"cuda": Sweep(("fp16", "bf16"), (256, 512, 1024, 2048, 4096, 8192),
                        ((4096, 4096), (8192, 8192)), (1, 16, 256, 4096, 16384, 65536), 8192),
          "cpu": Sweep(("fp32",), (64, 128, 256, 384, 640, 768, 1024),
                       ((1024, 1024), (3072, 1024), (1024, 3072)), (1, 4, 16, 64, 256, 1024),
                       4096)}


def _gemm(m: int, n: int, k: int, dtype: str, name: str) -> dict:
    return {"op": "gemm", "dtype": dtype, "m": m, "n": n, "k": k, "name": name}


def calibration_rows(device: str, name: str = "quick",
                     layers: bool = True) -> tuple[dict, ...]:
    """Sweeps for ``perfmodel calibrate``: streaming adds over sizes (bandwidth and its
    ramp), square GEMMs per dtype (peak rate), skinny and shallow GEMMs (tiles, k ramp,
    weight streaming), the non-GEMM kernels of a calibration-only model shape (per-kind
    streaming fractions, attention), a one-element add back to back (launch overhead), and
    (``layers``) every kernel of the calibration layer steps (``calibration_steps``): the
    glue fit subtracts their measured times; the efficiency is fitted without them."""
    if name not in SUITES:
        raise ValueError(f"--suite: expected one of {', '.join(SUITES)}, got {name!r}")
    kind = _kind(device)
    sweep = SWEEPS[kind]
    dtypes, squares, width = sweep.dtypes, sweep.squares, sweep.width
    if name == "full":
        squares = (*squares, squares[-1] * 3 // 2, squares[-1] * 2)
    rows = [_gemm(s, s, s, d, "square") for d in dtypes for s in squares]
    if kind == "cpu":
        rows += [_gemm(s, s, s, "bf16", "square") for s in (256, 512, 1024)]
    for n, k in sweep.skinny_nk:
        rows += [_gemm(m, n, k, dtypes[0], "skinny") for m in (1, 8, 32, 96)]
    if kind == "cpu":
        # decode-sized GEMMs (a CPU BLAS runs m = 1 as GEMV, small m as packed skinny GEMMs,
        # both far below streaming bandwidth): weights from in-cache to beyond the LLC
        for n, k in ((768, 2048), (2048, 768), (2048, 2048)):
            rows += [_gemm(m, n, k, dtypes[0], "skinny") for m in (1, 2, 4, 16)]
        rows += [_gemm(m, 6144, 2048, dtypes[0], "skinny") for m in (1, 4)]
        # wide outputs (LM-head-like: the packed path slows as n grows, gemm_n_half)
        rows += [_gemm(m, 12288, 768, dtypes[0], "wide") for m in (2, 8, 32, 192)]
        rows += [_gemm(1, n, k, dtypes[0], "gemv") for n, k in ((768, 768), (384, 1024))]
    depth = squares[len(squares) // 2]
    rows += [_gemm(depth, depth, k, dtypes[0], "shallow") for k in (32, 96, 160, 4 * depth)]
    rows += [{"op": "add", "dtype": dtypes[0], "m": m, "n": width, "name": "stream"}
             for m in sweep.add_rows]
    # every other kernel kind (norms, activations, rotary, cache writes, gathers, attention)
    rows += [r for r in kernel_rows(CALIB_MODELS[kind], _CALIB_STEPS[kind], dtypes[0])
             if r["op"] != "gemm"]
    # every kernel (GEMMs included) of the calibration layer steps: the glue fit subtracts
    # their measured times from the measured layers (layers=False: the sweep without them,
    # the rows the efficiency is fitted to)
    if layers:
        rows += layer_kernel_rows(calibration_steps(device))
    rows.append(LAUNCH_ROW | {"dtype": dtypes[0]})
    return _dedupe(rows)
