"""Issue 33's battery, the specs and loaders: what raised a traceback, allocated petabytes
or was silently accepted is one SpecError line naming the file or field; a misleading
message now says what is needed (docs/bad-input.md lists each)."""

import json
import os
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

import perfmodel as pm
from perfmodel.cli.app import app
from perfmodel.specs import load

runner = CliRunner()
SHIPPED = load.HARDWARE_DIR / "h100-sxm.yaml"


def _error(*args: str) -> str:
    result = runner.invoke(app, list(args))
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def _estimate(*args: str) -> str:
    return _error("estimate", "-m", "llama-3-8b", "-H", "h100-sxm", *args)


@pytest.mark.parametrize(("flag", "value", "field", "limit"), [
    ("--batch", "99999999999999999999999", "batch", "10,000,000"),
    ("--prompt", "1000000000000000000", "prompt_len", "1,000,000,000"),
    ("--prompt", "1000000000000", "prompt_len", "1,000,000,000"),
    ("--gen", "1000000000000", "gen_len", "1,000,000,000"),
])
def test_a_huge_size_is_refused_before_anything_is_allocated(flag, value, field, limit):
    line = _estimate(flag, value)
    assert line.startswith(f"error: workload: {field}: expected at most {limit}, got ")


def test_a_sequence_past_the_token_cap_names_both_lengths():
    with pytest.raises(pm.SpecError, match=r"prompt_len \+ gen_len: expected at most "
                                           r"1,000,000,000 tokens a sequence, got 1,000,000,001"):
        pm.Workload(prompt_len=10**9, gen_len=1)


@pytest.mark.parametrize("call", [lambda: pm.Workload(batch=10**30),
                                  lambda: pm.Workloads.of(batch=[4, 10**30]),
                                  lambda: pm.Workloads.grid(prompt_len=[10**19])])
def test_a_huge_python_int_is_a_spec_error_not_a_type_error(call):
    with pytest.raises(pm.SpecError, match="expected at most"):
        call()


def test_a_huge_group_size_is_refused():
    line = _estimate("--weights-dtype", "int4", "--group-size", "1000000000000")
    assert line == ("error: workload: weight_group_size: expected at most 16,777,216, "
                    "got 1,000,000,000,000")


def test_a_billion_token_generation_answers():
    """It hung for over a minute (the decode sum sampled every key tile)."""
    result = runner.invoke(app, ["estimate", "-m", "llama-3-8b", "-H", "h100-sxm",
                                 "--gen", "999999000", "-f", "json"])
    assert result.exit_code == 0, result.output
    est = json.loads(result.stdout)
    assert est["tpot_s"] > 0 and est["e2e_s"] > est["ttft_s"]


@pytest.mark.parametrize("text", ["[" * 100_000 + "]" * 100_000,
                                  '{"a":' * 50_000 + "1" + "}" * 50_000])
def test_deeply_nested_json_is_one_line(tmp_path, text):
    path = tmp_path / "config.json"
    path.write_text(text)
    line = _error("estimate", "-m", str(path), "-H", "h100-sxm")
    assert line == (f"error: {path}: not valid JSON: nested too deeply, expected a model "
                    f"YAML or a config.json")


def _hardware(tmp_path, **memory) -> str:
    data = yaml.safe_load(SHIPPED.read_text())
    data["memory"] |= memory
    path = tmp_path / "hw.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def test_a_bandwidth_of_1e_30_is_refused(tmp_path):
    path = _hardware(tmp_path, bandwidth_bytes_per_s=1e-30)
    with pytest.raises(pm.SpecError, match=r"memory.bandwidth_bytes_per_s: expected at least "
                                           r"1e\+06 \(or 0 where 0 means none\), got 1e-30"):
        pm.hardware(path)


def test_a_runtime_reserve_above_capacity_is_refused(tmp_path):
    path = _hardware(tmp_path, runtime_reserved_bytes="90 GB")
    with pytest.raises(pm.SpecError, match=r"memory.runtime_reserved_bytes: expected less "
                                           r"than capacity_bytes \(8\.552\d+e\+10\), got 9e\+10"):
        pm.hardware(path)


def _hf(tmp_path, **changes) -> str:
    data = json.loads((Path(__file__).parent / "data" / "hf" / "llama-awq.json").read_text())
    data.pop("quantization_config", None)
    data |= changes
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    return str(path)


def test_a_context_limit_of_0_written_out_is_refused(tmp_path):
    with pytest.raises(pm.SpecError, match=r"max_position_embeddings: expected an integer "
                                           r">= 1, got 0"):
        pm.model(_hf(tmp_path, max_position_embeddings=0))
    data = yaml.safe_load((load.MODELS_DIR / "llama-3-8b.yaml").read_text())
    data["max_position_embeddings"] = 0
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(pm.SpecError, match="max_position_embeddings: expected an integer >= 1"):
        pm.model(path)
    data.pop("max_position_embeddings")         # absent: unknown, as before
    path.write_text(yaml.safe_dump(data))
    assert pm.model(path).max_position_embeddings == 0


def test_heads_not_dividing_hidden_say_head_dim_is_needed(tmp_path):
    path = _hf(tmp_path, hidden_size=3584, num_attention_heads=27, num_key_value_heads=27)
    with pytest.raises(pm.SpecError) as exc:
        pm.model(path)
    assert str(exc.value) == (f"{path}: head_dim: needed: d_model 3584 / n_heads 27 is not "
                              f"whole (132.7), so the head width cannot be derived; expected "
                              f"head_dim given")
    assert pm.model(_hf(tmp_path, hidden_size=3584, num_attention_heads=27,
                        num_key_value_heads=27, head_dim=128)).head_dim == 128


def test_a_quoted_json_number_gets_no_yaml_hint(tmp_path):
    with pytest.raises(pm.SpecError) as exc:
        pm.model(_hf(tmp_path, num_hidden_layers="28"))
    assert str(exc.value).endswith("expected an integer, got '28' (a number in quotes is "
                                   "text; write it without the quotes)")
    with pytest.raises(pm.SpecError, match="YAML reads a number with an exponent"):
        data = yaml.safe_load((load.MODELS_DIR / "llama-3-8b.yaml").read_text())
        path = tmp_path / "m.yaml"
        path.write_text(yaml.safe_dump(data).replace("n_layers: 32", "n_layers: 3e1"))
        pm.model(path)


def test_a_hardware_list_on_estimate_says_it_takes_one():
    line = _estimate_hw("h100-sxm,h200-sxm")
    assert line == ("error: --hardware: 'h100-sxm,h200-sxm': expected one hardware name or "
                    "path, got a comma-separated list (sweep, roofline and plan take lists; "
                    "this command takes one)")


def _estimate_hw(hw: str) -> str:
    return _error("estimate", "-m", "llama-3-8b", "-H", hw)


def test_an_upper_case_name_gets_did_you_mean():
    assert "unknown hardware 'H100'; did you mean 'h100-sxm'?" in _estimate_hw("H100")
    assert "did you mean 'llama-3-8b'?" in _error("estimate", "-m", "Llama-3-8B",
                                                   "-H", "h100-sxm")


def test_a_hub_repo_id_says_a_config_path_is_needed():
    line = _error("estimate", "-m", "meta-llama/Llama-3.1-8B", "-H", "h100-sxm")
    assert line == ("error: meta-llama/Llama-3.1-8B: looks like a Hugging Face repo id; "
                    "expected a path to its config.json (download it first: nothing is "
                    "fetched here)")


def test_a_fifo_is_not_a_regular_file(tmp_path):
    fifo = tmp_path / "t.csv"
    os.mkfifo(fifo)
    line = _error("simulate", "-m", "llama-3-8b", "-H", "h100-sxm", "--trace", str(fifo))
    assert line == (f"error: {fifo}: not a regular file (a pipe, socket or device), "
                    f"expected a CSV trace file")
