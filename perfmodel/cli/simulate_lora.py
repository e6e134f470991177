"""``simulate``'s LoRA options: vLLM's (``--enable-lora``, ``--max-loras``,
``--max-lora-rank``, ``--max-cpu-loras``) and SGLang's (``--max-loras-per-batch``,
``--max-lora-rank``, ``--lora-paths``) into the engine's settings
(``serving.engines.lora``), and ``--loras N`` adapters for generated traffic.

Module level: typer and the standard library only (``perfmodel --help`` stays fast).
"""

from dataclasses import replace
from typing import Annotated, Any

import typer

from perfmodel.cli.errors import fail

_LORA = "LoRA adapters (vLLM's and SGLang's flag names)"
Opt = typer.Option

EnableLora = Annotated[bool, Opt(rich_help_panel=_LORA, help=(
    "serve LoRA adapters (vLLM --enable-lora; on with any other LoRA flag)"))]
MaxLoras = Annotated[int | None, Opt(rich_help_panel=_LORA, help=(
    "vLLM: adapters in GPU slots, the most one step runs (default 1)"))]
MaxLoraRank = Annotated[int | None, Opt(rich_help_panel=_LORA, help=(
    "the slots' rank, at which every adapter's kernels run (default 16)"))]
MaxCpuLoras = Annotated[int | None, Opt(rich_help_panel=_LORA, help=(
    "vLLM: adapters cached in host memory (default --max-loras)"))]
MaxLorasPerBatch = Annotated[int | None, Opt(rich_help_panel=_LORA, help=(
    "SGLang: adapters in its GPU pool, the most one batch runs (default 8)"))]
LoraPaths = Annotated[str | None, Opt(rich_help_panel=_LORA, help=(
    "SGLang: the adapters loaded at start-up, comma-separated names"))]
LoraModules = Annotated[str | None, Opt(rich_help_panel=_LORA, help=(
    "the target modules, comma-separated (default q,k,v,o,gate,up,down _proj)"))]
Loras = Annotated[int, Opt(min=0, rich_help_panel=_LORA, help=(
    "generated traffic: each request names one of N adapters"))]
LoraDist = Annotated[str, Opt(rich_help_panel=_LORA, help=(
    "the adapters' popularity: zipf | uniform | round-robin"))]
LoraSkew = Annotated[float, Opt(rich_help_panel=_LORA, help=(
    "--lora-dist zipf: adapter i has weight 1 / (i + 1)^skew"))]

VLLM_FLAGS = ("max_loras", "max_cpu_loras")
SGLANG_FLAGS = ("max_loras_per_batch", "lora_paths")
FLAGS = ("enable_lora", "max_lora_rank", "lora_target_modules", "loras", *VLLM_FLAGS,
         *SGLANG_FLAGS)


def configure(engine: Any, hw: Any, p: dict[str, Any]) -> Any:
    """``engine`` with LoRA's settings from the options ``p`` (unchanged when none is
    given); a warning on stderr where the device's host link is assumed."""
    from perfmodel.serving.engines.lora import LoraSettings, host_link
    from perfmodel.specs.errors import SpecError

    valued = [f for f in FLAGS if f not in ("enable_lora", "loras")]
    if not (p.get("enable_lora") or p.get("loras") or
            any(p.get(f) is not None for f in valued)):
        return engine
    own, other = (SGLANG_FLAGS, VLLM_FLAGS) if engine.name == "sglang" else \
        (VLLM_FLAGS, SGLANG_FLAGS)
    given = [f for f in other if p.get(f) is not None]
    if given:
        fail(f"--{given[0].replace('_', '-')}: applies to --engine "
             f"{'vllm' if engine.name == 'sglang' else 'sglang'}, not {engine.name}")
    slots = p.get(own[0])
    kw: dict[str, Any] = {"engine": engine.name}
    if slots is not None:
        kw["max_loras"] = slots
    elif engine.name == "sglang":
        kw["max_loras"] = 8                     # SGLang's --max-loras-per-batch default
    if p.get("max_lora_rank") is not None:
        kw["max_lora_rank"] = p["max_lora_rank"]
    if engine.name != "sglang" and p.get("max_cpu_loras") is not None:
        kw["max_cpu_loras"] = p["max_cpu_loras"]
    if engine.name == "sglang" and p.get("lora_paths"):
        kw["paths"] = tuple(x.strip() for x in p["lora_paths"].split(",") if x.strip())
    if p.get("lora_target_modules"):
        kw["modules"] = tuple(x.strip() for x in p["lora_target_modules"].split(",")
                              if x.strip())
    try:
        settings = LoraSettings(**kw)
        warning = host_link(hw)[1]
    except SpecError as exc:
        fail(str(exc))
    if warning:
        typer.echo(warning, err=True)
    return replace(engine, lora=settings)


def with_adapters(streams: list, p: dict[str, Any]) -> list:
    """Generated streams with ``--loras`` adapters drawn for their requests."""
    if not p.get("loras"):
        return streams
    from perfmodel.serving.engines.lora import assign
    from perfmodel.specs.errors import SpecError

    try:
        return [(r, assign(reqs, p["loras"], p["lora_dist"], p["lora_skew"], p["seed"]),
                 label) for r, reqs, label in streams]
    except SpecError as exc:
        fail(str(exc))
