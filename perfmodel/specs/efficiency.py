"""The efficiency model of a device (or of one engine's view of it): the achieved shares of
peak, fixed costs and kernel tables the cost layer prices with (``specs.efficiency_block``
reads it from a hardware YAML; ``specs.hardware.Hardware`` carries it)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class DequantKernel:
    """The kernel a GPU runs for a matmul whose weights are stored narrower than its 16-bit
    activations (weight-only int4/int8/fp8): it loads the packed weights and their scales,
    turns each weight into a 16-bit operand in registers, then multiplies (``cost.dequant``).

    ``ops_per_weight``: issue slots per weight of that conversion (integer unpack, convert,
    scale and zero), counted from the kernel's source; an instruction whose pipe runs slower
    than the issue rate counts issue rate / its rate slots. ``tile_m``: rows of activations
    one dequantized weight tile serves (each tile of m rows dequantizes the weights again).
    ``overlap``: the kernel prefetches the next weights while it converts the current ones
    (asynchronous copies in a software pipeline), so the conversion hides under the weight
    stream (max); false: it loads into registers and converts them in the same iteration,
    so the two add up."""

    ops_per_weight: float
    tile_m: int = 16
    overlap: bool = False


@dataclass(frozen=True)
class Efficiency:
    """Achievable fractions and fixed costs; defaults documented in each hardware YAML."""

    gemm_fraction: float = 0.8          # best-shape dense GEMM / dense peak
    memory_fraction: float = 0.9        # streaming bandwidth / peak bandwidth
    collective_fraction: float = 0.8    # all-reduce bus bandwidth / per-direction link
    gemm_tile_m: int = 128              # GEMM output tile (wave quantization)
    gemm_tile_n: int = 128
    # other output tiles (rows, columns) the GEMM library may run instead (cuBLAS's
    # heuristics, CUTLASS's tile menus), each at gemm_fraction, one program per tile: a GEMM
    # takes whichever of them and the tile above prices it fastest (``tiling.gemm_choice``)
    gemm_tiles: tuple[tuple[int, int], ...] = ()
    kernel_latency_s: float = 2e-6      # device-side fixed cost per kernel
    launch_overhead_s: float = 2.5e-6   # host launch per kernel; hidden under CUDA graphs
    # GEMM efficiency *= k / (k + gemm_k_half): the pipeline prologue and epilogue of each
    # output tile cost about this many k elements (3-4 stages x 32-64 deep k slices)
    gemm_k_half: float = 128.0
    # FlashAttention's MMA rate: softmax and rescaling share the SMs with the tensor cores.
    # None: 0.84 x gemm_fraction (FA2 73% vs cuBLAS 87% of A100 peak, Dao 2023)
    attention_fraction: float | None = None
    # the decode kernel's MMA share where the engine decodes with a kernel of its own (AITER's
    # assembly MLA decode, aiter/mla.py mla_decode_fwd, beside CK's fmha prefill); None:
    # attention_fraction (cost/attention.py decode_pool)
    attention_decode_fraction: float | None = None
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
    # fixed work of one attention program (thread block), in key positions of its own tile:
    # loading its queries, page table and softmax state, writing its output, whatever its
    # keys (0: none). Fitted by calibrate --from; a decode of many short sequences is made
    # of it
    attention_program_keys: float = 0.0
    # the same for the decode kernel where the engine decodes with a kernel of its own
    # (TensorRT-LLM's XQA beside its context FMHA; 0: as attention_program_keys)
    attention_decode_program_keys: float = 0.0
    # the fixed cost of that decode kernel's call (0: the attention call's,
    # kernel_latency_s.attention); set, a call with prefill and decode groups pays both, the
    # engine running its context and generation kernels one after the other
    attention_decode_latency_s: float = 0.0
    # and its per-score softmax work, as attention_head_dim_half is the block's (0: as that)
    attention_decode_head_dim_half: float = 0.0
    # how that decode kernel splits a sequence's keys over programs: '' FlashAttention-2's
    # num_splits_heuristic (tiling.kv_splits); 'xqa' TensorRT-LLM's XQA multi-block count
    # (cost/decode_fallback.py xqa_splits)
    attention_decode_splits: str = ""
    # query rows of a decode program's tile: a KV group's query heads are padded to it
    # (0: the smallest power of two from 16 to 128, a kernel for skinny shapes)
    attention_decode_tile_q: int = 0
    # the same for a decode over MLA's latent cache (Q/K wider than 256: the absorbed form),
    # whose kernels tile a KV head's query heads in 64 rows: FlashMLA (BLOCK_SIZE_M 64, the
    # query heads padded to it: deepseek-ai/FlashMLA csrc/.../splitkv_mla) and
    # FlashAttention-3 for head dims 64 + 512 (hopper/tile_size.h tile_size_fwd_sm90:
    # headdim_v 512 -> kBlockM 64), Hopper's kernels; Blackwell's trtllm-gen MLA kernels
    # tile otherwise (unpublished). 0: as attention_decode_tile_q
    attention_decode_tile_q_latent: int = 0
    # the same for an 8-bit KV cache, where the engine runs another decode kernel for it:
    # TensorRT-LLM's XQA runs an fp8 cache on sm90 with its GMMA kernel, whose swap-AB tile
    # pads a group to 8 rows (cpp/kernels/xqa/mha_sm90.cu: ctaNbQHeads = roundUp(headGrpSize
    # x beamWidth, swapAB ? 8 : 64)), a 16-bit cache with its HMMA kernel (mha.cu: warpTile.y
    # = roundUp(headGrpSize x beamWidth, 16)). 0: as attention_decode_tile_q
    attention_decode_tile_q_fp8: int = 0
    # query heads per KV head the engine's decode kernel serves, from min to max (0: any);
    # other groups run its fallback kernel (cost/decode_fallback.py). TensorRT-LLM's XQA:
    # 2 to 32 (decoderXQAImplJIT/kernelUtils.cpp: plain MHA with beam 1 is refused, and
    # head_grp_size x beam_width > 32), the rest runs masked multi-head attention (MMHA)
    attention_decode_min_group: int = 0
    attention_decode_max_group: int = 0
    # the fallback decode kernel's share of the fp32 (CUDA-core) peak: MMHA computes its dot
    # products on the CUDA cores, one thread block per query head (0: no fallback)
    attention_fallback_fraction: float = 0.0
    # the share of the compute units the main decode kernel's blocks must fill for the engine
    # to run it, else the fallback runs (TensorRT-LLM: 1 / kEnableMinBlockFactor = 0.25 of
    # the SMs in KV heads x sequences x past keys // 512, DecoderXQARunner::mayHavePerfGain).
    # 0: always the main kernel
    attention_decode_min_waves: float = 0.0
    # the fallback kernel's own fixed work per program (one query head of one sequence), in
    # its threads' loop steps: MMHA's thread reads one 16-byte vector of a key or value per
    # step, whatever head_dim, so a step is 8 x 256 threads / head_dim key positions
    # (cost/decode_fallback.py fallback_program_keys; 0: none)
    attention_fallback_program_steps: float = 0.0
    # attention's MMA share x head_dim / (head_dim + this): the per-score softmax work (an
    # exp, max, rescale) that does not scale with head_dim (0: off; cost/attention.py)
    attention_head_dim_half: float = 0.0
    # the backend quantizes a 16-bit query to an fp8 KV cache's dtype itself and runs FP8
    # attention (SGLang 0.5.14 fa3: q.to(kv dtype) for head_dim <= 256,
    # flashattention_backend.py; trtllm_mha: scaled_fp8_quant on Q, trtllm_mha_backend.py):
    # an FP8-cache call computes at the FP8 rate and pays that cast, a small kernel of its
    # own. false: a 16-bit query reads the FP8 cache with descales (FlashInfer, Triton)
    attention_q_cast: bool = False
    # that cast is done by an earlier kernel of the step, not one of its own: TensorRT-LLM's
    # MLA generation quantizes the query in its rope / cache-write kernel
    # (mla_rope_generation fills quant_q_buffer, tensorrt_llm/_torch/attention_backend/
    # trtllm.py), so the FP8-cache call computes in FP8 and pays no cast kernel or bytes
    attention_q_cast_fused: bool = False
    # query heads of one KV head a latent (MLA) decode CTA holds, by the KV group's size
    # ({min group: rows}; empty: off): a larger group runs ceil(group / rows) CTAs per
    # sequence, each streaming the sequence's latent cache again. TensorRT-LLM's trtllm-gen
    # MLA generation (cpp/tensorrt_llm/kernels/trtllmGenKernels/fmha/fmhaKernels.h,
    # hashFromRunnerParams / computeNumCtas): up to 32 heads SwapsMmaAb with 8 (up to 8) or
    # 16 heads a CTA, above KeepsMmaAb with 64, 128 heads on a 2-CTA MMA pair (one stream);
    # FlashMLA: 64 (BLOCK_SIZE_M)
    attention_latent_cta_rows: tuple[tuple[int, int], ...] = ()
    # how that kernel splits and schedules a latent decode's keys: '' as the block's decode;
    # 'trtllm_gen' (trtllm_gen_splits, reduces_in_kernel), 'flashmla' (its tile scheduler,
    # flashmla_fill; cost/latent_tiles.py)
    attention_latent_sched: str = ""
    # the fixed time of each such CTA whatever its keys (its queries, page table, tensor
    # memory, output), the CTAs spread over the SMs (cost/latent_tiles.py latent_costs)
    attention_cta_s: float = 0.0
    # the share of each further CTA's stream of the same cache that reaches HBM (the rest
    # is served by L2, read by a concurrent CTA of the same sequence)
    attention_restream_fraction: float = 0.0
    # attention kernel (a corpus row's ``kernel``: the backend the collector timed; with
    # ``@fp8``, its FP8-compute instantiation) -> the profile of its constants laid over this
    # block's (specs/efficiency_block.py PROFILE_FIELDS); the block's own constants are its
    # ``attention_backend``'s
    attention_kernels: dict[str, dict[str, float]] = field(default_factory=dict)
    # the kernel this block's attention constants describe: the engine's default backend on
    # this device (serving prices attention with it; '' unnamed)
    attention_backend: str = ""
    # the kernel MLA's absorbed decode (K and V from one latent, cost.tiling.latent_attention) runs
    # where it is not the block's backend: a profile of ``attention_kernels`` laid over the
    # block for those calls ('' none: the block's own constants). TensorRT-LLM decodes
    # MHA/GQA with XQA and DeepSeek-dim MLA with FlashMLA (SM90) or trtllm-gen (Blackwell)
    attention_latent_kernel: str = ""
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
    # a fused MoE layer's expert GEMMs per weight-format class (``cost.moe.FORMATS``):
    # (best-shape share of the dtype's peak, streaming share of HBM peak, fixed cost s, cost
    # per expert run s, programs per SM to stream at that share, s per k element of a
    # program's serial loop, s per (token, top-k) slot of the layer's routing and sort, s
    # per thread of its three-step sort's expert scans) of the kernel the engine runs for
    # it; a class not listed prices as a dense GEMM
    moe_kernels: dict[str, tuple[float, ...]] = field(default_factory=dict)
    # a dense GEMM of a quantized class (fp8, fp8_block, fp4): (best-shape share of the
    # dtype's peak, streaming share, fixed cost s) of the kernel the engine runs for it
    # (a class may be split by M bucket of the engine's dispatch: key ``<class>@<m_max>``)
    gemm_kernels: dict[str, tuple[float, ...]] = field(default_factory=dict)
    # a linear-attention scan's kernels per call class (``specs.dtypes.SCAN_CLASSES``):
    # (share of the dtype's peak, streaming share, fixed cost s per launch, s per serial
    # step of the state recurrence, launches of the call, state columns one program
    # carries; ``cost.scan_kernels``); empty: the scan is one fused kernel (stream rule)
    scan_kernels: dict[str, tuple[float, ...]] = field(default_factory=dict)
    # DeepEP's dispatch / combine kernels (``cost.ep.KERNELS``): (fixed cost s, share of the
    # NVLink reached, share of the NIC reached, copy rate per SM bytes/s (0: no cap), extra
    # fixed cost across nodes s, an SM's cost per token copy s) as the engine runs them; a
    # kernel not listed prices at the collective figures
    ep_kernels: dict[str, tuple[float, ...]] = field(default_factory=dict)
    # class or bucket key of ``gemm_kernels`` -> the engine's eager host path of one call
    # (``cost.eager``: only rows timed eagerly, ``timing`` stream, pay it)
    gemm_host_s: dict[str, float] = field(default_factory=dict)
    # class of ``gemm_kernels`` -> seconds per row (token) its activation quantization adds
    # beyond the fixed cost (vLLM's per-tensor fp8: one block per token, each ending in an
    # atomic max on the one scale, ``cost.moe.fixed_cost``)
    gemm_row_s: dict[str, float] = field(default_factory=dict)
    # whether the engine's quantized GEMM kernels (``gemm_kernels``) may split k as the
    # tiling rule picks; false: never (vLLM / sgl-kernel CUTLASS scaled_mm's persistent
    # scheduler, DeepGEMM's one block per output tile: ``cost.moe.own_kernel``)
    gemm_kernels_split_k: bool = False
    # key of ``gemm_kernels`` -> the kernel (``specs/kernel_tiles.yaml``) whose own heuristic
    # picks the output tile of that key's GEMMs (DeepGEMM: ``cost.kernel_tiles``); a key
    # not listed runs the device's tile menu (``tiling.gemm_plan``)
    gemm_kernel_tiles: dict[str, str] = field(default_factory=dict)
    # key of ``gemm_kernels`` -> the k elements of fixed work of one block of that key's
    # own-tile kernel (``gemm_kernel_tiles``: pipeline fill, output epilogue), its k-depth
    # ramp k / (k + this) in place of ``gemm_k_half``
    gemm_kernel_k_half: dict[str, float] = field(default_factory=dict)
    # async: host launches overlap device work (GPUs); sync: each op's dispatch adds to its
    # time (CPU eager execution)
    launch_mode: str = "async"
    # host time per decoder layer per step outside every operator (eager framework glue:
    # Python, module calls, views and reshapes). Added once per layer on a sync device;
    # on an async device host work overlaps device work, so it is not applied. 0: off
    layer_overhead_s: float = 0.0
    # weight dtype (int4, int8, fp8) -> the kernel that dequantizes it in a weight-only
    # matmul (``DequantKernel``); a dtype not listed costs no conversion (CPUs, TPUs)
    dequant: dict[str, DequantKernel] = field(default_factory=dict)
    # how a recurrent layer's chunked scan runs (``Scan`` records): "fused", one kernel per
    # step of the algorithm (mamba_ssm's Triton ssd kernels, FLA's chunk_gated_delta_rule),
    # or "unfused", the chain of eager torch operators of the pure-torch references, every
    # intermediate written and every operator dispatched (``cost.scan_chain``). A hardware
    # file without the key gets its vendor's default (``specs.load.SCAN_KERNEL``)
    scan_kernel: str = "fused"
    # thread instructions one compute unit issues per clock (an SM: 4 warp schedulers x 32
    # lanes = 128 on Ampere and Hopper) and the clock they run at (Hz; 0: unknown)
    alu_ops_per_clock_per_unit: float = 128.0
    alu_clock_hz: float = 0.0

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

    @property
    def attention_decode(self) -> float:
        return self.attention_decode_fraction if self.attention_decode_fraction is not None \
            else self.attention
