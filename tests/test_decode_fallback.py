"""TensorRT-LLM's decode attention as it dispatches: XQA for 2 to 32 query heads per KV
head, with a 16-row tile for a 16-bit cache (HMMA) and 8 rows for an fp8 one on sm90 (GMMA,
swap-AB), and masked multi-head attention on the CUDA cores for the other groups
(``cost.decode_fallback``). Hand-derived from the H100 SXM file's ``engines.trtllm`` block."""

import math
import re
from dataclasses import replace

import numpy as np
import pytest

import perfmodel as pm
from perfmodel.cost.attention import decode_row_tile
from perfmodel.cost.decode_fallback import fallback_groups
from perfmodel.cost.ops import Attention
from perfmodel.cost.roofline import op_time


@pytest.fixture(scope="module")
def trt():
    return pm.hardware("h100-sxm", "trtllm")


def decode(heads, kv_heads, batch=64, kv=8192, hd=128, kv_bytes=2.0):
    return Attention(batch=np.array([[batch]]), q_len=np.array([[1]]),
                     kv_len=np.array([[kv]]), n_heads=heads, n_kv_heads=kv_heads, qk_dim=hd,
                     v_dim=hd, cache_elems=2 * hd, kv_bytes=kv_bytes)


def test_xqa_serves_two_to_32_query_heads_per_kv_head(trt):
    heads = np.array([8, 16, 64, 256, 48, 128])
    kv = np.array([8, 8, 2, 8, 1, 1])        # groups 1, 2, 32, 32, 48, 128
    assert fallback_groups(trt, heads, kv).tolist() == [True, False, False, False, True, True]
    vllm = pm.hardware("h100-sxm")           # FlashAttention serves every group
    assert not fallback_groups(vllm, heads, kv).any()


def test_row_tile_follows_the_cache_dtype(trt):
    assert int(decode_row_tile(trt, np.array(128), np.array(2.0))) == 16    # HMMA, mha.cu
    assert int(decode_row_tile(trt, np.array(128), np.array(1.0))) == 8     # GMMA, mha_sm90.cu
    # unset, the fp8 tile is the 16-bit one
    plain = replace(trt, efficiency=replace(trt.efficiency, attention_decode_tile_q_fp8=0))
    assert int(decode_row_tile(plain, np.array(128), np.array(1.0))) == 16


def test_fallback_compute_runs_at_its_share_of_the_fp32_peak(trt):
    """A group of 64 on one KV head at a long cache is CUDA-core bound: its compute time is
    its FLOPs over fp32 peak x attention_fallback_fraction, over the waves of its one program
    per query head (64 sequences x 64 heads = 4096 on 132 SMs, unsplit: MMHA fills the SMs
    without a split), each doing 8192 keys + attention_fallback_program_keys of work."""
    eff = trt.efficiency
    op = decode(64, 1)
    t = op_time(op, trt, "kernel")
    n, units, keys = 64 * 64, trt.compute_units, 8192
    work = keys + eff.attention_fallback_program_keys
    makespan = (n * keys + n * eff.attention_fallback_program_keys) / units \
        + (math.ceil(n / units) - n / units) * work
    share = n * keys / (units * makespan)
    want = float(op.flops[0]) / (trt.peak("fp32") * eff.attention_fallback_fraction * share)
    assert float(t.compute_s[0]) == pytest.approx(want, rel=1e-12)
    assert float(t.compute_s[0]) > float(t.memory_s[0])           # compute-bound, as measured


def test_mmha_splits_a_long_cache_to_fill_the_sms(trt):
    """MMHA's multi-block grid: ceil(SMs / programs) blocks per head, but at least one
    unrolled key loop (8 x 256 threads / (head_dim / 8) keys: 128 at head_dim 128) each."""
    from perfmodel.cost.decode_fallback import fallback_splits

    units = trt.compute_units                   # 132
    got = fallback_splits(trt, np.array([128, 128, 128, 64]), np.array([8, 8, 4096, 8]),
                          np.array([65536, 300, 65536, 300]))
    assert got.tolist() == [math.ceil(units / 8), 3, 1, 2]


def test_fallback_is_slower_than_the_same_shape_on_xqa(trt):
    """One KV head's cache read by 32 query heads (XQA, tensor cores) and by 48 (MMHA, CUDA
    cores): the same bytes, 1.5x the FLOPs, and more time at every cache length."""
    for kv in (1024, 8192, 65536):
        served = op_time(decode(32, 1, kv=kv), trt, "kernel").time_s
        refused = op_time(decode(48, 1, kv=kv), trt, "kernel").time_s
        assert float(refused[0]) > float(served[0])


def test_a_device_without_the_fallback_prices_as_before(trt):
    off = replace(trt, efficiency=replace(trt.efficiency, attention_fallback_fraction=0.0))
    op = decode(64, 1)
    packed = op_time(op, off, "kernel")
    assert float(packed.compute_s[0]) < float(op_time(op, trt, "kernel").compute_s[0])


def test_reader_bounds_the_fraction(tmp_path):
    from perfmodel.specs.errors import SpecError

    text = (pm.__path__[0] + "/hardware/h100-sxm.yaml")
    body = re.sub(r"attention_fallback_fraction: [0-9.]+", "attention_fallback_fraction: 1.5",
                  open(text).read(), count=1)
    path = tmp_path / "bad.yaml"
    path.write_text(body)
    with pytest.raises(SpecError, match="attention_fallback_fraction"):
        pm.hardware(str(path), "trtllm")
