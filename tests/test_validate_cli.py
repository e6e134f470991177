"""calibrate, validate and compare through typer's runner, including one-line errors."""

import pytest
from typer.testing import CliRunner

from perfmodel.cli.app import app, load_plugins
from perfmodel.specs.load import load_hardware

load_plugins(app)       # the harness's commands, through the perfmodel.commands entry point

runner = CliRunner()
HEADER = ("device,source,model,tp,op,dtype,m,n,k,batch,q_len,kv_len,n_heads,n_kv_heads,"
          "head_dim,measured_s,measured_std_s")
ROWS = ["a100,t,m-a,1,gemm,fp16,4096,4096,4096,,,,,,,0.0006,",
        "a100,t,m-b,1,gemm,fp16,16,4096,4096,,,,,,,0.00003,",
        "a100,t,m-a,1,rms_norm,fp16,4096,4096,,,,,,,,0.00006,",
        "a100,t,m-b,1,attention,fp16,,,,4,1,1024,32,8,128,0.00002,"]


def csv_file(tmp_path, rows=ROWS, header=HEADER, name="m.csv"):
    path = tmp_path / name
    path.write_text("\n".join([header, *rows]) + "\n")
    return str(path)


def one_line_error(result, *parts):
    assert result.exit_code == 2, result.output
    lines = [x for x in result.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for part in parts:
        assert part in lines[0]


def test_compare_prints_classes_and_writes(tmp_path):
    out = tmp_path / "p.csv"
    result = runner.invoke(app, ["compare", csv_file(tmp_path), "-H", "a100-80gb-sxm",
                                 "--out", str(out), "--summary", str(tmp_path / "s.md")])
    assert result.exit_code == 0, result.output
    for word in ("gemm", "norm", "attention", "median|e|", "4 rows"):
        assert word in result.stdout
    text = out.read_text()
    assert "predicted_s" in text.splitlines()[0] and len(text.splitlines()) == 5
    assert "| op_class |" in (tmp_path / "s.md").read_text()


def test_compare_can_take_the_append_kv_prefill_path(tmp_path):
    rows = ["a100,t,m,1,attention,fp16,,,,1,1024,3072,32,4,128,0.0004,"]
    times = []
    for flag in ([], ["--attention-append-kv"]):
        out = tmp_path / "p.csv"
        result = runner.invoke(app, ["compare", csv_file(tmp_path, rows), "-H",
                                     "a100-80gb-sxm", "--out", str(out), *flag])
        assert result.exit_code == 0, result.output
        times.append(float(out.read_text().splitlines()[1].split(",")[17]))
    # each of the 512 (block, head) programs also copies up to 1024 new K/V rows
    assert times[1] > 1.3 * times[0]


def test_compare_sets_aside_ops_it_has_no_formula_for(tmp_path):
    out = tmp_path / "p.csv"
    rows = [*ROWS, "a100,t,m-a,1,conv2d,fp16,64,64,,,,,,,,1e-5,",
            "a100,t,m-b,1,conv2d,fp16,32,64,,,,,,,,1e-5,"]
    result = runner.invoke(app, ["compare", csv_file(tmp_path, rows), "-H", "a100-80gb-sxm",
                                 "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "4 rows predicted" in result.stdout
    assert "skipped 2 rows of op 'conv2d' (first at row 6)" in result.stdout
    assert len(out.read_text().splitlines()) == 5 and "conv2d" not in out.read_text()


@pytest.mark.parametrize("rows, header, parts", [
    (ROWS, HEADER.replace("measured_s,", "time,"), ["m.csv", "column measured_s: missing"]),
    (["a100,t,,1,conv,fp16,1,1,1,,,,,,,1e-3,"], HEADER, ["row 2", "column op", "'conv'"]),
    (["a100,t,,1,gemm,fp16,,1,1,,,,,,,1e-3,"], HEADER, ["row 2", "column m"]),
    ([*ROWS, "mi210" + ROWS[0][4:]], HEADER, ["column device", "--device-filter"]),
])
def test_compare_bad_input(tmp_path, rows, header, parts):
    result = runner.invoke(app, ["compare", csv_file(tmp_path, rows, header), "-H",
                                 "a100-80gb-sxm"])
    one_line_error(result, *parts)


def test_compare_bad_files(tmp_path):
    one_line_error(runner.invoke(app, ["compare", str(tmp_path / "nope.csv"), "-H",
                                       "a100-80gb-sxm"]), "no such file")
    one_line_error(runner.invoke(app, ["compare", csv_file(tmp_path), "-H", "no-such-gpu"]),
                   "--hardware", "no-such-gpu")
    one_line_error(runner.invoke(app, ["compare", csv_file(tmp_path), "-H", "a100-80gb-sxm",
                                       "--split-by", "model", "--calibrate-on", "0.5"]),
                   "choose one")
    one_line_error(runner.invoke(app, ["compare", csv_file(tmp_path, ROWS[:1]), "-H",
                                       "a100-80gb-sxm", "--split-by", "model"]),
                   "at least two models")


def test_compare_split_by_model(tmp_path):
    rows = [f"a100,t,{m},1,gemm,fp16,{s},4096,4096,,,,,,,{s * 1.6e-7 + 5e-6},"
            for m in ("m-a", "m-b", "m-c") for s in (64, 256, 1024, 4096)]
    result = runner.invoke(app, ["compare", csv_file(tmp_path, rows), "-H", "a100-80gb-sxm",
                                 "--split-by", "model"])
    assert result.exit_code == 0, result.output
    assert "fitted on 8 rows of models: m-a, m-c" in result.stdout
    assert "evaluated on 4 rows of models: m-b" in result.stdout


def test_compare_split_can_drop_fitted_shapes(tmp_path):
    # m-b shares shapes 64 and 4096 with the fitted models and has two of its own
    rows = [f"a100,t,{m},1,gemm,fp16,{s},4096,4096,,,,,,,{s * 1.6e-7 + 5e-6},"
            for m in ("m-a", "m-c") for s in (64, 256, 1024, 4096)]
    rows += [f"a100,t,m-b,1,gemm,fp16,{s},4096,4096,,,,,,,{s * 1.6e-7 + 5e-6},"
             for s in (64, 128, 2048, 4096)]
    result = runner.invoke(app, ["compare", csv_file(tmp_path, rows), "-H", "a100-80gb-sxm",
                                 "--split-by", "model", "--exclude-fitted-shapes"])
    assert result.exit_code == 0, result.output
    assert "evaluating only the 2 of 4 rows whose shape was not fitted" in result.stdout
    assert "2 rows predicted" in result.stdout


def test_validate_bad_hardware_is_one_line(tmp_path):
    one_line_error(runner.invoke(app, ["validate", "-H", str(tmp_path / "x.yaml"), "--out",
                                       str(tmp_path)]), "x.yaml", "no such file")


@pytest.fixture
def tiny_harness(monkeypatch):
    pytest.importorskip("torch")
    from validate import runner as run
    from validate import suites

    monkeypatch.setattr(run, "KERNEL_BUDGET_S", 0.01)
    monkeypatch.setattr(run, "STEP_BUDGET_S", 0.01)
    monkeypatch.setattr(run, "wait_quiet", lambda dev: 0.0)
    rows = [{"op": "gemm", "dtype": "fp32", "m": s, "n": s, "k": s, "name": "square"}
            for s in (32, 64, 128)]
    rows += [{"op": "add", "dtype": "fp32", "m": m, "n": 256, "name": "stream"} for m in (4, 64)]
    rows.append(suites.LAUNCH_ROW)
    monkeypatch.setattr(suites, "calibration_rows",
                        lambda device, name, layers=True: tuple(rows))
    micro = suites.Suite("quick", (rows[0], {"op": "rms_norm", "dtype": "fp32", "m": 8,
                                             "n": 256}), ())
    monkeypatch.setattr(suites, "validation_suite", lambda name, device="cpu": micro)


def test_calibrate_then_validate(tmp_path, tiny_harness):
    yaml_path = tmp_path / "cpu-test.yaml"
    result = runner.invoke(app, ["calibrate", "--out", str(yaml_path), "--threads", "1",
                                 "--no-progress"])
    assert result.exit_code == 0, result.output
    hw = load_hardware(yaml_path)
    assert hw.name == "cpu-test" and hw.compute_units == 1 and "fp32" in hw.peak_flops_per_s
    cal = hw.calibration
    assert cal["threads"] == 1 and cal["torch_version"] and cal["hostname"]
    assert cal["command"] == (f"perfmodel calibrate --device cpu --out {yaml_path} "
                              "--suite quick --threads 1")   # defaults as run, unset left out
    assert "gemm fp32 m=64 n=64 k=64" in cal["fit_shapes"]
    # PyTorch's CPU flash attention: query blocks by length, exact keys, no GQA packing
    eff = hw.efficiency
    assert eff.attention_tile_q == ((1, 32), (192, 64), (768, 256))
    assert eff.attention_tile_kv == 512 and eff.attention_clip_kv and not eff.attention_pack_gqa
    assert not eff.attention_decode_pack_gqa      # decode: one query head per program
    assert not eff.gemm_overlap          # a CPU core packs, then multiplies
    assert eff.parallel_grain_elements == 32768     # PyTorch's at::internal::GRAIN_SIZE
    assert (tmp_path / "cpu-test.calibration.csv").is_file()
    # no kernel of the calibration layers in this sweep: each op counts at its predicted time
    glue = cal["layer_overhead"]
    assert glue["ops_at_predicted_time"] == sum(len(s["predicted_ops"]) for s in glue["steps"])
    assert glue["kernel_shapes"] == [] and glue["ops_at_predicted_time"] > 0
    out = tmp_path / "report"
    result = runner.invoke(app, ["validate", "-H", str(yaml_path), "--out", str(out),
                                 "--threads", "1", "--no-progress", "--no-plots"])
    assert result.exit_code == 0, result.output
    summary = (out / "summary.md").read_text()
    assert "Held-out kernels (1 rows)" in summary        # the fitted GEMM is not held out
    assert "Held-out kernels (1 rows):\n- memory-bound ops (non-GEMM): median |error|" \
        in result.output                                  # the CLI prints the headline
    assert "perfmodel calibrate --device cpu" in summary
    assert (f"perfmodel validate --device cpu --hardware {yaml_path} --suite quick "
            f"--out {out} --threads 1") in summary
