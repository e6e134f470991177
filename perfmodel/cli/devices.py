"""The serving engine whose kernels a command prices (``--engine``) and the devices it
loads for it (``specs.engines``): one option, one check, one warning line.

Module level: typer and the standard library. No ``from __future__ import annotations``:
typer reads the Annotated option types.
"""

from typing import Annotated, Any

import typer

from perfmodel.cli.common import names


def engine_option(value: str) -> str:
    """``--engine``'s check: one of ``specs.engines.ENGINES`` (typer's usage error else)."""
    from perfmodel.specs.engines import check_engine
    from perfmodel.specs.errors import SpecError

    try:
        return check_engine(value)
    except SpecError as exc:
        raise typer.BadParameter(str(exc).removeprefix("--engine: ")) from None


EngineOpt = Annotated[str, typer.Option(
    "--engine", callback=engine_option, help="serving engine whose kernels are priced: vllm, "
    "sglang or trtllm (the device file's engines.<name> block; without one, its top-level "
    "figures and a warning)")]


def device(name: str, engine: str) -> Any:
    """The device ``name`` as ``engine`` runs it (``specs.engines``); priced with another
    engine's figures, it says so in one ``warning:`` line on stderr."""
    from perfmodel.specs import load

    hw = load.hardware(name, engine)
    if hw.engine_warning:
        typer.echo(f"warning: {hw.engine_warning}", err=True)
    return hw


def devices(option: str, text: str, engine: str) -> list[Any]:
    """The devices of a comma list (``device`` each)."""
    return [device(n, engine) for n in names(option, text)]
