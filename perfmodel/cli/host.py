"""The engine host-time options shared by simulate, plan and compare-serving
(``serving.host_time``): --engine-version, --engine-mode, --engine-profile, --host-time.

Module level: typer and the standard library. No ``from __future__ import annotations``:
typer reads the Annotated option types.
"""

from pathlib import Path
from typing import Annotated, Any

import typer

_PANEL = "engine host time"
VersionOpt = Annotated[str | None, typer.Option(
    rich_help_panel=_PANEL, show_default="the profile's (vLLM 0.24.0)",
    help="engine version: picks its host-time mode (vLLM >= 0.12: v1 with async scheduling; "
         "0.8-0.11: v1; older: v0)")]
ModeOpt = Annotated[str | None, typer.Option(
    rich_help_panel=_PANEL, show_default="the version's",
    help="host-time mode: vllm v1-async | v1 | v0; sglang overlap | no-overlap; trtllm "
         "overlap | no-overlap")]
ProfileOpt = Annotated[Path | None, typer.Option(
    rich_help_panel=_PANEL, help="an engine profile YAML (perfmodel calibrate-serving's) "
                                 "instead of the shipped one")]
FrontendOpt = Annotated[str, typer.Option(
    rich_help_panel=_PANEL, help="http (an OpenAI server, streaming) or in-process (no HTTP)")]
HostOnOpt = Annotated[bool, typer.Option(
    rich_help_panel=_PANEL, help="add the engine's host time (off: GPU steps only, as "
                                 "perfmodel estimate)")]


def host_profile(engine: str, version: str | None, mode: str | None, profile: Path | None,
                 frontend: str = "http", on: bool = True) -> Any:
    """The ``HostTime`` the options name (SpecError on a bad one)."""
    from perfmodel.serving import host_time

    if not on:
        return host_time.HostTime()
    if profile is not None:
        return host_time.load_profile(profile)
    out = host_time.resolve(engine, version, mode, frontend)
    warning = host_time.past_profile(engine, version)
    if warning:
        typer.echo(f"warning: {warning}", err=True)
    return out
