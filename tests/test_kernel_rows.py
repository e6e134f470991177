"""validate.corpus.rows: the calibration's kernel sets come from the kernel corpus's rows, the
same whether read from a corpus folder (perfmodel kernels import) or built in memory from
aiconfigurator's tables (tiny parquet tables written here)."""

import numpy as np
import pytest

from perfmodel.kernels.importer import import_aiconfigurator
from perfmodel.specs import SpecError
from validate.corpus.rows import Rows, load_sets

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")


def _table(folder, name, rows, version="0.24.0"):
    folder.mkdir(parents=True, exist_ok=True)
    meta = {"framework": "VLLM", "version": version, "device": "NVIDIA H100 80GB HBM3"}
    pq.write_table(pa.Table.from_pylist([meta | r for r in rows]), folder / f"{name}.parquet")


def _attn(op, kernel, isl, step, kv="bfloat16", head_dim=128, latency=0.02):
    return {"op_name": op, "kernel_source": kernel, "batch_size": 4, "isl": isl,
            "num_heads": 32, "num_key_value_heads": 8, "head_dim": head_dim, "beam_width": 1,
            "attn_dtype": "bfloat16", "kv_cache_dtype": kv, "step": step, "window_size": 0,
            "latency": latency}


def make_tree(root):
    """h100_sxm under vLLM 0.24.0 (and an older GEMM table that must not be read), NCCL,
    and an a100_sxm vLLM 0.14.0 generation table (timed before the collector counted the
    new token outside ``step``)."""
    h100 = root / "h100_sxm"
    gemm = [{"op_name": "gemm", "kernel_source": "torch.nn.functional.linear",
             "gemm_dtype": "bfloat16", "m": m, "n": n, "k": 2048, "latency": 0.001 * m}
            for m in (1, 8, 128, 1024) for n in (1024, 4096)]
    gemm += [{"op_name": "gemm", "kernel_source": "CutlassFP8ScaledMMLinearKernel",
              "gemm_dtype": "fp8", "m": 8, "n": 4096, "k": 2048, "latency": 0.012}]
    _table(h100 / "gemm/vllm/0.24.0", "gemm_perf", gemm)
    _table(h100 / "gemm/vllm/0.14.0", "gemm_perf", gemm[:3], "0.14.0")
    _table(h100 / "attention/vllm/0.24.0", "context_attention_perf", [
        _attn("context_attention", "vllm_flash_attn_fa3", 1024, 0),
        _attn("context_attention", "vllm_flash_attn_fa3", 512, 0, head_dim=256),
        _attn("context_attention", "vllm_flash_attn_fa4", 512, 0),
        _attn("context_attention", "vllm_flash_attn_fa3", 512, 0, kv="fp8")])
    _table(h100 / "attention/vllm/0.24.0", "generation_attention_perf", [
        _attn("generation_attention", "vllm_flash_attn_fa3", 1, 1023, latency=0.012),
        _attn("generation_attention", "vllm_flash_attn_fa3", 1, 4095, latency=0.03),
        _attn("generation_attention", "vllm_flash_attn_fa3", 1, 4095, head_dim=512)])
    _table(h100 / "comm/vllm/0.24.0", "custom_allreduce_perf", [
        {"op_name": "all_reduce", "kernel_source": f"vLLM_custom_{mode}",
         "allreduce_dtype": "bfloat16", "num_gpus": 4, "message_size": size,
         "latency": 0.004 + size * 1e-9}
        for mode in ("graph", "eager") for size in (4096, 65536)])
    _table(h100 / "comm/nccl/2.29.2", "nccl_perf", [
        {"op_name": op, "kernel_source": "NCCL", "nccl_dtype": "half", "num_gpus": 8,
         "message_size": size, "latency": 0.02 + size * 1e-9}
        for op in ("all_reduce", "all_gather") for size in (1 << 20, 1 << 24)], "2.29.2")
    _table(root / "a100_sxm/attention/vllm/0.14.0", "generation_attention_perf", [
        _attn("generation_attention", "vllm_flash_attn", 1, 1024)], "0.14.0")


def _same(a, b) -> None:
    assert [s.error_class for s in a] == [s.error_class for s in b]
    for x, y in zip(a, b, strict=True):
        assert x.source == y.source
        assert x.columns.keys() == y.columns.keys()
        for name in x.columns:
            np.testing.assert_array_equal(x.columns[name], y.columns[name])
        np.testing.assert_array_equal(x.measured_s, y.measured_s)
        np.testing.assert_array_equal(x.fold, y.fold)


def test_corpus_folder_and_in_memory_rows_give_the_same_sets(tmp_path) -> None:
    make_tree(tmp_path / "data")
    import_aiconfigurator(tmp_path / "corpus", root=tmp_path / "data")
    memory = load_sets("h100-sxm", "vllm", Rows(tmp_path / "data"))
    folder = load_sets("h100-sxm", "vllm", Rows(tmp_path / "corpus"))
    _same(memory[0], folder[0])
    assert memory[1] == folder[1]
    sets, prov = folder
    # 16-bit GEMMs of the newest table only (8 rows: m 1 and 8 are gemv); attention: the
    # bf16-KV rows of head_dim <= 256 of each phase's most measured kernel; the custom
    # all-reduce under a CUDA graph and NCCL's all-reduce
    assert prov["rows"] == {"gemv": 4, "gemm": 4, "attention_decode": 2,
                            "attention_prefill": 2, "collective": 4}
    assert prov["versions"] == {
        "gemm": "0.24.0", "attention_context_kernel": "vllm_flash_attn_fa3",
        "attention_generation_kernel": "vllm_flash_attn_fa3", "attention": "0.24.0",
        "custom_all_reduce": "0.24.0", "nccl": "2.29.2"}
    by = {s.error_class: s for s in sets}
    # vLLM 0.24.0's collector: seq_lens = step + 1 (the new token after step cached ones)
    assert sorted(by["attention_decode"].columns["kv_len"]) == [1024, 4096]
    assert sorted(by["attention_prefill"].columns["kv_len"]) == [512, 1024]
    # message_size counts 16-bit elements
    assert sorted(by["collective"].columns["bytes"]) == [8192, 131072, 2 << 20, 2 << 24]
    assert by["gemm"].measured_s.max() == pytest.approx(1.024e-3)


def test_old_vllm_generation_rows_count_the_new_token_in_step(tmp_path) -> None:
    make_tree(tmp_path / "data")
    sets, _ = load_sets("a100-80gb-sxm", "vllm", Rows(tmp_path / "data"))
    assert list(sets[0].columns["kv_len"]) == [1024]


def test_from_names_a_corpus_or_tables(tmp_path) -> None:
    with pytest.raises(SpecError, match="expected aiconfigurator, a corpus folder"):
        Rows(tmp_path)
    make_tree(tmp_path / "data")
    with pytest.raises(SpecError, match="--hardware: mi300x: no aiconfigurator tables"):
        load_sets("mi300x", "vllm", Rows(tmp_path / "data"))


def test_family_band_pools_the_family_leave_one_out_residuals(tmp_path) -> None:
    """h100-pcie and h100-nvl (Hopper, no measurements) borrow q10 / q90 of h100-sxm's and
    h200-sxm's leave-one-device-out residuals pooled; the shipped file then loads with it."""
    import perfmodel as pm
    from perfmodel.specs.load import load_hardware
    from validate.corpus import write as kw
    from validate.corpus.calibrate import Calibration, family_bands

    def cal(name, errors):
        c = Calibration(name, "vllm", [], {"source": "aiconfigurator-core 0.12.0 (x): y"},
                        pm.hardware(name), {})
        c.lodo_errors = {"gemm": np.array(errors)}
        return c

    cals = {"h100-sxm": cal("h100-sxm", np.arange(0, 50) / 100),
            "h200-sxm": cal("h200-sxm", np.arange(50, 101) / 100)}
    bands = family_bands(cals)
    assert sorted(bands) == ["h100-nvl", "h100-pcie"]
    band = bands["h100-pcie"]
    assert band["source"] == "leave-one-device-out, hopper"
    assert band["error_q10"] == {"gemm": 0.1} and band["error_q90"] == {"gemm": 0.9}
    path = tmp_path / "h100-pcie.yaml"
    text = kw.shipped_path("h100-pcie").read_text()
    path.write_text(kw.band_text(kw.band_text(text, band), band))    # replaced, not doubled
    hw = load_hardware(path)
    assert hw.uncertainty.family == "hopper" and hw.uncertainty.q90 == {"gemm": 0.9}
