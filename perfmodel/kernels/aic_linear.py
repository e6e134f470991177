"""aiconfigurator-core's linear-attention tables (``gdn_perf``: Gated DeltaNet, Qwen3.5 /
Qwen3-Next; ``kda_perf``: Kimi Delta Attention, Kimi-K3) as corpus rows.

The collector (ai-dynamo/aiconfigurator ``collector/<engine>/collect_gdn.py``,
``collect_kda.py``) times one kernel call per row, replayed from a CUDA graph
(``helper.benchmark_with_power``: timing kernel), on ``batch_size`` sequences of
``seq_len`` new tokens, bf16 activations, an fp32 recurrent state of ``num_v_heads`` x
``head_v_dim`` x ``head_k_dim`` per sequence:

- ``causal_conv1d_fn`` (context) / ``causal_conv1d_update`` (generation, verify): the short
  conv over the packed q, k, v channels (2 num_k_heads head_k_dim + num_v_heads head_v_dim),
  width ``d_conv``; ``causal_conv1d_fn_qkv3`` (KDA): three calls, one per q, k, v
  (num_v_heads head_k_dim channels each): op ``conv1d``, ``calls`` 3;
- the chunked scan of a prefill (``chunk_gated_delta_rule``: SGLang's, TensorRT-LLM's and
  vLLM's Triton FLA kernels; ``chunk_gated_delta_rule_flashinfer``: vLLM on SM90 / SM100;
  ``chunk_kda``, ``chunk_kda_with_fused_gate``, ``flashkda_fwd``: KDA), chunks of 64
  (``chunk_local_cumsum(g, chunk_size=64)`` in FLA's ``chunk_gated_delta_rule_fwd``), no
  state before (``has_initial_state`` zeros; TensorRT-LLM passes none): op
  ``linear_attention``, kv_len = q_len;
- the recurrent step (``fused_recurrent_*``, ``fused_sigmoid_gating_delta_rule_update``) of
  a generation row (one token) or a verify row (``seq_len`` draft tokens, one after the
  other): chunk 1 after a state (kv_len = q_len + 1).

q and k are L2-normalised in the kernel (``use_qk_l2norm_in_kernel=True``) except in
TensorRT-LLM's calls (FLA's default False) and vLLM's GDN prefill (``False``: its
``fused_post_conv_prep`` normalises them before). KDA rows carry head_k_dim decay
channels per head (``channel_gates``).

Kept without a formula (counted): the fused decode modules that fold the conv, the
recurrence and the gated norm into one kernel (``kda_fused_decode``, ``fused_kda_decode``,
``fused_kda_decode_mtp_dspark``): op ``kda_module``.
"""

from __future__ import annotations

import numpy as np

CHUNK = 64
CONV = ("causal_conv1d_fn", "causal_conv1d_update", "causal_conv1d_fn_qkv3")
MODULES = ("kda_fused_decode", "fused_kda_decode", "fused_kda_decode_mtp_dspark")


def _l2norm(engine: str, kernel: np.ndarray, table: str) -> np.ndarray:
    """Whether each row's call L2-normalises q and k itself (module docstring)."""
    if engine == "trtllm":
        return np.zeros(len(kernel), dtype=bool)
    vllm_gdn_prefill = (engine == "vllm") & (table == "gdn_perf") \
        & np.char.startswith(kernel.astype(str), "chunk_")
    return ~vllm_gdn_prefill


def linear(df, engine: str, table: str) -> tuple[dict, np.ndarray]:
    """Columns of ``gdn_perf`` / ``kda_perf`` rows (module docstring)."""
    kernel = df["kernel_source"].astype(str).to_numpy()
    batch = df["batch_size"].to_numpy(dtype=float)
    seq = df["seq_len"].to_numpy(dtype=float)
    hk = df["num_k_heads"].to_numpy(dtype=float)
    hv = df["num_v_heads"].to_numpy(dtype=float)
    dk = df["head_k_dim"].to_numpy(dtype=float)
    dv = df["head_v_dim"].to_numpy(dtype=float)
    kda = table == "kda_perf"
    conv = np.isin(kernel, CONV)
    module = np.isin(kernel, MODULES)
    chunked = np.char.startswith(kernel.astype(str), "chunk_") | (kernel == "flashkda_fwd")
    qkv3 = kernel == "causal_conv1d_fn_qkv3"
    channels = np.where(qkv3, hv * dk, 2 * hk * dk + hv * dv)
    op = np.where(conv, "conv1d", np.where(module, "kda_module", "linear_attention"))
    return {"op": op, "dtype": "bf16", "m": batch * seq, "n": channels,
            "width": df["d_conv"], "calls": np.where(qkv3, 3, 1),
            "batch": batch, "q_len": seq, "kv_len": np.where(chunked, seq, seq + 1),
            "n_heads": hv, "n_kv_heads": hk, "head_dim": dk, "v_dim": dv,
            "chunk": np.where(chunked, CHUNK, 1),
            "l2norm": _l2norm(engine, kernel, table).astype(int),
            "channel_gates": np.where(kda, dk, 0), "timing": "kernel"}, np.ones(len(df), bool)
