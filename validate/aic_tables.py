"""Read aiconfigurator-core's measured kernel tables into ``kernel_sets`` (no torch).

aiconfigurator-core (NVIDIA, Apache-2.0; ``pip install aiconfigurator-core``) ships, per
GPU, parquet tables of kernels its collectors timed under vLLM, SGLang and TensorRT-LLM:
``systems/data/<device>/<class>/<engine>/<version>/*.parquet``, latency in milliseconds.
This module reads the classes the calibration fits (dense 16-bit GEMMs, attention without
sliding window, all-reduce), taking the newest version directory of each; the general
importer (``perfmodel kernels import aiconfigurator``) writes every class to CSV.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from perfmodel.specs.errors import SpecError
from validate.kernel_sets import KernelSet, attention_sets, collective_set, gemm_sets

# shipped hardware name -> aiconfigurator's device directory
DEVICES = {
    "h100-sxm": "h100_sxm", "h200-sxm": "h200_sxm", "a100-80gb-sxm": "a100_sxm",
    "a100-80gb-pcie": "a100_pcie", "b200": "b200_sxm", "h100-pcie": "h100_pcie",
    "l40s": "l40s", "l4": "l4", "rtx-pro-6000": "rtx_pro_6000_server", "b300": "b300_sxm",
    "gb200": "gb200", "gb300": "gb300", "a30": "a30",
}
ENGINES = ("vllm", "sglang", "trtllm")
# the GEMM kernel each engine runs for 16-bit dense linears, per its collector
GEMM_SOURCES = {"vllm": "torch.nn.functional.linear", "sglang": None, "trtllm": None}
CUSTOM_AR = {"vllm": "vLLM_custom_graph", "sglang": "SGLang_CustomAllReduce_graph",
             "trtllm": "TRTLLM"}


def data_root(path: Path | None = None) -> Path:
    """The ``systems/data`` directory: ``path`` itself, or the installed package's."""
    if path is not None:
        for candidate in (path, path / "systems" / "data"):
            if (candidate / "h100_sxm").is_dir():
                return candidate
        raise SpecError(f"--from: {path}: expected aiconfigurator-core's systems/data "
                        "directory (one folder per GPU, e.g. h100_sxm/)")
    try:
        import aiconfigurator_core
    except ImportError:
        raise SpecError("--from: aiconfigurator-core is not installed: pip install "
                        "aiconfigurator-core, or give its systems/data directory") from None
    return Path(aiconfigurator_core.__file__).parent / "systems" / "data"


def _version_key(name: str) -> tuple:
    return tuple(int(p) if p.isdigit() else -1 for p in
                 name.replace("rc", ".").replace("post", ".").split("."))


def newest(directory: Path) -> Path | None:
    """The newest version subdirectory of ``directory`` (None if there is none)."""
    if not directory.is_dir():
        return None
    versions = sorted((p for p in directory.iterdir() if p.is_dir()),
                      key=lambda p: _version_key(p.name))
    return versions[-1] if versions else None


def _read(path: Path):
    import pandas as pd

    return pd.read_parquet(path)


def load_sets(hardware: str, engine: str = "vllm", root: Path | None = None,
              ) -> tuple[list[KernelSet], dict]:
    """The kernel sets of ``hardware`` under ``engine`` and their provenance
    (``{"versions": {class: version}, "rows": {error class: n}}``)."""
    if hardware not in DEVICES:
        raise SpecError(f"--hardware: {hardware}: no aiconfigurator tables for it; expected "
                        f"one of {', '.join(DEVICES)}")
    base = data_root(root) / DEVICES[hardware]
    sets: list[KernelSet] = []
    versions: dict[str, str] = {}
    gemm_dir = newest(base / "gemm" / engine)
    if gemm_dir is not None and (gemm_dir / "gemm_perf.parquet").exists():
        df = _read(gemm_dir / "gemm_perf.parquet")
        df = df[df["gemm_dtype"].isin(["bfloat16", "float16"])]
        if len(df):
            versions["gemm"] = gemm_dir.name
            src = f"{DEVICES[hardware]}/gemm/{engine}/{gemm_dir.name}"
            sets += gemm_sets(df["m"], df["n"], df["k"], df["latency"].to_numpy() * 1e-3,
                              "bf16", src)
    attn_dir = newest(base / "attention" / engine)
    if attn_dir is not None:
        parts = [_main_kernel(_read(p), versions, p.stem.split("_")[0])
                 for p in (attn_dir / "context_attention_perf.parquet",
                           attn_dir / "generation_attention_perf.parquet") if p.exists()]
        if parts:
            import pandas as pd

            df = pd.concat(parts, ignore_index=True)
            df = df[(df.get("window_size", 0) == 0) & (df["kv_cache_dtype"] == "bfloat16")]
            df = df[df["head_dim"] <= 256]
            gen = df["isl"].to_numpy() <= 1
            kv = np.where(gen, df["step"].to_numpy(), df["isl"].to_numpy())
            versions["attention"] = attn_dir.name
            src = f"{DEVICES[hardware]}/attention/{engine}/{attn_dir.name}"
            sets += attention_sets(df["batch_size"], df["isl"], np.maximum(kv, 1),
                                   df["num_heads"], df["num_key_value_heads"], df["head_dim"],
                                   np.zeros(len(df)), np.full(len(df), 2.0),
                                   df["latency"].to_numpy() * 1e-3, src)
    sets += _collectives(base, engine, versions)
    sets = [s for s in sets if len(s)]
    return sets, {"versions": versions, "rows": {s.error_class: len(s) for s in sets}}


def _main_kernel(df, versions: dict[str, str], phase: str):
    """The rows of the table's most measured kernel: a collector may time two backends on
    the same shapes (FlashAttention-2 and FlashInfer on Ada), and one model prices one
    kernel; the one kept is named in the provenance."""
    df = df[df["head_dim"] <= 256]
    if "kernel_source" not in df.columns or df.empty:
        return df
    main = df["kernel_source"].value_counts().index[0]
    versions[f"attention_{phase}_kernel"] = main
    return df[df["kernel_source"] == main]


def _collectives(base: Path, engine: str, versions: dict[str, str]) -> list[KernelSet]:
    """The engine's custom all-reduce (CUDA-graph timed) and NCCL's all-reduce rows."""
    import pandas as pd

    frames = []
    comm = newest(base / "comm" / engine)
    if comm is not None and (comm / "custom_allreduce_perf.parquet").exists():
        df = _read(comm / "custom_allreduce_perf.parquet")
        df = df[df["kernel_source"] == CUSTOM_AR[engine]]
        if len(df):
            versions["custom_all_reduce"] = comm.name
            frames.append(df.assign(algorithm=1))
    nccl = newest(base / "comm" / "nccl")
    if nccl is not None and (nccl / "nccl_perf.parquet").exists():
        df = _read(nccl / "nccl_perf.parquet")
        df = df[(df["op_name"] == "all_reduce") & (df["nccl_dtype"] == "half")]
        if len(df):
            versions["nccl"] = nccl.name
            frames.append(df.assign(algorithm=0))
    if not frames:
        return []
    df = pd.concat(frames, ignore_index=True)
    # message_size counts elements, not bytes: collect_nccl.py logs size // bytes_per_element
    # of nccl-tests' byte size, collect_all_reduce.py the element count of its bf16 tensor
    return [collective_set(df["num_gpus"], df["message_size"] * 2.0, df["algorithm"],
                           df["latency"].to_numpy() * 1e-3, f"{base.name}/comm")]
