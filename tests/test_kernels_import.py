"""kernels: aiconfigurator tables into corpus rows (golden mapping, provenance, derived rows
left out), CSV import, and the one-line errors of the import command."""

import gzip
import sys

import pandas as pd
import pytest
import yaml
from typer.testing import CliRunner

from perfmodel.cli.app import build
from perfmodel.kernels.corpus import corpus_files, read_file
from perfmodel.specs import SpecError

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

runner = CliRunner()
META = {"framework": "VLLM", "version": "0.24.0", "device": "NVIDIA H100 80GB HBM3"}


def _table(folder, name, rows):
    folder.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist([META | r for r in rows]), folder / f"{name}.parquet")


def make_tree(root):
    """A tiny systems/data tree: one table of each kind the importer maps, one it does not,
    a derived table and a reuse pointer."""
    h100 = root / "h100_sxm"
    (h100 / "gemm/vllm/0.24.0").mkdir(parents=True)
    (h100 / "gemm/vllm/0.24.0/collection_meta.yaml").write_text("provenance: collected\n")
    _table(h100 / "gemm/vllm/0.24.0", "gemm_perf", [
        {"op_name": "gemm", "kernel_source": "torch.nn.functional.linear",
         "gemm_dtype": "bfloat16", "m": 128, "n": 4096, "k": 2048, "latency": 0.05},
        {"op_name": "gemm", "kernel_source": "CutlassFP8ScaledMMLinearKernel",
         "gemm_dtype": "fp8", "m": 8, "n": 4096, "k": 2048, "latency": 0.012},
        {"op_name": "gemm", "kernel_source": "DeepGemmFp8BlockScaledMMKernel",
         "gemm_dtype": "fp8_block", "m": 64, "n": 4096, "k": 2048, "latency": 0.02},
        {"op_name": "gemm", "kernel_source": "torch.nn.functional.linear",
         "gemm_dtype": "bfloat16", "m": 1, "n": 16, "k": 16, "latency": 0.0}])
    _table(h100 / "attention/vllm/0.24.0", "generation_attention_perf", [
        {"op_name": "generation_attention", "kernel_source": "vllm_flash_attn_fa3",
         "batch_size": 4, "isl": 1, "num_heads": 32, "num_key_value_heads": 8,
         "head_dim": 128, "beam_width": 1, "attn_dtype": "bfloat16", "kv_cache_dtype": "fp8",
         "step": 1023, "window_size": 0, "latency": 0.012}])
    _table(h100 / "moe/vllm/0.24.0", "moe_perf", [
        {"op_name": "moe", "kernel_source": "vllm_fused_moe", "moe_dtype": "bfloat16",
         "num_tokens": 16, "hidden_size": 4096, "inter_size": 14336, "topk": 2,
         "num_experts": 8, "moe_tp_size": 2, "moe_ep_size": 1,
         "distribution": "power_law_1.2", "latency": 0.3}])
    _table(h100 / "comm/vllm/0.24.0", "custom_allreduce_perf", [
        {"op_name": "all_reduce", "kernel_source": "vLLM_custom_graph",
         "allreduce_dtype": "bfloat16", "num_gpus": 4, "message_size": 4096,
         "latency": 0.0046, "backend": "vllm_graph"}])
    _table(h100 / "mla/vllm/0.24.0", "mla_generation_module_perf", [
        {"op_name": "mla_generation_module", "kernel_source": "default", "num_heads": 128,
         "batch_size": 1, "isl": 1, "step": 8, "latency": 0.09}])
    _table(h100 / "quantize/vllm/0.24.0", "computescale_perf", [
        {"op_name": "compute_scale", "m": 8, "k": 4096, "quant_dtype": "fp8", "latency": 0.002,
         "kernel_source": "dynamic_per_token_scaled_fp8_quant_minus_static_scaled_fp8_quant"}])
    (h100 / "mhc/vllm/0.22.0").mkdir(parents=True)
    (h100 / "mhc/vllm/0.22.0/reuse.yaml").write_text("reuse:\n- table: mhc_module_perf\n")
    _table(root / "b300_sxm/comm/nccl/2.29.2", "nccl_perf", [
        {"op_name": "all_reduce", "kernel_source": "NCCL", "nccl_dtype": "half",
         "num_gpus": 8, "message_size": 1024, "latency": 0.02}])
    return root


@pytest.fixture
def corpus(tmp_path):
    from perfmodel.kernels.importer import import_aiconfigurator

    out = tmp_path / "corpus"
    manifest = import_aiconfigurator(out, root=make_tree(tmp_path / "data"))
    return out, manifest


def _rows(folder, name):
    return read_file(folder / name).to_dict("records")


def test_golden_rows_keep_shapes_dtypes_seconds_and_provenance(corpus):
    out, _ = corpus
    rows = {(r["op"], r["dtype"], r["m"]): r for r in _rows(out, "h100-sxm__vllm.csv.gz")}
    bf16 = rows[("gemm", "bf16", "128")]
    assert float(bf16["measured_s"]) == pytest.approx(50e-6)          # 0.05 ms
    assert (bf16["n"], bf16["k"], bf16["timing"]) == ("4096", "2048", "kernel")
    assert (bf16["device"], bf16["source"], bf16["engine"], bf16["engine_version"],
            bf16["kernel"], bf16["table"]) == ("h100-sxm", "aiconfigurator-core", "vllm",
                                               "0.24.0", "torch.nn.functional.linear",
                                               "gemm_perf")
    fp8 = rows[("gemm", "fp8", "8")]
    assert (fp8["act_quant"], fp8["weight_format"]) == ("tensor", "")  # per-tensor dynamic
    block = rows[("gemm", "fp8", "64")]
    assert (block["act_quant"], block["weight_format"], block["timing"]) == \
        ("token", "fp8-block128", "stream")                           # timed eagerly
    att = next(r for r in rows.values() if r["op"] == "attention")
    assert (att["batch"], att["q_len"], att["kv_len"], att["n_kv_heads"], att["kv_dtype"],
            att["kv_write"]) == ("4", "1", "1024", "8", "fp8", "1")   # kv_len = step + 1
    moe = next(r for r in rows.values() if r["op"] == "moe")
    assert (moe["m"], moe["n"], moe["k"], moe["experts"], moe["topk"], moe["skew"]) == \
        ("16", "4096", "7168", "8", "2", "1.2")                       # 14336 / tp 2
    ar = next(r for r in rows.values() if r["op"] == "all_reduce")
    assert (ar["message_bytes"], ar["n_devices"], ar["algorithm"]) == ("8192", "4", "custom")
    assert next(r for r in rows.values() if r["op"] == "mla_generation_module")


def test_derived_zero_and_reuse_rows_are_left_out_and_counted(corpus):
    out, manifest = corpus
    ops = [r["op"] for r in _rows(out, "h100-sxm__vllm.csv.gz")]
    assert "compute_scale" not in ops and len(ops) == 7
    assert manifest["skipped"] == {
        "computescale_perf: derived (kernel source '<a>_minus_<b>')": 1,
        "gemm_perf: no positive latency": 1}
    assert list(manifest["not_read"].values()) == [["h100_sxm/mhc/vllm/0.22.0/reuse.yaml"]]
    written = yaml.safe_load((out / "manifest.yaml").read_text())
    assert written["files"]["h100-sxm__vllm.csv.gz"]["ops"]["gemm"] == 3
    assert written["tables"]["h100_sxm/gemm/vllm/0.24.0/gemm_perf.parquet"] == \
        {"rows": 3, "collection": "collected"}


def test_devices_we_lack_keep_their_name_and_nccl_bytes_are_elements_times_size(corpus):
    out, _ = corpus
    [row] = _rows(out, "b300__nccl.csv.gz")
    assert (row["device"], row["engine"], row["engine_version"], row["message_bytes"],
            row["dtype"]) == ("b300", "nccl", "2.29.2", "2048", "fp16")
    assert [p.name for p in corpus_files(out, devices=["b300"])] == ["b300__nccl.csv.gz"]
    with gzip.open(out / "b300__nccl.csv.gz", "rt") as f:
        assert "kv_write" not in f.readline()        # only the columns some row fills


def test_csv_import_adds_files_and_keeps_the_source(tmp_path, corpus):
    from perfmodel.kernels.importer import import_csv

    out, _ = corpus
    src = tmp_path / "vidur.csv"
    pd.DataFrame([{"device": "a100-80gb", "source": "vidur:a100/mlp.csv", "op": "gemm",
                   "dtype": "fp16", "m": 4096, "n": 8192, "k": 8192,
                   "measured_s": 0.0025}]).to_csv(src, index=False)
    import_csv([src], out, engine="vidur")
    [row] = _rows(out, "a100-80gb-sxm__vidur.csv.gz")
    assert (row["source"], row["engine"], row["timing"], row["table"]) == \
        ("vidur:a100/mlp.csv", "vidur", "kernel", "vidur.csv")
    manifest = yaml.safe_load((out / "manifest.yaml").read_text())
    assert "a100-80gb-sxm__vidur.csv.gz" in manifest["files"]
    assert "h100-sxm__vllm.csv.gz" in manifest["files"]


def test_cli_import_and_one_line_errors(tmp_path, monkeypatch):
    data = make_tree(tmp_path / "data")
    cli = build()
    ok = runner.invoke(cli, ["kernels", "import", "aiconfigurator", "--data", str(data),
                             "--out", str(tmp_path / "c"), "--device", "h100-sxm"])
    assert ok.exit_code == 0, ok.output
    assert "7 rows in 1 files" in ok.output
    bad = runner.invoke(cli, ["kernels", "import", "aiconfigurator", "--data",
                              str(tmp_path / "nope"), "--out", str(tmp_path / "c")])
    assert bad.exit_code == 2 and bad.output.count("\n") == 1
    assert bad.output.startswith("error: ") and "systems/data" in bad.output
    none = runner.invoke(cli, ["kernels", "import", "aiconfigurator", "--data", str(data),
                               "--device", "tpu-v9"])
    assert none.exit_code == 2 and "no parquet table" in none.output
    monkeypatch.setitem(sys.modules, "aiconfigurator_core", None)
    missing = runner.invoke(cli, ["kernels", "import", "aiconfigurator",
                                  "--out", str(tmp_path / "c")])
    assert missing.exit_code == 2
    assert missing.output == ("error: aiconfigurator: package aiconfigurator-core is not "
                              "installed; expected pip install aiconfigurator-core\n")


def test_corpus_files_errors(tmp_path):
    with pytest.raises(SpecError, match="expected a corpus folder"):
        corpus_files(tmp_path / "missing")
    with pytest.raises(SpecError, match="found none"):
        corpus_files(tmp_path)
