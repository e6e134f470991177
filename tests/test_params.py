"""Parameter counts: published totals, and exact agreement with a torch module."""

import pytest

import perfmodel as pm
from perfmodel.cost.params import param_counts
from perfmodel.specs.load import MODELS_DIR, shipped

torch_reference = pytest.importorskip("tests.torch_reference")

# published totals (billions): model cards / papers
PUBLISHED = {
    "llama-2-13b": (13.0, None), "llama-3-70b": (70.6, None),
    "mixtral-8x7b": (46.7, 12.9), "deepseek-v3": (671.0, None),
    "llama-2-7b": (6.74, None), "llama-2-70b": (69.0, None), "llama-3-8b": (8.03, None),
    "llama-3.1-405b": (405.9, None), "mistral-7b": (7.24, None), "gemma-2-9b": (9.24, None),
    "falcon-7b": (6.92, None), "qwen2.5-7b": (7.61, None), "gpt-3-175b": (175.0, None),
    "llama-3.1-8b": (8.03, None), "qwen3-14b": (14.8, None), "qwen3-32b": (32.8, None),
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_published_totals_within_one_percent(name):
    model = pm.model(name)
    counts = param_counts(model)
    total, active = PUBLISHED[name]
    assert counts.total / 1e9 == pytest.approx(total, rel=0.01)
    if active is not None:      # Mistral's 12.9B counts the input embedding in
        assert (counts.active(model) + counts.embedding) / 1e9 == pytest.approx(active,
                                                                                 rel=0.01)


@pytest.mark.parametrize(("name", "total", "active"), [("gpt-oss-120b", 116.83, 5.13),
                                                        ("gpt-oss-20b", 20.91, 3.61)])
def test_active_parameters_leave_out_the_input_embedding_as_model_cards_do(name, total,
                                                                            active):
    """OpenAI's gpt-oss model card: 116.83B total, 5.13B active (20.91B, 3.61B): the input
    embedding is a gather of one row per token, not read whole; the LM head is."""
    model = pm.model(name)
    counts = param_counts(model)
    assert counts.total / 1e9 == pytest.approx(total, rel=0.002)
    assert counts.active(model) / 1e9 == pytest.approx(active, rel=0.002)


def test_a_tied_table_stays_active_as_the_lm_head():
    """gemma-2-9b ties its LM head to the embedding: the one table is read by the head."""
    model = pm.model("gemma-2-9b")
    counts = param_counts(model)
    assert model.tie_embeddings and counts.lm_head == 0
    assert counts.active(model) == pytest.approx(counts.total)


def test_deepseek_v3_active_and_mtp():
    model = pm.model("deepseek-v3")
    counts = param_counts(model)
    # 37B is DeepSeek's rounded headline; counting the embedding and LM head as for every
    # model (which reproduces Mixtral's 12.9B) gives 37.55B; without the embedding table
    # (a gather) 36.63B. Both definitions bracket the headline.
    assert 37.0e9 <= counts.active(model) + counts.embedding < 38.0e9
    assert 36.0e9 < counts.active(model) < 37.0e9
    # the MTP module (~14B with its own MoE block) is outside the 671B
    assert counts.mtp / 1e9 == pytest.approx(11.5, abs=0.3)


@pytest.mark.parametrize("name", shipped(MODELS_DIR))
def test_counts_equal_torch_module(name):
    model = pm.model(name)
    main, mtp = torch_reference.build(model)
    counts = param_counts(model)
    assert counts.total == main
    assert counts.mtp == mtp


@pytest.mark.parametrize("name", ["llama-3-70b", "mixtral-8x7b", "deepseek-v3", "falcon-7b"])
def test_tp_never_increases_per_device_params(name):
    model = pm.model(name)
    previous = param_counts(model, 1).total
    for tp in (2, 4, 8):
        if model.n_heads % tp:
            continue
        current = param_counts(model, tp).total
        assert current <= previous
        previous = current


def test_tp_split_of_llama_3_70b_attention_is_exact():
    # 64 heads / 8 KV heads, head_dim 128, d 8192: TP=8 -> 8 q heads, 1 kv head per device
    model = pm.model("llama-3-70b")
    per = param_counts(model, 8).attention / model.n_layers
    assert per == 8192 * (8 + 2) * 128 + 8 * 128 * 8192
    # TP=16 replicates the single KV head
    per16 = param_counts(model, 16).attention / model.n_layers
    assert per16 == 8192 * (4 + 2) * 128 + 4 * 128 * 8192
