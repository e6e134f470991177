"""Loading specs: every shipped file, Hugging Face configs, and one-line errors."""

import json

import pytest

import perfmodel as pm
from perfmodel.specs import SpecError, units
from perfmodel.specs.load import HARDWARE_DIR, MODELS_DIR, load_hardware, load_model, shipped
from tests.datasheet import datasheet, datasheet_path

HW_YAML = (datasheet_path("h100-sxm")).read_text()
MODEL_YAML = (MODELS_DIR / "llama-2-13b.yaml").read_text()


@pytest.mark.parametrize("name", shipped(HARDWARE_DIR))
def test_shipped_hardware_loads_with_sources(name):
    hw = pm.hardware(name)
    assert hw.name == name
    for block in ("compute", "memory", "on_chip", "interconnect", "efficiency"):
        assert hw.sources[block].strip()
    assert 0 < hw.efficiency.gemm_fraction <= 1 and 0 < hw.efficiency.memory_fraction <= 1


@pytest.mark.parametrize("name", shipped(MODELS_DIR))
def test_shipped_models_load(name):
    model = pm.model(name)
    assert model.name == name and model.source


def test_kernel_fractions_and_launch_mode_load(tmp_path):
    text = HW_YAML.replace("  kernel_latency_s:", "  kernel_memory_fraction:\n    rms_norm: 0.4\n"
                           "  launch_mode: sync\n  gemm_n_half: 25000\n  kernel_latency_s:")
    text = text.replace("  kernel_latency_by_kind:\n    rms_norm: 4.3 us\n",
                        "  kernel_latency_by_kind:\n    attention: 8 us\n")
    hw = load_hardware(_write(tmp_path, text))
    assert hw.efficiency.gemm_n_half == 25000
    assert hw.efficiency.kernel_memory_fraction == {"rms_norm": 0.4}
    assert hw.efficiency.memory_fraction_for("rms_norm") == 0.4
    assert hw.efficiency.memory_fraction_for("add") == hw.efficiency.memory_fraction
    assert hw.efficiency.launch_mode == "sync"
    assert hw.efficiency.latency_for("attention") == pytest.approx(8e-6)
    assert hw.efficiency.latency_for("add") == hw.efficiency.kernel_latency_s


def test_units():
    assert units.parse_quantity("32 GiB", "bytes") == 32 * 2**30
    assert units.parse_quantity("3.35 TB/s", "bytes_per_s") == 3.35e12
    assert units.parse_quantity("66.9 TFLOP/s", "flops_per_s") == 66.9e12
    assert units.parse_quantity("2.4 us", "s") == pytest.approx(2.4e-6)
    assert units.parse_quantity(5, "bytes") == 5.0
    with pytest.raises(units.UnitError):
        units.parse_quantity("3 TB/s", "bytes")


def _write(tmp_path, text, name="spec.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path


BAD_HARDWARE = [
    ("memory:\n  capacity_bytes: [oops", "not valid YAML"),
    (HW_YAML.replace("  l2_bytes: 50 MB", "  l2_bytes: 50 MB\n  l3_bytes: 1 GB"),
     "on_chip: 1 unknown field; did you mean 'l2_bytes'?"),
    (HW_YAML.replace("  capacity_bytes: 81559 MiB\n", ""), "memory.capacity_bytes: missing"),
    (HW_YAML.replace("capacity_bytes: 81559 MiB", "capacity_bytes: lots"), "memory.capacity_bytes"),
    (HW_YAML.replace("capacity_bytes: 81559 MiB", "capacity_bytes: -81559 MiB"), "positive"),
    (HW_YAML.replace("bandwidth_bytes_per_s: 3.35 TB/s", "bandwidth_bytes_per_s: 0"),
     "memory.bandwidth_bytes_per_s: expected a positive"),
    (HW_YAML.replace("    fp8: 1978.9", "    fp9: 1978.9"), "peak_flops_per_s.fp9: unknown dtype"),
    (HW_YAML.replace("compute_units: 132", "compute_units: 13.2"), "compute.compute_units"),
    (HW_YAML.replace("gemm_fraction: 0.80", "gemm_fraction: 80"), "at most 1"),
    (HW_YAML.replace("version: 1", "version: 7"), "version"),
    (HW_YAML.replace("  kernel_latency_s:", "  kernel_memory_fraction: {gemm: 0.5}\n"
                     "  kernel_latency_s:"), "kernel_memory_fraction.gemm: expected a memory"),
    (HW_YAML.replace("  kernel_latency_s:", "  launch_mode: eager\n  kernel_latency_s:"),
     "efficiency.launch_mode: expected one of async, sync"),
    (HW_YAML.replace("  attention_tile_q: 128\n", "  attention_tile_q: {1: 32, 768: big}\n"),
     "efficiency.attention_tile_q: expected integer"),
    (HW_YAML.replace("  attention_tile_q: 128\n", "  attention_tile_q: 0\n"),
     "efficiency.attention_tile_q: expected an integer >= 1"),
    (HW_YAML.replace("  kernel_latency_s:", "  attention_pack_gqa: maybe\n  kernel_latency_s:"),
     "efficiency.attention_pack_gqa: expected true or false"),
    (HW_YAML.replace("  kernel_latency_s:", "  gemm_overlap: 2\n  kernel_latency_s:"),
     "efficiency.gemm_overlap: expected true or false"),
    (HW_YAML.replace("  kernel_latency_s:", "  parallel_grain_elements: -1\n  kernel_latency_s:"),
     "efficiency.parallel_grain_elements: expected an integer >= 0"),
    ("- just\n- a list\n", "mapping"),
]


def test_attention_query_tile_steps_load(tmp_path):
    text = HW_YAML.replace("  attention_tile_q: 128\n  attention_tile_kv: 128\n",
                           "  attention_tile_q: {768: 256, 1: 32, 192: 64}"
                           "\n  attention_tile_kv: 512\n  attention_clip_kv: true"
                           "\n  attention_decode_pack_gqa: false\n  attention_append_kv: true"
                           "\n  parallel_grain_elements: 32768\n")
    eff = load_hardware(_write(tmp_path, text)).efficiency
    assert eff.attention_tile_q == ((1, 32), (192, 64), (768, 256))
    assert eff.attention_tile_kv == 512 and eff.attention_clip_kv
    assert not eff.attention_decode_pack_gqa and eff.parallel_grain_elements == 32768
    assert eff.attention_append_kv
    default = load_hardware(_write(tmp_path, HW_YAML)).efficiency
    assert default.attention_tile_q == ((1, 128),) and not default.attention_clip_kv
    assert default.attention_decode_pack_gqa and default.parallel_grain_elements == 0
    assert not default.attention_append_kv


@pytest.mark.parametrize(("text", "message"), BAD_HARDWARE)
def test_bad_hardware_is_one_line_naming_file_and_field(tmp_path, text, message):
    path = _write(tmp_path, text)
    with pytest.raises(SpecError) as info:
        load_hardware(path)
    text = str(info.value)
    assert "\n" not in text and str(path) in text and message in text


BAD_MODEL = [
    (MODEL_YAML.replace("n_layers: 40", "n_layer: 40"),
     "(top level): 1 unknown field; did you mean 'n_layers'?"),
    (MODEL_YAML.replace("n_layers: 40\n", ""), "n_layers: missing"),
    (MODEL_YAML.replace("n_layers: 40", "n_layers: 0"), "n_layers: expected an integer >= 1"),
    (MODEL_YAML.replace("n_layers: 40", "n_layers: forty"), "n_layers: expected an integer"),
    (MODEL_YAML.replace("n_kv_heads: 40", "n_kv_heads: 7"), "n_kv_heads: expected a divisor"),
    (MODEL_YAML.replace("gated_mlp: true", "gated_mlp: maybe"), "gated_mlp: expected true"),
    (MODEL_YAML.replace("norm: rms", "norm: batch"), "norm: expected one of"),
    (MODEL_YAML + "moe:\n  n_experts: 4\n  top_k: 8\n  expert_intermediate_size: 8\n",
     "moe.top_k"),
]


@pytest.mark.parametrize(("text", "message"), BAD_MODEL)
def test_bad_model_is_one_line_naming_file_and_field(tmp_path, text, message):
    path = _write(tmp_path, text)
    with pytest.raises(SpecError) as info:
        load_model(path)
    assert "\n" not in str(info.value) and str(path) in str(info.value)
    assert message in str(info.value)


def test_unknown_names_list_the_shipped_ones():
    with pytest.raises(SpecError, match=r"unknown hardware 'h1000'.*h100-sxm"):
        pm.hardware("h1000")
    with pytest.raises(SpecError, match="unknown model"):
        pm.model("llama-9")


def test_missing_file(tmp_path):
    with pytest.raises(SpecError, match="no such file"):
        pm.model(str(tmp_path / "nope.yaml"))


LLAMA_HF = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128,
            "vocab_size": 100, "hidden_act": "silu", "tie_word_embeddings": False,
            "rope_theta": 10000.0, "torch_dtype": "bfloat16", "max_position_embeddings": 512}

HF_CONFIGS = {
    "llama": LLAMA_HF,
    "mistral": LLAMA_HF | {"model_type": "mistral", "sliding_window": 32},
    "qwen2": LLAMA_HF | {"model_type": "qwen2", "sliding_window": 32,
                         "use_sliding_window": False},
    "mixtral": LLAMA_HF | {"model_type": "mixtral", "num_local_experts": 4,
                           "num_experts_per_tok": 2},
    "gemma2": LLAMA_HF | {"model_type": "gemma2", "head_dim": 32, "sliding_window": 16,
                          "hidden_activation": "gelu_pytorch_tanh",
                          "attn_logit_softcapping": 50.0, "tie_word_embeddings": True},
    "deepseek_v3": LLAMA_HF | {"model_type": "deepseek_v3", "num_key_value_heads": 4,
                               "q_lora_rank": 24, "kv_lora_rank": 16, "qk_nope_head_dim": 8,
                               "qk_rope_head_dim": 4, "v_head_dim": 8, "n_routed_experts": 8,
                               "num_experts_per_tok": 2, "n_shared_experts": 1,
                               "moe_intermediate_size": 32, "first_k_dense_replace": 1,
                               "moe_layer_freq": 1, "num_nextn_predict_layers": 1},
}


@pytest.mark.parametrize("family", sorted(HF_CONFIGS))
def test_hf_config_families(tmp_path, family):
    folder = tmp_path / f"tiny-{family}"
    folder.mkdir()
    path = folder / "config.json"
    path.write_text(json.dumps(HF_CONFIGS[family]))
    model = pm.model(str(path))
    assert model.name == f"tiny-{family}" and model.n_layers == 2 and model.d_model == 64
    assert model.max_position_embeddings == HF_CONFIGS[family].get("max_position_embeddings", 0)
    if family == "mistral":
        assert model.sliding_window == 32 and model.layer_kinds() == ["local", "local"]
    if family == "qwen2":
        assert model.qkv_bias and model.sliding_window is None
    if family == "mixtral":
        assert model.moe.n_experts == 4 and model.moe.expert_intermediate_size == 128
    if family == "gemma2":
        assert model.layer_kinds() == ["local", "global"] and model.norms_per_layer == 4
        assert model.activation == "gelu_tanh" and model.tie_embeddings
    if family == "deepseek_v3":
        assert model.mla.kv_lora_rank == 16 and model.moe.first_dense_layers == 1
        assert model.head_dim == 12 and model.mtp_modules == 1
    est = pm.estimate(datasheet("h100-sxm"), model, pm.Workload(prompt_len=64, gen_len=4))
    assert est.e2e_s > 0


def test_hf_config_errors(tmp_path):
    bad = _write(tmp_path, json.dumps(LLAMA_HF | {"model_type": "bert"}), "config.json")
    with pytest.raises(SpecError, match="model_type: unsupported text of 4 characters"):
        pm.model(str(bad))
    missing = dict(LLAMA_HF)
    del missing["hidden_size"]
    bad = _write(tmp_path, json.dumps(missing), "config.json")
    with pytest.raises(SpecError, match=r"config\.json: hidden_size: missing"):
        pm.model(str(bad))
    bad = _write(tmp_path, "{not json", "config.json")
    with pytest.raises(SpecError, match="not valid JSON"):
        pm.model(str(bad))


def test_a_field_given_twice_is_an_error_not_a_silent_override(tmp_path):
    text = HW_YAML.replace("  kernel_latency_s: 2 us\n", "  kernel_latency_s: 2 us\n"
                           "  kernel_latency_s: 9 us\n")
    with pytest.raises(SpecError, match=r"not valid YAML: a field given twice "
                                        r"\(line \d+, column \d+\)"):
        load_hardware(_write(tmp_path, text))
