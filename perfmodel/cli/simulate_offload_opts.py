"""``simulate``'s KV offload options (``serving.kvtiers``) and their lines of its table.

Module level: typer and the standard library only (``perfmodel --help`` stays fast).
"""

from typing import Annotated

import typer

_OFFLOAD = "KV offload tiers"
Opt = typer.Option

Tiers = Annotated[str | None, Opt("--kv-offload", rich_help_panel=_OFFLOAD, help=(
    "cpu | cpu,ssd: KV tiers below the GPU's prefix cache (vLLM's OffloadingConnector, "
    "SGLang's --enable-hierarchical-cache), loaded over the device's host: link"))]
CpuGb = Annotated[float | None, Opt(rich_help_panel=_OFFLOAD, help=(
    "CPU tier GB per GPU (default: 2 x the GPU KV pool, SGLang's --hicache-ratio)"))]
SsdGb = Annotated[float | None, Opt(rich_help_panel=_OFFLOAD, help=(
    "SSD tier GB per GPU (with --kv-offload cpu,ssd)"))]
WritePolicy = Annotated[str, Opt(rich_help_panel=_OFFLOAD, help=(
    "write_through (a chain is stored when cached) | write_back (when the GPU evicts it), "
    "as --hicache-write-policy"))]
Overlap = Annotated[str | None, Opt(rich_help_panel=_OFFLOAD, help=(
    "async (vLLM's OffloadingConnector: the request waits out a step while its KV loads) "
    "| serial (the load holds the step: LMCache) | layered (layer by layer: HiCache, "
    "LMCache use_layerwise); default: the engine's"))]


def show(summary: dict) -> None:
    """The tiers' lines of one run's table, when it had tiers."""
    if "kv_tiers" in summary:
        from perfmodel.report.kv_tiers import tiers_table

        typer.echo(tiers_table(summary["kv_tiers"]))
