"""TensorRT-LLM's XQA as rc20-era source runs it (``cost.decode_fallback``): its history
block of 128 keys, at least one block whatever the history in the dispatch rule, its
multi-block count, MMHA's fixed work per program in loop steps, and XQA's own constants
beside the context FMHA's. Hand-derived from the H100 SXM file's ``engines.trtllm`` block
(132 SMs)."""

import re

import numpy as np
import pytest

import perfmodel as pm
from perfmodel.cost import attention_kernels as ak
from perfmodel.cost.decode_fallback import fallback_mask, fallback_program_keys, xqa_splits
from perfmodel.cost.ops import Attention


@pytest.fixture(scope="module")
def trt():
    return pm.hardware("h100-sxm", "trtllm")


def decode(heads, kv_heads, batch, kv, hd=128):
    return Attention(batch=np.array([[batch]]), q_len=np.array([[1]]),
                     kv_len=np.array([[kv]]), n_heads=heads, n_kv_heads=kv_heads, qk_dim=hd,
                     v_dim=hd, cache_elems=2 * hd, kv_bytes=2.0)


def test_xqa_runs_on_a_short_history_once_its_blocks_fill_a_quarter_of_the_sms(trt):
    """mayHavePerfGain: KV heads x sequences x max(1, past // 128) x 4 >= 132. One past key:
    33 (sequence, KV head) blocks run XQA, 32 run MMHA; 511 past keys (3 blocks each): 11
    sequences run XQA, 10 run MMHA."""
    one = np.ones((1, 1), dtype=bool)
    runs_mmha = [bool(fallback_mask(decode(8, 1, b, kv), trt, one)[0, 0])
                 for b, kv in ((32, 2), (33, 2), (10, 512), (11, 512))]
    assert runs_mmha == [True, False, True, False]


def test_xqa_multi_block_count(trt):
    """computeMultiBlockCount: past // 128, at most round(sqrt(8 x that)), cut back past 8
    waves of 132 SMs. 8,191 past keys: 63 -> 22 (sqrt 504 = 22.4); on 1,024 (sequence, KV
    head) pairs 1024 x 22 / 132 / 8 = 21.3 waves over, floor(22 / 21.3) = 1; 1,023 past keys
    on 4: 7 (sqrt 56 = 7.5 -> 7); 100 past keys: at least 1."""
    got = xqa_splits(trt, np.array([8, 1024, 4, 8]), np.array([1, 128, 4, 1]),
                     np.array([8191, 8191, 1023, 100]))
    assert got.tolist() == [22, 1, 7, 1]


def test_mmha_fixed_work_is_the_same_time_at_every_head_dim(trt):
    """A loop step covers 8 x 256 / head_dim keys, so the fixed work in key positions halves
    as head_dim doubles, and its FLOPs (4 x head_dim a key) stay the same."""
    steps = trt.efficiency.attention_fallback_program_steps
    keys = fallback_program_keys(trt, np.array([64.0, 128.0, 256.0]))
    assert keys.tolist() == pytest.approx([steps * 32, steps * 16, steps * 8])
    assert (keys * np.array([64, 128, 256])).tolist() == pytest.approx([steps * 2048] * 3)


def test_another_kernels_profile_does_not_inherit_the_decode_constants(trt):
    """FlashMLA's profile is laid over the block for MLA's decode: XQA's own decode constants
    are not FlashMLA's, so the view drops them (and XQA's split rule)."""
    eff = trt.efficiency
    assert eff.attention_decode_program_keys > 0 and eff.attention_decode_splits == "xqa"
    view = ak.for_kernel(trt, eff.attention_latent_kernel).efficiency
    assert view.attention_decode_fraction is None
    assert view.attention_decode_program_keys == 0.0
    assert view.attention_decode_latency_s == 0.0
    assert view.attention_decode_splits == ""


def test_a_call_with_prefill_and_decode_pays_both_kernels_fixed_costs(trt):
    """The context and generation kernels run one after the other: a call holding a prefill
    chunk and a decode pays the call's fixed cost and XQA's."""
    from perfmodel.cost.roofline import op_time

    eff = trt.efficiency
    both = Attention(batch=np.array([[1, 1]]), q_len=np.array([[512, 1]]),
                     kv_len=np.array([[512, 4096]]), n_heads=32, n_kv_heads=8, qk_dim=128,
                     v_dim=128, cache_elems=256, kv_bytes=2.0)
    fixed = float(op_time(both, trt, "kernel").fixed_s[0])
    assert fixed >= eff.latency_for("attention") + eff.attention_decode_latency_s


def test_reader_wants_a_known_split_rule(tmp_path):
    from perfmodel.specs.errors import SpecError

    text = open(pm.__path__[0] + "/hardware/h100-sxm.yaml").read()
    body = re.sub(r"attention_decode_splits: xqa", "attention_decode_splits: flash", text,
                  count=1)
    path = tmp_path / "bad.yaml"
    path.write_text(body)
    with pytest.raises(SpecError, match="attention_decode_splits"):
        pm.hardware(str(path), "trtllm")
