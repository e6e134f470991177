"""MLA attention as its kernels run it: aiconfigurator's MLA tables read as the collector
laid them out (``kernels.aiconfigurator.mla``), and a decode over the latent cache tiled in
64 query rows (FlashMLA, FlashAttention-3 for head dims 64 + 512), not FA3's 128 of a
head-dim-128 decode."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd

import perfmodel as pm
from perfmodel.cost.attention import attention_time
from perfmodel.cost.ops import Attention
from perfmodel.kernels.aiconfigurator import mla


def _table(**cols) -> pd.DataFrame:
    base = {"mla_dtype": ["bfloat16"], "kv_cache_dtype": ["bfloat16"], "num_heads": [16],
            "batch_size": [4], "isl": [1], "step": [4095], "kernel_source": ["default"]}
    return pd.DataFrame(base | cols)


def test_generation_rows_are_absorbed_mqa_over_the_latent() -> None:
    cols, known = mla(_table(), generation=True, engine="trtllm")
    assert known.all()
    assert (cols["head_dim"][0], cols["v_dim"][0], cols["cache_dim"][0]) == (576, 512, 576)
    assert cols["n_kv_heads"][0] == 1 and cols["kv_len"][0] == 4096 and cols["q_len"][0] == 1


def test_trtllm_context_rows_are_expanded_mha() -> None:
    cols, _ = mla(_table(isl=[2048], step=[0]), generation=False, engine="trtllm")
    assert (cols["head_dim"][0], cols["v_dim"][0]) == (192, 128)
    assert cols["n_kv_heads"][0] == 16 and cols["kv_len"][0] == 2048


def test_sglang_hopper_context_rows_are_latent_and_blackwell_expanded() -> None:
    cols, _ = mla(_table(isl=[512, 512], step=[0, 0], num_heads=[16, 16],
                         kernel_source=["flash_attention", "trtllm_mla"],
                         mla_dtype=["bfloat16"] * 2, kv_cache_dtype=["fp8"] * 2,
                         batch_size=[1, 1]), generation=False, engine="sglang")
    assert list(cols["head_dim"]) == [576, 192] and list(cols["n_kv_heads"]) == [1, 1]
    assert list(cols["kv_dtype"]) == ["fp8", "fp8"]


def _latent_decode(heads: int, batch: int = 64, kv: int = 8192) -> Attention:
    return Attention(batch=np.array([[batch]]), q_len=np.array([[1]]),
                     kv_len=np.array([[kv]]), n_heads=heads, n_kv_heads=1, qk_dim=576,
                     v_dim=512, cache_elems=576)


def test_latent_decode_of_few_heads_streams_the_cache() -> None:
    """16 heads of one KV head in a 64-row tile: 64 x 2 x (576 + 512) FLOPs per cached
    position against its 1,152 bytes = 121 FLOP/B, under the H200's ridge (989e12 /
    4.8e12 = 206): the decode is bound by the latent's bytes. In a 128-row tile it would be
    242 FLOP/B and compute-bound (the pre-fix model: 2.4-2.9 TB/s predicted where the
    corpus's FlashMLA / FA3 rows stream 4.1-4.2 TB/s)."""
    hw = pm.hardware("h200-sxm")
    t = attention_time(_latent_decode(16), hw, 0)
    assert float(np.ravel(t.memory_s)[0]) > float(np.ravel(t.compute_s)[0])
    wide_hw = replace(hw, efficiency=replace(hw.efficiency, attention_decode_tile_q_latent=128))
    wide = attention_time(_latent_decode(16), wide_hw, 0)
    assert float(np.ravel(wide.compute_s)[0]) > float(np.ravel(wide.memory_s)[0])


def test_latent_tile_leaves_head_dim_128_decode_alone() -> None:
    """A GQA decode (head_dim 128) keeps attention_decode_tile_q whatever the latent tile."""
    hw = pm.hardware("h200-sxm")
    op = Attention(batch=np.array([[64]]), q_len=np.array([[1]]), kv_len=np.array([[8192]]),
                   n_heads=32, n_kv_heads=8, qk_dim=128, v_dim=128, cache_elems=256)
    other = replace(hw, efficiency=replace(hw.efficiency, attention_decode_tile_q_latent=16))
    assert float(np.ravel(attention_time(op, hw, 0).compute_s)[0]) == \
        float(np.ravel(attention_time(op, other, 0).compute_s)[0])
