"""compare: rows to records and back, hand-computed predictions, reading, splitting."""

import numpy as np
import pytest

from perfmodel.compare import (
    drop_unsupported,
    op_row,
    predict_rows,
    read_measurements,
    records,
    row_op,
    shape_key,
    split_by_model,
    split_fraction,
)
from perfmodel.cost.ops import Attention, Embedding, Gemm, KvWrite, kind_names, pointwise
from perfmodel.specs import SpecError
from perfmodel.specs.dtypes import CODE
from perfmodel.specs.load import load_hardware

HW_YAML = """\
version: 1
name: toy
compute:
  peak_flops_per_s: {fp16: 100 TFLOP/s}
  compute_units: 4
  source: test
memory: {capacity_bytes: 80 GB, bandwidth_bytes_per_s: 1 TB/s, source: test}
on_chip: {l2_bytes: 40 MB, source: test}
interconnect: {link_bytes_per_s: 100 GB/s, latency_s: 5 us, source: test}
efficiency:
  gemm_fraction: 0.5
  memory_fraction: 0.8
  gemm_tile_m: 128
  gemm_tile_n: 128
  kernel_latency_s: 2 us
  launch_overhead_s: 5 us
  gemm_k_half: 0
  memory_half_bytes: 0
  source: test
"""
HEADER = ("device,source,model,tp,op,dtype,m,n,k,batch,q_len,kv_len,n_heads,n_kv_heads,"
          "head_dim,measured_s,measured_std_s")


@pytest.fixture
def toy(tmp_path):
    path = tmp_path / "toy.yaml"
    path.write_text(HW_YAML)
    return load_hardware(path)


def gemm_row(m=256, n=256, k=1024, measured=1e-5, **extra):
    return {"op": "gemm", "dtype": "fp16", "m": str(m), "n": str(n), "k": str(k),
            "measured_s": str(measured)} | extra


def test_gemm_prediction_by_hand(toy):
    # 2x2 tiles of 128 fill the 4 units in one wave, no padding, no split-K: eff = 0.5
    compute = 2 * 256 * 256 * 1024 / (100e12 * 0.5)                   # 2.684 us
    memory = (256 * 1024 + 1024 * 256 + 256 * 256) * 2 / (1e12 * 0.8)  # 1.475 us: loses
    kernel = compute + 2e-6
    [row] = predict_rows([gemm_row(measured=kernel * 2)], toy, "kernel")
    assert compute > memory
    assert row["predicted_s"] == pytest.approx(kernel, rel=1e-9)
    assert row["error"] == pytest.approx(-0.5)
    assert row["op_class"] == "gemm" and row["regime"] == "compute"
    [host] = predict_rows([gemm_row(timing="host")], toy, "auto")
    assert host["predicted_s"] == pytest.approx(kernel + 5e-6, rel=1e-9)
    [auto] = predict_rows([gemm_row(timing="")], toy, "auto")      # no timing: kernel
    assert auto["predicted_s"] == pytest.approx(kernel, rel=1e-9)


FP32, BF16 = CODE["fp32"], CODE["bf16"]
RECORDS = [
    Gemm(name="g", m=64, n=128, k=256, weight_bytes=4, act_bytes=4, dtype=FP32),
    Attention(name="a", batch=[2], q_len=[1], kv_len=[300], n_heads=8, n_kv_heads=2,
              qk_dim=64, v_dim=64, act_bytes=2, kv_bytes=2, dtype=BF16, cache_elems=128),
    pointwise("rms_norm", 16, 4096, act_bytes=2, dtype=BF16, name="r"),
    pointwise("silu_and_mul", 16, 1024, act_bytes=2, dtype=BF16, name="s"),
    pointwise("rotary", 8, 640, act_bytes=4, dtype=FP32, name="x"),
    Embedding(name="e", rows=8, n=512, act_bytes=4, dtype=FP32),
    KvWrite(name="w", rows=8, n=256, act_bytes=4, kv_bytes=4, dtype=FP32),
]


def same_record(a, b):
    """Same kind, dtype, FLOPs and bytes by source (records of one instance each)."""
    return (kind_names(a).ravel().tolist() == kind_names(b).ravel().tolist()
            and a.dtype_name(0) == b.dtype_name(0)
            and np.ravel(a.flops).tolist() == np.ravel(b.flops).tolist()
            and [np.ravel(x).tolist() for x in a.bytes.astuple()]
            == [np.ravel(x).tolist() for x in b.bytes.astuple()])


@pytest.mark.parametrize("op", RECORDS)
def test_op_row_round_trip(op):
    back = row_op({k: str(v) for k, v in op_row(op).items()})
    assert type(back) is type(op) and same_record(back, op)


def test_records_group_rows_by_record_type():
    rows = [{k: str(v) for k, v in op_row(op).items()} for op in RECORDS]
    groups = records(rows)
    assert [type(r) for _, r in groups] == [Gemm, Attention, type(RECORDS[2]), Embedding,
                                            KvWrite]
    assert [i.tolist() for i, _ in groups] == [[0], [1], [2, 3, 4], [5], [6]]
    for index, rec in groups:
        for j, i in enumerate(index):
            assert same_record(rec.take(np.array([j])), RECORDS[i])


def test_rows_without_a_row_form():
    with pytest.raises(ValueError, match="grouped GEMMs"):
        op_row(Gemm(m=4, n=8, k=8, groups=2))
    with pytest.raises(ValueError, match="windowed or multi-group"):
        op_row(Attention(batch=[1], q_len=[1], kv_len=[64], n_heads=4, n_kv_heads=4,
                         qk_dim=16, v_dim=16, cache_elems=32, window=32))


def test_shape_key_is_canonical():
    assert shape_key({"op": "gemm", "dtype": "fp32", "m": "64.0", "n": 64, "k": "64",
                      "batch": ""}) == "gemm fp32 m=64 n=64 k=64"


def test_bad_rows_name_row_and_column(toy):
    with pytest.raises(SpecError, match="row 2: column op: unsupported op 'conv'"):
        predict_rows([{"op": "conv", "measured_s": "1"}], toy)
    with pytest.raises(SpecError, match="row 3: column m"):
        predict_rows([gemm_row(), gemm_row(m="")], toy)
    with pytest.raises(SpecError, match="column measured_s"):
        predict_rows([gemm_row(measured="-1")], toy)


def test_drop_unsupported_keeps_predictable_rows_and_names_the_rest():
    rows = [{"op": "conv"}, gemm_row(), {"op": "rms_norm"}, {"op": "conv"}, {"op": ""}]
    kept, notes = drop_unsupported(rows)
    assert [r["op"] for r in kept] == ["gemm", "rms_norm"]
    assert notes == ["skipped 2 rows of op 'conv' (first at row 2): no formula for it",
                     "skipped 1 row of op '' (first at row 6): no formula for it"]
    with pytest.raises(SpecError, match=r"f\.csv: column op: no row has an op .*'conv'"):
        drop_unsupported([{"op": "conv"}], "f.csv")


def write_csv(path, lines):
    path.write_text("\n".join([HEADER, *lines]) + "\n")
    return path


def test_read_measurements(tmp_path):
    g = ",src,m1,1,gemm,fp16,64,64,64,,,,,,,1e-5,"
    path = write_csv(tmp_path / "a.csv", ["a100" + g, "mi210" + g])
    with pytest.raises(SpecError, match=r"several devices .*a100, mi210.*--device-filter"):
        read_measurements(path)
    rows = read_measurements(path, ["mi210"])
    assert len(rows) == 1 and rows[0]["device"] == "mi210" and rows[0]["batch"] == ""
    with pytest.raises(SpecError, match="no rows for h100"):
        read_measurements(path, ["h100"])
    (tmp_path / "b.csv").write_text("op,m\ngemm,1\n")
    with pytest.raises(SpecError, match=r"b\.csv: column measured_s: missing"):
        read_measurements(tmp_path / "b.csv")
    with pytest.raises(SpecError, match="no such file"):
        read_measurements(tmp_path / "nope.csv")


def test_splits_are_deterministic_and_disjoint():
    rows = [gemm_row(m=m, model=name) for m in (1, 2, 3, 64, 100, 512, 999)
            for name in ("b", "a", "c")]
    fit, rest, fit_models, eval_models = split_by_model(rows)
    assert (fit_models, eval_models) == (["a", "c"], ["b"])
    assert len(fit) == 14 and len(rest) == 7
    with pytest.raises(SpecError, match="at least two models"):
        split_by_model([gemm_row(model="a")])
    a, b = split_fraction(rows, 0.5)
    assert split_fraction(rows, 0.5) == (a, b) and len(a) + len(b) == len(rows)
    assert not {shape_key(r) for r in a} & {shape_key(r) for r in b}
    with pytest.raises(SpecError, match="fraction in"):
        split_fraction(rows, 1.5)
