"""kernels compare: a corpus scored with the shipped hardware files (hand-set errors in the
summary, error classes, regimes, seeded stratified sampling, rows not scored counted) and
the report the CLI writes. Needs no pyarrow: the corpus is written with pandas."""

import pandas as pd
import pytest
from typer.testing import CliRunner

from perfmodel.cli.app import build
from perfmodel.compare import predict_rows
from perfmodel.kernels.compare import compare_files, sample_rows, strata
from perfmodel.kernels.corpus import file_name, write_frame
from perfmodel.specs.load import hardware

runner = CliRunner()
H100 = hardware("h100-sxm")


def gemm(m, **extra):
    return {"op": "gemm", "dtype": "bf16", "m": str(m), "n": "4096", "k": "4096",
            "timing": "kernel", "engine": "vllm", "device": "h100-sxm", **extra}


ATT = {"op": "attention", "dtype": "bf16", "batch": "8", "q_len": "1", "kv_len": "2048",
       "n_heads": "32", "n_kv_heads": "8", "head_dim": "128", "kv_write": "1",
       "timing": "kernel", "engine": "vllm", "device": "h100-sxm"}
AR = {"op": "all_reduce", "dtype": "bf16", "message_bytes": "32768", "n_devices": "4",
      "algorithm": "custom", "timing": "kernel", "engine": "vllm", "device": "h100-sxm"}


def _measured(rows, factors):
    """``rows`` with measured_s = predicted / (1 + error) for the given errors."""
    out = []
    for row, err in zip(rows, factors, strict=True):
        pred = predict_rows([row | {"measured_s": "1"}], H100, "auto")[0]["predicted_s"]
        out.append(row | {"measured_s": repr(pred / (1 + err))})
    return out


@pytest.fixture
def corpus(tmp_path):
    rows = _measured([gemm(128), gemm(256), gemm(8), ATT, AR, gemm(512, timing="stream")],
                     [0.25, -0.1, 0.5, -0.6, 1.2, -0.9])
    rows += [{"op": "mla_generation_module", "measured_s": "1e-4", "device": "h100-sxm",
              "engine": "vllm"}, gemm(0, measured_s="1e-5")]
    write_frame(pd.DataFrame(rows), tmp_path / file_name("h100-sxm", "vllm"))
    write_frame(pd.DataFrame([gemm(64, device="b60", measured_s="1e-5")]),
                tmp_path / file_name("b60", "vllm"))
    return tmp_path


def test_errors_classes_and_regimes(corpus):
    result = compare_files(corpus, sample=0)
    by = {(r.op, r.m): r for r in result["rows"].itertuples()}
    assert by[("gemm", "128")].error == pytest.approx(0.25)
    assert by[("gemm", "8")].error_class == "gemv"
    assert by[("gemm", "128")].error_class == "gemm"
    assert by[("gemm", "512")].regime.endswith(" eager")        # timed one call at a time
    att = result["rows"][result["rows"]["op"] == "attention"].iloc[0]
    assert (att.error_class, att.error) == ("attention_decode", pytest.approx(-0.6))
    ar = result["rows"][result["rows"]["op"] == "all_reduce"].iloc[0]
    assert (ar.error_class, ar.regime) == ("collective", "custom <64KiB")
    assert ar.error == pytest.approx(1.2)
    assert len(result["rows"]) == 6
    assert result["no_hardware"] == ["b60"]
    assert result["skipped"][("h100-sxm", "vllm")] == {
        "mla_generation_module: no formula": 1, "gemm: a shape column below 1": 1}


def test_sampling_is_stratified_and_seeded():
    df = pd.DataFrame([gemm(m) for m in range(1, 200)] + [ATT] * 5)
    picked = sample_rows(df, 10, seed=3)
    assert list(pd.Series(strata(picked)).value_counts().sort_index().items()) == [
        ("attention_decode", 5), ("gemm", 10), ("gemv", 10)]
    assert picked.index.equals(sample_rows(df, 10, seed=3).index)
    assert not picked.index.equals(sample_rows(df, 10, seed=4).index)
    assert len(sample_rows(df, 0, seed=3)) == len(df)


def test_cli_writes_the_report_and_fails_in_one_line(corpus, tmp_path):
    out = tmp_path / "report"
    cli = build()
    ok = runner.invoke(cli, ["kernels", "compare", str(corpus), "--sample", "0", "--out",
                             str(out)])
    assert ok.exit_code == 0, ok.output
    assert "6 rows scored" in ok.output and "no perfmodel/hardware/b60.yaml" in ok.output
    errors = pd.read_csv(out / "errors.csv")
    gemm_row = errors[(errors.error_class == "gemm") & (errors.regime == "memory")]
    assert (int(gemm_row.n.iloc[0]), gemm_row.median_abs_error.iloc[0]) == \
        (2, pytest.approx((0.25 + 0.1) / 2, abs=1e-4))
    assert gemm_row.median_error.iloc[0] == pytest.approx((0.25 - 0.1) / 2, abs=1e-4)
    summary = (out / "summary.md").read_text()
    assert "| h100-sxm | vllm |" in summary and "b60" in summary
    assert (out / "h100-sxm.png").stat().st_size > 1000
    bad = runner.invoke(cli, ["kernels", "compare", str(corpus), "--device", "a40"])
    assert bad.exit_code == 2 and bad.output.count("\n") == 1
    assert "no corpus file for device ['a40']" in bad.output
    missing = runner.invoke(cli, ["kernels", "compare", str(tmp_path / "nope")])
    assert missing.exit_code == 2 and "expected a corpus folder" in missing.output
    only_b60 = runner.invoke(cli, ["kernels", "compare", str(corpus), "--device", "b60"])
    assert only_b60.exit_code == 2 and "without one: b60" in only_b60.output


def test_each_engine_priced_with_its_own_block(tmp_path):
    """One GEMM row written with an error of +10% against H100's SGLang view: compare reads
    it back as +10% in the sglang file (its ``engines.sglang`` block), and as the vLLM
    view's own error in a vllm file; a source that is no engine (nccl) gets the top-level
    (vLLM) figures."""
    sglang = hardware("h100-sxm", "sglang")
    assert sglang.efficiency.gemm_fraction != H100.efficiency.gemm_fraction   # a real block
    row = gemm(4096) | {"measured_s": "1"}
    t_sglang = predict_rows([row], sglang, "auto")[0]["predicted_s"]
    t_vllm = predict_rows([row], H100, "auto")[0]["predicted_s"]
    measured = repr(t_sglang / 1.1)
    for engine in ("sglang", "vllm", "nccl"):
        write_frame(pd.DataFrame([row | {"engine": engine, "measured_s": measured}]),
                    tmp_path / file_name("h100-sxm", engine))
    got = compare_files(tmp_path, sample=0)["rows"].set_index("engine")["error"]
    assert got["sglang"] == pytest.approx(0.1)
    assert got["vllm"] == pytest.approx(t_vllm / float(measured) - 1)
    assert got["nccl"] == pytest.approx(got["vllm"])
    assert abs(got["vllm"] - 0.1) > 0.01                # the two views differ on this shape
