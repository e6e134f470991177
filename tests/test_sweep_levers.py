"""The quantization levers as sweep dimensions: --weights-format (a format expands into its
dtype, group size and scale bytes), --group-size, --outlier-fraction, --kv-group-size and
--kv-scale-bytes. Every point is what ``perfmodel estimate`` prints for the same flags."""

import csv
import json

import pytest
from typer.testing import CliRunner

import perfmodel as pm
from perfmodel.cli.app import app
from perfmodel.schedules.sweep import rows, series, sweep
from perfmodel.specs.errors import SpecError
from perfmodel.specs.formats import weight_format

runner = CliRunner()
BASE = ["-m", "llama-3-8b", "-H", "h100-sxm", "--prompt", "1024", "--gen", "16"]
FORMATS = [*BASE, "--batch", "1,64", "--weights-format", "nvfp4,w4a16-g128,w8a16",
           "--kv-dtype", "int8", "--kv-group-size", "0,64", "--kv-scale-bytes", "2,4"]
GROUPS = [*BASE, "--batch", "1,64", "--weights-dtype", "int4,fp8", "--group-size", "64,128",
          "--outlier-fraction", "0,0.01"]
# (sweep, the estimate flags of one of its points)
POINTS = [
    (FORMATS, ["--batch", "64", "--weights-format", "nvfp4", "--kv-dtype", "int8",
               "--kv-group-size", "64", "--kv-scale-bytes", "2"]),
    (FORMATS, ["--batch", "1", "--weights-format", "w8a16", "--kv-dtype", "int8",
               "--kv-group-size", "0", "--kv-scale-bytes", "4"]),
    (GROUPS, ["--batch", "64", "--weights-dtype", "int4", "--group-size", "64",
              "--outlier-fraction", "0.01"]),
]


def _estimate_json(flags: list[str]) -> dict:
    """``perfmodel estimate -f json`` as one flat record, keyed as the sweep's columns."""
    out = runner.invoke(app, ["estimate", *BASE, *flags, "-f", "json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.stdout)
    flat = {k: v for k, v in data.items() if not isinstance(v, (dict, list))}
    flat |= {f"workload_{k}": v for k, v in data["workload"].items()}
    flat |= data["parallelism"]
    for phase in ("prefill", "decode"):
        flat |= {f"{phase}_{k}": v for k, v in data[phase].items()
                 if not isinstance(v, (dict, list))}
    return flat


def _sweep_csv(tmp_path, args: list[str]) -> list[dict]:
    out = runner.invoke(app, ["sweep", *args, "--kv-models", "llama-3-8b",
                                 "--no-figures", "--out", str(tmp_path)])
    assert out.exit_code == 0, out.output
    return list(csv.DictReader((tmp_path / "sweep.csv").open()))


def _cell(value) -> str:
    """A JSON value as sweep.csv writes it (report.tables.column_cells)."""
    if value is None:
        return ""
    return "%.10g" % value if isinstance(value, float) else str(value)  # noqa: UP031


def _matches(row: dict, flags: list[str]) -> bool:
    wanted = dict(zip(flags[::2], flags[1::2], strict=True))
    if "--weights-format" in wanted:
        fmt = wanted.pop("--weights-format")
        wanted |= {"--weights-dtype": weight_format(fmt).scheme[0]}
        if row["workload_weights_format"] != fmt:
            return False
    keys = {"--batch": "workload_batch", "--weights-dtype": "workload_weights_dtype",
            "--kv-dtype": "workload_kv_dtype", "--kv-group-size": "workload_kv_group_size",
            "--group-size": "workload_weight_group_size"}
    floats = {"--kv-scale-bytes": "workload_kv_scale_bytes",
              "--outlier-fraction": "workload_outlier_fraction"}
    return all(str(row[keys[k]]) == v for k, v in wanted.items() if k in keys) \
        and all(float(row[floats[k]]) == float(v) for k, v in wanted.items() if k in floats)


@pytest.mark.parametrize("grid,flags", POINTS)
def test_sweep_csv_row_is_the_estimate_json_of_the_same_flags(tmp_path, grid, flags):
    """Every number of ``estimate -f json`` that sweep.csv has a column for is the CSV's
    cell exactly (at the CSV's 10 significant digits), for a point of a larger grid."""
    (row,) = [r for r in _sweep_csv(tmp_path, grid) if _matches(r, flags)]
    ref = _estimate_json(flags)
    shared = [k for k in ref if k in row]
    assert len(shared) > 50 and "workload_weight_scale_bytes" in shared
    for key in shared:
        assert row[key] == _cell(ref[key]), key


@pytest.mark.parametrize("grid,flags", POINTS)
def test_sweep_point_is_the_estimate_json_exactly(grid, flags):
    """In process, a sweep point (other points priced in the same vectorised call) equals
    the JSON numbers of ``estimate`` bit for bit."""
    h, m = pm.hardware("h100-sxm"), pm.model("llama-3-8b")
    args = dict(zip(grid[::2], grid[1::2], strict=False))
    base = pm.Workload(gen_len=16, kv_dtype=args.get("--kv-dtype", "bf16"))
    levers = {f: [cast(v) for v in args[o].split(",")] for o, f, cast in (
        ("--kv-group-size", "kv_group_size", int), ("--kv-scale-bytes", "kv_scale_bytes", float),
        ("--group-size", "weight_group_size", int),
        ("--outlier-fraction", "outlier_fraction", float)) if o in args}
    fmts = args.get("--weights-format")
    cols = sweep([m], [h], [1, 64], [1024], base,
                 None if fmts else args["--weights-dtype"].split(","), levers=levers,
                 weights_formats=fmts.split(",") if fmts else None)
    (point,) = [r for r in rows(cols) if _matches(r, flags)]
    ref = _estimate_json(flags)
    numbers = [k for k, v in ref.items() if isinstance(v, float) and k in point]
    assert {"ttft_s", "tpot_s", "e2e_s", "weights_bytes", "decode_time_s"} <= set(numbers)
    for key in numbers:
        assert point[key] == ref[key], key
    assert point["max_batch"] == ref["max_batch"] and point["fits"] == ref["fits"]


def test_format_expands_into_its_dtype_group_and_scale_columns(tmp_path):
    """A format is one dimension in the weights dtype's place (kv levers slower, batch
    fastest); its name is a column, before the dtype it sets."""
    got = _sweep_csv(tmp_path, FORMATS)
    assert len(got) == 3 * 2 * 2 * 2
    assert [(r["workload_weights_format"], r["workload_weights_dtype"],
             r["workload_weight_group_size"], r["workload_weight_scale_bytes"],
             r["workload_batch"]) for r in got[:6]] == [
        ("nvfp4", "fp4", "16", "1", "1"), ("nvfp4", "fp4", "16", "1", "64"),
        ("w4a16-g128", "int4", "128", "2.5", "1"), ("w4a16-g128", "int4", "128", "2.5", "64"),
        ("w8a16", "int8", "", "2", "1"), ("w8a16", "int8", "", "2", "64")]
    header = list(got[0])
    assert header.index("workload_weights_format") + 1 == header.index("workload_weights_dtype")
    assert {(r["workload_kv_group_size"], r["workload_kv_scale_bytes"]) for r in got} == {
        (g, s) for g in ("0", "64") for s in ("2", "4")}
    smaller = {r["workload_weights_format"]: int(r["weights_bytes"]) for r in got}
    # 4 bits + 1 byte per 16 > 4 bits + 2.5 bytes per 128; both below 8 bits
    assert smaller["w4a16-g128"] < smaller["nvfp4"] < smaller["w8a16"]


def test_group_size_and_outliers_are_dimensions(tmp_path):
    got = _sweep_csv(tmp_path, GROUPS)
    assert len(got) == 2 * 2 * 2 * 2
    assert "workload_weights_format" not in got[0]
    assert {(r["workload_weight_group_size"], r["workload_outlier_fraction"]) for r in got} \
        == {(g, o) for g in ("64", "128") for o in ("0", "0.01")}


def test_series_labels_name_the_format_and_the_kv_scales():
    h, m = pm.hardware("h100-sxm"), pm.model("llama-3-8b")
    cols = sweep([m], [h], [1, 8], [512], pm.Workload(gen_len=8, kv_dtype="int8"),
                 levers={"kv_group_size": [0, 64]}, weights_formats=["nvfp4", "mxfp4"])
    labels = list(series(rows(cols), exclude=("workload_batch",)))
    assert labels == ["nvfp4, KV group 0", "mxfp4, KV group 0", "nvfp4, KV group 64",
                      "mxfp4, KV group 64"]


@pytest.mark.parametrize("kwargs,words", [
    ({"weights_formats": ["nvfp5"]}, ("unknown 'nvfp5'", "did you mean 'nvfp4'")),
    ({"weights_formats": ["nvfp4"], "weights_dtypes": ["fp8"]}, ("drop the weights dtypes",)),
    ({"weights_formats": ["nvfp4"], "levers": {"weight_group_size": [64]}},
     ("drop weight_group_size",)),
])
def test_sweep_format_mistakes_are_spec_errors(kwargs, words):
    with pytest.raises(SpecError) as exc:
        sweep([pm.model("llama-3-8b")], [pm.hardware("h100-sxm")], [1], [512], **kwargs)
    for w in words:
        assert w in str(exc.value)


def test_series_labels_name_the_plan_levers_that_vary():
    """A sweep over pipeline stages draws one line per plan, not one line through both."""
    h, m = pm.hardware("h100-sxm"), pm.model("llama-3-8b")
    cols = sweep([m], [h], [1, 8], [512], pm.Workload(gen_len=8),
                 plans=[pm.Parallelism(pp=1), pm.Parallelism(pp=2)])
    assert list(series(rows(cols), exclude=("workload_batch",))) == ["PP 1", "PP 2"]
