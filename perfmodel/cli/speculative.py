"""Speculative decoding's options for ``simulate`` and ``plan``, named as the engines name
them (``serving.engines.speculation_flags``): vLLM's and TensorRT-LLM's
``--speculative-config`` JSON, SGLang's ``--speculative-*`` flags, and perfmodel's own
acceptance options.

Module level: typer and the standard library only (``perfmodel --help`` stays fast). No
``from __future__ import annotations``: typer reads the Annotated option types.
"""

from typing import Annotated, Any

import typer

from perfmodel.cli.common import fail

PANEL = "speculative decoding (each engine's own names)"
Opt = typer.Option

SpecConfig = Annotated[str | None, Opt(rich_help_panel=PANEL, help=(
    "vLLM: JSON {\"method\": eagle|eagle3|mtp|draft_model|ngram|suffix, "
    "\"num_speculative_tokens\": K, \"model\": ...}; --engine trtllm: its speculative_config "
    "as JSON {\"decoding_type\": Eagle|Eagle3|MTP|NGram|DraftTarget, \"max_draft_len\": K}"))]
SpecAlgorithm = Annotated[str | None, Opt(rich_help_panel=PANEL, help=(
    "--engine sglang: EAGLE | EAGLE3 | NEXTN | STANDALONE | NGRAM"))]
SpecDraftPath = Annotated[str | None, Opt(rich_help_panel=PANEL, help=(
    "--engine sglang: the drafter (STANDALONE: a shipped name, model YAML or config.json)"))]
SpecSteps = Annotated[int | None, Opt(rich_help_panel=PANEL, help=(
    "--engine sglang: draft passes a step (default 3)"))]
SpecTopk = Annotated[int | None, Opt(rich_help_panel=PANEL, help=(
    "--engine sglang: tokens per draft pass (default 1: a chain)"))]
SpecDraftTokens = Annotated[int | None, Opt(rich_help_panel=PANEL, help=(
    "--engine sglang: tokens verified a request (default steps + 1)"))]
Acceptance = Annotated[str | None, Opt("--acceptance", rich_help_panel=PANEL, help=(
    "chance a drafted token is accepted: one rate, or K comma-separated, one per position"))]
AcceptanceProfile = Annotated[str | None, Opt(rich_help_panel=PANEL, help=(
    "a published acceptance profile instead (e.g. deepseek-v3-mtp)"))]
AcceptanceMode = Annotated[str, Opt(rich_help_panel=PANEL, help=(
    "expected: every verify emits E tokens on average exactly, deterministic; sampled: "
    "each position drawn from a table seeded by --acceptance-seed"))]
AcceptanceSeed = Annotated[int, Opt(rich_help_panel=PANEL)]

NAMES = ("speculative_config", "speculative_algorithm", "speculative_draft_model_path",
         "speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens",
         "acceptance", "acceptance_profile", "acceptance_mode", "acceptance_seed")
_SGL = NAMES[1:6]


def speculative(engine: str, p: dict[str, Any]) -> Any:
    """The ``SpecDecode`` the options in ``p`` describe for ``engine``, or None when none
    is given; one clear line for options of another engine or bad values."""
    from perfmodel.serving.engines import speculation_flags as flags
    from perfmodel.specs.errors import SpecError

    sgl = [n for n in _SGL if p.get(n) is not None]
    config = p.get("speculative_config")
    rates = (p.get("acceptance"), p.get("acceptance_profile"))
    mode, seed = p.get("acceptance_mode") or "expected", int(p.get("acceptance_seed") or 0)
    if engine == "sglang" and config is not None:
        fail("--speculative-config: --engine sglang takes --speculative-algorithm and its "
             "--speculative-* flags")
    if engine != "sglang" and sgl:
        fail(f"--{sgl[0].replace('_', '-')}: applies to --engine sglang, not {engine} "
             "(use --speculative-config)")
    if config is None and p.get("speculative_algorithm") is None:
        if sgl or any(r is not None for r in rates):
            fail(f"--{(sgl or ['acceptance'])[0].replace('_', '-')}: needs "
                 f"{'--speculative-algorithm' if engine == 'sglang' else '--speculative-config'}")
        return None
    try:
        if engine == "sglang":
            return flags.from_sglang(p["speculative_algorithm"],
                                     p.get("speculative_draft_model_path"),
                                     p.get("speculative_num_steps"),
                                     p.get("speculative_eagle_topk"),
                                     p.get("speculative_num_draft_tokens"), rates, mode, seed)
        read = flags.from_trtllm if engine == "trtllm" else flags.from_vllm
        return read(config, rates, mode, seed)
    except SpecError as exc:
        fail(str(exc))
