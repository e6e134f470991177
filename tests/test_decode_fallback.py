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
from perfmodel.cost import attention_kernels as ak
from perfmodel.cost.attention import decode_row_tile
from perfmodel.cost.decode_fallback import fallback_groups, fallback_mask
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
    without a split), each doing 8192 keys + its own work, attention_fallback_program_steps
    loop steps of 8 x 256 / head_dim keys each."""
    eff = trt.efficiency
    op = decode(64, 1)
    t = op_time(op, trt, "kernel")
    n, units, keys = 64 * 64, trt.compute_units, 8192
    fixed = eff.attention_fallback_program_steps * 8 * 256 / 128
    work = keys + fixed
    makespan = (n * keys + n * fixed) / units \
        + (math.ceil(n / units) - n / units) * work
    share = n * keys / (units * makespan)
    want = float(op.flops[0]) / (trt.peak("fp32") * eff.attention_fallback_fraction * share)
    assert float(t.compute_s[0]) == pytest.approx(want, rel=1e-12)
    assert float(t.compute_s[0]) > float(t.memory_s[0])           # compute-bound, as measured


def test_mmha_splits_a_long_cache_to_fill_the_sms(trt):
    """MMHA's multi-block grid: ceil(SMs / programs) blocks per head, but at least one
    unrolled key loop of its block each, grown to 1,024 threads with fewer programs than SMs
    (8 x 1024 threads / (head_dim / 8) keys: 512 at head_dim 128, 1,024 at 64)."""
    from perfmodel.cost.decode_fallback import fallback_splits

    units = trt.compute_units                   # 132
    got = fallback_splits(trt, np.array([128, 128, 128, 64]), np.array([8, 8, 4096, 8]),
                          np.array([65536, 2000, 65536, 2000]))
    assert got.tolist() == [math.ceil(units / 8), 4, 1, 2]


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


def latent(heads=128, batch=8, kv=8192):
    """MLA's absorbed decode as DeepSeek-V3 runs it: ``heads`` query heads on the one latent
    head (Q/K 512 + 64 rope, V 512), an fp8 cache."""
    return Attention(batch=np.array([[batch]]), q_len=np.array([[1]]), kv_len=np.array([[kv]]),
                     n_heads=heads, n_kv_heads=1, qk_dim=576, v_dim=512, cache_elems=576,
                     kv_bytes=1.0)


def test_mla_decode_runs_its_latent_kernel_not_the_fallback():
    """128 query heads on one KV head is a group XQA refuses; a 128-wide head decodes on
    MMHA, but MLA's 576-wide latent form runs FlashMLA on SM90 (decode_fallback's
    docstring), priced on the trtllm block's ``flashmla`` profile: turning the profile off
    prices it on the block's XQA constants, not on MMHA, and FlashMLA is faster than MMHA's
    CUDA-core price of the same FLOPs would be. (XQA's own fixed work per CTA, refitted at
    about 560 key positions of a 128-wide head, makes the counterfactual XQA price of a
    576-wide latent slower than that; TensorRT-LLM never runs MLA on XQA.)"""
    h200 = pm.hardware("h200-sxm", "trtllm")
    assert fallback_groups(h200, np.array(128), np.array(1))
    on = np.ones((1, 1), dtype=bool)
    assert fallback_mask(decode(128, 1), h200, on).all()
    assert not fallback_mask(latent(), h200, on).any()
    assert h200.efficiency.attention_latent_kernel == "flashmla"
    flash = op_time(latent(), h200, "kernel")
    alone = op_time(latent(), ak.for_kernel(h200, "flashmla"), "kernel")
    assert float(flash.time_s[0]) == pytest.approx(float(alone.time_s[0]), rel=1e-12)
    off = replace(h200, efficiency=replace(h200.efficiency, attention_latent_kernel=""))
    xqa = op_time(latent(), off, "kernel")
    assert float(flash.time_s[0]) != pytest.approx(float(xqa.time_s[0]), rel=0.01)
    cuda_cores = float(latent().flops[0]) / h200.peak("fp32")
    assert float(flash.time_s[0]) < cuda_cores


def test_a_batch_of_mla_and_gqa_decodes_prices_each_on_its_own_kernel():
    """Two instances in one call, one latent and one GQA: each prices as it would alone."""
    h200 = pm.hardware("h200-sxm", "trtllm")
    a, b = latent(), decode(32, 8)
    both = Attention(batch=np.array([[8], [64]]), q_len=np.array([[1], [1]]),
                     kv_len=np.array([[8192], [8192]]), n_heads=np.array([128, 32]),
                     n_kv_heads=np.array([1, 8]), qk_dim=np.array([576, 128]),
                     v_dim=np.array([512, 128]), cache_elems=np.array([576, 256]),
                     kv_bytes=np.array([1.0, 2.0]))
    got = op_time(both, h200, "kernel").time_s
    assert got.tolist() == pytest.approx([float(op_time(a, h200, "kernel").time_s[0]),
                                          float(op_time(b, h200, "kernel").time_s[0])])


def test_reader_wants_the_latent_kernel_among_the_profiles(tmp_path):
    from perfmodel.specs.errors import SpecError

    text = open(pm.__path__[0] + "/hardware/h200-sxm.yaml").read()
    path = tmp_path / "bad.yaml"
    path.write_text(text.replace("attention_latent_kernel: flashmla",
                                 "attention_latent_kernel: flash_mla"))
    with pytest.raises(SpecError, match=r"bad.yaml: .*attention_latent_kernel: expected the "
                                        r"name of a profile listed under attention_kernels$"):
        pm.hardware(str(path), "trtllm")


def test_sglang_on_blackwell_decodes_mla_on_tensorrt_llms_profile():
    """SGLang's trtllm_mla backend runs TensorRT-LLM's trtllm-gen MLA kernels through
    FlashInfer: the B200 SGLang block carries the profile fitted on TensorRT-LLM's rows,
    unchanged (a refit of one must be copied to the other)."""
    sg, trt = pm.hardware("b200", "sglang"), pm.hardware("b200", "trtllm")
    assert sg.efficiency.attention_latent_kernel == "trtllm_gen_mla"
    assert trt.efficiency.attention_latent_kernel == "trtllm_gen_mla"
    assert sg.efficiency.attention_kernels["trtllm_gen_mla"] \
        == trt.efficiency.attention_kernels["trtllm_gen_mla"]
    h200 = pm.hardware("h200-sxm", "sglang")      # fa3's own (64, 512) build: no profile yet
    assert h200.efficiency.attention_latent_kernel == ""


def test_a_512_wide_head_of_its_own_is_not_mla():
    """The corpus decodes heads of 512 with their own K and V (a position holds 1,024
    elements): wide, but not MLA's shared latent, so they keep the block's backend and its
    dispatch; priced on the latent profile, B200 SGLang's sample of them moved 10.7 -> 14.3%."""
    sg = pm.hardware("b200", "sglang")
    wide = decode(4, 1, hd=512)
    off = replace(sg, efficiency=replace(sg.efficiency, attention_latent_kernel=""))
    assert float(op_time(wide, sg, "kernel").time_s[0]) \
        == float(op_time(wide, off, "kernel").time_s[0])
    assert float(op_time(latent(4), sg, "kernel").time_s[0]) \
        != pytest.approx(float(op_time(latent(4), off, "kernel").time_s[0]), rel=0.01)
    trt = pm.hardware("h100-sxm", "trtllm")
    assert fallback_mask(decode(128, 1, hd=512), trt, np.ones((1, 1), dtype=bool)).all()
