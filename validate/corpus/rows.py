"""The calibration's measured kernels: kernel-corpus rows (``perfmodel.kernels``) into
``corpus.sets`` (no torch).

The rows come from a corpus folder ``perfmodel kernels import aiconfigurator`` wrote, or
(``--from aiconfigurator``, or aiconfigurator-core's ``systems/data`` folder) are built in
memory by the same reader (``perfmodel.kernels.aiconfigurator``): device names, seconds,
dtypes, a generation row's kv_len and an all-reduce's bytes are that reader's. What this
module adds is the calibration's choice of rows, per device and engine:

- the newest engine version of each table (a version folder holds that version's timings);
- GEMMs: dense 16-bit (bf16 / fp16, no weight format, no activation quantization);
- attention: no sliding window, a bf16 KV cache, head_dim <= 256, and per phase (context,
  generation table) the kernel most measured among those rows: a collector may time two
  backends on the same shapes (FlashAttention-2 and FlashInfer on Ada), and one model
  prices one kernel; the one kept is named in the provenance;
- all-reduce: the engine's custom all-reduce replayed from a CUDA graph (``CUSTOM_AR``,
  ``algorithm`` 1) and NCCL's 16-bit all-reduce (0);
- fused MoE layers: every format, each weight format (gated and non-gated experts apart)
  from the newest version that measured it, of the kernel the engine serves for it where
  the collector timed more than one (``moe_served.yaml``; the others' rows are counted
  in the provenance, ``moe_not_served``); quantized linears (fp8, fp8 blocks, nvfp4)
  graph-replayed or eager.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from perfmodel.specs.errors import SpecError
from validate.corpus.sets import (
    KernelSet,
    attention_sets,
    collective_set,
    gemm_sets,
    linear_set,
    moe_set,
)

ENGINES = ("vllm", "sglang", "trtllm")
# the custom all-reduce kernel source each engine's collector times under a CUDA graph
CUSTOM_AR = {"vllm": "vLLM_custom_graph", "sglang": "SGLang_CustomAllReduce_graph",
             "trtllm": "TRTLLM"}
TABLES = {"gemm_perf": "gemm", "context_attention_perf": "attention",
          "generation_attention_perf": "attention", "custom_allreduce_perf": "comm",
          "nccl_perf": "comm", "moe_perf": "moe"}
NUMERIC = ("m", "n", "k", "batch", "q_len", "kv_len", "n_heads", "n_kv_heads", "head_dim",
           "window", "message_bytes", "n_devices", "measured_s", "experts", "topk", "ep",
           "skew")
TEXT = ("device", "source", "source_version", "engine", "engine_version", "table", "kernel",
        "timing",
        "op", "dtype", "kv_dtype", "weight_format", "weight_dtype", "act_quant",
        "distribution")
AIC_SOURCE = "aiconfigurator-core {version} (NVIDIA, Apache-2.0): systems/data/{device}"


class Rows:
    """Where the measured kernels come from: a corpus folder, or aiconfigurator-core's
    tables (the installed package's, or a ``systems/data`` folder) read in memory."""

    def __init__(self, spec: str | Path) -> None:
        self.corpus: Path | None = None
        self.root: Path | None = None
        if str(spec) == "aiconfigurator":
            return
        path = Path(spec)
        if path.is_dir() and any(path.glob("*.csv.gz")):
            self.corpus = path
            return
        for candidate in (path, path / "systems" / "data"):
            if candidate.is_dir() and any(candidate.glob("*/*/*/*/*.parquet")):
                self.root = candidate
                return
        raise SpecError(f"--from: {spec}: expected aiconfigurator, a corpus folder (perfmodel "
                        "kernels import ...) or aiconfigurator-core's systems/data directory")

    def devices(self) -> list[str]:
        """The devices the rows cover (hardware file names where there is one)."""
        if self.corpus is not None:
            from perfmodel.kernels.corpus import corpus_files, split_name

            return sorted({split_name(f)[0] for f in corpus_files(self.corpus)})
        from perfmodel.kernels import aiconfigurator as aic

        root = self.root or aic.data_root()
        return sorted({aic.DEVICES.get(p.name, p.name.replace("_", "-"))
                       for p in root.iterdir() if p.is_dir()})

    def frame(self, device: str, engine: str):
        """The calibration tables' rows of ``device`` under ``engine`` (and NCCL's), typed."""
        if self.corpus is not None:
            from perfmodel.kernels.corpus import read_rows

            df = read_rows(self.corpus, [device], [engine, "nccl"])
            df = df[df["table"].isin(list(TABLES))]
        else:
            from perfmodel.kernels.importer import aiconfigurator_rows

            df = aiconfigurator_rows([device], [engine, "nccl"], TABLES, self.root)
        return typed(df)


def typed(df):
    """The columns this module reads: numbers as floats (blank: NaN), text as text
    (blank: ''), whether the rows came from CSV text or the reader's own frame."""
    import pandas as pd

    out = pd.DataFrame(index=df.index)
    for name in NUMERIC:
        col = df[name] if name in df.columns else pd.Series("", index=df.index)
        out[name] = pd.to_numeric(col.astype(object).where(col.notna(), ""),
                                  errors="coerce").astype(float)
    for name in TEXT:
        col = df[name] if name in df.columns else pd.Series("", index=df.index)
        out[name] = col.astype(object).where(col.notna(), "").astype(str)
    return out.reset_index(drop=True)


def newest(df):
    """Each table's rows of its newest engine version only."""
    from perfmodel.kernels.aiconfigurator import version_key

    keep = np.zeros(len(df), dtype=bool)
    for _table, part in df.groupby("table"):
        top = max(set(part["engine_version"]), key=version_key)
        keep[part.index[part["engine_version"] == top]] = True
    return df[keep]


def _aic_device(device: str) -> str:
    from perfmodel.kernels.aiconfigurator import DEVICES

    return next((k for k, v in DEVICES.items() if v == device), device.replace("-", "_"))


def load_sets(hardware: str, engine: str = "vllm", rows: Rows | None = None,
              ) -> tuple[list[KernelSet], dict]:
    """The kernel sets of ``hardware`` under ``engine`` and their provenance
    (``{"source": text, "versions": {class: version}, "rows": {error class: n}}``)."""
    rows = rows or Rows("aiconfigurator")
    if hardware not in rows.devices():
        raise SpecError(f"--hardware: {hardware}: no aiconfigurator tables for it; expected "
                        f"one of {', '.join(rows.devices())}")
    full = rows.frame(hardware, engine)
    df = newest(full)
    where = _aic_device(hardware)
    sets: list[KernelSet] = []
    versions: dict[str, str] = {}
    gemm = df[(df["table"] == "gemm_perf") & df["dtype"].isin(["bf16", "fp16"])
              & (df["weight_format"] == "") & (df["weight_dtype"] == "")
              & (df["act_quant"] == "")]
    if len(gemm):
        versions["gemm"] = v = gemm["engine_version"].iloc[0]
        sets += gemm_sets(gemm["m"], gemm["n"], gemm["k"], gemm["measured_s"].to_numpy(),
                          "bf16", f"{where}/gemm/{engine}/{v}")
    parts = [_main_kernel(df[df["table"] == f"{phase}_attention_perf"], versions, phase)
             for phase in ("context", "generation")]
    import pandas as pd

    att = pd.concat(parts)
    if len(att):
        versions["attention"] = v = att["engine_version"].iloc[0]
        sets += attention_sets(att["batch"], att["q_len"], att["kv_len"], att["n_heads"],
                               att["n_kv_heads"], att["head_dim"], np.zeros(len(att)),
                               np.full(len(att), 2.0), att["measured_s"].to_numpy(),
                               f"{where}/attention/{engine}/{v}")
    sets += _collectives(df, engine, versions, where)
    sets += _moe(full, engine, versions, where, hardware)
    sets += _quantized(df, engine, versions, where, hardware)
    sets = [s for s in sets if len(s)]
    source = df["source"].iloc[0] if len(df) else ""
    text = AIC_SOURCE.format(version=df["source_version"].iloc[0], device=where) \
        if source == "aiconfigurator-core" else f"{source}: {hardware}"
    return sets, {"source": text, "versions": versions,
                  "rows": {s.error_class: len(s) for s in sets}}


def _main_kernel(df, versions: dict[str, str], phase: str):
    """The fitted rows of one attention table, of its most measured kernel."""
    df = df[(df["window"].fillna(0) == 0) & (df["kv_dtype"] == "bf16")
            & (df["head_dim"] <= 256)]
    if df.empty:
        return df
    main = df["kernel"].value_counts().index[0]
    versions[f"attention_{phase}_kernel"] = main
    return df[df["kernel"] == main]


def _collectives(df, engine: str, versions: dict[str, str], where: str) -> list[KernelSet]:
    """The engine's custom all-reduce (CUDA-graph timed) and NCCL's 16-bit all-reduce."""
    custom = df[(df["table"] == "custom_allreduce_perf") & (df["kernel"] == CUSTOM_AR[engine])]
    nccl = df[(df["table"] == "nccl_perf") & (df["op"] == "all_reduce")
              & (df["dtype"] == "fp16")]
    if len(custom):
        versions["custom_all_reduce"] = custom["engine_version"].iloc[0]
    if len(nccl):
        versions["nccl"] = nccl["engine_version"].iloc[0]
    both = [custom.assign(algorithm=1), nccl.assign(algorithm=0)]
    import pandas as pd

    rows = pd.concat(both)
    if rows.empty:
        return []
    return [collective_set(rows["n_devices"], rows["message_bytes"], rows["algorithm"],
                           rows["measured_s"].to_numpy(), f"{where}/comm")]


def _moe(df, engine: str, versions: dict[str, str], where: str, hardware: str
         ) -> list[KernelSet]:
    """The fused MoE layers the collector timed, every weight format and kernel of the
    newest version (``compare.moe_forms.moe_layer``), routed as it routed them."""
    from perfmodel.compare.moe_routing import is_known
    from perfmodel.specs.dtypes import CODE

    rows = df[(df["table"] == "moe_perf") & df["distribution"].map(is_known)
              & df["dtype"].isin(list(CODE))]
    if rows.empty:
        return []
    rows = _newest_per_format(rows)
    rows, dropped = served(rows, engine, hardware)
    if dropped:
        versions["moe_not_served"] = dropped
    versions["moe"] = v = ", ".join(sorted(set(rows["engine_version"])))
    return [moe_set(_records(rows), rows["measured_s"].to_numpy(),
                    f"{where}/moe/{engine}/{v}")]


def _records(rows) -> list[dict]:
    return [{k: ("" if isinstance(x, float) and np.isnan(x) else x) for k, x in r.items()}
            for r in rows.to_dict("records")]


def _quantized(df, engine: str, versions: dict[str, str], where: str, device: str
               ) -> list[KernelSet]:
    """The fp8, fp8-block and nvfp4 linears the collector timed: replayed from a CUDA
    graph, or eagerly (vLLM's fp8_block, timing ``stream``: priced with the host path as
    a floor, ``cost.eager``), each row's dispatch bucket in column ``bucket``
    (``corpus.dispatch``)."""
    from perfmodel.specs.dtypes import CODE

    rows = df[(df["table"] == "gemm_perf") & df["dtype"].isin(["fp8", "fp4"])
              & (df["weight_dtype"] == "") & df["timing"].isin(["kernel", "stream"])
              & df["dtype"].isin(list(CODE))]
    if rows.empty:
        return []
    versions["gemm_quantized"] = v = rows["engine_version"].iloc[0]
    s = linear_set(_records(rows), rows["measured_s"].to_numpy(),
                   f"{where}/gemm/{engine}/{v}")
    from validate.corpus.dispatch import buckets

    c = s.columns
    c["bucket"] = buckets(engine, device, c["format"], c["m"], c["n"], c["k"])
    return [s]


def served(rows, engine: str, hardware: str):
    """(``rows`` less those of a format's kernels the engine does not serve as timed,
    ``moe_served.yaml``; the count left out, as text: '' when none). Non-gated experts'
    rows stay: their kernel is another layer's, not a rival for the same one."""
    from perfmodel.compare.moe_forms import NON_GATED
    from validate.corpus.calibrate import family_of

    table = (SERVED.get(engine) or {}).get(family_of(hardware) or "") or {}
    fmt = rows["dtype"] + "/" + rows["weight_format"]
    keep = np.ones(len(rows), dtype=bool)
    parts = []
    for name, kernel in table.items():
        other = (fmt == name).to_numpy() & ~rows["kernel"].str.startswith(kernel).to_numpy() \
            & ~rows["kernel"].str.endswith(NON_GATED).to_numpy()
        if other.any() and (fmt == name).sum() > other.sum():
            keep &= ~other
            parts.append(f"{name} {int(other.sum())} rows of "
                         + "/".join(sorted(set(rows["kernel"][other]))))
    return rows[keep], ", ".join(parts)


def _served_table() -> dict:
    import yaml

    return yaml.safe_load((Path(__file__).with_name("moe_served.yaml")).read_text()) or {}


SERVED = _served_table()


def _newest_per_format(rows):
    """Each weight format's rows of the newest engine version that measured it, gated and
    non-gated experts (``compare.moe_forms.NON_GATED``) apart: a later collection may re-time
    only some of them (TensorRT-LLM 1.3.0rc23's MoE table holds bf16 / fp8 non-gated rows,
    rc20 the gated ones of the same formats)."""
    from perfmodel.compare.moe_forms import NON_GATED
    from perfmodel.kernels.aiconfigurator import version_key

    keep = np.zeros(len(rows), dtype=bool)
    gated = ~rows["kernel"].map(lambda k: any(k.endswith(s) for s in NON_GATED))
    key = rows["dtype"] + "/" + rows["weight_format"] + "/" + rows["weight_dtype"] \
        + "/" + gated.astype(str)
    for _, part in rows.groupby(key):
        top = max(set(part["engine_version"]), key=version_key)
        keep[rows.index.get_indexer(part.index[part["engine_version"] == top])] = True
    return rows[keep]
