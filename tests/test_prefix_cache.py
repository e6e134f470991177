"""Prefix caching: a hit prefills only the tokens after the shared prefix (which still attend
the whole prompt), and the prefix's KV blocks are stored once for the batch. Golden values
derived by hand for Llama-3-8B (32 layers, d 4096, 32 query / 8 KV heads of 128, MLP 14336,
vocabulary 128256) on an H100 SXM."""

import json

import numpy as np
import pytest
from typer.testing import CliRunner

import perfmodel as pm
from perfmodel.cli.app import app

L, D, HEADS, KV, HD, FF, VOCAB = 32, 4096, 32, 8, 128, 14336, 128256
P, S, G, B = 4100, 4000, 16, 8          # prompt, shared prefix, generated, batch


def _linear_params() -> int:
    attn = D * (HEADS + 2 * KV) * HD + HEADS * HD * D
    return L * (attn + 3 * D * FF)


def _prefill_flops(new: int, context: int, seqs: int) -> float:
    """Linear layers on every new token, causal attention (QK and PV, 2 FLOPs per multiply-
    add) of each new token over the keys up to itself, LM head on the last token."""
    keys = new * (context - new) + new * (new + 1) // 2
    return seqs * (2 * _linear_params() * new + 4 * HD * HEADS * L * keys + 2 * D * VOCAB)


@pytest.fixture(scope="module")
def pair():
    hw, model = pm.hardware("h100-sxm"), pm.model("llama-3-8b")
    w = pm.Workloads.of(batch=B, prompt_len=P, gen_len=G, shared_prefix=[0, S])
    return hw, pm.estimate_many(hw, model, w)


def test_hits_prefill_only_the_tokens_after_the_prefix(pair):
    _, est = pair
    cold, warm = est.phase("prefill").total_flops
    linear_and_attention = pytest.approx(_prefill_flops(P, P, B), rel=2e-3)
    assert cold == linear_and_attention
    assert warm == pytest.approx(_prefill_flops(P - S, P, B), rel=2e-3)
    ratio = cold / warm                                    # 38.3: what the FLOPs say
    assert ratio == pytest.approx(_prefill_flops(P, P, B) / _prefill_flops(P - S, P, B),
                                  rel=1e-3)
    # the TTFT falls by a little less than the FLOPs: the weights are read once either way
    # and 800-row GEMMs run below the 32,800-row ones' efficiency
    assert 0.6 * ratio < est.ttft_s[0] / est.ttft_s[1] < ratio
    assert est.ttft_without_prefix_cache_s[1] == pytest.approx(est.ttft_s[0], rel=1e-12)
    # decode is unchanged: every sequence still reads its whole context
    assert est.tpot_s[0] == est.tpot_s[1]


def test_shared_blocks_raise_the_batch_ceiling_by_hand(pair):
    hw, est = pair
    kv_token = 2 * KV * HD * 2 * L                         # 131,072 B
    per_seq = int(np.ceil((P + G) / 16)) * 16 * kv_token   # 4,128 tokens in whole blocks
    shared = (S // 16) * 16 * kv_token                     # 4,000 tokens, stored once
    ws_token = (2 * D + max((HEADS + 2 * KV) * HD, 3 * FF)) * 2
    logits = VOCAB * 4
    usable = hw.memory_bytes * 0.9 - hw.runtime_reserved_bytes
    weights = float(est.memory.weights_bytes[0])
    step = ws_token * 8192      # one full step's activations (chunked prefill's budget)
    cold = np.floor((usable - weights - step) / (per_seq + logits))
    warm = np.floor((usable - weights - shared - step) / (per_seq - shared + logits))
    assert cold * P >= 8192 and warm * (P - S) >= 8192     # both batches fill a step
    assert est.memory.max_batch.tolist() == [cold, warm]
    assert est.memory.kv_cache_bytes.tolist() == [B * per_seq, B * (per_seq - shared) + shared]
    assert warm > 20 * cold


def test_a_partial_hit_rate_prices_whole_requests():
    hw, model = pm.hardware("h100-sxm"), pm.model("llama-3-8b")
    w = pm.Workloads.of(batch=4, prompt_len=P, gen_len=G, shared_prefix=S,
                        prefix_hit_rate=[0.0, 0.5, 1.0])
    assert w.prefix_hits.tolist() == [0, 2, 4]
    est = pm.estimate_many(hw, model, w)
    flops = est.phase("prefill").total_flops
    assert flops[1] == pytest.approx((flops[0] + flops[2]) / 2, rel=1e-9)
    assert est.ttft_s[0] > est.ttft_s[1] > est.ttft_s[2]


def test_cli_reports_ttft_with_and_without():
    runner = CliRunner()
    args = ["estimate", "-m", "llama-3-8b", "-H", "h100-sxm", "--batch", "8", "--prompt",
            str(P), "--gen", str(G), "--shared-prefix", str(S)]
    table = runner.invoke(app, args)
    assert table.exit_code == 0 and "8 of 8 requests hit; TTFT without it" in table.stdout
    data = json.loads(runner.invoke(app, [*args, "-f", "json"]).stdout)
    assert data["ttft_without_prefix_cache_s"] > 20 * data["ttft_s"]
    bad = runner.invoke(app, [*args[:-1], str(P)])
    assert bad.exit_code == 2 and "shared_prefix 4100 must be shorter than prompt_len" \
        in bad.stderr
