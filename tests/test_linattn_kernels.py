"""Linear-attention corpus rows (aiconfigurator's gdn_perf / kda_perf) and the scan's
engine kernels (``cost.scan_kernels``): the importer's columns, the row form against the
model's own record, hand goldens of the kernel rule and the hardware block's checks."""

from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from perfmodel.compare.rows import records
from perfmodel.cost.roofline import _stream_time, op_time
from perfmodel.cost.scan import LinearScan
from perfmodel.cost.scan_kernels import call_class, chain_bytes
from perfmodel.cost.timebase import peak
from perfmodel.kernels.aic_linear import linear
from perfmodel.specs.dtypes import CODE
from perfmodel.specs.efficiency_block import _scan_kernels
from perfmodel.specs.errors import SpecError
from perfmodel.specs.fields import Fields
from perfmodel.specs.load import hardware

H200 = hardware("h200-sxm")
BF16 = CODE["bf16"]


def _frame(kernels, phase="context", batch=2, seq=128):
    n = len(kernels)
    return pd.DataFrame({"kernel_source": kernels, "phase": [phase] * n,
                         "batch_size": [batch] * n, "seq_len": [seq] * n, "d_conv": [4] * n,
                         "num_k_heads": [16] * n, "head_k_dim": [128] * n,
                         "num_v_heads": [32] * n, "head_v_dim": [128] * n})


def test_importer_columns_by_hand():
    """Conv channels 2 x 16 x 128 + 32 x 128 = 8192; a chunked row has no state before
    (kv_len = q_len), chunks of 64; SGLang normalises q and k in the call, TRT-LLM does not."""
    df = _frame(["causal_conv1d_fn", "chunk_gated_delta_rule"])
    cols, known = linear(df, "sglang", "gdn_perf")
    assert list(cols["op"]) == ["conv1d", "linear_attention"] and known.all()
    assert cols["n"][0] == 8192 and cols["m"][0] == 256
    assert cols["chunk"][1] == 64 and cols["kv_len"][1] == 128
    assert list(cols["l2norm"]) == [1, 1]
    assert list(linear(df, "trtllm", "gdn_perf")[0]["l2norm"]) == [0, 0]
    assert linear(df, "vllm", "gdn_perf")[0]["l2norm"][1] == 0


def test_importer_kda_and_decode_rows():
    """KDA's three convs: calls 3 of 32 x 128 channels; a decode row is a recurrent step
    (chunk 1) after a state; the fused decode modules are kept without a formula."""
    df = _frame(["causal_conv1d_fn_qkv3", "fused_recurrent_kda_packed_decode",
                 "kda_fused_decode"], phase="generation", seq=1)
    cols, _ = linear(df, "sglang", "kda_perf")
    assert cols["calls"][0] == 3 and cols["n"][0] == 32 * 128
    assert cols["chunk"][1] == 1 and cols["kv_len"][1] == 2
    assert cols["channel_gates"][1] == 128 and cols["op"][2] == "kda_module"


def _row(**kw):
    base = {"op": "linear_attention", "dtype": "bf16", "batch": 2, "q_len": 128,
            "kv_len": 128, "n_heads": 32, "n_kv_heads": 16, "head_dim": 128, "v_dim": 128,
            "chunk": 64, "l2norm": 1, "channel_gates": 0}
    return base | kw


def test_row_form_is_the_models_record():
    """The row's record is the LinearScan the step template builds for Gated DeltaNet
    (q and k at the value heads, the L2 norm over the q/k heads, gates g and beta)."""
    (_, op), = records([_row()])
    want = LinearScan(batch=np.array([[2.0]]), q_len=np.array([[128.0]]),
                      kv_len=np.array([[128.0]]), heads=32, qk_heads=32, d_k=128, d_v=128,
                      chunk=64, delta=True, gates=2, l2norm_heads=16, channel_gates=0,
                      act_bytes=2.0, state_bytes=4.0, dtype=BF16)
    assert float(op.flops[0]) == pytest.approx(float(np.ravel(want.flops)[0]))
    assert float(op.bytes.total[0]) == pytest.approx(float(np.ravel(want.bytes.total)[0]))


def _with(table):
    return replace(H200, efficiency=replace(H200.efficiency, scan_kernels=table))


def test_chain_bytes_by_hand():
    """Per token and head (d_k = d_v = 128, Q = 64, bf16): g's cumsum 5 x 4, A at fp32 and
    bf16 2 x 64 x (4 + 2), w and u 2 x 256 x 2, v_new 2 x 128 x 2, k read 3 more times
    3 x 128 x 2: 3,092 B; x 2 sequences x 128 tokens x 32 heads."""
    (_, op), = records([_row()])
    assert float(np.ravel(chain_bytes(op))[0]) == 3092 * 2 * 128 * 32


def test_chunked_time_by_hand():
    """Every term by hand on an H200 (its file's bf16 peak and bandwidth): memory-bound at
    memory_fraction 0.5 plus (6 + 2 l2norm) launches of 3 us; the serial term,
    ceil(2 x 32 x 4 / 132) = 2 waves x 2 chunks x step_s, wins when step_s is large."""
    (_, op), = records([_row()])
    fast = _with({"delta_chunk": (0.9, 0.5, 3e-6, 0.0, 6.0, 32.0)})
    flops, counts = op.group_work()
    nbytes = float(np.ravel(counts.total)[0]) + 3092 * 2 * 128 * 32
    memory = nbytes / (H200.memory_bytes_per_s * 0.5)
    compute = float(np.ravel(flops)[0]) / (float(np.ravel(peak(fast, BF16))[0]) * 0.9)
    assert memory > compute
    got = float(op_time(op, fast, "kernel").time_s[0])
    assert got == pytest.approx(memory + 8 * 3e-6, rel=1e-9)
    slow = _with({"delta_chunk": (0.9, 0.5, 3e-6, 1e-3, 6.0, 32.0)})
    assert float(op_time(op, slow, "kernel").time_s[0]) == pytest.approx(
        2 * 2 * 1e-3 + 8 * 3e-6, rel=1e-9)


def test_serial_term_follows_waves_not_batch():
    """With the serial step dominant, one and two sequences of 32 heads x 4 programs
    (128 and 256 programs on 132 SMs) take one and two waves; a fused kernel (one launch,
    one program per head) runs both in one wave."""
    table = {"delta_chunk": (0.9, 0.9, 0.0, 1e-3, 6.0, 32.0)}
    one, two = (records([_row(batch=b, l2norm=0)])[0][1] for b in (1, 2))
    t1, t2 = (float(op_time(o, _with(table), "kernel").time_s[0]) for o in (one, two))
    assert t2 == pytest.approx(2 * t1)
    fused = {"delta_chunk": (0.9, 0.9, 0.0, 1e-3, 1.0, 0.0)}
    f1, f2 = (float(op_time(o, _with(fused), "kernel").time_s[0]) for o in (one, two))
    assert f1 == pytest.approx(f2)


def test_decode_is_a_step_class_and_without_a_table_the_stream_rule():
    (_, op), = records([_row(q_len=1, kv_len=2, chunk=1)])
    assert int(np.ravel(call_class(op))[0]) == 1                    # delta_step
    bare = _with({})                          # no scan_kernels: one fused kernel
    plain = float(op_time(op, bare, "kernel").time_s[0])
    assert plain == float(_stream_time(op, bare, 0).time_s[0])
    other = _with({"delta_chunk": (0.9, 0.9, 1.0, 1.0, 6.0, 32.0)})  # only the chunk class
    step = float(op_time(op, other, "kernel").time_s[0])
    assert step < 1e-3                        # the step class takes the device's figures


def test_hardware_block_checked():
    f = Fields({"scan_kernels": {"delta_chunk": {"gemm_fraction": 0.1,
                                                 "memory_fraction": 0.5,
                                                 "latency_s": 3e-6, "launches": 6}}}, "h.yaml")
    assert _scan_kernels(f.sub("scan_kernels")) == {
        "delta_chunk": (0.1, 0.5, 3e-6, 0.0, 6.0, 0.0)}
    bad = Fields({"scan_kernels": {"gdn": {"gemm_fraction": 0.1}}}, "h.yaml")
    with pytest.raises(SpecError, match=r"scan_kernels.*gdn.*expected a scan call class"):
        _scan_kernels(bad.sub("scan_kernels"))
    over = Fields({"scan_kernels": {"kda_step": {"gemm_fraction": 1.5, "memory_fraction": 0.5,
                                                 "latency_s": 1e-6}}}, "h.yaml")
    with pytest.raises(SpecError, match="gemm_fraction"):
        _scan_kernels(over.sub("scan_kernels"))


def test_verify_writes_a_state_per_draft_token():
    """A recurrent call over 4 draft tokens (chunk 1) streams 3 more states than the one
    it ends with: 3 x 2 sequences x 32 x 128 x 128 x 4 bytes at the class's fraction."""
    table = {"delta_step": (0.9, 0.5, 0.0, 0.0, 1.0, 8.0)}
    (_, op), = records([_row(q_len=4, kv_len=5, chunk=1, l2norm=0)])
    _, counts = op.group_work()
    extra = 3 * 2 * 32 * 128 * 128 * 4
    want = (float(np.ravel(counts.total)[0]) + extra) / (H200.memory_bytes_per_s * 0.5)
    assert float(op_time(op, _with(table), "kernel").time_s[0]) == pytest.approx(want)


@pytest.mark.parametrize("device", ["h100-sxm", "h200-sxm", "b200"])
def test_shipped_source_figures_are_the_kernels(device):
    """Each engine's shipped scan_kernels carry the launches and state columns of the
    kernels' source (validate/corpus/scan_kernels.yaml), and a chunked prefill is slower
    than before (the stream rule) for a long Qwen3-Next-sized prompt."""
    from validate.corpus.scan import SOURCES

    (_, op), = records([_row(batch=1, q_len=8192, kv_len=8192)])
    for engine, classes in SOURCES["engines"].items():
        hw = hardware(device, engine)
        assert hw.efficiency.scan_kernels, (device, engine)
        for cls, src in classes.items():
            row = hw.efficiency.scan_kernels[cls]
            assert row[4:] == (src["launches"], src["state_columns"]), (device, engine, cls)
        plain = replace(hw, efficiency=replace(hw.efficiency, scan_kernels={}))
        assert op_time(op, hw, "kernel").time_s[0] > op_time(op, plain, "kernel").time_s[0]
