"""trtllm-gen MLA generation's CTA rule (cost/latent_tiles.py, reports/kernels/trtmla)."""

from dataclasses import replace

import numpy as np
import pytest

import perfmodel as pm
from perfmodel.cost import attention_kernels as ak
from perfmodel.cost.latent_tiles import latent_streams, trtllm_gen_splits
from perfmodel.cost.ops import Attention
from perfmodel.cost.roofline import op_time


def latent(heads: int, batch: int = 256, kv: int = 65536, kv_bytes: float = 2.0) -> Attention:
    return Attention(batch=np.array([[batch]]), q_len=np.array([[1]]), kv_len=np.array([[kv]]),
                     n_heads=heads, n_kv_heads=1, qk_dim=576, v_dim=512, cache_elems=576,
                     kv_bytes=kv_bytes)


def test_head_tiles_follow_the_kernel_selection():
    """Up to 8 heads one 8-row CTA, up to 16 one 16-row CTA, 32 two of them; 64 one 64-row
    CTA, 128 one 2-CTA pair (fmhaKernels.h hashFromRunnerParams)."""
    eff = pm.hardware("b200", "trtllm").efficiency
    assert latent_streams(eff, np.array([1, 8, 16, 32, 64, 128])).tolist() \
        == [1, 1, 1, 2, 1, 1]


def test_32_heads_stream_the_cache_again_through_l2():
    """A long cache at a large batch is bandwidth-bound: 32 heads take 1 + the restream share
    of 16 heads' time, 64 heads (one CTA) about 16 heads' time."""
    b200 = pm.hardware("b200", "trtllm")
    share = b200.efficiency.attention_kernels["trtllm_gen_mla"]["attention_restream_fraction"]
    t = {h: float(op_time(latent(h), b200, "kernel").time_s[0]) for h in (16, 32, 64)}
    assert t[32] / t[16] == pytest.approx(1 + share, rel=0.02)
    assert t[64] / t[16] == pytest.approx(1.0, rel=0.1)


def test_split_takes_two_key_steps_and_fills_the_sms():
    """min(ceil(keys / 256), SMs // CTAs): no split up to 256 keys or past 148 CTAs."""
    b200 = pm.hardware("b200", "trtllm")
    on = np.ones((1, 1), dtype=bool)
    assert trtllm_gen_splits(b200, latent(16, 1, 256), on).tolist() == [1]
    assert trtllm_gen_splits(b200, latent(16, 1, 257), on).tolist() == [2]
    assert trtllm_gen_splits(b200, latent(16, 1, 131072), on).tolist() == [148]
    assert trtllm_gen_splits(b200, latent(32, 64, 131072), on).tolist() == [1]


def test_fp8_cache_runs_its_own_build_without_a_cast_kernel():
    """An FP8 cache prices on trtllm_gen_mla@fp8 at the FP8 peak; the query was quantized by
    the rope kernel (attention_q_cast_fused), so no cast kernel or bytes are added."""
    b200 = pm.hardware("b200", "trtllm")
    view = ak.for_kernel(b200, "trtllm_gen_mla")
    fp8 = ak.fp8_view(view)
    assert fp8.efficiency.attention_backend == "trtllm_gen_mla@fp8"
    assert fp8.efficiency.attention_q_cast_fused
    assert not ak.q_cast_bytes(fp8, np.array([1e6]), np.array([2.0]), np.array([1.0])).any()
    got = float(op_time(latent(128, kv_bytes=1.0), b200, "kernel").time_s[0])
    alone = float(op_time(latent(128, kv_bytes=1.0), fp8, "kernel").time_s[0])
    assert got == pytest.approx(alone, rel=1e-12)


def test_flashmla_streams_once_per_64_heads_and_charges_five_blocks_a_sequence():
    """FlashMLA (H100 / H200 trtllm): 128 heads run two 64-row CTAs per part, the second
    stream at the restream share; an empty cache still costs the scheduler's 5 blocks a
    sequence, so doubling the batch of a 2-key cache (past one per part) costs more."""
    from perfmodel.cost.latent_tiles import flashmla_fill

    h200 = pm.hardware("h200-sxm", "trtllm")
    view = ak.for_kernel(h200, "flashmla")
    assert view.efficiency.attention_latent_sched == "flashmla"
    assert latent_streams(view.efficiency, np.array([64, 128])).tolist() == [1, 2]
    on = np.ones((1, 1), dtype=bool)
    share, splits = flashmla_fill(view, latent(64, 1, 131072), on)
    # 2,048 + 5 blocks over parts of ceil(2,053 / 132) + 5 = 21 blocks: 98 pieces
    assert splits.tolist() == [98]
    assert float(share[0]) == pytest.approx(2048 / (132 * (np.ceil(2053 / 132) + 5)))
    t = [float(op_time(latent(16, b, 2), h200, "kernel").time_s[0]) for b in (256, 512)]
    assert t[1] > t[0]
    off = replace(view, efficiency=replace(view.efficiency, attention_restream_fraction=0.0))
    assert float(op_time(latent(128), view, "kernel").time_s[0]) \
        > float(op_time(latent(128), off, "kernel").time_s[0])
