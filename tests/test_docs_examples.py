"""Every code example in the README and docs/ runs here, or is marked as not run.

- A ```bash block's ``perfmodel ...`` commands run through typer's runner, in a temporary
  folder (what they write lands there). A block preceded by a line
  ``<!-- not run: REASON -->`` (a server, minutes of work, a file the reader supplies) is
  only checked: its command exists and takes every option it names.
- A ```python block runs (``exec``), unless marked the same way.
- Output is fenced as ```text or ```console and left alone; a fence without a language
  holds no command (a diagram), so an unmarked example cannot slip through.
- Other lines of a bash block (set-up: venv, pip, pytest, scripts) are allowed only in a
  block marked not run, or in the set-up commands .ci/run runs itself.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from perfmodel.cli.app import app, load_plugins

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^```(\S*)")
NOT_RUN = re.compile(r"^<!-- not run: .+ -->$")
LANGUAGES = {"bash", "python", "text", "console", "yaml", "json", "csv", "markdown"}
# set-up lines the docs show and .ci/run runs itself (a venv, pip, the test command)
SETUP = ("python3 -m venv", ". .venv/bin/activate", "pip install", "python -m pytest",
         "python -m build")


def blocks(path: Path) -> list[tuple[str, str, bool, int]]:
    """(language, text, marked not run, line) of every fenced block of ``path``."""
    out, lines, i = [], path.read_text().splitlines(), 0
    while i < len(lines):
        found = FENCE.match(lines[i])
        if not found:
            i += 1
            continue
        start, marked = i, i > 0 and bool(NOT_RUN.match(lines[i - 1].strip()))
        i += 1
        while i < len(lines) and not lines[i].startswith("```"):
            i += 1
        out.append((found.group(1), "\n".join(lines[start + 1:i]), marked, start + 1))
        i += 1
    return out


def commands(text: str) -> list[str]:
    """Each command of a bash block (continuation lines joined; ``a && b`` split)."""
    joined = re.sub(r"\\\n\s*", " ", text)
    out = []
    for line in joined.splitlines():
        out += [part.strip() for part in line.split("&&") if part.strip()]
    return [c for c in out if not c.startswith("#")]


def _examples(want: str) -> list:
    out = []
    for path in PAGES:
        for language, text, marked, line in blocks(path):
            if language == want:
                out.append(pytest.param(text, marked, id=f"{path.relative_to(ROOT)}:{line}"))
    return out


def test_every_fence_is_a_known_language_or_holds_no_command() -> None:
    command = re.compile(r"^\s*(\$ |perfmodel |python|import |from )", re.M)
    bad = [f"{p.relative_to(ROOT)}:{line}" for p in PAGES
           for language, text, _, line in blocks(p)
           if language not in LANGUAGES and (language or command.search(text))]
    assert not bad, "fences of an unknown language, or unmarked commands: " + ", ".join(bad)


@pytest.fixture(scope="module")
def cli() -> typer.Typer:
    return load_plugins(app)


def _command(cli: typer.Typer, words: list[str]):
    """The click command ``words`` name (a group's subcommand too) and the rest."""
    import typer.main

    command = typer.main.get_command(cli)
    while words and hasattr(command, "get_command"):
        root = {o: p for p in command.params for o in p.opts}
        if words[0] in root:               # a group's own option (--specs DIR, --version)
            words = words[1 if root[words[0]].is_flag else 2:]
            if not words:
                return None, []
            continue
        sub = command.get_command(None, words[0])
        if sub is None:
            break
        command, words = sub, words[1:]
    return command, words


def check_options(cli: typer.Typer, argv: list[str]) -> None:
    command, rest = _command(cli, argv)
    if command is None:                    # only the root's options: perfmodel --version
        return
    assert not hasattr(command, "get_command"), f"no such command: {argv[:2]}"
    known = {o for p in command.params for o in [*p.opts, *p.secondary_opts]}
    for word in rest:
        name = word.split("=", 1)[0]
        if name.startswith("-") and not re.fullmatch(r"-\d.*", name):
            assert name in known, f"perfmodel {' '.join(argv[:2])}: no option {name}"


@pytest.mark.parametrize(("text", "marked"), _examples("bash"))
def test_bash_examples_run(text: str, marked: bool, cli, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    for command in commands(text):
        argv = shlex.split(command, comments=True)
        if not argv:
            continue
        if argv[0] != "perfmodel":
            assert marked or command.startswith(SETUP), f"not run and not marked: {command}"
            continue
        check_options(cli, argv[1:])
        if marked:
            continue
        result = CliRunner().invoke(cli, argv[1:])
        assert result.exit_code == 0, f"{command}\n{result.output}"


@pytest.mark.parametrize(("text", "marked"), _examples("python"))
def test_python_examples_run(text: str, marked: bool, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    if not marked:
        exec(compile(text, "<docs>", "exec"), {})


def test_ci_runs_the_readmes_test_command() -> None:
    """The README's second set-up command installs the extras .ci/run installs and runs the
    test command .ci/run runs (CI takes torch from its own mirror, not PyTorch's index)."""
    setup = next(text for language, text, _, _ in blocks(ROOT / "README.md")
                 if language == "bash")
    second = commands(setup.splitlines()[1])
    ci = (ROOT / ".ci" / "run").read_text()
    extras = next(c for c in second if c.startswith("pip install -e"))
    assert extras.replace("pip install", "python -m pip install -q") in ci
    assert f"\n{second[-1]}\n" in ci
    assert second[-1] == 'python -m pytest -q -m "not slow"'
    assert "torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu" in second[2]
