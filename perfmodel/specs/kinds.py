"""The registry of operator kinds: the one place a kind is declared.

A kind is a kernel type. Hardware YAMLs key their per-kind tables by it, the cost model
builds records and picks the roofline rule by it, calibration decides what to fit by it,
and ``compare`` reads measurement rows by it. Adding a kind is one ``Kind`` line here (plus a
record type in ``cost.ops`` when no existing one has its byte formula).

Fields of a ``Kind``:
- ``op_class``: the class reports group it under (error tables, stacked figures);
- ``rule``: the roofline rule that times it (``cost.roofline``): ``gemm`` (tiles, waves,
  split-K), ``attention`` (FlashAttention tiles and splits), ``stream`` (a memory pass),
  ``scan`` (a recurrent layer's scan: a fused kernel timed as a stream, or the chain of
  operators of ``cost.scan_chain``), ``collective`` (the interconnect) or ``host``
  (framework glue, no device work);
- ``threading``: ``own`` when the kernel spreads over the compute units its own way (GEMMs,
  attention), ``grain`` when a host framework splits it by a minimum chunk of elements
  (PyTorch's ``parallel_for`` grain; elementwise passes), ``none`` for no kernel;
- ``own_fraction``: the hardware file and calibration give it its own streaming fraction
  and per-unit rate (memory-bound kernels whose loads differ: a two-pass norm reaches less
  than a vector add); otherwise it streams at the shared ``memory_fraction``;
- ``own_latency``: calibration fits its own fixed cost (``kernel_latency_by_kind``);
- ``row``: the measurement-schema columns ``compare`` reads for it (None: not predicted from
  measurement rows);
- ``reads``, ``writes``, ``flops``: for elementwise passes, elements read and written per
  output element (in units of the row width n) and FLOPs per output element.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Kind:
    name: str
    op_class: str
    rule: str
    threading: str = "grain"
    own_fraction: bool = True
    own_latency: bool = True
    row: tuple[str, ...] | None = ("m", "n")
    reads: int = 0
    writes: int = 0
    flops: int = 0


_MN = ("m", "n")
_ATTENTION = ("batch", "q_len", "kv_len", "n_heads", "n_kv_heads", "head_dim")
_COLLECTIVE = ("message_bytes", "n_devices")   # bytes of each device's buffer, devices
_SCAN = ("batch", "q_len", "kv_len", "n_heads", "head_dim")
_EP = ("m", "n", "topk", "experts", "n_devices")

KINDS: dict[str, Kind] = {k.name: k for k in (
    Kind("gemm", "gemm", "gemm", "own", own_fraction=False, row=("m", "n", "k")),
    Kind("attention", "attention", "attention", "own", own_fraction=False, row=_ATTENTION),
    Kind("rms_norm", "norm", "stream", reads=1, writes=1, flops=4),
    Kind("layer_norm", "norm", "stream", reads=1, writes=1, flops=7),
    Kind("silu_and_mul", "activation", "stream", reads=2, writes=1, flops=5),
    Kind("gelu_and_mul", "activation", "stream", reads=2, writes=1, flops=9),
    Kind("gelu", "activation", "stream", reads=1, writes=1, flops=8),
    # sigmoid(g) * h, an output gate (Qwen3-Next's attention, MiniMax-01's lightning
    # attention): h / (1 + exp(-g)) is a negation, an exp, an add and a divide per element
    # (torch.sigmoid = 1 / (1 + exp(-x))): silu_and_mul's 5, x / (1 + exp(-x)) * y, less
    # one multiply. Not calibrated on its own: it streams at the shared memory_fraction
    Kind("sigmoid_mul", "activation", "stream", own_fraction=False, own_latency=False,
         reads=2, writes=1, flops=4),
    Kind("softmax", "elementwise", "stream", reads=1, writes=1, flops=5),
    Kind("add", "elementwise", "stream", reads=2, writes=1, flops=1),
    Kind("rotary", "elementwise", "stream", reads=1, writes=1, flops=3),
    # a copy of activations, never measured alone: some columns (``A[:, idx].contiguous()``,
    # the 16-bit outlier channels' inputs, priced inside their GEMM: ``cost.outliers``), or
    # Zamba2's concat of the hidden state and the embeddings (``cost.layers``)
    Kind("gather", "elementwise", "stream", own_fraction=False, own_latency=False, row=None,
         reads=1, writes=1),
    Kind("kv_cache_write", "elementwise", "stream"),
    # a W8A8 / W4A4 linear's activation quantization (``cost.quantize``): priced inside the
    # measured linear it belongs to, never a row of its own
    Kind("quantize", "elementwise", "stream", own_fraction=False, own_latency=False, row=None),
    Kind("embedding", "embedding", "stream"),
    # recurrent layers (``cost.scan``): the chunked scan is matmul work within chunks and a
    # stream over the tokens and the state; fused, timed by the stream rule's max(compute,
    # memory), unfused, as its chain of operators (``efficiency.scan_kernel``)
    # (rows: ``compare.forms`` ``scan_parts`` / ``conv_parts``)
    Kind("ssm_scan", "recurrent", "scan", "own", row=None),
    Kind("linear_attention", "recurrent", "scan", "own", row=_SCAN),
    Kind("conv1d", "recurrent", "stream", "own", row=_MN),
    # a measured MoE layer (``compare.forms``): its experts' two grouped GEMMs and the
    # activation between them (m tokens, n hidden, k the expert width per device)
    Kind("moe", "gemm", "gemm", "own", own_fraction=False, own_latency=False,
         row=("m", "n", "k", "experts", "topk")),
    Kind("all_reduce", "communication", "collective", "own", own_fraction=False,
         own_latency=False, row=_COLLECTIVE),
    Kind("all_to_all", "communication", "collective", "own", own_fraction=False,
         own_latency=False, row=_COLLECTIVE),
    # DeepEP's expert-parallel dispatch / combine (``cost.ep``): m tokens per rank of hidden
    # n, top-k of ``experts`` over n_devices; the payload dtype is the row's
    Kind("ep_dispatch", "communication", "collective", "own", own_fraction=False,
         own_latency=False, row=_EP),
    Kind("ep_combine", "communication", "collective", "own", own_fraction=False,
         own_latency=False, row=_EP),
    Kind("layer_overhead", "framework", "host", "none", own_fraction=False, own_latency=False,
         row=None),
    # rows a schedule adds to a phase, not kernels the step template prices
    Kind("p2p", "communication", "collective", "none", own_fraction=False, own_latency=False,
         row=None),
    Kind("pipeline_bubble", "idle", "host", "none", own_fraction=False, own_latency=False,
         row=None),
    Kind("draft", "draft", "host", "none", own_fraction=False, own_latency=False, row=None),
    # the seconds weight-only GEMMs' in-kernel conversion adds (``cost.dequant``): a row the
    # reports split off the GEMMs' own, no kernel of its own
    Kind("dequant", "dequant", "host", "none", own_fraction=False, own_latency=False,
         row=None),
)}

# elementwise passes: one record type (``cost.ops.Pointwise``), bytes and FLOPs from the table
POINTWISE = tuple(k for k, v in KINDS.items() if v.reads)
# kinds with their own streaming fraction and per-unit rate in a hardware file
OWN_FRACTION = tuple(k for k, v in KINDS.items() if v.own_fraction)
# kinds with their own fitted fixed cost
OWN_LATENCY = tuple(k for k, v in KINDS.items() if v.own_latency)
# kinds ``compare`` predicts from measurement rows
ROW_KINDS = tuple(k for k, v in KINDS.items() if v.row is not None)
OP_CLASSES = tuple(dict.fromkeys(v.op_class for v in KINDS.values()))
# the classes measured error is grouped in (``cost.error_class`` assigns them; declared
# here so that a hardware file's per-class blocks can be checked while it is read)
ERROR_CLASSES = ("gemv", "gemm", "moe", "attention_prefill", "attention_decode", "collective",
                 "memory", "host")
POINTWISE_CODE = {k: i for i, k in enumerate(POINTWISE)}


def op_class(kind: str) -> str:
    """The report class of ``kind`` (elementwise for a kind not in the registry)."""
    entry = KINDS.get(kind)
    return entry.op_class if entry else "elementwise"
