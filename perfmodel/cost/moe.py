"""A fused MoE layer's expert GEMMs: the constants that set them apart from a dense GEMM.

Every engine runs a MoE layer's experts as two grouped GEMMs over the tokens routed to
each expert (``Gemm`` with ``experts`` set: ``groups`` experts of ``m`` rows each), with the
gated activation between them (``cost.layers``, ``compare.forms``):

- vLLM's and SGLang's Triton ``fused_moe`` (vllm ``model_executor/layers/fused_moe/
  fused_moe.py``): ``moe_align_block_size`` sorts the (token, expert) pairs by expert and
  pads each expert's rows to ``BLOCK_SIZE_M``, then one program per BLOCK_SIZE_M x
  BLOCK_SIZE_N output tile of each expert gathers its rows and streams that expert's
  weights; the tiles and waves are ``cost.tiling``'s. With fp8 weights in 128 x 128 blocks
  (``use_fp8_w8a8`` with ``group_k``) each BLOCK_K step multiplies the tensor-core partial
  sum by the activation's per-token-group scale and the weight block's scale before it
  accumulates; int4 / mxfp4 (Marlin, ``fused_moe`` w4a16) dequantize the weights in the
  kernel;
- TensorRT-LLM's CUTLASS MoE (``cutlass_kernels/moe_gemm``), FlashInfer's CUTLASS and
  trtllm-gen MoE, DeepGEMM's grouped fp8 GEMM (m-grouped contiguous layout, 128-row
  alignment per expert; DeepGEMM promotes its fp8 partial sums to fp32 on the CUDA cores
  every 128 k): the same structure with their own tiles.

A grouped expert GEMM reaches a smaller share of the tensor cores and of the memory than a
dense GEMM of the same size (rows gathered by index, per-expert tile tails, few programs per
expert at decode, the scale epilogue of block-scaled formats), and the layer around it runs
kernels a dense GEMM does not (top-k routing, the alignment sort, the weighted
un-permutation sum). Which kernel runs is the engine's choice per weight format (vLLM's
``select_*_moe_backend``, SGLang's ``--moe-runner-backend``, TensorRT-LLM's MoE backend per
quantization: e.g. vLLM on Hopper runs bf16 and fp8-block on Triton, per-tensor fp8 on
FlashInfer's CUTLASS, int4 / mxfp4 on Marlin), so a device's file carries, per engine and per
format class (``FORMATS``), from the measured MoE layers (``validate/corpus/fit.py``, stage
``moe``), ``efficiency.moe_kernels.<class>``:

- ``gemm_fraction``: the expert GEMMs' best-shape share of the dtype's peak;
- ``memory_fraction``: their weight streaming share of HBM peak;
- ``latency_s``: the fixed cost of each expert GEMM with its share of the routing, sorting
  and un-permutation kernels;
- ``expert_latency_s``: the cost each expert it runs adds (its tiles' pipeline fill and
  tail, its rows' index loads), the term that grows with the experts a step touches;
- ``programs_per_unit``: the programs per compute unit it needs to stream at its memory
  fraction (``stream_fill``): few experts at decode leave most units idle;
- ``depth_s``: the time per k element of one program's serial loop over k (one weight
  tile load after another, each waiting on memory latency): at decode a program has one
  or two M rows of work per weight tile, so its k loop, not the bandwidth, sets a floor
  of k x depth_s (vLLM H100 Triton bf16, 8 experts of 2048 x 384 at one token: 27.5 us;
  16 of 6144 x 80: 55 us);
- ``slot_s``: the time per (token, top-k) slot of the layer's routing and expert sort,
  which read every slot of the batch, the device's or not, before any expert runs
  (TensorRT-LLM ``cutlass_kernels/moe_gemm/moe_kernels.cu``: the single-block
  ``fusedBuildExpertMapsSortFirstTokenKernel`` ranks all num_tokens x k
  ``token_selected_experts`` at up to 256 tokens, and above that
  ``threeStepBuildExpertMapsSortFirstToken`` runs ``blockExpertPrefixSumKernel``, whose
  threads each load their token's k expert ids, stride k, for every local expert, then
  ``globalExpertPrefixSumKernel`` and ``mergeExpertPrefixSumKernel``). Priced on the
  layer's first expert GEMM (``Gemm.slots``); 0 (off) where the file has none: the
  Triton kernels' un-permutation already reads every slot (``compare.moe_forms.moe_layer``);
- ``scan_s``: the time per thread of the three-step sort's per-expert scans, which the
  one-block prologue does not run (``expert_scan``: local experts x tokens threads);
  priced, and 0 (off) where absent, as ``slot_s``.

A class the file lacks prices as a dense GEMM of the device (``gemm_fraction``,
``kernel_latency_s``).

Dense GEMMs of a quantized class run a kernel of their own too (fp8 per-tensor: CUTLASS
``cutlass_scaled_mm`` / TensorRT-LLM's fp8 GEMM; fp8 128 x 128 blocks: DeepGEMM or
CUTLASS's blockwise-scaled GEMM, whose fp8 partial sums are promoted and rescaled on the
CUDA cores every 128 k; nvfp4: CUTLASS / cuDNN block-scaled fp4 MMA with 16-element
scale reads), so ``efficiency.gemm_kernels.<class>`` (classes fp8, fp8_block, fp4) gives
their ``gemm_fraction``, ``memory_fraction`` and ``latency_s`` the same way; the 16-bit
GEMMs keep the device's own figures.
"""

from __future__ import annotations

import numpy as np

from perfmodel.cost.kernel_tiles import chosen_tile, whole_tiles
from perfmodel.cost.ops import Gemm
from perfmodel.cost.tiling import gemm_plan, tile_plan
from perfmodel.specs.dtypes import BYTES, CODE
from perfmodel.specs.dtypes import MOE_FORMATS as FORMATS
from perfmodel.specs.hardware import Hardware

FIELDS = ("gemm_fraction", "memory_fraction", "latency_s", "expert_latency_s",
          "programs_per_unit", "depth_s", "slot_s", "scan_s")
DENSE_FIELDS = FIELDS[:3]
# the output tile of one fused-MoE program at decode sizes: BLOCK_SIZE_M 16 (vLLM
# fused_moe get_default_config for M <= E; the m16n8k16 MMA), BLOCK_SIZE_N 64 (its tuned
# configs for small M, e.g. configs/E=*,N=*,device_name=NVIDIA_H100_80GB_HBM3.json)
PROGRAM_ROWS, PROGRAM_COLUMNS = 16, 64
# TensorRT-LLM's one-block routing prologue (moe_kernels.cu
# fusedBuildExpertMapsSortFirstToken*): at most 256 tokens, top-k 1, 2, 4, 6 or 8, and
# floor(log2(local experts + 1)) + 1 <= 9 radix bits (at most 510 local experts)
FUSED_SORT_TOKENS, FUSED_SORT_TOPK, FUSED_SORT_EXPERTS = 256, (1, 2, 4, 6, 8), 510


def expert_scan(tokens: np.ndarray, topk: np.ndarray, local_experts: np.ndarray
                ) -> np.ndarray:
    """The threads of TensorRT-LLM's three-step routing sort where the one-block prologue
    cannot run (``FUSED_SORT_*``): ``blockExpertPrefixSumKernel`` and
    ``mergeExpertPrefixSumKernel`` each launch a grid of local experts x token blocks, one
    thread per (local expert, token): each thread of the first loads its token's top-k
    expert ids to match its block's expert, then block-scans (NVIDIA/TensorRT-LLM
    000dea27, cutlass_kernels/moe_gemm/moe_kernels.cu threeStepBuildExpertMapsSortFirstToken).
    0 where the prologue is the one block's."""
    tokens, local = np.asarray(tokens, dtype=float), np.asarray(local_experts, dtype=float)
    fused = ((tokens <= FUSED_SORT_TOKENS) & np.isin(topk, FUSED_SORT_TOPK)
             & (local <= FUSED_SORT_EXPERTS))
    return np.where(fused, 0.0, local * tokens)


def is_expert(op: Gemm) -> np.ndarray:
    """Where ``op`` is a fused MoE layer's expert GEMM."""
    return np.asarray(op.experts, dtype=bool)


def block_scaled(op: Gemm) -> np.ndarray:
    """Where ``op``'s stored weights carry block scales (bytes per weight above the stored
    dtype's own: ``specs.dtypes.weight_bytes`` of a format with groups)."""
    stored = np.where(np.asarray(op.weight_dtype) >= 0, op.weight_dtype, op.dtype)
    return np.asarray(op.weight_bytes) > BYTES[np.asarray(stored, dtype=int)] * (1 + 1e-9)


def format_class(op: Gemm) -> np.ndarray:
    """Each instance's index in ``FORMATS``: the compute dtype, the stored weights'
    width and whether they carry block scales."""
    dtype = np.broadcast_to(np.asarray(op.dtype, dtype=int), op.shape)
    stored = np.broadcast_to(np.asarray(op.weight_dtype, dtype=int), op.shape)
    narrow = stored >= 0
    four = narrow & (BYTES[np.where(narrow, stored, 0)] < 1)
    fp8 = dtype == CODE["fp8"]
    out = np.where(fp8, np.where(four, 5, np.where(block_scaled(op), 2, 1)), 0)
    out = np.where(dtype == CODE["fp4"], 3, out)
    sixteen = BYTES[dtype] >= 2
    return np.where(sixteen & four, 4, np.where(sixteen & narrow, 6, out))


def _table(hw: Hardware, op: Gemm, field: int, dense: np.ndarray | float
           ) -> np.ndarray | float:
    """``FIELDS[field]`` per instance: an expert GEMM's from ``moe_kernels``, a dense
    quantized GEMM's from ``gemm_kernels`` (its first three fields), ``dense`` for any
    other GEMM, a class the file lacks or a field its row does not carry."""
    eff = hw.efficiency
    moe_rows = eff.moe_kernels if np.any(op.experts) else {}
    dense_rows = eff.gemm_kernels if field < len(DENSE_FIELDS) else {}
    if not moe_rows and not dense_rows:
        return dense
    cls = format_class(op)
    expert = is_expert(op)
    out = np.broadcast_to(np.asarray(dense, dtype=float), op.shape).copy()
    m = np.broadcast_to(np.asarray(op.m, dtype=float), op.shape)
    for i, name in enumerate(FORMATS):
        if name in moe_rows and field < len(moe_rows[name]):
            out = np.where(expert & (cls == i), moe_rows[name][field], out)
        for m_max, key in reversed(dense_buckets(dense_rows, name)):
            out = np.where(~expert & (cls == i) & (m <= m_max), dense_rows[key][field], out)
        if f"{name}@{UNALIGNED}" in dense_rows:
            out = np.where(~expert & (cls == i) & unaligned(op),
                           dense_rows[f"{name}@{UNALIGNED}"][field], out)
    return out


def dense_buckets(table: dict[str, tuple[float, ...]], name: str
                  ) -> list[tuple[float, str]]:
    """(largest M, key) of each row of class ``name`` in a ``gemm_kernels`` table, by M:
    ``<class>@<m_max>`` rows (one per M bucket of the engine's dispatch, e.g. vLLM's
    CUTLASS fp8 configs for M <= 16, <= 64, <= 128, above), then the plain ``<class>``
    row; the last covers every larger M. A ``<class>@unaligned`` row (``unaligned``)
    replaces them where DeepGEMM cannot run the shape."""
    rows = sorted((float(k.partition("@")[2]), k) for k in table
                  if k.partition("@")[0] == name and k.partition("@")[2].isdigit())
    if name in table:
        rows.append((np.inf, name))
    return [*rows[:-1], (np.inf, rows[-1][1])] if rows else []


def dense_key(hw: Hardware, op: Gemm) -> list[tuple[np.ndarray, str]]:
    """(mask, ``gemm_kernels`` key) of every bucket row ``op``'s dense quantized
    instances price with (``cost.eager`` reads the host path of the same row)."""
    table = hw.efficiency.gemm_kernels
    if not table:
        return []
    cls = format_class(op)
    dense = ~is_expert(op)
    m = np.broadcast_to(np.asarray(op.m, dtype=float), op.shape)
    out = []
    for i, name in enumerate(FORMATS):
        lower = -np.inf
        for m_max, key in dense_buckets(table, name):
            out.append((dense & (cls == i) & (m > lower) & (m <= m_max), key))
            lower = m_max
        if f"{name}@{UNALIGNED}" in table:
            off = dense & (cls == i) & unaligned(op)
            out = [(mask & ~off, k) for mask, k in out] + [(off, f"{name}@{UNALIGNED}")]
    return out


# DeepGEMM's fp8 GEMM needs N % 64 == 0 and K % 128 == 0 (vllm/utils/deep_gemm.py
# should_use_deepgemm_for_fp8_linear: N_MULTIPLE 64, K_MULTIPLE 128); vLLM runs other
# block-fp8 linears on CUTLASS's blockwise kernel (or Triton's), a kernel of its own
DEEPGEMM_N, DEEPGEMM_K = 64, 128
UNALIGNED = "unaligned"


def unaligned(op: Gemm) -> np.ndarray:
    """Where a dense fp8-block GEMM's shape is one DeepGEMM cannot run."""
    n, k = np.asarray(op.n, dtype=float), np.asarray(op.k, dtype=float)
    return (np.mod(n, DEEPGEMM_N) != 0) | (np.mod(k, DEEPGEMM_K) != 0)


def plan(op: Gemm, hw: Hardware) -> tuple[np.ndarray, np.ndarray]:
    """(achievable compute fraction, split-K factor) of a GEMM (``tiling.gemm_plan``); an
    expert GEMM never splits k (Triton's fused_moe grid is M blocks x N blocks of each
    expert; CUTLASS's grouped GEMM one tile per program) and runs at its kernel's share
    (``compute_factor``) where the file has a fused-MoE table; without one, a dense plan;
    neither does a dense quantized GEMM with a kernel of its own (``own_kernel``)."""
    frac, split = gemm_plan(op.m, op.n, op.k, op.groups, hw)
    whole_k = is_expert(op) if hw.efficiency.moe_kernels else np.zeros(op.shape, bool)
    if hw.efficiency.gemm_kernels:
        whole_k = whole_k | own_kernel(op, hw)
    if not np.any(whole_k):
        return frac * compute_factor(op, hw), split
    whole, _ = gemm_plan(op.m, op.n, op.k, op.groups, hw, may_split=False)
    whole = own_tile_plan(op, hw, whole)
    return (np.where(whole_k, whole, frac) * compute_factor(op, hw),
            np.where(whole_k, 1.0, split))


def own_tile_plan(op: Gemm, hw: Hardware, whole: np.ndarray) -> np.ndarray:
    """``whole`` (the one-program-per-tile fraction of the device's tile menu), where a
    dense quantized GEMM's ``gemm_kernels`` key names a kernel that picks its own tile
    (``efficiency.gemm_kernel_tiles``) the fraction of the tile that kernel chooses
    (``kernel_tiles.chosen_tile``: its padding, waves and operand share, ``tiling.tile_plan``,
    with the key's own k-depth ramp ``gemm_kernel_k_half`` where the file has one)."""
    named = hw.efficiency.gemm_kernel_tiles
    if not named:
        return whole
    m, n, k = (np.broadcast_to(np.asarray(v, dtype=float), op.shape) for v in (op.m, op.n, op.k))
    for mask, key in dense_key(hw, op):
        if key in named and np.any(mask):
            bm, bn, share = chosen_tile(named[key], m, n, k, hw.compute_units)
            k_half = hw.efficiency.gemm_kernel_k_half.get(key)
            mine = tile_plan(m, n, k, op.groups, hw, (bm, bn), k_half,
                             whole_tiles(named[key])) * share
            whole = np.where(mask, mine, whole)
    return whole


def own_kernel(op: Gemm, hw: Hardware) -> np.ndarray:
    """Where a dense GEMM runs a quantized kernel of its own (its class has a
    ``gemm_kernels`` row): those never split k. vLLM's and sgl-kernel's CUTLASS
    ``scaled_mm`` configs run one persistent tile per output tile
    (``scaled_mm_sm90_fp8_dispatch.cuh``: ``PersistentScheduler``, no stream-K), and
    DeepGEMM's normal fp8 GEMM one block per output tile over the whole k
    (``heuristics/sm90.hpp``: layouts of block_m x block_n only). An engine block with
    ``gemm_kernels_split_k`` (AITER's CK blockscale GEMM, whose tuned configs carry a
    ``splitK``) splits as a dense GEMM does."""
    cls = format_class(op)
    listed = [i for i, name in enumerate(FORMATS) if dense_buckets(hw.efficiency.gemm_kernels,
                                                                    name)]
    return ~is_expert(op) & np.isin(cls, listed) & (not hw.efficiency.gemm_kernels_split_k)


def compute_factor(op: Gemm, hw: Hardware) -> np.ndarray | float:
    """The factor on a GEMM's achievable compute fraction: 1, or for an expert GEMM its
    kernel's best-shape share over the dense one."""
    eff = hw.efficiency
    return _table(hw, op, 0, eff.gemm_fraction) / eff.gemm_fraction


def memory_fraction(op: Gemm, hw: Hardware, dense: np.ndarray | float) -> np.ndarray | float:
    """An expert GEMM's streaming fraction (its kernel's, times ``stream_fill``), else
    ``dense``."""
    own = _table(hw, op, 1, dense)
    if not hw.efficiency.moe_kernels or not np.any(op.experts):
        return own
    fill = stream_fill(op, hw, _table(hw, op, 4, 0.0))
    return np.where(is_expert(op), own * fill, own)


def stream_fill(op: Gemm, hw: Hardware, per_unit: np.ndarray | float) -> np.ndarray:
    """The share of the streaming rate a grouped GEMM of few programs reaches: its
    programs (one per PROGRAM_ROWS x PROGRAM_COLUMNS output tile of each expert) over the
    ``per_unit`` programs per compute unit that keep enough loads in flight to saturate
    the memory (Little's law), at most 1. At decode under expert parallelism a device runs
    one or two experts, a few dozen programs: 132 SMs cannot all stream (vLLM H100 fused
    MoE, E 256, 6144 x 2048 experts: one expert streams at 1.2 TB/s, eight at 2.7 TB/s)."""
    m = np.asarray(op.m, dtype=float)
    rows = np.where(m <= PROGRAM_ROWS, PROGRAM_ROWS, 4 * PROGRAM_ROWS)
    programs = np.ceil(np.asarray(op.groups)) * np.ceil(m / rows) \
        * np.ceil(np.asarray(op.n) / PROGRAM_COLUMNS)
    need = np.maximum(np.asarray(per_unit, dtype=float) * hw.compute_units, 1e-9)
    return np.minimum(1.0, programs / need)


def row_cost(op: Gemm, hw: Hardware) -> np.ndarray | float:
    """Seconds a dense quantized GEMM's activation quantization adds per row, m x
    ``gemm_row_s`` of its class: vLLM's per-tensor dynamic fp8 quantization
    (csrc/quantization/w8a8/fp8/common.cu, dynamic_scaled_fp8_quant) launches
    ``segmented_max_reduction`` on a grid of one block per token, each block ending in an
    ``atomicMaxFloat`` on the tensor's one scale: same-address atomics serialise, a
    cost per token whatever the width (vLLM H100: 4.8 us at 1 token, 122 us at 16,384
    tokens of 32 elements). Per-token-group quantization (SGLang's and TensorRT-LLM's
    ``per_token_group_quant_fp8`` before DeepGEMM) writes each row's scales in the
    column-major, TMA-aligned layout DeepGEMM reads, a store per row and group; its
    ``row_s`` is fitted the same way, near 0 where a kernel adds nothing per row."""
    rows = hw.efficiency.gemm_row_s
    if not rows:
        return 0.0
    cls = format_class(op)
    dense = ~is_expert(op)
    per = np.zeros(op.shape)
    for i, name in enumerate(FORMATS):
        if name in rows:
            per = np.where(dense & (cls == i), rows[name], per)
    return per * np.asarray(op.m, dtype=float)


def fixed_cost(op: Gemm, hw: Hardware) -> np.ndarray | float:
    """One GEMM kernel's fixed cost: its kernel's for an expert GEMM (plus its cost per
    expert it runs, per k element of a program's loop and, on the layer's first, per
    (token, top-k) slot its routing and sort read, ``slot_s`` x ``slots``, and per thread
    of its three-step sort, ``scan_s`` x ``scan``), else ``gemm``'s."""
    if not np.any(op.experts):
        return _table(hw, op, 2, hw.efficiency.latency_for("gemm")) + row_cost(op, hw)
    per, depth, slot, scan = (_table(hw, op, i, 0.0) for i in (3, 5, 6, 7))
    return (_table(hw, op, 2, hw.efficiency.latency_for("gemm"))
            + per * np.asarray(op.groups) + depth * np.asarray(op.k)
            + slot * np.asarray(op.slots) + scan * np.asarray(op.scan))
