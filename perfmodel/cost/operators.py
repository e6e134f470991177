"""The operator specs a step template is made of (``cost.layers``, ``cost.recurrent``): one
NamedTuple per record type, with its constants and the step quantity that sets its rows.
``cost.instantiate`` turns them into records (``cost.ops``, ``cost.scan``)."""

from __future__ import annotations

from typing import NamedTuple

from perfmodel.cost.params import other_formats, unquantized
from perfmodel.specs.model import SUBCLASSES, Model, MoE

ROW_QUANTITIES = ("tokens", "seqs", "logits", "expert_rows", "expert_act_rows", "absorbed",
                  "expanded_context")


class GemmSpec(NamedTuple):
    """A linear layer: [rows, k] x [k, n] (x ``groups``: a number, or "touched" experts).
    ``weights``: "matmul" (the weight dtype, group scales), "act" (embedding-like tables,
    routers and the linear classes a quantized checkpoint keeps at 16 bits, at the
    activation dtype, which is then also the compute dtype: see ``weights_of``) or "head"
    (the LM head: "matmul" in the configurations that quantize it,
    ``Workload.quantize_lm_head``, else "act")."""

    name: str
    n: int
    k: int
    count: float
    rows: str = "tokens"
    groups: float | str = 1.0
    weights: str = "matmul"
    bias: bool = False
    context: bool = False       # its shape moves with the context (priced per decode step)
    slots: bool = False         # a MoE layer's first expert GEMM: it carries the layer's
    #                             (token, top-k) slots (``instantiate.Values.slots``)


class PointwiseSpec(NamedTuple):
    context = False         # no step quantity of the context moves it
    name: str
    kind: str
    n: int
    count: float
    rows: str = "tokens"
    weight_elems: float = -1.0  # weights read per instance; -1: the kind's (ops.Pointwise)


class AttentionSpec(NamedTuple):
    """Attention of one form over the step's groups. ``form``: "all" groups, or only those
    MLA runs "absorbed" or "expanded"."""

    name: str
    heads: int
    kv_heads: int
    qk_dim: int
    v_dim: int
    cache_elems: int
    count: float
    window: int = 0             # kernel shape: a sliding window, or a chunked layer's chunk
    chunk: int = 0              # chunked layer: FLOPs and bytes within chunks of this
    from_cache: bool = True
    form: str = "all"
    context: bool = True
    elem_bytes: float = 0.0     # bytes per cached element; 0: the KV dtype's (DSA's indexer
                                # keys are fp8 with a scale whatever the KV dtype)
    math_dtype: str = ""        # the dtype its MMAs run at; "": the attention dtype's


class EmbeddingSpec(NamedTuple):
    context = False         # no step quantity of the context moves it
    name: str
    n: int
    count: float = 1.0


class KvWriteSpec(NamedTuple):
    context = False         # no step quantity of the context moves it
    name: str
    n: int
    count: float
    elem_bytes: float = 0.0     # bytes per element stored; 0: the KV dtype's


class AllReduceSpec(NamedTuple):
    """Ring all-reduce of ``width`` activations per token over ``devices``."""

    context = False         # no step quantity of the context moves it
    name: str
    width: int
    devices: int
    count: float


class AllToAllSpec(NamedTuple):
    """Expert-parallel dispatch or combine: each device sends ``width`` activations per
    (token, expert) pair of its tokens, ``elem_bytes`` each (0: the activation dtype), to
    the ``devices`` holding the experts (``cost.collectives.all_to_all_parts``); ``moe``:
    the routing (experts, top-k, group limit) that sets the nodes a token reaches."""

    context = False
    name: str
    width: int
    devices: int
    count: float
    elem_bytes: float = 0.0
    moe: MoE | None = None


class OverheadSpec(NamedTuple):
    """Framework glue of ``count`` decoder layers (priced on a host-timed device only)."""

    context = False         # no step quantity of the context moves it
    name: str
    count: float


class ScanSpec(NamedTuple):
    """The chunked scan of a recurrent layer (``scan.Scan``): ``heads`` state heads of
    ``d_k`` x ``d_v``, the q.k (C.B) products over ``qk_heads``, chunks of ``chunk`` tokens
    (1: the recurrent selective scan), ``delta``: the gated delta rule's WY transform;
    ``gates`` per-token scalars per head it reads (dt / decay, and beta for the delta rule);
    ``l2norm_heads`` q/k heads whose rows it L2-normalises (Gated DeltaNet; 0: none);
    ``channel_gates`` decay values per head and token (KDA: d_k; 0: per-head scalars).
    Its cost depends on a group's new tokens, not its context (decode: one state update)."""

    context = False
    name: str
    kind: str               # "ssm_scan" or "linear_attention"
    heads: int
    qk_heads: int
    d_k: int
    d_v: int
    chunk: int
    delta: bool
    gates: int
    count: float
    state_bytes: float
    l2norm_heads: int = 0
    channel_gates: int = 0


class ConvSpec(NamedTuple):
    """Causal depthwise conv1d of width ``width`` over ``n`` channels (``scan.Conv1d``)."""

    context = False
    name: str
    n: int
    width: int
    count: float


Spec = GemmSpec | PointwiseSpec | AttentionSpec | EmbeddingSpec | KvWriteSpec \
    | AllReduceSpec | AllToAllSpec | OverheadSpec | ScanSpec | ConvSpec


def weights_of(model: Model, linear_class: str) -> str:
    """A GemmSpec's ``weights`` for a layer of ``linear_class`` (``params.LINEAR_CLASSES``):
    "act" when the model's quantization leaves that class unquantized, "format:NAME" when
    it stores the class in another format (``params.other_formats``), else "matmul"."""
    kept, formats = unquantized(model), other_formats(model)
    if linear_class in SUBCLASSES and linear_class not in kept and linear_class not in formats:
        linear_class = SUBCLASSES[linear_class]      # a part not named follows its class
    if linear_class in kept:
        return "act"
    other = formats.get(linear_class)
    return "matmul" if other is None else f"format:{other}"
