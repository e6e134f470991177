"""compare.forms: corpus row forms priced as the kernels the measured call ran (a collective
by hand from the hardware file, W8A8 GEMMs with their activation quantization, attention
with its KV write, a MoE layer, windows), and bad values as one-line errors."""

import numpy as np
import pytest

from perfmodel.compare import predict_rows, row_op
from perfmodel.compare.rows import row_parts
from perfmodel.cost.ops import Attention, Gemm, KvWrite
from perfmodel.cost.quantize import ActQuant
from perfmodel.cost.roofline import op_time
from perfmodel.specs import SpecError
from tests.datasheet import datasheet

H100 = datasheet("h100-sxm")    # the hand derivations name its datasheet constants


def test_all_reduce_row_by_hand_from_the_yaml():
    link = H100.interconnect
    assert (link.link_bytes_per_s, link.latency_s, link.collective_latency_s,
            H100.efficiency.collective_fraction) == (450e9, 0.6e-6, 6.6e-6, 0.82)
    row = {"op": "all_reduce", "message_bytes": "8192", "n_devices": "4", "measured_s": "4.6e-6"}
    [out] = predict_rows([row], H100, "kernel")
    # ring: 6.6 us + 2(n-1) hops of 0.6 us + 2(n-1)/n x 8 KB at 82% of 450 GB/s (the tree,
    # 6.6 + 2 x 3 x 0.6 us + 8 KB at half that rate, is slower by 11 ns)
    ring = 6.6e-6 + 6 * 0.6e-6 + 1.5 * 8192 / (450e9 * 0.82)
    assert out["predicted_s"] == pytest.approx(ring, rel=1e-9)
    assert out["predicted_s"] == pytest.approx(10.233e-6, abs=1e-9)
    assert out["error"] == pytest.approx(ring / 4.6e-6 - 1)
    a2a = predict_rows([row | {"op": "all_to_all"}], H100, "kernel")[0]["predicted_s"]
    assert a2a == pytest.approx(6.6e-6 + 0.6e-6 + 0.75 * 8192 / (450e9 * 0.82))


def _sum(row, timing="kernel"):
    parts = row_parts([row], hw=H100)
    return sum(float(op_time(op, H100, timing).time_s[0]) for _, op, _ in parts), parts


def test_w8a8_gemm_adds_its_activation_quantization():
    base = {"op": "gemm", "dtype": "fp8", "m": "256", "n": "4096", "k": "4096",
            "measured_s": "1e-5"}
    bare = predict_rows([base], H100)[0]["predicted_s"]
    total, parts = _sum(base | {"act_quant": "tensor"})
    [(_, gemm, first), (_, quant, second)] = parts
    assert first and not second
    assert isinstance(gemm, Gemm) and isinstance(quant, ActQuant)
    # a reduction and a quantizing pass read the bf16 input twice, write fp8 once
    assert float(quant.bytes.total[0]) == 256 * 4096 * (2 * 2 + 1)
    assert float(op_time(gemm, H100, "kernel").time_s[0]) == pytest.approx(bare)
    with_quant = predict_rows([base | {"act_quant": "tensor"}], H100)[0]
    assert with_quant["predicted_s"] == pytest.approx(total) and total > bare
    token = _sum(base | {"act_quant": "token"})[1][1][1]
    # one pass, and its fp32 scale per 128-element group (cost.quantize)
    assert float(token.bytes.total[0]) == 256 * 4096 * (3 + 4 / 128)
    assert with_quant["op_class"] == "gemm"                      # the GEMM's class


def test_attention_row_adds_its_kv_write_and_reads_an_fp8_cache():
    row = {"op": "attention", "dtype": "bf16", "kv_dtype": "fp8", "batch": "8", "q_len": "1",
           "kv_len": "4096", "n_heads": "32", "n_kv_heads": "8", "head_dim": "128",
           "measured_s": "2e-5"}
    [(_, att, primary)] = row_parts([row])
    assert primary
    assert isinstance(att, Attention)
    assert float(att.bytes.kv_read[0]) == 8 * 8 * 4096 * 256 * 1.0  # one byte per element
    total, parts = _sum(row | {"kv_write": "1"})
    write = parts[1][1]
    assert isinstance(write, KvWrite)
    assert float(write.bytes.total[0]) == 8 * 2 * 8 * 128 * (2 + 1)  # read bf16, store fp8
    got = predict_rows([row | {"kv_write": "1"}], H100)[0]["predicted_s"]
    assert got == pytest.approx(total)


def test_window_caps_the_positions_read():
    row = {"op": "attention", "dtype": "bf16", "batch": "1", "q_len": "1", "kv_len": "8192",
           "n_heads": "8", "n_kv_heads": "8", "head_dim": "128", "measured_s": "1e-5"}
    full = row_parts([row])[0][1]
    windowed = row_parts([row | {"window": "128"}])[0][1]
    assert float(full.bytes.kv_read[0]) == pytest.approx(64 * float(windowed.bytes.kv_read[0]))


def test_moe_row_is_two_grouped_gemms_and_the_activation():
    row = {"op": "moe", "dtype": "bf16", "m": "4096", "n": "4096", "k": "7168",
           "experts": "8", "topk": "2", "measured_s": "1e-3"}
    parts = row_parts([row])
    up, down = parts[0][1], parts[2][1]
    # 4096 tokens touch all 8 experts: 1024 rows each; up/gate 2 x 7168 wide
    assert float(up.groups[0]) == pytest.approx(8.0)
    assert float(up.m[0]) == pytest.approx(1024.0)
    assert float(up.flops[0] + down.flops[0]) == pytest.approx(
        2 * 4096 * 2 * (2 * 7168 * 4096 + 4096 * 7168))
    ep = row_parts([row | {"ep": "4"}])[0][1]
    assert float(ep.groups[0]) == pytest.approx(2.0)     # 8 experts over 4 devices
    assert float(ep.m[0] * ep.groups[0]) == pytest.approx(4096 * 2 / 4)


def test_skewed_expert_parallel_moe_prices_the_busiest_device():
    # Zipf s = 1.2 over 8 experts, top-2: the two hottest (on device 0 of 4, contiguous
    # ids, as the collector places them) hold p1 + p2 of the 2 picks per token
    from perfmodel.cost.routing import zipf_popularity

    p = zipf_popularity(8, 2, 1.2)
    row = {"op": "moe", "dtype": "bf16", "m": "4096", "n": "4096", "k": "7168",
           "experts": "8", "topk": "2", "ep": "4", "skew": "1.2", "measured_s": "1e-3"}
    parts = row_parts([row])
    up, act = parts[0][1], parts[1][1]
    assert float(act.rows[0]) == pytest.approx(4096 * (p[0] + p[1]))
    assert float(act.rows[0]) > 4096 * 2 / 4     # busier than the mean device
    # the GEMMs run each expert's rows padded to fused_moe's 64-row block (M > E)
    padded = sum(np.ceil(4096 * q / 64) * 64 for q in p[:2])
    assert float(up.m[0] * up.groups[0]) == pytest.approx(padded)


@pytest.mark.parametrize(("column", "value", "message"), [
    ("act_quant", "rowwise", "column act_quant: expected one of tensor, token or blank"),
    ("weight_format", "fp3", "column weight_format: unknown 'fp3'"),
    ("kv_dtype", "fp9", "column kv_dtype: unknown dtype 'fp9'"),
    ("window", "-4", "column window: expected a non-negative number")])
def test_bad_extra_columns_are_one_line_errors(column, value, message):
    op = "attention" if column in ("kv_dtype", "window") else "gemm"
    row = {"op": op, "dtype": "bf16", "m": "4", "n": "4", "k": "4", "batch": "1", "q_len": "1",
           "kv_len": "4", "n_heads": "1", "n_kv_heads": "1", "head_dim": "64",
           "measured_s": "1e-6", column: value}
    with pytest.raises(SpecError, match=message):
        predict_rows([row], H100)


def test_plain_rows_have_one_part_and_keep_their_record():
    row = {"op": "gemm", "dtype": "bf16", "m": "64", "n": "64", "k": "64"}
    [(index, _op, primary)] = row_parts([row])
    assert primary and np.array_equal(index, [0]) and isinstance(row_op(row), Gemm)
