"""User mistakes in model and hardware files and names: each is one SpecError line naming the
file or argument, the field, the value and what was expected; through the CLI, one
``error:`` line and exit code 2."""

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

import perfmodel as pm
from perfmodel.cli.app import app
from perfmodel.specs import SpecError
from perfmodel.specs.load import HARDWARE_DIR, MODELS_DIR, load_model, unique_names

runner = CliRunner()
MODEL_YAML = (MODELS_DIR / "llama-2-7b.yaml").read_text()
HW_YAML = (HARDWARE_DIR / "h100-sxm.yaml").read_text()
LLAMA_HF = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128,
            "vocab_size": 100}


def _raises(call, *parts: str) -> str:
    with pytest.raises(SpecError) as info:
        call()
    message = str(info.value)
    assert "\n" not in message
    for part in parts:
        assert part in message, (part, message)
    return message


def _cli(model: str, hardware: str = "h100-sxm", *parts: str) -> str:
    result = runner.invoke(app, ["estimate", "-m", model, "-H", hardware])
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    for part in parts:
        assert part in lines[0], (part, lines[0])
    return lines[0]


# 1. unreadable files
@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0,
                    reason="root reads a chmod 000 file")
@pytest.mark.parametrize("kind", ["model", "hardware"])
def test_unreadable_file(tmp_path, kind):
    path = tmp_path / "locked.yaml"
    path.write_text(MODEL_YAML if kind == "model" else HW_YAML)
    path.chmod(0)
    try:
        load = pm.model if kind == "model" else pm.hardware
        _raises(lambda: load(str(path)), str(path), "cannot read: permission denied")
        args = (str(path), "h100-sxm") if kind == "model" else ("llama-2-7b", str(path))
        _cli(*args, "cannot read: permission denied")
    finally:
        path.chmod(0o644)


def test_unreadable_file_even_as_root(tmp_path, monkeypatch):
    """The same path when the OS refuses the read (checked as any user, root included)."""
    path = tmp_path / "locked.yaml"
    path.write_text(MODEL_YAML)

    def refuse(self, *args, **kwargs):
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "read_text", refuse)
    _raises(lambda: pm.model(str(path)), f"{path}: cannot read: permission denied")
    _cli(str(path), "h100-sxm", "cannot read: permission denied")


# 2. a directory
def test_directory_is_not_a_missing_file(tmp_path):
    folder = tmp_path / "somedir"
    folder.mkdir()
    _raises(lambda: pm.model(str(folder)), str(folder),
            "is a directory, expected a model YAML or a config.json")
    _raises(lambda: pm.hardware(folder), "is a directory, expected a hardware YAML")
    _cli(str(folder), "h100-sxm", "is a directory, expected a model YAML or a config.json")
    _cli("llama-2-7b", str(folder), "is a directory, expected a hardware YAML")


# 3. the suffix picks the reader
@pytest.mark.parametrize("name", ["config.txt", "model", "spec.yaml.bak"])
def test_unknown_suffix(tmp_path, name):
    path = tmp_path / name
    path.write_text(MODEL_YAML)
    _raises(lambda: pm.model(str(path)), str(path), "expected .yaml or .yml (a model YAML) "
            "or .json (a Hugging Face config.json)")
    _cli(str(path), "h100-sxm", "expected .yaml or .yml")
    _raises(lambda: pm.hardware(str(path)), "expected .yaml or .yml (a hardware YAML)")


def test_txt_suffix_named_even_when_missing(tmp_path):
    _raises(lambda: pm.model(str(tmp_path / "config.txt")), "suffix '.txt'")
    _cli("config.txt", "h100-sxm", "suffix '.txt'")


def test_perfmodel_schema_in_json(tmp_path):
    import yaml

    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(yaml.safe_load(MODEL_YAML)))
    model = pm.model(str(path))
    assert model.name == "llama-2-7b" and model.d_model == 4096


# 4. a JSON key given twice
def test_duplicate_json_key(tmp_path):
    path = tmp_path / "config.json"
    path.write_text('{"model_type": "llama", "hidden_size": 64, "hidden_size": 32}')
    _raises(lambda: pm.model(str(path)), str(path), "a field given twice")
    _cli(str(path), "h100-sxm", "not valid JSON: a field given twice")


# 5. sizes: bounds, floats, bools, zero and negatives
SIZES = [
    ("d_model: 4096", "d_model: 5000000000", "d_model: expected an integer <= 1,048,576, "
     "got 5,000,000,000"),
    ("n_layers: 32", "n_layers: 100000", "n_layers: expected an integer <= 4,096"),
    ("n_heads: 32", "n_heads: 1000000", "n_heads: expected an integer <= 16,384"),
    ("vocab_size: 32000", "vocab_size: 3200000000", "vocab_size: expected an integer <= "),
    ("intermediate_size: 11008", "intermediate_size: 11008000000",
     "intermediate_size: expected an integer <= 16,777,216"),
    ("d_model: 4096", "d_model: 5e9", "d_model: expected an integer, got '5e9' (YAML reads"),
    ("d_model: 4096", "d_model: 4096.0", "d_model: expected an integer, got 4096.0 (write "
     "4096)"),
    ("n_layers: 32", "n_layers: true", "n_layers: expected an integer, got True"),
    ("n_layers: 32", "n_layers: 0", "n_layers: expected an integer >= 1, got 0"),
    ("vocab_size: 32000", "vocab_size: -5", "vocab_size: expected an integer >= 1, got -5"),
]


@pytest.mark.parametrize(("old", "new", "message"), SIZES)
def test_absurd_sizes(tmp_path, old, new, message):
    path = tmp_path / "m.yaml"
    path.write_text(MODEL_YAML.replace(old, new))
    _raises(lambda: load_model(path), str(path), message)


def test_absurd_expert_count_and_cli(tmp_path):
    path = tmp_path / "moe.yaml"
    path.write_text(MODEL_YAML + "moe:\n  n_experts: 1000000\n  top_k: 2\n"
                    "  expert_intermediate_size: 1024\n")
    _raises(lambda: load_model(path), "moe.n_experts: expected an integer <= 65,536")
    _cli(str(path), "h100-sxm", "moe.n_experts: expected an integer <= 65,536")


def test_absurd_size_in_a_hf_config_names_the_hf_key(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(LLAMA_HF | {"hidden_size": 5_000_000_000}))
    _raises(lambda: pm.model(str(path)), f"{path}: hidden_size: expected an integer <= "
            "1,048,576")
    path.write_text(json.dumps(LLAMA_HF | {"num_hidden_layers": 32.0}))
    _raises(lambda: pm.model(str(path)), "num_hidden_layers: expected an integer, got 32.0")


def test_largest_real_shapes_are_within_bounds():
    for name in ("llama-3.1-405b", "deepseek-v3"):
        pm.model(name)


# 6. not a name nor a path
@pytest.mark.parametrize("value", [None, 7, 3.5, ["llama-2-7b"], ""])
def test_argument_of_the_wrong_type(value):
    _raises(lambda: pm.model(value), "model: expected a shipped model name or a path, got "
            f"{value!r}")
    _raises(lambda: pm.hardware(value), "hardware: expected a shipped hardware name or a "
            f"path, got {value!r}")
    _raises(lambda: pm.load_model(value), "model: expected")
    _raises(lambda: pm.load_hardware(value), "hardware: expected")


# 7. did you mean
def test_name_typos_suggest_the_closest():
    _raises(lambda: pm.model("llama-2-7"), "unknown model 'llama-2-7'; did you mean "
            "'llama-2-7b'? (known: ", "mixtral-8x7b")
    _raises(lambda: pm.hardware("h100-sxn"), "unknown hardware 'h100-sxn'; did you mean "
            "'h100-sxm'?")
    _cli("llama-2-7", "h100-sxm", "did you mean 'llama-2-7b'?")
    _cli("llama-2-7b", "h100-sxn", "did you mean 'h100-sxm'?")
    message = _raises(lambda: pm.model("zzzz"), "unknown model 'zzzz' (known: ")
    assert "did you mean" not in message


def test_shipped_names_with_a_dot_still_resolve():
    assert pm.model("llama-3.1-405b").name == "llama-3.1-405b"
    assert pm.model("qwen2.5-7b").name == "qwen2.5-7b"


def test_unknown_yaml_keys_suggest_the_closest(tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text(MODEL_YAML.replace("n_heads:", "n_head:"))
    _raises(lambda: load_model(path), "(top level): 1 unknown field; did you mean 'n_heads'?")
    path.write_text(MODEL_YAML + "moe:\n  n_expert: 8\n  top_k: 2\n"
                    "  expert_intermediate_size: 1024\n")
    _raises(lambda: load_model(path), "moe.n_experts: missing required field (a field given "
            "is close to this name: a misspelling?)")
    path.write_text(HW_YAML.replace("  l2_bytes:", "  l2_byte:"))
    _raises(lambda: pm.load_hardware(path), "on_chip.l2_bytes: missing required field (a field "
            "given is close to this name: a misspelling?)")
    path.write_text(HW_YAML.replace("on_chip:", "on_chips:"))
    _raises(lambda: pm.load_hardware(path), "(top level): 1 unknown field; did you mean 'on_chip'?")


# 8. names of models read from Hugging Face configs
def _config(tmp_path, folder: str, name: str, extra: dict) -> str:
    where = tmp_path / folder
    where.mkdir(exist_ok=True)
    (where / name).write_text(json.dumps(LLAMA_HF | extra))
    return str(where / name)


def test_hf_names(tmp_path):
    snap = "0123456789abcdef0123456789abcdef01234567"
    cases = [
        ("hf", "config.json", {"_name_or_path": "meta-llama/Llama-2-7b-hf"}, "Llama-2-7b-hf"),
        ("hf", "a.json", {"_name_or_path": "/models/llama/"}, "llama"),
        ("hf", "b.json", {"_name_or_path": "", "architectures": ["LlamaForCausalLM"]},
         "LlamaForCausalLM-64x2"),
        ("hf", "c.json", {}, "c"),
        ("tiny-llama", "config.json", {}, "tiny-llama"),
        (snap, "config.json", {}, "config"),
    ]
    for folder, name, extra, expected in cases:
        assert pm.model(_config(tmp_path, folder, name, extra)).name == expected


def test_unique_names():
    assert unique_names(["a", "b", "a", "a"]) == ["a", "b", "a-2", "a-3"]
    assert unique_names(["a", "a-2", "a"]) == ["a", "a-2", "a-3"]
    assert unique_names([]) == []
    names = ["config", "config", "x"]
    assert len(set(unique_names(names))) == 3 and names == ["config", "config", "x"]
