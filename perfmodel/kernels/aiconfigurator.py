"""Read aiconfigurator-core's measured kernel tables into corpus rows (``kernels.corpus``).

aiconfigurator-core (NVIDIA, Apache-2.0) ships, per device, op family, engine and engine
version, parquet tables of latencies in milliseconds timed by its collector
(github.com/ai-dynamo/aiconfigurator, ``collector/``):
``systems/data/<device>/<family>/<engine>/<version>/<table>.parquet``. One function per
table kind maps its rows to the shapes and dtypes ``compare.forms`` prices; what the
collector timed decides the row form:

- ``gemm_perf``: the framework's linear forward. vLLM times ``RowParallelLinear.forward``,
  which for fp8 quantizes the activations with a per-tensor dynamic scale before CUTLASS's
  scaled_mm (``act_quant`` tensor), for fp8_block / nvfp4 per 128-element group / 16-element
  block (token); SGLang times ``sgl_per_token_quant_fp8`` + ``fp8_scaled_mm`` (token),
  ``per_token_group_quant_fp8`` + DeepGEMM, ``fp4_quantize`` + ``mm_fp4``; TRT-LLM's fp8
  ``Linear`` runs its dynamic quantization (tensor). Replayed from a CUDA graph (timing
  kernel), except vLLM's fp8_block, timed eagerly (stream).
- ``context_attention_perf`` / ``generation_attention_perf``: the backend's forward, which
  stores the new K/V into the paged cache and attends (vLLM's ``collect_attn.py`` calls
  ``do_kv_cache_update`` first where the forward does not): ``kv_write`` 1. Generation rows
  attend ``step`` cached positions plus the new token (kv_len = step + 1: SGLang's
  ``collect_attn.py`` sizes the sequence ``input_len + 1``, TRT-LLM's caches ``input_len``
  tokens before its one-token step, vLLM's collector since its 0.24.0 upgrade gives
  ``seq_lens = input_len + 1``); vLLM tables of an earlier version were timed by the
  collector before that change, whose ``seq_lens = input_len`` counted the new token in
  ``step`` (kv_len = step, ``step_counts_query``). Context rows ``isl`` new tokens after
  ``step`` cached ones.
- ``moe_perf``: the fused MoE layer (both grouped GEMMs and the gated activation) of
  ``num_tokens`` tokens on one device of ``moe_tp_size`` x ``moe_ep_size``; routing
  ``balanced`` is skew 0, ``power_law_<s>`` Zipf exponent s (``cost.routing``).
- ``nccl_perf`` (NCCL's own kernels: all_reduce, alltoall, all_gather, reduce_scatter) and
  ``custom_allreduce_perf`` (the engines' custom all-reduce, ``algorithm`` custom):
  ``message_size`` counts elements (``collect_nccl.py``: size // bytes_per_element).

- ``context_mla_perf`` / ``generation_mla_perf``: one layer's MLA attention as the
  collector lays it out (``mla``).

- ``gdn_perf`` / ``kda_perf``: the linear-attention layers' short conv and chunked or
  recurrent scan, one kernel call a row (``kernels.aic_linear``).

Every other table (MLA's BMMs and modules, wide-EP MLA, sparse / compressed attention
modules, Mamba2, mHC, TensorRT-LLM's own MoE all-to-all, wide-EP modules, quantization
kernels) is kept with its op name and time and no formula.

- ``wideep_deepep_normal_perf`` / ``wideep_deepep_ll_perf`` (sglang) and ``moe_a2a_perf``
  (vLLM, TensorRT-LLM): DeepEP's dispatch and combine, one row per phase (``ep_long``,
  ``deepep``), priced by ``cost.ep``.

Left out (counted in the manifest): rows the database derives rather than measures —
kernel sources named ``<a>_minus_<b>`` (vLLM's ``computescale_perf`` is the difference of
two timed kernels: kernel_source_backends.yaml calls it a "derived overhead measure");
tables a ``reuse.yaml`` lists are another version's data at query time and are never read
from the donor (only the parquet files present in a version's folder are: those hold that
version's own timings); rows without a positive latency; beam search (beam_width > 1).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np

from perfmodel.kernels import aic_linear
from perfmodel.specs.errors import SpecError

SOURCE = "aiconfigurator-core"
# aiconfigurator's system names -> our hardware file names (others keep theirs)
DEVICES = {"h100_sxm": "h100-sxm", "h200_sxm": "h200-sxm", "a100_sxm": "a100-80gb-sxm",
           "b200_sxm": "b200", "l40s": "l40s", "l4": "l4",
           "rtx_pro_6000_server": "rtx-pro-6000", "h100_pcie": "h100-pcie",
           "a100_pcie": "a100-80gb-pcie", "b300_sxm": "b300"}
# quantization mode -> (compute dtype, weight_format, weight_dtype, act_quant)
GEMM_DTYPES = {
    "bfloat16": ("bf16", "", "", ""), "float16": ("fp16", "", "", ""),
    "fp8": ("fp8", "", "", "tensor"), "fp8_block": ("fp8", "fp8-block128", "", "token"),
    "nvfp4": ("fp4", "nvfp4", "", "token"), "int8_wo": ("bf16", "", "int8", ""),
    "int4_wo": ("bf16", "w4a16-g128", "", ""), "sq": ("int8", "", "", "token"),
    "w4a16_mxfp4": ("bf16", "mxfp4", "", ""), "w4a8_mxfp4_mxfp8": ("fp8", "mxfp4", "", "token"),
    "w4afp8": ("fp8", "", "int4", "token"),
}
ATTENTION_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "fp8": "fp8", "fp8_e4m3": "fp8",
                    "int8": "int8"}
COMM_DTYPES = {"half": ("fp16", 2), "bfloat16": ("bf16", 2), "float16": ("fp16", 2),
               "int8": ("int8", 1), "float": ("fp32", 4)}
COMM_OPS = {"all_reduce": "all_reduce", "alltoall": "all_to_all"}


def data_root() -> Path:
    """The installed aiconfigurator-core's ``systems/data`` folder; SpecError if absent."""
    try:
        import aiconfigurator_core
    except ImportError:
        raise SpecError("aiconfigurator: package aiconfigurator-core is not installed; "
                        "expected pip install aiconfigurator-core") from None
    root = Path(aiconfigurator_core.__file__).parent / "systems" / "data"
    if not root.is_dir():
        raise SpecError(f"{root}: expected aiconfigurator-core's systems/data folder")
    return root


def package_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("aiconfigurator-core")
    except PackageNotFoundError:
        return "unknown"


def collection(folder: Path) -> str:
    """The ``provenance`` its ``collection_meta.yaml`` gives a version folder's tables
    (collected, local, legacy), '' without one."""
    import yaml

    meta = folder / "collection_meta.yaml"
    if not meta.is_file():
        return ""
    try:
        data = yaml.safe_load(meta.read_text()) or {}
    except yaml.YAMLError:
        return ""
    return str(data.get("provenance") or "") if isinstance(data, dict) else ""


def _ms(df) -> np.ndarray:
    return df["latency"].to_numpy(dtype=float) * 1e-3


def _col(df, name: str, default: object = 0):
    return df[name] if name in df.columns else default


def gemm(df) -> tuple[dict, np.ndarray]:
    """Columns of ``gemm_perf`` rows (and which rows have a known dtype)."""
    modes = df["gemm_dtype"].astype(str)
    known = modes.isin(list(GEMM_DTYPES)).to_numpy()
    spec = [GEMM_DTYPES.get(x, ("", "", "", "")) for x in modes]
    eager = (df["framework"].astype(str).str.upper() == "VLLM") & (modes == "fp8_block")
    return {"op": "gemm", "dtype": [s[0] for s in spec], "weight_format": [s[1] for s in spec],
            "weight_dtype": [s[2] for s in spec], "act_quant": [s[3] for s in spec],
            "m": df["m"], "n": df["n"], "k": df["k"],
            "timing": np.where(eager, "stream", "kernel")}, known


def version_key(name: str) -> tuple:
    """A version folder's name as a sortable tuple (``1.3.0rc20`` after ``1.3.0rc5``)."""
    return tuple(int(p) if p.isdigit() else -1 for p in
                 name.replace("rc", ".").replace("post", ".").split("."))


def step_counts_query(engine: str, version: str) -> bool:
    """Whether a generation row's ``step`` already counts the new token: vLLM tables timed
    before the collector's 0.24.0 upgrade (``seq_lens = [input_len]``, ai-dynamo/aiconfigurator
    ``collector/vllm/collect_attn.py``; ``input_len + 1`` since)."""
    return engine == "vllm" and version_key(version) < (0, 24, 0)


def attention(df, generation: bool, query_in_step: bool = False) -> tuple[dict, np.ndarray]:
    """Columns of ``context_attention_perf`` / ``generation_attention_perf`` rows
    (``query_in_step``: a generation row's ``step`` counts the new token)."""
    step = df["step"].to_numpy(dtype=float)
    isl = df["isl"].to_numpy(dtype=float)
    heads = df["num_heads"].to_numpy(dtype=float)
    kv_heads = df["num_key_value_heads"].to_numpy(dtype=float)
    dtype = df["attn_dtype"].astype(str).map(ATTENTION_DTYPES)
    kv = df["kv_cache_dtype"].astype(str).map(ATTENTION_DTYPES)
    window = np.nan_to_num(np.asarray(_col(df, "window_size", 0), dtype=float))
    known = (dtype.notna() & kv.notna()).to_numpy() \
        & (np.asarray(_col(df, "beam_width", 1), dtype=float) <= 1)
    q_len = np.ones_like(isl) if generation else isl
    kv_len = step if generation and query_in_step else step + q_len
    return {"op": "attention", "dtype": dtype.fillna(""), "kv_dtype": kv.fillna(""),
            "batch": df["batch_size"], "q_len": q_len, "kv_len": kv_len,
            "n_heads": heads, "n_kv_heads": np.where(kv_heads > 0, kv_heads, heads),
            "head_dim": df["head_dim"], "window": np.broadcast_to(window, step.shape),
            "kv_write": 1, "timing": "kernel"}, known


def mla(df, generation: bool, engine: str) -> tuple[dict, np.ndarray]:
    """Columns of ``context_mla_perf`` / ``generation_mla_perf`` rows: one layer's MLA
    attention on ``num_heads`` local heads (DeepSeek-V3 dims: latent 512, rope 64, nope and
    V 128), as the collector lays it out (``collector/<engine>/collect_mla.py``):

    - generation, every engine: absorbed, MQA over the cached latent: one KV head, Q/K 576
      wide, V 512, the cache holding 576 per position; ``step`` cached positions and the
      new token (kv_len = step + 1), which the forward appends (kv_write);
    - TRT-LLM context: the expanded form, ``num_kv_heads = num_heads`` (K 192 = nope +
      rope, V 128, given as activations), ``isl`` new tokens causal; the latent it also
      appends (576 elements a token) is left out beside the attention;
    - SGLang context: its Hopper (``flash_attention``, FA3) and Triton backends run the
      absorbed latent form on the new tokens (a RadixAttention of head_dim 576, v 512,
      one KV head), which the forward stores first; ``trtllm_mla`` (Blackwell) the
      expanded form with one KV head (K 192, V 128).
    The query is bf16 (``mla_dtype``), the cache bf16 or fp8."""
    isl = df["isl"].to_numpy(dtype=float)
    step = df["step"].to_numpy(dtype=float)
    heads = df["num_heads"].to_numpy(dtype=float)
    kv = df["kv_cache_dtype"].astype(str).map(ATTENTION_DTYPES)
    known = (df["mla_dtype"].astype(str) == "bfloat16").to_numpy() & kv.notna().to_numpy()
    kernel = df["kernel_source"].astype(str).to_numpy() if "kernel_source" in df.columns \
        else np.full(len(df), "")
    latent, expanded = (576.0, 512.0, 576.0), (192.0, 128.0, 320.0)
    if generation:
        dims, kv_heads, write = np.tile(latent, (len(df), 1)), np.ones_like(heads), 1.0
    elif engine == "trtllm":
        dims, kv_heads, write = np.tile(expanded, (len(df), 1)), heads, 0.0
    else:
        blackwell = kernel == "trtllm_mla"
        dims = np.where(blackwell[:, None], expanded, latent)
        kv_heads, write = np.ones_like(heads), np.where(blackwell, 0.0, 1.0)
    q_len = np.ones_like(isl) if generation else isl
    return {"op": "attention", "dtype": "bf16", "kv_dtype": kv.fillna(""),
            "batch": df["batch_size"], "q_len": q_len, "kv_len": step + q_len,
            "n_heads": heads, "n_kv_heads": kv_heads, "head_dim": dims[:, 0],
            "v_dim": dims[:, 1], "cache_dim": dims[:, 2],
            "kv_write": np.broadcast_to(write, isl.shape), "timing": "kernel"}, known


def _skew(names) -> np.ndarray:
    out = []
    for name in names.astype(str):
        if name in ("balanced", "uniform"):
            out.append(0.0)
        elif name.startswith("power_law_") and name[10:].replace(".", "", 1).isdigit():
            out.append(float(name[10:]))
        else:
            out.append(np.nan)
    return np.array(out)


def moe(df) -> tuple[dict, np.ndarray]:
    """Columns of ``moe_perf`` rows."""
    modes = df["moe_dtype"].astype(str)
    spec = [GEMM_DTYPES.get(x, ("", "", "", "")) for x in modes]
    skew = _skew(df["distribution"])
    tp = np.maximum(df["moe_tp_size"].to_numpy(dtype=float), 1)
    known = modes.isin(list(GEMM_DTYPES)).to_numpy() & np.isfinite(skew)
    return {"op": "moe", "dtype": [s[0] for s in spec], "weight_format": [s[1] for s in spec],
            "weight_dtype": [s[2] for s in spec], "act_quant": [s[3] for s in spec],
            "m": df["num_tokens"], "n": df["hidden_size"],
            "k": np.floor(df["inter_size"].to_numpy(dtype=float) / tp),
            "experts": df["num_experts"], "topk": df["topk"], "ep": df["moe_ep_size"],
            "tp": df["moe_tp_size"], "skew": np.nan_to_num(skew),
            "distribution": df["distribution"], "timing": "kernel"}, known


def comm(df, custom: bool) -> tuple[dict, np.ndarray]:
    """Columns of ``nccl_perf`` / ``custom_allreduce_perf`` rows (message_size elements)."""
    dcol = "allreduce_dtype" if custom else "nccl_dtype"
    spec = [COMM_DTYPES.get(x, ("", 0)) for x in df[dcol].astype(str)]
    size = np.array([s[1] for s in spec], dtype=float)
    ops = df["op_name"].astype(str).map(lambda x: COMM_OPS.get(x, x))
    kernel = df["kernel_source"].astype(str) if "kernel_source" in df.columns else ""
    eager = kernel.str.contains("eager") if custom else False
    return {"op": ops, "dtype": [s[0] for s in spec],
            "message_bytes": df["message_size"].to_numpy(dtype=float) * size,
            "n_devices": df["num_gpus"], "algorithm": "custom" if custom else "nccl",
            "timing": np.where(eager, "stream", "kernel")}, size > 0


# comm dtype of a DeepEP row -> (dispatch payload, combine payload); "default": the
# collectors' FP8 dispatch (per_token_cast_to_fp8 / use_fp8=True) and BF16 combine
EP_DTYPES = {"default": ("fp8", "bf16"), "bfloat16": ("bf16", "bf16"), "fp8": ("fp8", "fp8"),
             "nvfp4": ("fp4", "bf16"), "fp4": ("fp4", "fp4")}
EP_MODES = {"normal": "normal", "ll": "ll", "deepep_ht": "normal", "deepep_ll": "ll",
            "trtllm_deepep_ht": "normal", "trtllm_deepep_ll": "ll"}
# sglang's wide tables: phase -> (time columns in us, SM column)
EP_PHASES = {"wideep_deepep_normal_perf": {
                 "dispatch": (("dispatch_transmit_us", "dispatch_notify_us"), "dispatch_sms"),
                 "combine": (("combine_transmit_us", "combine_notify_us"), "combine_sms")},
             "wideep_deepep_ll_perf": {"dispatch": (("dispatch_avg_t_us",), ""),
                                       "combine": (("combine_avg_t_us",), "")}}


def ep_long(df, table: str, device_dir: str):
    """A DeepEP table as one row per dispatch or combine with ``latency`` in ms, ``phase``,
    ``mode`` (normal | ll), ``sms``, ``ep`` and ``nodes``. sglang's wide tables hold both
    phases in a row of a full node per ``node_num`` (8 GPUs, 4 on GB200 / GB300:
    ``collector/wideep/sglang/collect_deepep_normal.py``); ``moe_a2a_perf`` one phase a row,
    times in us."""
    import pandas as pd

    if table == "moe_a2a_perf":
        return df.assign(latency=df["latency"].to_numpy(dtype=float) * 1e-3,
                         mode=df["comm_backend"].astype(str), ep=df["ep_size"],
                         nodes=df["node_num"], num_token=df["num_tokens"], num_topk=df["topk"])
    per_node = 4 if device_dir.startswith("gb") else 8
    parts = []
    for phase, (times, sms) in EP_PHASES[table].items():
        us = df[list(times)].to_numpy(dtype=float).sum(axis=1)
        parts.append(df.assign(latency=us * 1e-3, phase=phase, comm_dtype="default",
                               mode=df["op_name"].astype(str),
                               sms=df[sms] if sms else 0, nodes=df["node_num"],
                               ep=df["node_num"].to_numpy(dtype=int) * per_node))
    return pd.concat(parts, ignore_index=True)


def deepep(df) -> tuple[dict, np.ndarray]:
    """Columns of DeepEP dispatch / combine rows (``ep_long``): op ``ep_<phase>``, the
    payload dtype, tokens per rank ``m``, hidden ``n``; the internode collector's routing
    picks ``min(nodes, 4)`` of ``nodes`` node groups (``deepep/test_internode.py``
    ``--num-topk-groups``), the others route uniformly. DeepEP V2 backends are unknown."""
    phase = df["phase"].astype(str).to_numpy()
    mode = df["mode"].astype(str).map(EP_MODES)
    spec = [EP_DTYPES.get(x) for x in df["comm_dtype"].astype(str)]
    known = mode.notna().to_numpy() & np.array([x is not None for x in spec]) \
        & np.isin(phase, ("dispatch", "combine"))
    dtype = [("" if s is None else s[0] if p == "dispatch" else s[1])
             for s, p in zip(spec, phase, strict=True)]
    nodes = df["nodes"].to_numpy(dtype=float)
    return {"op": np.char.add("ep_", phase.astype(str)), "dtype": dtype,
            "mode": mode.fillna(""), "m": df["num_token"], "n": df["hidden_size"],
            "topk": df["num_topk"], "experts": df["num_experts"], "n_devices": df["ep"],
            "nodes": nodes, "sms": df["sms"], "groups": nodes,
            "topk_groups": np.minimum(nodes, 4), "timing": "kernel"}, known


def other(df) -> tuple[dict, np.ndarray]:
    """A table with no formula: its op name and time only."""
    op = df["op_name"].astype(str) if "op_name" in df.columns else "unknown"
    return {"op": op}, np.ones(len(df), dtype=bool)


# table -> reader(df, engine, version)
READERS: dict[str, Callable] = {
    "gemm_perf": lambda df, e, v: gemm(df),
    "context_attention_perf": lambda df, e, v: attention(df, False),
    "generation_attention_perf": lambda df, e, v: attention(df, True, step_counts_query(e, v)),
    "context_mla_perf": lambda df, e, v: mla(df, False, e),
    "generation_mla_perf": lambda df, e, v: mla(df, True, e),
    "moe_perf": lambda df, e, v: moe(df),
    "nccl_perf": lambda df, e, v: comm(df, False),
    "custom_allreduce_perf": lambda df, e, v: comm(df, True),
    "gdn_perf": lambda df, e, v: aic_linear.linear(df, e, "gdn_perf"),
    "kda_perf": lambda df, e, v: aic_linear.linear(df, e, "kda_perf"),
    **{t: lambda df, e, v: deepep(df) for t in (*EP_PHASES, "moe_a2a_perf")},
}


def read_table(path: Path, skipped: Counter):
    """Corpus rows (pandas) of one parquet table; rows left out are counted in ``skipped``
    by reason."""
    import pandas as pd
    import pyarrow.parquet as pq

    device_dir, _family, engine, version = path.parts[-5:-1]
    table = path.stem
    df = pq.read_table(path).to_pandas()
    if table in EP_PHASES or table == "moe_a2a_perf":
        df = ep_long(df, table, device_dir)
    if "latency" not in df.columns:
        if "avg_ms" in df.columns:
            df = df.assign(latency=df["avg_ms"])
        else:
            df = df.assign(latency=np.nan)
    kernel = df["kernel_source"].astype(str) if "kernel_source" in df.columns \
        else pd.Series([""] * len(df))
    derived = kernel.str.contains("_minus_").to_numpy()
    latency = df["latency"].to_numpy(dtype=float)
    positive = np.isfinite(latency) & (latency > 0)
    columns, known = READERS.get(table, lambda d, e, v: other(d))(df, engine, version)
    keep = ~derived & positive & np.asarray(known, dtype=bool)
    skipped[f"{table}: derived (kernel source '<a>_minus_<b>')"] += int(derived.sum())
    skipped[f"{table}: no positive latency"] += int((~derived & ~positive).sum())
    skipped[f"{table}: unknown dtype, routing or beam search"] += int(
        (~derived & positive & ~np.asarray(known, dtype=bool)).sum())
    out = pd.DataFrame({k: v if np.ndim(v) == 0 else np.asarray(v)
                        for k, v in columns.items()}, index=df.index)
    out = out.assign(device=DEVICES.get(device_dir, device_dir.replace("_", "-")),
                     source=SOURCE, source_version=package_version(), engine=engine,
                     engine_version=version, kernel=kernel.to_numpy(), table=table,
                     measured_s=_ms(df))
    return _integers(out[keep])


def _integers(df):
    """Numeric columns whose values are whole numbers as integers (blanks stay blank)."""
    for name in df.columns:
        if df[name].dtype.kind == "f" and name != "measured_s":
            values = df[name].to_numpy()
            finite = values[np.isfinite(values)]
            if np.all(finite == np.floor(finite)):
                df[name] = df[name].astype("Int64")
    return df


def tables(root: Path, devices: list[str] | None = None, engines: list[str] | None = None
           ) -> list[Path]:
    """Every parquet table under ``root`` (``<device>/<family>/<engine>/<version>/``),
    filtered by our device name and engine."""
    out = []
    for path in sorted(root.glob("*/*/*/*/*.parquet")):
        device_dir, _, engine, _ = path.parts[-5:-1]
        name = DEVICES.get(device_dir, device_dir.replace("_", "-"))
        if (not devices or name in devices) and (not engines or engine in engines):
            out.append(path)
    return out
