"""Recurrent layers (Mamba-1/2, Gated DeltaNet, lightning attention) and the hybrid families:
state bytes by hand, the chunked scan's FLOPs by hand, decode cost against context, and
parameter totals against the published ones."""

import numpy as np
import pytest

from perfmodel.cost.memory import kv_bytes_per_sequence
from perfmodel.cost.params import param_counts
from perfmodel.cost.scan import Scan
from perfmodel.cost.step import Dtypes, Step, price_step
from perfmodel.specs.errors import SpecError
from perfmodel.specs.fields import Fields
from perfmodel.specs.load import hardware, model
from perfmodel.specs.schema import model_from_fields
from perfmodel.specs.workload import Parallelism

HYBRIDS = ("jamba-1.5-mini", "nemotron-h-8b", "qwen3-next-80b-a3b", "minimax-text-01")
L256K = 262144


def test_jamba_state_and_kv_bytes_at_256k_by_hand():
    """4 attention layers x 262,144 tokens x (K + V: 2 x 8 heads x 128) x 2 bytes, plus
    28 Mamba-1 layers x (d_inner 8192 x d_state 16 x 4 bytes + 3 x 8192 conv x 2 bytes)."""
    kv = 4 * 262144 * 2 * 8 * 128 * 2                       # 4,294,967,296
    state = 28 * (8192 * 16 * 4 + 3 * 8192 * 2)             # 16,056,320
    got = kv_bytes_per_sequence(model("jamba-1.5-mini"), 1, np.array([2.0]),
                                np.array([L256K]))
    assert got[0] == kv + state == 4_311_023_616


def test_qwen3_next_state_and_kv_bytes_at_256k_by_hand():
    """12 full-attention layers x 262,144 x (2 x 2 KV heads x 256) x 2 bytes, plus 36 Gated
    DeltaNet layers x (32 heads x 128 x 128 x 4 bytes + 3 x (2 x 16 x 128 + 32 x 128) x 2)."""
    kv = 12 * 262144 * 2 * 2 * 256 * 2                      # 6,442,450,944
    state = 36 * (32 * 128 * 128 * 4 + 3 * 8192 * 2)        # 77,266,944
    got = kv_bytes_per_sequence(model("qwen3-next-80b-a3b"), 1, np.array([2.0]),
                                np.array([L256K]))
    assert got[0] == kv + state == 6_519_717_888


def test_state_bytes_do_not_grow_with_the_length():
    m = model("nemotron-h-8b")
    lengths = np.array([16, 1024, 8192])
    per_seq = kv_bytes_per_sequence(m, 1, np.array([2.0]), lengths)
    kv = 4 * lengths * 2 * 8 * 128 * 2
    # 24 Mamba-2 layers: 128 heads x 64 x 128 x 4 bytes + 3 x (8192 + 2 x 8 x 128) x 2
    assert np.array_equal(per_seq - kv, np.full(3, 24 * (128 * 64 * 128 * 4 + 3 * 10240 * 2)))


def _chunk_by_hand(q, heads, groups, n, p):
    """One SSD chunk of q tokens, term by term (Mamba-2 section 6)."""
    cb = 2 * q * q * n * groups           # C B^T per group
    cbx = 2 * q * q * p * heads           # masked scores x X per head
    state = 2 * q * n * p * heads         # B^T X: the chunk's state
    out = 2 * q * n * p * heads           # C x the state entering the chunk
    passing = 2 * n * p * heads           # decay the running state, add the chunk's
    return cb + cbx + state + out + passing


def test_prefill_flops_of_a_mamba2_scan_by_hand_at_chunk_256():
    """A 600-token prefill in chunks of 256 is chunks of 256, 256 and 88 tokens; Nemotron-H's
    dims (128 heads of 64, d_state 128, 8 groups), 3 sequences."""
    per_seq = 2 * _chunk_by_hand(256, 128, 8, 128, 64) + _chunk_by_hand(88, 128, 8, 128, 64)
    # C B^T, scores x X, chunk state, output from the state, state passing
    assert per_seq == 2 * (134_217_728 + 1_073_741_824 + 536_870_912 + 536_870_912
                           + 2_097_152) \
        + (15_859_712 + 126_877_696 + 184_549_376 + 184_549_376 + 2_097_152) \
        == 5_081_530_368
    op = Scan(batch=np.array([3]), q_len=np.array([600]), kv_len=np.array([600]), heads=128,
              qk_heads=8, d_k=128, d_v=64, chunk=256)
    assert op.flops == 3 * per_seq
    # the template's scan at the model's own chunk (128): 4 whole chunks and one of 88
    m = model("nemotron-h-8b")
    cost = price_step(m, hardware("h100-sxm"), Parallelism(), Step.uniform(3, 600, 600),
                      Dtypes.of())
    row = cost.names.index("mamba.scan")
    by_hand = 4 * _chunk_by_hand(128, 128, 8, 128, 64) + _chunk_by_hand(88, 128, 8, 128, 64)
    assert cost.flops[row, 0] == 24 * 3 * by_hand


def test_a_decode_step_reads_and_writes_the_state_once():
    op = Scan(batch=np.array([5]), q_len=np.array([1]), kv_len=np.array([9000]), heads=32,
              qk_heads=32, d_k=128, d_v=128, chunk=64, delta=True, gates=2)
    state = 5 * 32 * 128 * 128 * 4.0
    assert op.bytes.kv_read == state and op.bytes.kv_write == state
    fresh = Scan(batch=np.array([5]), q_len=np.array([700]), kv_len=np.array([700]),
                 heads=32, qk_heads=32, d_k=128, d_v=128, chunk=64)
    assert fresh.bytes.kv_read == 0 and fresh.bytes.kv_write == state


def test_gated_deltanet_l2_norm_of_q_and_k_in_the_scan_record():
    """Qwen3-Next's scan L2-normalises the 16 q/k heads of 128 (use_qk_l2norm_in_kernel):
    3 FLOPs an element of q and k, 2 x 16 x 128 = 4096 elements a token; the chunked path
    also reads and writes them once more (l2norm_fwd passes), a decode step does not (in
    the fused recurrent kernel)."""
    cost = price_step(model("qwen3-next-80b-a3b"), hardware("h100-sxm"), Parallelism(),
                      Step.uniform(np.array([2, 8]), np.array([100, 1]),
                                   np.array([100, 500])), Dtypes.of())
    row = cost.names.index("linear.scan")
    plain = [Scan(batch=np.array([b]), q_len=np.array([t]), kv_len=np.array([c]), heads=32,
                  qk_heads=32, d_k=128, d_v=128, chunk=64, delta=True, gates=2)
             for b, t, c in ((2, 100, 100), (8, 1, 500))]
    # prefill: 36 layers x 2 sequences x 100 tokens x 4096 elements
    assert cost.flops[row, 0] - 36 * plain[0].flops == 36 * 2 * 100 * 4096 * 3 \
        == 88_473_600
    assert cost.bytes.act_read[row, 0] - 36 * plain[0].bytes.act_read \
        == cost.bytes.act_write[row, 0] - 36 * plain[0].bytes.act_write \
        == 36 * 2 * 100 * 4096 * 2 == 58_982_400
    # decode: 36 x 8 sequences x 1 token x 4096 x 3 FLOPs, no bytes
    assert cost.flops[row, 1] - 36 * plain[1].flops == 36 * 8 * 4096 * 3 == 3_538_944
    assert cost.bytes.act_read[row, 1] == 36 * plain[1].bytes.act_read


def _decode(m, contexts):
    hw = hardware("h100-sxm")
    c = np.asarray(contexts)
    return price_step(m, hw, Parallelism(), Step.uniform(4, np.ones_like(c), c), Dtypes.of())


@pytest.mark.parametrize("name", [*HYBRIDS, "gemma-3-27b", "llama-4-scout"])
def test_decode_cost_against_context(name):
    """Property: over random contexts, recurrent operators (scan, conv and the rest that do
    not move with the context) cost the same at every context; local attention is flat
    beyond its window; a chunked layer repeats with its chunk (bounded by it); global
    attention's FLOPs and KV bytes are linear in the context (zero second differences)."""
    m = model(name)
    rng = np.random.default_rng(20261124)
    window, chunk = m.sliding_window or 0, m.attention_chunk or 0
    base = np.sort(rng.integers(max(window, chunk, 2) + 1, 200_000, size=6))
    contexts = np.concatenate([base, base + 1, base + 2])
    cost = _decode(m, contexts)
    kv = cost.bytes.kv_read
    for i, (op, kind) in enumerate(zip(cost.names, cost.kinds, strict=True)):
        if kind != "attention":
            assert np.all(cost.time_s[i] == cost.time_s[i, 0]), op
        elif op.endswith("local"):
            assert np.all(cost.flops[i] == cost.flops[i, 0]), op
        elif op.endswith("chunk"):
            again = _decode(m, (contexts - 1) % chunk + 1)
            assert np.array_equal(cost.flops[i], again.flops[i]), op
        else:
            for series in (cost.flops[i], kv[i]):
                a, b, c = np.split(series, 3)
                assert np.allclose(c - 2 * b + a, 0, atol=1e-6 * np.abs(c).max()), op
                assert np.all(b > a), op
    recurrent = [i for i, k in enumerate(cost.kinds) if k in ("ssm_scan", "linear_attention")]
    assert bool(recurrent) == (name in HYBRIDS)


@pytest.mark.parametrize(("name", "total", "active"), [
    # Jamba-1.5 report (arXiv 2408.12570): "12B active parameters, 52B total"
    ("jamba-1.5-mini", 52e9, 12e9),
    # MiniMax-01 report (arXiv 2501.08313): 456B total, 45.9B activated (the count without
    # the embedding and LM head matches: 45.94B)
    ("minimax-text-01", 456e9, None),
    # Qwen3-Next model card: "80B in total and 3B activated" (the 3B is rounded: routed
    # 10 of 512 + shared + mixers without embeddings come to 3.25B; not checked to 1%)
    ("qwen3-next-80b-a3b", 80e9, None),
    # Nemotron-H-8B: "8B" in arXiv 2504.03624 (our count 8.10B, within 1.3%: checked to 2%)
    ("nemotron-h-8b", 8e9, None),
])
def test_parameter_totals_against_published(name, total, active):
    m = model(name)
    counts = param_counts(m)
    tolerance = 0.02 if name == "nemotron-h-8b" else 0.01
    assert counts.total == pytest.approx(total, rel=tolerance)
    if active is not None:
        # Jamba's 12B counts the input embedding in (ours leaves the gather out)
        assert counts.active(m) + counts.embedding == pytest.approx(active, rel=0.01)


def test_qwen3_next_shared_expert_gate_by_hand():
    """vLLM qwen3_next.py shared_expert_gate: ReplicatedLinear(2048, 1), 16-bit, in each of
    the 48 MoE layers: 48 x 2048 = 98,304 parameters (class router: 48 x 2048 x 512 routed
    logits + them); a d -> 1 GEMM, 2 x 2048 FLOPs a token, its 2048 weights at 2 bytes."""
    m = model("qwen3-next-80b-a3b")
    c = param_counts(m)
    assert c.router == 48 * 2048 * (512 + 1) == 50_429_952
    # the total still brackets the published 80B (test_parameter_totals_against_published)
    assert c.total == pytest.approx(79.674e9, rel=1e-4)
    cost = price_step(m, hardware("h100-sxm"), Parallelism(), Step.uniform(4, 1, 300),
                      Dtypes.of())
    row = cost.names.index("shared.gate")
    assert cost.flops[row, 0] == 48 * 4 * 2 * 2048 == 786_432
    assert cost.bytes.weights[row, 0] == 48 * 2048 * 2 == 196_608


def test_minimax_active_without_embeddings_is_the_published_45_9b():
    m = model("minimax-text-01")
    c = param_counts(m)
    assert c.active(m) - c.lm_head == pytest.approx(45.9e9, rel=0.01)


def _spec(**extra):
    base = {"version": 1, "name": "t", "n_layers": 4, "d_model": 256, "n_heads": 4,
            "n_kv_heads": 4, "vocab_size": 1000, "intermediate_size": 512}
    return model_from_fields(Fields({**base, **extra}, "t.yaml"))


@pytest.mark.parametrize(("extra", "message"), [
    ({"attention": {"layer_pattern": ["mamba", "global"]}}, "mamba"),
    ({"mamba": {"d_inner": 512, "d_state": 16, "head_dim": 64, "chunk_size": 64}}, "mamba"),
    ({"attention": {"layer_pattern": ["linear", "global"]}}, "linear_attention"),
    ({"attention": {"layer_pattern": ["global", "mlp"]},
      "moe": {"n_experts": 4, "top_k": 1, "expert_intermediate_size": 64}}, "moe"),
    ({"moe": {"n_experts": 4, "top_k": 1, "expert_intermediate_size": 64,
              "shared_expert_gate": True}}, r"moe\.shared_expert_gate.*n_shared_experts"),
])
def test_recurrent_schema_mistakes(extra, message):
    with pytest.raises(SpecError, match=message):
        _spec(**extra)


def test_mlp_only_layers_have_no_mixer():
    m = _spec(attention={"layer_pattern": ["mamba", "mlp", "global", "mlp"]},
              mamba={"d_inner": 512, "d_state": 16, "head_dim": 64, "chunk_size": 64})
    assert (m.attention_layers, m.mixer_layers, m.mlp_layers, m.kv_layers) == (1, 2, 2, 1)


def test_sigmoid_output_gates_by_hand():
    """sigmoid(g) * h reads g and h, writes h, 4 FLOPs an element (h / (1 + exp(-g))).
    Qwen3-Next's attn_gate: 12 full-attention layers x 16 heads x 256 = 4096 wide; MiniMax's
    lightning gate: 70 linear layers x 64 heads x 128 = 8192 wide (vLLM minimax_text_01.py
    ``F.sigmoid(gate) * hidden``); Gated DeltaNet's gate stays silu(z) (5 FLOPs). Qwen3-Next
    at 4 tokens: 12 x 4 x 4096 x 4 = 786,432 FLOPs (983,040 at silu_and_mul's 5)."""
    step, h100 = Step.uniform(4, 1, 300), hardware("h100-sxm")
    for name, row, layers, width, flops in (
            ("qwen3-next-80b-a3b", "attn_gate", 12, 4096, 4),
            ("minimax-text-01", "linear.gate", 70, 8192, 4),
            ("qwen3-next-80b-a3b", "linear.gate", 36, 4096, 5)):
        cost = price_step(model(name), h100, Parallelism(), step, Dtypes.of())
        i = cost.names.index(row)
        assert cost.flops[i, 0] == layers * 4 * width * flops
        assert cost.bytes.act_read[i, 0] == layers * 4 * 2 * width * 2
        assert cost.bytes.act_write[i, 0] == layers * 4 * width * 2
