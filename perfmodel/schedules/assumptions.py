"""What an estimate assumes that changes its numbers, said out loud.

Each assumption is one line of text and a mask over the configurations it applies to, so a
sweep of 100,000 configurations pays one numpy comparison per assumption, not a loop. The
estimate carries them as warnings (table, JSON, CSV, report). An assumption that cannot
hold is not here: it is a ``SpecError`` where it is found (``check_plan`` below, the
workload's own checks, ``Hardware.rate_dtype``).
"""

from __future__ import annotations

import numpy as np

from perfmodel.cost.instantiate import remote_share
from perfmodel.cost.memory import kv_vector_elems
from perfmodel.cost.routing import token_reach
from perfmodel.schedules.speculative import Speculation
from perfmodel.schedules.weight_paths import path_assumptions
from perfmodel.specs.dtypes import BYTES, CODE, DTYPES, KV_PER_VECTOR, KV_SCALED, compute_codes
from perfmodel.specs.errors import SpecError
from perfmodel.specs.hardware import Hardware
from perfmodel.specs.model import Model
from perfmodel.specs.workload import Parallelism, Workloads

Assumption = tuple[np.ndarray, str]     # (mask over configurations, one line)

# the operations whose rate comes from a dtype pair: (what, operand codes of the workload)
_RATED = (("matmuls (weights x activations)", ("weights_dtype", "act_dtype")),
          ("attention (activations x KV cache)", ("kv_dtype", "act_dtype")))


def check_network(hw: Hardware, plan: Parallelism) -> None:
    """SpecError for a replica (its group x pp devices) that spans nodes of
    ``interconnect.max_devices`` on a device whose file gives no network between them."""
    nodes = -(-plan.group * plan.pp // hw.interconnect.max_devices)
    if nodes > 1 and not hw.interconnect.network_bytes_per_s:
        raise SpecError(f"parallelism: {plan.describe()} spans {nodes} nodes of "
                        f"{hw.interconnect.max_devices} {hw.name} devices, and its hardware "
                        f"file gives no interconnect.network_bytes_per_s between them")


def check_plan(hw: Hardware, model: Model, plan: Parallelism) -> None:
    """SpecError for a plan the device cannot hold: more tensor-parallel devices than its
    interconnect joins (tensor parallelism over the network between nodes is not priced),
    a replica over nodes without a network figure (``check_network``), more pipeline
    stages than the model has layers, or pipeline stages of a model with shared blocks
    (vLLM's Zamba2ForCausalLM does not implement SupportsPP)."""
    if plan.ep > 1 and (model.moe is None or model.moe.n_experts % plan.ep):
        what = "has no routed experts" if model.moe is None else \
            f"has {model.moe.n_experts} routed experts, not a multiple of it"
        raise SpecError(f"parallelism: ep={plan.ep}: {model.name} {what}")
    check_network(hw, plan)
    if plan.pp > model.n_layers:
        raise SpecError(f"parallelism: pp={plan.pp} exceeds n_layers={model.n_layers} of "
                        f"{model.name}: every pipeline stage needs a layer")
    if plan.pp > 1 and model.shared_block is not None:
        raise SpecError(f"parallelism: pp={plan.pp} with the shared blocks of {model.name} is "
                        f"not modelled (vLLM runs Zamba2 without pipeline parallelism); use pp=1")
    limit = hw.interconnect.max_devices
    if plan.tp > limit:
        raise SpecError(f"parallelism: tp={plan.tp}: {hw.name} joins at most {limit} devices "
                        f"over its interconnect (interconnect.max_devices); tensor "
                        f"parallelism across nodes is not modelled, use tp <= {limit}")


def assumptions(hw: Hardware, model: Model, w: Workloads,
                plan: Parallelism | None = None) -> list[Assumption]:
    """Every assumption that applies to at least one configuration of ``w``."""
    out = _rates(hw, w) + _narrow_acts(w) + _checkpoint(model, w) + _quant_formats(model, w)
    out += path_assumptions(hw, model, w) + _dispatch_reach(hw, model, w, plan)
    if hw.engine_warning:
        out.append((np.ones(np.shape(w.batch), dtype=bool), hw.engine_warning))
    ways = plan.attention_ways if plan is not None else 1
    idle = w.batch < ways
    if idle.any():
        out.append((idle, f"batch below the {ways} data-parallel attention devices: priced "
                          f"as if each held one sequence (overstates the experts' work and "
                          f"the all-to-all; the idle devices do none)"))
    graphs = np.asarray(w.cuda_graphs, dtype=bool)
    if not hw.has_graphs and graphs.any():
        out.append((graphs, f"cuda_graphs ignored: {hw.name} (vendor {hw.vendor}) has no "
                            f"CUDA/HIP graphs"))
    single = w.gen_len == 1
    if single.any():
        out.append((single, "gen_len 1: the prefill emits the only token and no decode step "
                            "runs (decode rate 0; TPOT is the step that would follow)"))
    return out


def _dispatch_reach(hw: Hardware, model: Model, w: Workloads,
                    plan: Parallelism | None) -> list[Assumption]:
    """The nodes a token's experts reach, which set the bytes the expert-parallel
    all-to-all sends over the network (``routing.token_reach``), when it spans nodes."""
    per_node = hw.interconnect.max_devices
    if plan is None or not plan.attention_dp or model.moe is None or plan.ep <= per_node:
        return []
    moe, nodes = model.moe, -(-plan.ep // per_node)
    reach = token_reach(moe.n_experts, moe.top_k, plan.ep, per_node, moe.n_groups,
                        moe.topk_groups)
    limit = (f"from at most {moe.topk_groups} of {moe.n_groups} expert groups"
             if moe.group_limited else "no group limit")
    return [(np.ones(np.shape(w.batch), dtype=bool),
             f"EP all-to-all over {nodes} nodes of {per_node}: a token's {moe.top_k} experts "
             f"({limit}; uniform routing, experts on contiguous devices) sit on "
             f"{reach.nodes:.3f} of the {nodes - 1} other nodes and {reach.devices:.2f} other "
             f"devices on average; sent once per remote node (DeepEP), "
             f"{remote_share(moe, plan.ep, per_node):.1%} of the dispatch and combine bytes "
             f"cross the network")]


def _rates(hw: Hardware, w: Workloads) -> list[Assumption]:
    out = []
    for what, (a, b) in _RATED:
        codes = compute_codes(getattr(w, a), getattr(w, b))
        # the codes present (small integers); np.unique would load np.ma (7 ms at start)
        for code in np.flatnonzero(np.bincount(np.ravel(codes))).tolist():
            name = DTYPES[code]
            used = hw.rate_dtype(name)
            if used != name:
                out.append((codes == code, f"{hw.name} lists no {name} rate: {name} {what} "
                                           f"are priced at its {used} rate"))
    return out


def _narrow_acts(w: Workloads) -> list[Assumption]:
    """Activations narrower than the weights (fp4 activations, bf16 weights): priced as
    asked, but said, since engines quantize activations only with the weights."""
    out = []
    narrow = BYTES[w.act_dtype] < BYTES[w.weights_dtype]
    pairs = dict.fromkeys(zip(w.act_dtype[narrow].tolist(), w.weights_dtype[narrow].tolist(),
                              strict=True))
    for act, weights in pairs:
        a, b = DTYPES[act], DTYPES[weights]
        out.append(((w.act_dtype == act) & (w.weights_dtype == weights),
                    f"activations {a} narrower than the {b} weights: the matmuls run at {b} "
                    f"(the wider operand) on activations stored as {a}; engines quantize "
                    f"activations only with the weights (W8A8, W4A4): no engine serves this"))
    return out


def _checkpoint(model: Model, w: Workloads) -> list[Assumption]:
    """Weights priced otherwise than the model's checkpoint stores them (its quantization)."""
    q = model.quantization
    if q is None:
        return []
    other = (w.weights_dtype != CODE[q.weights_dtype]) | (w.weight_group_size != (
        q.group_size or 0)) | (w.weight_scale_bytes != q.scale_bytes) | (w.outlier_fraction > 0) \
        | (w.quantize_lm_head != q.lm_head)
    if not other.any():
        return []
    group = f", groups of {q.group_size}" if q.group_size else ""
    return [(other, f"{model.name}'s checkpoint stores {q.weights_dtype} weights ({q.method}"
                    f"{group}); priced with the weights asked for instead")]


def _quant_formats(model: Model, w: Workloads) -> list[Assumption]:
    """The KV cache's scales taken from its dtype, and the outlier channels' kernels."""
    out = []
    for name in KV_SCALED:
        assumed = (w.kv_group_size == KV_PER_VECTOR) & (w.kv_dtype == CODE[name])
        if assumed.any():
            out.append((assumed, f"{name} KV cache: a scale per (token, KV head) of "
                                 f"{kv_vector_elems(model)} elements assumed, as LMDeploy "
                                 f"stores it (kv_group_size sets another group)"))
    outliers = w.outlier_fraction > 0
    if outliers.any():
        out.append((outliers, "outlier channels: each quantized GEMM priced as bitsandbytes "
                              "runs LLM.int8()'s decomposition, a copy of the outlier "
                              "activation columns and a separate 16-bit GEMM added into the "
                              "output, with the quantized GEMM over the other channels"))
    return out


def check_speculation(model: Model, plan: Parallelism, spec: Speculation) -> None:
    """SpecError for speculation that cannot hold (``schedules.speculative.Speculation``):
    MTP drafting on a model without MTP modules, a draft model whose vocabulary differs
    from the target's (its tokens could not be verified), or a pipelined plan (the rounds
    are not scheduled over stages; vLLM refuses or breaks on speculative decoding under
    pipeline parallelism, vllm-project/vllm issues 14117 and 49355, so no engine to model
    runs it)."""
    if spec.draft == "mtp" and model.mtp_modules < 1:
        raise SpecError(f"speculation: MTP drafting needs a model with MTP modules; "
                        f"{model.name} has none (mtp: n_modules)")
    draft = spec.draft_model
    if spec.draft == "model" and draft.vocab_size != model.vocab_size:
        raise SpecError(f"speculation: draft {draft.name} has a vocabulary of "
                        f"{draft.vocab_size} tokens, {model.name} {model.vocab_size}; a draft "
                        f"must share the target's tokenizer")
    if plan.pp > 1:
        raise SpecError(f"speculation: pipeline parallelism (pp={plan.pp}) with speculative "
                        f"decoding is not modelled (vLLM does not run the two together: "
                        f"vllm-project/vllm issues 14117, 49355); use pp=1")


def speculation_assumptions(w: Workloads, spec: Speculation) -> list[Assumption]:
    """What speculative decoding's numbers assume."""
    live = w.gen_len > 1
    out = [(live, "speculative decoding priced at the mean context (prompt + gen // 2): "
                  "(gen - 1) / E rounds, an expectation (fractional), of the round there, "
                  "not summed step by step")]
    if spec.draft == "model" and spec.draft_hw is not None:
        out.append((live, f"the draft model ({spec.draft_model.name}) runs on "
                          f"{spec.draft_hw.name}: its weights and KV cache are not counted on "
                          f"the target's devices"))
    return out


def joined(found: list[Assumption], n: int) -> np.ndarray:
    """Per configuration, the lines that apply joined by "; " (object array, '' for none)."""
    text = np.full(n, "", dtype=object)
    for mask, line in found:
        mask = np.broadcast_to(mask, (n,))
        text[mask] = np.where(text[mask] == "", line, text[mask] + "; " + line)
    return text
