"""Multi-LoRA batching: the adapter kernels a step runs beside each base linear layer, as
records priced by the same roofline path as every other GEMM (``roofline.op_time``).

How the engines run them:

- Punica (Chen et al. 2023, arXiv:2310.18547; punica-ai/punica) and S-LoRA (Sheng et al.
  2023, arXiv:2311.03285): a batch's tokens are grouped by adapter, and each LoRA linear
  y += B_a (A_a x) runs as two batched gathered matmuls over the groups: SGMV (segmented
  gather matrix-vector, prefill segments) and BGMV (one row per decode token, the rows of
  one adapter sharing its weights). Each is bound by the bytes it reads.
- vLLM v1 runs both phases through one pair of Triton kernels
  (``vllm/lora/ops/triton_ops/lora_shrink_op.py`` ``_lora_shrink_kernel`` and
  ``lora_expand_op.py`` ``_lora_expand_kernel``): the tokens are sorted by adapter
  (``token_indices_sorted_by_lora_ids``, ``num_tokens_per_lora``), the grid is
  (tiles of M x N [x SPLIT_K], slices, adapters), a program past its adapter's rows exits
  early, and the tokens of no adapter (id -1) are skipped. So each adapter's rows are
  padded to the program's BLOCK_M, and each adapter's A and B are read once per step.
  Shrink: x [tokens, in] times A [in, rank] per slice (the q, k, v of a fused qkv_proj, the
  gate and up of gate_up_proj are slices of one launch); expand: [tokens, rank] times
  B [rank, out] per slice, added into the base layer's output.
- The kernels run at ``max_lora_rank`` whatever the adapter's own rank: the slots' stacked
  buffers are ``max_lora_rank`` wide (``vllm/lora/layers``: ``lora_a_stacked`` of shape
  (max_loras, 1, max_lora_rank, in), ``lora_b_stacked`` (max_loras, 1, out, max_lora_rank)),
  and the kernel's N (shrink) and K (expand) are that width.

Here each packed linear's shrink and expand are one ``Gemm`` each with ``groups`` the
distinct adapters of the step and ``m`` the mean rows per adapter: FLOPs
2 x tokens x in x (slices x rank) and 2 x tokens x rank x out; bytes: the adapters' A (in x
slices x rank) and B (rank x out) once per adapter, the input and the output activations.
Not priced: the expand's read of the base output it adds into (tokens x out, a tenth or
less of the step's activation bytes at rank 16), the shrink's fp32 intermediate (counted at
the activation width), and the rank-wide all-gather S-LoRA's tensor parallelism adds
(vLLM's default shards B of a column-parallel layer and A of a row-parallel one, so no
collective is added: the partial outputs join the base layer's all-reduce).

Under tensor parallelism (vLLM ``ColumnParallelLinearWithLoRA``: A whole, B sharded by
output; ``RowParallelLinearWithLoRA``: A sharded by input, B whole).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from perfmodel.cost.ops import Gemm
from perfmodel.cost.params import kv_heads_per_device
from perfmodel.cost.roofline import op_time
from perfmodel.cost.sums import sum_rows
from perfmodel.specs.errors import SpecError
from perfmodel.specs.hardware import Hardware
from perfmodel.specs.model import Model

# the linear layers an adapter may target, as PEFT's target_modules and vLLM name them
MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
ATTENTION = MODULES[:4]
# each packed layer vLLM wraps (one shrink and one expand launch each) and its slices
PACKED = (("qkv_proj", ("q_proj", "k_proj", "v_proj")), ("o_proj", ("o_proj",)),
          ("gate_up_proj", ("gate_proj", "up_proj")), ("down_proj", ("down_proj",)))


@dataclass(frozen=True)
class Linear:
    """One packed LoRA linear on one device: its input width, each slice's output width,
    and the layers that run it."""

    name: str
    k: int
    outs: tuple[int, ...]
    layers: int


def check_modules(modules: tuple[str, ...], where: str = "--lora-modules") -> tuple[str, ...]:
    """``modules`` in ``MODULES`` order; SpecError naming the first unknown one."""
    for m in modules:
        if m not in MODULES:
            raise SpecError(f"{where}: {m!r} is not a LoRA target module; expected some of "
                            f"{', '.join(MODULES)}")
    if not modules:
        raise SpecError(f"{where}: expected at least one of {', '.join(MODULES)}")
    return tuple(m for m in MODULES if m in modules)


def linears(model: Model, tp: int, modules: tuple[str, ...]) -> list[Linear]:
    """The packed linears of ``model`` (on one of ``tp`` devices) that carry the adapter's
    ``modules``. SpecError for a model whose layers these are not (MLA attention, MoE
    experts: their LoRA layers are not modelled here)."""
    modules = check_modules(modules)
    if model.mla is not None and set(modules) & set(ATTENTION):
        raise SpecError(f"--lora-modules: {model.name} has MLA attention, whose LoRA layers "
                        "are not modelled; expected only gate_proj, up_proj, down_proj")
    dense = model.mlp_layers - (model.n_moe_layers if model.moe is not None else 0)
    if model.moe is not None and set(modules) - set(ATTENTION) and not dense:
        raise SpecError(f"--lora-modules: {model.name}'s MLPs are MoE experts, whose LoRA "
                        "layers are not modelled; expected only q_proj, k_proj, v_proj, "
                        "o_proj")
    hd, d = model.head_dim, model.d_model
    q, kv = model.n_heads // tp * hd, kv_heads_per_device(model, tp) * hd
    inter = model.intermediate_size // tp
    width = {"q_proj": q, "k_proj": kv, "v_proj": kv, "o_proj": d, "gate_proj": inter,
             "up_proj": inter, "down_proj": d}
    if not model.gated_mlp:
        width.pop("gate_proj")
    inputs = {"qkv_proj": d, "o_proj": q, "gate_up_proj": d, "down_proj": inter}
    layers = {"qkv_proj": model.attention_layers, "o_proj": model.attention_layers,
              "gate_up_proj": dense, "down_proj": dense}
    out = []
    for name, parts in PACKED:
        outs = tuple(width[p] for p in parts if p in modules and p in width)
        if outs and layers[name]:
            out.append(Linear(name, inputs[name], outs, int(layers[name])))
    return out


def records(model: Model, tp: int, modules: tuple[str, ...], rank: int, tokens: object,
            adapters: object, elem_bytes: float = 2.0) -> list[Gemm]:
    """The shrink and expand ``Gemm`` of each packed linear over N steps: ``tokens`` (N,)
    the tokens that carry an adapter, ``adapters`` (N,) the distinct adapters among them
    (a step with none runs no LoRA kernel: count 0). ``elem_bytes``: the adapters' and
    activations' bytes per element (16-bit)."""
    tokens = np.asarray(tokens, dtype=float)
    groups = np.asarray(adapters, dtype=float)
    on = (tokens > 0) & (groups > 0)
    m = np.where(on, tokens / np.where(on, groups, 1.0), 1.0)
    g = np.where(on, groups, 1.0)
    out = []
    for lin in linears(model, tp, modules):
        count = np.where(on, float(lin.layers), 0.0)
        kw = dict(m=m, groups=g, count=count, weight_bytes=elem_bytes, act_bytes=elem_bytes)
        out += [Gemm(name=f"lora_shrink.{lin.name}", n=len(lin.outs) * rank, k=lin.k, **kw),
                Gemm(name=f"lora_expand.{lin.name}", n=sum(lin.outs), k=rank, **kw)]
    return out


@dataclass(frozen=True)
class LoraCost:
    """The LoRA kernels of N steps: names, and (operators, N) seconds, FLOPs and bytes."""

    names: tuple[str, ...]
    time_s: np.ndarray
    flops: np.ndarray
    bytes: np.ndarray

    @property
    def time(self) -> np.ndarray:
        """Seconds of each step (N,), the same for a step priced alone or with others."""
        return sum_rows(self.time_s)


def step_cost(model: Model, hw: Hardware, tp: int, modules: tuple[str, ...], rank: int,
              tokens: object, adapters: object, timing: str | np.ndarray | int = "stream",
              elem_bytes: float = 2.0) -> LoraCost:
    """Seconds, FLOPs and bytes of the LoRA kernels of N steps (``records``), each timed by
    ``roofline.op_time`` under ``timing`` (the step's: ``cost.step``)."""
    recs = records(model, tp, modules, rank, tokens, adapters, elem_bytes)
    n = np.shape(np.asarray(tokens, dtype=float).reshape(-1))[0]
    times = np.zeros((len(recs), n))
    flops, nbytes = np.zeros_like(times), np.zeros_like(times)
    for i, rec in enumerate(recs):
        times[i] = op_time(rec, hw, timing).time_s
        flops[i] = rec.flops * rec.count
        nbytes[i] = rec.bytes.total * rec.count
    return LoraCost(tuple(r.name for r in recs), times, flops, nbytes)


def adapter_bytes(model: Model, tp: int, modules: tuple[str, ...], rank: int,
                  elem_bytes: float = 2.0) -> float:
    """Bytes of one adapter of ``rank`` on one device: each layer's A (in x rank per slice)
    and B (rank x out per slice), as the engine's slot holds it and a load copies it."""
    return float(sum(lin.layers * rank * (len(lin.outs) * lin.k + sum(lin.outs))
                     for lin in linears(model, tp, modules)) * elem_bytes)
