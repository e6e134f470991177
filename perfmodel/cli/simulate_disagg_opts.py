"""``simulate``'s options of a disaggregated deployment (``cli.simulate_disagg``): typer's
option types, each named once for both pools.

Module level: typer and the standard library only (``perfmodel --help`` stays fast).
"""

from typing import Annotated

import typer

Opt = typer.Option
_PD = "disaggregated prefill/decode (--prefill-replicas P; docs/disaggregation.md)"

Replicas = Annotated[int, Opt(min=0, rich_help_panel=_PD, help=(
    "prefill instances: P > 0 serves prompts and generation on two pools, the KV moved "
    "between them"))]
DecodeReplicas = Annotated[int, Opt(min=1, rich_help_panel=_PD, help="decode instances")]
Hardware = Annotated[str | None, Opt(rich_help_panel=_PD, help=(
    "the pool's device (default -H)"))]
Tp = Annotated[int | None, Opt(min=1, rich_help_panel=_PD, help="the pool's TP (default --tp)")]
Ep = Annotated[int | None, Opt(min=1, rich_help_panel=_PD, help="the pool's EP (default --ep)")]
Flag = Annotated[list[str] | None, Opt(rich_help_panel=_PD, help=(
    "NAME=VALUE: an engine flag for the pool alone, named as simulate names it "
    "(max-num-batched-tokens=16384, max-num-seqs=64); repeat for more"))]
Link = Annotated[str, Opt(rich_help_panel=_PD, help=(
    "what the KV moves over: nixl | mooncake | rdma (each device's NIC, at the share of "
    "its rate each achieves) | nvlink (one node) | network (the NIC's line rate)"))]
Contention = Annotated[bool, Opt(rich_help_panel=_PD, help=(
    "transfers leaving one prefill instance queue on its NICs"))]
