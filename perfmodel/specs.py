"""Frozen records for everything the model reads: dtypes, hardware, model shapes, workloads.

Records hold validated values in base SI units (see ``units``). They are built by ``load`` from
files, or directly from Python; constructors check invariants and raise ``SpecError``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, TypeVar

# Bytes per element. Floats: int4/fp4 are half a byte (integer division would make them 0).
DTYPE_BYTES: dict[str, float] = {
    "fp32": 4.0, "tf32": 4.0, "bf16": 2.0, "fp16": 2.0,
    "fp8": 1.0, "int8": 1.0, "int4": 0.5, "fp4": 0.5,
}
DTYPES = tuple(DTYPE_BYTES)


T = TypeVar("T")


class SpecError(ValueError):
    """A user mistake in a spec or argument; the message is one line naming file and field."""


def read_user_file(path: Path, what: str, parse: Callable[[Path], T],
                   errors: tuple[type[Exception], ...]) -> T:
    """``parse(path)``, with a missing file or any of ``errors`` turned into a one-line
    SpecError: "PATH: no such file" or "PATH: not WHAT: <first line of the error>"."""
    if not path.is_file():
        raise SpecError(f"{path}: no such file")
    try:
        return parse(path)
    except errors as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise SpecError(f"{path}: not {what}: {first}") from None


def dtype_bytes(name: str, where: str = "dtype") -> float:
    """Bytes per element of dtype ``name``; SpecError naming ``where`` if unknown."""
    if name not in DTYPE_BYTES:
        raise SpecError(f"{where}: unknown dtype {name!r}, expected one of {', '.join(DTYPES)}")
    return DTYPE_BYTES[name]


def compute_dtype(weights: str, acts: str) -> str:
    """Dtype a matmul of ``weights`` x ``acts`` runs at: the wider of the two operands.

    Weight-only quantization (int4/int8/fp8 weights, bf16 activations) dequantizes to the
    activation dtype and runs at its rate; both operands fp8 runs at the fp8 rate.
    """
    if DTYPE_BYTES[weights] >= DTYPE_BYTES[acts]:
        return weights
    return acts


@dataclass(frozen=True)
class Efficiency:
    """Achievable fractions and fixed costs; defaults documented in each hardware YAML."""

    gemm_fraction: float = 0.8          # best-shape dense GEMM / dense peak
    memory_fraction: float = 0.9        # streaming bandwidth / peak bandwidth
    collective_fraction: float = 0.8    # all-reduce bus bandwidth / per-direction link
    gemm_tile_m: int = 128              # GEMM output tile (wave quantization)
    gemm_tile_n: int = 128
    kernel_latency_s: float = 2e-6      # device-side fixed cost per kernel
    launch_overhead_s: float = 2.5e-6   # host launch per kernel; hidden under CUDA graphs
    # GEMM efficiency *= k / (k + gemm_k_half): the pipeline prologue and epilogue of each
    # output tile cost about this many k elements (3-4 stages x 32-64 deep k slices)
    gemm_k_half: float = 128.0
    # FlashAttention's MMA rate: softmax and rescaling share the SMs with the tensor cores.
    # None: 0.84 x gemm_fraction (FA2 73% vs cuBLAS 87% of A100 peak, Dao 2023)
    attention_fraction: float | None = None
    # FlashAttention prefill tiles: a program holds attention_tile_q query rows of one head
    # and steps over the keys attention_tile_kv at a time; a causal mask skips the key tiles
    # past the diagonal but computes the diagonal ones in full. The query tile is given as
    # (min q_len, tile) steps, since a kernel may pick it by sequence length (PyTorch's CPU
    # flash attention does). Default: FlashAttention-2 for head_dim 128 on sm80 (128 x 64).
    attention_tile_q: tuple[tuple[int, int], ...] = ((1, 128),)
    attention_tile_kv: int = 64
    # the last key tile of a block ends at kv_len (a CPU kernel runs a GEMM on the keys that
    # remain: PyTorch's CPU flash attention) instead of computing a whole padded tile (GPU
    # tensor-core MMAs on a full tile, FlashAttention)
    attention_clip_kv: bool = False
    # the query heads sharing a KV head may share a tile's rows (FlashAttention-3's PackGQA,
    # FlashInfer): a short chunk (speculative verification, small chunked prefill) then fills
    # the rows with heads instead of padding. Decode (q_len = 1) always packs. The model takes
    # the better of packed and unpacked when true; false: prefill never packs (FA2, CPU)
    attention_pack_gqa: bool = True
    # decode (q_len = 1): true, a program holds the query heads of one KV head (FlashAttention)
    # and long caches are split over programs; false, one query head per program and no key
    # split, each streaming its KV head's cache again (PyTorch's CPU flash attention: a
    # matrix-vector product per head). calibrate on CPU: false
    attention_decode_pack_gqa: bool = True
    # prefill runs as FlashAttention-2's flash_attn_with_kvcache given the chunk's new K/V
    # (Sarathi-Serve; vLLM's chunked prefill before its varlen path): the split-KV kernel,
    # 64 query rows x decode_kv_tile keys per program, keys split over programs when they are
    # few (num_splits_heuristic, then a combine kernel), and every (query block, query head)
    # program first copies the chunk's new K/V, up to its own causal end, into the cache
    # (its Append_KV prologue: all programs of a KV head write the same rows). false: the
    # standard path (the cache written by its own kernel, then the varlen forward kernel)
    attention_append_kv: bool = False
    memory_half_bytes: float = 0.0      # bandwidth efficiency *= b / (b + memory_half_bytes)
    # a GEMM's operand streaming overlaps its multiply-adds (GPU: asynchronous copies feed
    # the tensor cores, time = max of the two); false: they add (a CPU BLAS core packs a
    # weight panel, then multiplies it: time = compute + streaming). calibrate on CPU: false
    gemm_overlap: bool = True
    # GEMM efficiency *= m / (m + gemm_m_half) for m > 1, replacing the row padding: a CPU
    # BLAS packs each weight panel once per call and reuses it for the m rows, so the packing
    # (about gemm_m_half rows' worth of work) dominates skinny GEMMs. 0: off (GPU tiles)
    gemm_m_half: float = 0.0
    # GEMM efficiency *= gemm_n_half / (gemm_n_half + n) for m > 1: a CPU BLAS's packed path
    # slows as the output widens (each k-panel pass walks more weight rows and pages than its
    # caches and TLB hold). 0: off (GPUs, where wide outputs only add tiles)
    gemm_n_half: float = 0.0
    # streaming fraction of GEMM operand traffic (a CPU BLAS packing its weight panels; with
    # gemm_overlap false this time adds to the multiply-adds). None: memory_fraction
    gemm_memory_fraction: float | None = None
    # streaming fraction of a matrix-vector product (m = 1; BLAS runs a GEMV kernel, which
    # does not pack). None: gemm_memory_fraction
    gemv_memory_fraction: float | None = None
    # GEMV streaming *= k / (k + gemv_k_half): each output element's dot product ends in a
    # fixed cost (horizontal reduction, store, loop set-up) worth gemv_k_half streamed
    # elements, so short-k GEMVs stream slower (CPU BLAS; fitted on sync devices). 0: off
    gemv_k_half: float = 0.0
    # kernel kind -> streaming fraction replacing memory_fraction for that kind (calibrated:
    # e.g. a two-pass norm or a scalar-load activation reaches less than a vector add)
    kernel_memory_fraction: dict[str, float] = field(default_factory=dict)
    # kernel kind -> streaming rate per compute unit (bytes/s per SM, or per CPU thread) that
    # caps the kind's bandwidth at (units it runs on) x rate: a kernel whose loads are too
    # narrow to keep enough bytes in flight per SM (Little's law) is bounded by its SMs, not
    # by the memory; the cap carries a measured kernel from one GPU to another with the SM
    # count. On a CPU it is what one thread delivers (see parallel_grain_elements). Fitting
    # a kind's memory_fraction without its rate replaces the cap
    kernel_unit_bytes_per_s: dict[str, float] = field(default_factory=dict)
    # a host (CPU) kernel of e elements runs on min(compute_units, ceil(e / grain)) threads:
    # PyTorch's at::parallel_for hands each thread at least at::internal::GRAIN_SIZE = 32768
    # elements, so decode-sized elementwise kernels run on one thread. Applies to the
    # memory-bound kinds (not GEMMs or attention, which thread their own way). 0: off (GPUs)
    parallel_grain_elements: int = 0
    # kernel kind -> fixed device time replacing kernel_latency_s for that kind (calibrated:
    # e.g. a split-KV decode attention with its combine pass, or an op dispatched as several)
    kernel_latency_by_kind: dict[str, float] = field(default_factory=dict)
    # async: host launches overlap device work (GPUs); sync: each op's dispatch adds to its
    # time (CPU eager execution)
    launch_mode: str = "async"
    # host time per decoder layer per step outside every operator (eager framework glue:
    # Python, module calls, views and reshapes). Added once per layer on a sync device;
    # on an async device host work overlaps device work, so it is not applied. 0: off
    layer_overhead_s: float = 0.0

    def memory_fraction_for(self, kind: str) -> float:
        return self.kernel_memory_fraction.get(kind, self.memory_fraction)

    def gemm_memory_fraction_for(self, m: float) -> float:
        """Streaming fraction of a GEMM with ``m`` rows (m = 1: a matrix-vector product)."""
        if m <= 1 and self.gemv_memory_fraction is not None:
            return self.gemv_memory_fraction
        if self.gemm_memory_fraction is not None:
            return self.gemm_memory_fraction
        return self.memory_fraction

    def attention_q_tile(self, q_len: float) -> int:
        """Query rows per attention program for a prefill of ``q_len`` new tokens."""
        tile = self.attention_tile_q[0][1]
        for min_q, step in self.attention_tile_q:
            if q_len >= min_q:
                tile = step
        return tile

    def latency_for(self, kind: str) -> float:
        return self.kernel_latency_by_kind.get(kind, self.kernel_latency_s)

    @property
    def attention(self) -> float:
        return self.attention_fraction if self.attention_fraction is not None \
            else 0.84 * self.gemm_fraction


@dataclass(frozen=True)
class Interconnect:
    link_bytes_per_s: float             # per device, per direction
    latency_s: float                    # per hop (one ring step)
    topology: str = "switch"
    max_devices: int = 8
    collective_latency_s: float = 0.0   # fixed cost of one collective (launch, handshakes)


@dataclass(frozen=True)
class Hardware:
    """One accelerator. FLOP/s are dense; bandwidth and capacity are decimal SI."""

    name: str
    peak_flops_per_s: dict[str, float]
    memory_bytes: float
    memory_bytes_per_s: float
    compute_units: int
    l2_bytes: float
    interconnect: Interconnect
    efficiency: Efficiency = field(default_factory=Efficiency)
    vendor: str = "other"
    description: str = ""
    sources: dict[str, str] = field(default_factory=dict)
    calibration: dict | None = None

    def peak(self, dtype: str) -> float:
        """Dense peak FLOP/s at ``dtype``; else the other 16-bit float (fp16 <-> bf16 share a
        datapath); else the nearest wider supported dtype (e.g. fp8 on Ampere runs as bf16)."""
        if dtype in self.peak_flops_per_s:
            return self.peak_flops_per_s[dtype]
        twin = {"fp16": "bf16", "bf16": "fp16"}.get(dtype)
        if twin in self.peak_flops_per_s:
            return self.peak_flops_per_s[twin]
        wider = sorted((d for d in self.peak_flops_per_s if DTYPE_BYTES[d] > DTYPE_BYTES[dtype]),
                       key=lambda d: DTYPE_BYTES[d])
        for candidate in wider:
            return self.peak_flops_per_s[candidate]
        raise SpecError(f"hardware {self.name}: compute.peak_flops_per_s has no rate for {dtype} "
                        f"or any wider dtype (it lists {', '.join(self.peak_flops_per_s)}); "
                        f"choose a narrower --weights-dtype / --act-dtype / --kv-dtype")

    def ridge_point(self, dtype: str = "bf16") -> float:
        """Arithmetic intensity (FLOP/byte) where the compute and memory roofs meet."""
        return self.peak(dtype) / self.memory_bytes_per_s


@dataclass(frozen=True)
class MLA:
    """DeepSeek multi-head latent attention dimensions."""

    q_lora_rank: int | None
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int


@dataclass(frozen=True)
class MoE:
    n_experts: int
    top_k: int
    expert_intermediate_size: int
    n_shared_experts: int = 0
    first_dense_layers: int = 0


LayerKind = Literal["global", "local"]


@dataclass(frozen=True)
class Model:
    """A decoder-only transformer shape. Sizes are element counts."""

    name: str
    n_layers: int
    d_model: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    vocab_size: int
    intermediate_size: int
    gated_mlp: bool = True
    activation: str = "silu"
    norm: str = "rms"
    norms_per_layer: int = 2
    tie_embeddings: bool = False
    position: str = "rope"
    max_position_embeddings: int = 0       # context limit (0: unknown); learned-table rows
    qkv_bias: bool = False
    linear_bias: bool = False
    parallel_block: bool = False
    sliding_window: int | None = None
    layer_pattern: tuple[str, ...] = ()
    logit_softcap: float | None = None
    mla: MLA | None = None
    moe: MoE | None = None
    mtp_modules: int = 0
    family: str = ""
    source: str = ""

    def layer_kinds(self) -> list[str]:
        """'local' or 'global' for every layer, from the window and the repeating pattern."""
        if self.sliding_window is None:
            return ["global"] * self.n_layers
        pattern = self.layer_pattern or ("local",)
        return [pattern[i % len(pattern)] for i in range(self.n_layers)]

    def is_moe_layer(self, index: int) -> bool:
        return self.moe is not None and index >= self.moe.first_dense_layers

    @property
    def attention_kind(self) -> str:
        """mha / gqa / mqa / mla, for reports."""
        if self.mla is not None:
            return "mla"
        if self.n_kv_heads == self.n_heads:
            return "mha"
        return "mqa" if self.n_kv_heads == 1 else "gqa"


@dataclass(frozen=True)
class Workload:
    """What is asked of the model: batch, lengths, dtypes and parallelism.

    ``batch`` sequences, each a prompt of ``prompt_len`` tokens followed by ``gen_len``
    generated tokens. The prefill emits the first generated token; the remaining
    ``gen_len - 1`` come from decode steps.
    """

    batch: int = 1
    prompt_len: int = 512
    gen_len: int = 128
    weights_dtype: str = "bf16"
    act_dtype: str = "bf16"
    kv_dtype: str = "bf16"
    weight_group_size: int | None = None   # group-quantized weights carry a 16-bit scale per group
    tp: int = 1
    usable_memory_fraction: float = 0.9    # share of device memory the server may use
    kv_block_tokens: int = 16              # paged-KV block size; 1 = no paging
    cuda_graphs: bool = False              # decode launched as a graph: no per-kernel host cost

    def __post_init__(self) -> None:
        for name in ("batch", "prompt_len", "gen_len", "tp", "kv_block_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise SpecError(f"workload: {name} must be a positive integer, got {value!r}")
        for name in ("weights_dtype", "act_dtype", "kv_dtype"):
            dtype_bytes(getattr(self, name), f"workload: {name}")
        if self.weight_group_size is not None and self.weight_group_size < 1:
            raise SpecError("workload: weight_group_size must be a positive integer")
        if not 0 < self.usable_memory_fraction <= 1:
            raise SpecError("workload: usable_memory_fraction must be in (0, 1]")

    @property
    def weight_bytes_per_param(self) -> float:
        """Bytes per matmul weight, including a 16-bit scale per group when grouped."""
        extra = 2.0 / self.weight_group_size if self.weight_group_size else 0.0
        return DTYPE_BYTES[self.weights_dtype] + extra

    @property
    def final_len(self) -> int:
        return self.prompt_len + self.gen_len
