"""Where a spec name is found (specs.places): the user's folders (--specs, then
PERFMODEL_SPECS_PATH), then the package's own, read through importlib.resources; and
``perfmodel --version``."""

import os
from importlib.metadata import version
from pathlib import Path

import pytest
from typer.testing import CliRunner

import perfmodel as pm
from perfmodel.cli.app import app, command_name
from perfmodel.specs import places
from perfmodel.specs.errors import SpecError
from perfmodel.specs.load import HARDWARE_DIR, MODELS_DIR

runner = CliRunner()


def _folder(root: Path, kind: str, name: str, source: Path, edit=("", "")) -> Path:
    (root / places.FOLDERS[kind]).mkdir(parents=True, exist_ok=True)
    text = source.read_text().replace(*edit)
    (root / places.FOLDERS[kind] / f"{name}.yaml").write_text(text)
    return root


@pytest.fixture
def clean_env(monkeypatch):
    monkeypatch.setenv(places.ENV, "")    # recorded: whatever a test or --specs sets is undone
    return monkeypatch


def test_shipped_folders_are_the_package_data():
    import importlib.resources

    # what importlib.resources answers, taken without importing it (start-up)
    assert HARDWARE_DIR == importlib.resources.files("perfmodel") / "hardware"
    assert MODELS_DIR == importlib.resources.files("perfmodel") / "models"
    assert MODELS_DIR.parent == Path(pm.__file__).parent
    assert (HARDWARE_DIR / "h100-sxm.yaml").is_file()
    assert "llama-2-13b" in places.names("model")


def test_env_folders_come_first_in_order(tmp_path, clean_env):
    base = (HARDWARE_DIR / "h100-sxm.yaml").read_text()
    a = _folder(tmp_path / "a", "hardware", "h100-sxm", HARDWARE_DIR / "h100-sxm.yaml",
                ("description:", "description: from-a #"))
    b = _folder(tmp_path / "b", "hardware", "h100-sxm", HARDWARE_DIR / "h100-sxm.yaml",
                ("description:", "description: from-b #"))
    assert "from-a" not in base
    clean_env.setenv(places.ENV, os.pathsep.join([str(a), str(b)]))
    assert pm.hardware("h100-sxm").description.startswith("from-a")
    clean_env.setenv(places.ENV, os.pathsep.join([str(b), "", str(a)]))
    assert pm.hardware("h100-sxm").description.startswith("from-b")
    clean_env.setenv(places.ENV, "")
    assert not pm.hardware("h100-sxm").description.startswith("from-")


def test_a_user_name_resolves_and_is_offered_as_a_guess(tmp_path, clean_env):
    mine = _folder(tmp_path, "model", "my-llama", MODELS_DIR / "llama-2-7b.yaml")
    clean_env.setenv(places.ENV, str(mine))
    assert pm.model("my-llama").n_layers == pm.model("llama-2-7b").n_layers
    with pytest.raises(SpecError, match="did you mean 'my-llama'"):
        pm.model("my-lama")
    assert "my-llama" in places.names("model")
    # only a models/ folder: hardware names still come from the package
    assert places.search_dirs("hardware") == [HARDWARE_DIR]


def test_bad_folders_are_one_line_naming_the_variable(tmp_path, clean_env):
    clean_env.setenv(places.ENV, str(tmp_path / "nope"))
    with pytest.raises(SpecError, match=f"^{places.ENV}: .*nope: no such folder"):
        pm.model("llama-2-7b")
    clean_env.setenv(places.ENV, str(tmp_path))
    with pytest.raises(SpecError, match="holds neither hardware/ nor models/"):
        pm.hardware("h100-sxm")
    # a path is a path: no folder is searched, so a stale variable does not stand in the way
    assert pm.model(str(MODELS_DIR / "llama-2-7b.yaml")).name == "llama-2-7b"


def test_cli_specs_option_is_searched_before_the_variable(tmp_path, clean_env):
    first = _folder(tmp_path / "first", "hardware", "gpu-x", HARDWARE_DIR / "l4.yaml")
    second = _folder(tmp_path / "second", "hardware", "gpu-x", HARDWARE_DIR / "h100-sxm.yaml")
    clean_env.setenv(places.ENV, str(second))
    result = runner.invoke(app, ["--specs", str(first), "estimate", "-m", "llama-2-7b", "-H",
                                 "gpu-x", "-f", "json"])
    assert result.exit_code == 0, result.output
    assert pm.hardware("l4").name in result.output
    # put in front of the variable, so child processes search alike
    assert os.environ[places.ENV].split(os.pathsep) == [str(first.resolve()), str(second)]
    listed = runner.invoke(app, ["list"])
    assert f"[from {first.resolve() / 'hardware'}]" in listed.output


def test_cli_specs_mistake_is_one_line(tmp_path, clean_env):
    result = runner.invoke(app, ["--specs", str(tmp_path / "none"), "list"])
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [
        f"error: --specs: {tmp_path / 'none'}: no such folder, expected a folder holding "
        "hardware/ or models/ subfolders of YAML specs"]


def test_command_name_skips_the_specs_value():
    assert command_name(["--specs", "estimate", "list"]) == "list"
    assert command_name(["--version"]) is None
    assert command_name(["estimate", "-m", "x"]) == "estimate"


def test_version_is_the_package_metadata():
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.output == f"perfmodel {version('perfmodel')}\n"
