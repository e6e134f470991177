"""The ``perfmodel`` command: the core commands, and those other packages register.

A user mistake (bad file, unknown name, impossible workload) prints one line naming the
file and field and exits with code 2; never a traceback. The measurement harness
(``validate``) adds calibrate, validate and compare through the ``perfmodel.commands``
entry point (this package never imports it); on a checkout where nothing is installed,
``python -m validate`` runs the same command set.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from typer.core import TyperGroup

from perfmodel.specs.errors import SpecError

# command -> (module, function): imported when the command set is built
CORE = {"estimate": ("perfmodel.cli.estimate", "estimate"),
        "list": ("perfmodel.cli.estimate", "list_specs"),
        "roofline": ("perfmodel.cli.figures", "roofline_cmd"),
        "sweep": ("perfmodel.cli.figures", "sweep_cmd"),
        "report": ("perfmodel.cli.report", "report_cmd"),
        "simulate": ("perfmodel.cli.simulate", "simulate_cmd"),
        "plan": ("perfmodel.cli.plan", "plan_cmd"),
        "compare-serving": ("perfmodel.cli.serving_compare", "compare_serving_cmd"),
        "calibrate-serving": ("perfmodel.cli.serving_calibrate", "calibrate_serving_cmd"),
        "compare-inferencex": ("perfmodel.cli.inferencex", "compare_inferencex_cmd"),
        "ui": ("perfmodel.ui.command", "ui_cmd")}   # the optional page: its own package
# command group -> (module, Typer): its subcommands (``perfmodel kernels import ...``)
GROUPS = {"kernels": ("perfmodel.cli.kernels", "app")}
_plugins_loaded = False
# Ctrl-C: ``error: aborted`` and the shell's code for a SIGINT (128 + 2), whichever command
ABORTED = 130


class _Interrupted(Exception):
    """A KeyboardInterrupt inside a command, carried past typer (which would turn it into a
    silent exit 130) to ``_exit_code``."""


def build(only: str | None = None) -> typer.Typer:
    """The command set: every core command, or only ``only`` (a run of one command imports
    and converts nothing else: a faster start). Help is click's plain layout: it wraps the
    text and never cuts an option name, at any width (the boxed rich layout truncates
    names like ``--memory-fraction`` at 80 columns)."""
    cli = typer.Typer(cls=OneLineErrors, add_completion=False, no_args_is_help=True,
                      pretty_exceptions_enable=False, rich_markup_mode=None,
                      help="Predict LLM inference speed on an accelerator, and say why.",
                      context_settings={"max_content_width": 120,
                                        "help_option_names": ["-h", "--help"]})
    cli.callback()(_root)           # "perfmodel COMMAND" even with one command registered
    for name, (module, function) in CORE.items():
        if only is None or name == only:
            cli.command(name)(getattr(importlib.import_module(module), function))
    for name, (module, attr) in GROUPS.items():
        if only is None or name == only:
            cli.add_typer(getattr(importlib.import_module(module), attr), name=name)
    return cli


def _version(value: bool) -> None:
    """``--version``: the installed distribution's version (package metadata), then exit."""
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            typer.echo(f"perfmodel {version('perfmodel')}")
        except PackageNotFoundError:   # a checkout run with PYTHONPATH, nothing installed
            typer.echo("perfmodel (not installed: no package metadata)")
        raise typer.Exit()


Version = Annotated[bool, typer.Option(
    "--version", callback=_version, is_eager=True, help="Print the version and exit.")]
Specs = Annotated[list[Path] | None, typer.Option(
    "--specs", metavar="DIR", help=(
        "A folder of your own specs (hardware/NAME.yaml, models/NAME.yaml), searched for "
        "names before PERFMODEL_SPECS_PATH's folders and the shipped specs; repeatable, "
        "first given first. Give it before the command: perfmodel --specs DIR estimate ..."))]


def _root(version: Version = False, specs: Specs = None) -> None:
    if specs:
        from perfmodel.specs.places import add_user_dirs

        add_user_dirs(specs)


_full: typer.Typer | None = None


def full_app() -> typer.Typer:
    """Every core command (built once; ``app`` is this, made on first use)."""
    global _full
    if _full is None:
        _full = build()
    return _full


def __getattr__(name: str) -> typer.Typer:
    if name == "app":
        return full_app()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def load_plugins(target: typer.Typer | None = None) -> typer.Typer:
    """Add the commands of every installed ``perfmodel.commands`` entry point to ``target``
    (default: the full app, once)."""
    global _plugins_loaded
    app = full_app()
    target = target or app
    if target is app and _plugins_loaded:
        return target
    from importlib.metadata import entry_points

    for ep in entry_points(group="perfmodel.commands"):
        try:
            register = ep.load()
        except Exception as exc:   # a broken plugin must not take the core commands down
            typer.echo(f"warning: commands of {ep.name!r} ({ep.value}) not loaded: "
                       f"{type(exc).__name__}: {exc}", err=True)
            continue
        register(target)
    if target is app:
        _plugins_loaded = True
    return target


def run(cli: typer.Typer, args: list[str] | None = None) -> None:
    """Run ``cli``: every user mistake is one ``error:`` line and exit code 2."""
    cli(args=args)


def _hint(exc: Exception) -> str:
    """``--dpi: 0 is not in the range 1<=x<=1200.`` for a bad option value; click's own
    message for the other usage errors (missing option, unknown option)."""
    param = getattr(exc, "param", None)
    if type(exc).__name__ == "BadParameter" and param is not None:
        name = param.opts[0] if param.opts and param.opts[0].startswith("-") \
            else param.human_readable_name
        return f"{name}: {exc.message}"
    return exc.format_message()


def _exit_code(call: Callable[[], Any]) -> int:
    """Run ``call`` (a command set's non-standalone main) and turn every user mistake into
    one ``error:`` line on stderr: the exit code (2 for a mistake)."""
    try:   # typer >= 0.2x vendors click as typer._click; older releases use click itself
        from typer._click import exceptions as click
    except ImportError:  # pragma: no cover
        import click.exceptions as click

    try:
        code = call()
    except click.NoArgsIsHelpError as exc:
        typer.echo(exc.ctx.get_help() if exc.ctx else str(exc))
        code = 0
    except click.UsageError as exc:
        typer.echo(f"error: {_hint(exc)}", err=True)
        code = 2
    except SpecError as exc:   # a spec error raised outside a command's own handler
        typer.echo(f"error: {exc}", err=True)
        code = 2
    except (typer.Abort, KeyboardInterrupt, _Interrupted):
        typer.echo("error: aborted", err=True)
        code = ABORTED
    except BrokenPipeError:   # output piped into a reader that closed early (| head)
        sys.stderr = open(os.devnull, "w")
        code = 0
    return code if isinstance(code, int) else 0


class OneLineErrors(TyperGroup):
    """The command set's group: run standalone (the console script, ``CliRunner``), a user
    mistake prints one ``error:`` line and exits 2 instead of click's usage block."""

    def main(self, args: Any = None, prog_name: str | None = None,
             complete_var: str | None = None, standalone_mode: bool = True,
             **extra: Any) -> Any:
        def call() -> Any:
            return super(OneLineErrors, self).main(args, prog_name, complete_var,
                                                   standalone_mode=False, **extra)

        if not standalone_mode:
            return call()
        sys.exit(_exit_code(call))

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            raise _Interrupted() from None


def main() -> None:
    """Console entry point. A core command runs alone, without looking up plugins or
    building the other commands (fast start)."""
    first = command_name(sys.argv[1:])
    try:            # Ctrl-C while the command set is built (its modules imported)
        if first in CORE or first in GROUPS:
            cli = build(only=first)
        elif first is None and "--version" in sys.argv[1:]:
            cli = build(only="")     # no command needed: none built, no plugin looked up
        else:
            cli = load_plugins()
    except KeyboardInterrupt:
        typer.echo("error: aborted", err=True)
        sys.exit(ABORTED)
    run(cli)


def command_name(args: list[str]) -> str | None:
    """The command ``args`` name: the first word that is neither an option nor the value of
    the root's ``--specs``."""
    words = iter(args)
    for word in words:
        if word == "--specs":
            next(words, None)
        elif not word.startswith("-"):
            return word
    return None


if __name__ == "__main__":
    main()
