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

import typer

from perfmodel.specs.errors import SpecError

# command -> (module, function): imported when the command set is built
CORE = {"estimate": ("perfmodel.cli.estimate", "estimate"),
        "list": ("perfmodel.cli.estimate", "list_specs"),
        "roofline": ("perfmodel.cli.figures", "roofline_cmd"),
        "sweep": ("perfmodel.cli.figures", "sweep_cmd"),
        "report": ("perfmodel.cli.report", "report_cmd")}
_plugins_loaded = False


def build(only: str | None = None) -> typer.Typer:
    """The command set: every core command, or only ``only`` (a run of one command imports
    and converts nothing else: a faster start)."""
    cli = typer.Typer(add_completion=False, no_args_is_help=True,
                      pretty_exceptions_enable=False,
                      help="Predict LLM inference speed on an accelerator, and say why.",
                      context_settings={"max_content_width": 120})
    cli.callback()(_root)           # "perfmodel COMMAND" even with one command registered
    for name, (module, function) in CORE.items():
        if only is None or name == only:
            cli.command(name)(getattr(importlib.import_module(module), function))
    return cli


def _root() -> None:
    pass


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
    try:   # typer >= 0.2x vendors click as typer._click; older releases use click itself
        from typer._click import exceptions as click
    except ImportError:  # pragma: no cover
        import click.exceptions as click

    try:
        code = cli(args=args, standalone_mode=False)
    except click.NoArgsIsHelpError as exc:
        typer.echo(exc.ctx.get_help() if exc.ctx else str(exc))
        code = 0
    except click.UsageError as exc:
        typer.echo(f"error: {exc.format_message()}", err=True)
        code = 2
    except SpecError as exc:   # a spec error raised outside a command's own handler
        typer.echo(f"error: {exc}", err=True)
        code = 2
    except (typer.Abort, KeyboardInterrupt):
        typer.echo("error: aborted", err=True)
        code = 1
    except BrokenPipeError:   # output piped into a reader that closed early (| head)
        sys.stderr = open(os.devnull, "w")
        code = 0
    sys.exit(code if isinstance(code, int) else 0)


def main() -> None:
    """Console entry point. A core command runs alone, without looking up plugins or
    building the other commands (fast start)."""
    first = next((a for a in sys.argv[1:] if not a.startswith("-")), None)
    if first in CORE:
        run(build(only=first))
    run(load_plugins())


if __name__ == "__main__":
    main()
