"""What every CLI module shares: the one-line user error, the reproducing command line, the
options of estimate-like commands and the records they build.

Command modules import this one; ``cli.app`` imports the command modules to register them,
so nothing imports ``app`` back (no cycle). Module level: typer and the standard library.
"""

from __future__ import annotations

import shlex
from enum import Enum
from typing import Annotated, Any

import typer

from perfmodel.cli.errors import fail, raising
from perfmodel.cli.outputs import out_dir, out_file, out_path, save, writing
from perfmodel.specs.dtypes import DTYPES
from perfmodel.specs.formats import format_names, weight_format

# re-exported: their homes are cli.errors and cli.outputs
__all__ = ["fail", "out_dir", "out_file", "out_path", "raising", "save", "writing"]


def command_line(command: str, **options: Any) -> str:
    """The ``perfmodel COMMAND ...`` line that reproduces a run: options in the order given,
    ``None`` left out, booleans as ``--flag`` / ``--no-flag``, enums by value, shell-quoted."""
    parts = ["perfmodel", command]
    for key, value in options.items():
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            parts.append(flag if value else f"--no-{flag[2:]}")
        elif value is not None:
            parts += [flag, str(value.value if isinstance(value, Enum) else value)]
    return shlex.join(parts)


def workload(model: Any, batch: int, prompt: int, gen: int, weights_dtype: str | None,
             act_dtype: str, kv_dtype: str, group_size: int | None = None,
             cuda_graphs: bool = False, memory_fraction: float = 0.9, kv_block: int = 16,
             **levers: Any) -> Any:
    """The ``Workload`` of an estimate-like command's options; weights as ``model``'s
    checkpoint stores them unless ``--weights-dtype`` is given (``Workload.for_model``).
    ``levers``: further Workload fields (shared_prefix, prefix_hit_rate, ...)."""
    from perfmodel.specs.workload import Workload

    given = {"weight_group_size": group_size} if group_size is not None else {}
    return Workload.for_model(model, batch=batch, prompt_len=prompt, gen_len=gen,
                              weights_dtype=weights_dtype, act_dtype=act_dtype,
                              kv_dtype=kv_dtype, cuda_graphs=cuda_graphs,
                              usable_memory_fraction=memory_fraction, kv_block_tokens=kv_block,
                              **given, **levers)


def weights_format(name: str | None, weights_dtype: str | None,
                   group_size: int | None) -> tuple[str | None, int | None, dict[str, Any]]:
    """(weights dtype, group size, further Workload fields) of ``--weights-format`` (a
    ``specs.formats`` name), or the options as given when it is not set; a one-line error
    when it is set beside --weights-dtype or --group-size."""
    if name is None:
        return weights_dtype, group_size, {}
    given = [f for f, v in (("--weights-dtype", weights_dtype), ("--group-size", group_size))
             if v is not None]
    if given:
        fail(f"--weights-format {name} sets the weights' dtype, group size and scale bytes; "
             f"drop {' and '.join(given)}")
    dtype, group, scale = weight_format(name).scheme
    return dtype, group, {"weight_scale_bytes": scale}


def load_models(option: str, text: str) -> list[Any]:
    """The models of a comma list, renamed where two share a name (two Hugging Face configs
    of one family) so that every figure and row tells them apart."""
    from dataclasses import replace

    from perfmodel.specs import load

    models = [load.model(n) for n in names(option, text)]
    unique = load.unique_names([m.name for m in models])
    return [m if m.name == n else replace(m, name=n) for m, n in zip(models, unique, strict=True)]


def plan(tp: int = 1, pp: int = 1, ep: int = 1, dp: int = 1,
         attention_dp: bool = False, expert_replicas: int = 0) -> Any:
    """The ``Parallelism`` of the options (a plan that cannot hold raises SpecError)."""
    from perfmodel.specs.workload import Parallelism

    out = Parallelism(tp=tp, pp=pp, ep=ep, dp=dp, attention_dp=attention_dp,
                      expert_replicas=expert_replicas)
    out.require_modelled()
    return out


def _dtype(value: str) -> str:
    if value not in DTYPES:
        raise typer.BadParameter(f"unknown dtype {value!r}, expected one of {', '.join(DTYPES)}")
    return value


def _bad_format(value: str) -> str:
    raise typer.BadParameter(f"unknown weights format {value!r}, expected one of "
                             f"{', '.join(format_names())}")


# options shared by estimate, roofline, sweep and report: same bounds, same messages
ModelOpt = Annotated[str, typer.Option("--model", "-m",
                     help="shipped model name, model YAML, or HF config.json")]
HardwareOpt = Annotated[str, typer.Option("--hardware", "-H",
                        help="shipped hardware name or hardware YAML")]
Batch = Annotated[int, typer.Option(min=1, help="concurrent sequences")]
Prompt = Annotated[int, typer.Option(min=1, help="prompt tokens per sequence")]
Gen = Annotated[int, typer.Option(min=1, help="generated tokens per sequence")]
DtypeOpt = Annotated[str, typer.Option(callback=_dtype, help=f"one of {', '.join(DTYPES)}")]
WeightsOpt = Annotated[str | None, typer.Option(
    callback=lambda v: v if v is None else _dtype(v), show_default="the checkpoint's",
    help=f"one of {', '.join(DTYPES)}; default: as the model's checkpoint stores them "
         "(quantization_config), else bf16")]
Tp = Annotated[int, typer.Option(min=1, help="tensor-parallel degree")]
Pp = Annotated[int, typer.Option(min=1, help="pipeline-parallel stages per replica")]
Ep = Annotated[int, typer.Option(
    min=1, help="expert-parallel degree: = --tp, or with --attention-dp (and --tp 1)")]
AttentionDp = Annotated[bool, typer.Option(
    help="data-parallel attention over the --ep devices, experts reached by all-to-all")]
ExpertReplicas = Annotated[int, typer.Option(
    min=0, help="redundant copies of the hottest experts over the --ep devices (EPLB); "
                "DeepSeek-V3 prefill uses 32 on EP32")]
Dp = Annotated[int, typer.Option(min=1, help="data-parallel replicas (--batch is per replica)")]
GroupSize = Annotated[int | None, typer.Option(
    min=1, help="weight quantization group size (adds a 16-bit scale per group)")]
WeightsFormatOpt = Annotated[str | None, typer.Option(
    "--weights-format",
    callback=lambda v: v if v is None or v in format_names() else _bad_format(v),
    help=f"weights as a kernel stores them, one of {', '.join(format_names())} "
         "(docs/checkpoints.md): sets the dtype, group size and scale bytes (instead of "
         "--weights-dtype / --group-size) of every class the checkpoint quantizes")]
KvGroupSize = Annotated[int | None, typer.Option(
    min=0, show_default="a scale per (token, head) for int8/int4, none otherwise",
    help="KV-cache elements per scale (0: none)")]
KvScaleBytes = Annotated[float, typer.Option(
    min=0.01, max=16.0, help="bytes of scale (and zero point) per KV-cache group")]
OutlierFraction = Annotated[float, typer.Option(
    min=0.0, max=0.5, help="share of the quantized weights' input channels kept in 16 bits")]
QuantizeHead = Annotated[bool | None, typer.Option(
    "--quantize-lm-head/--no-quantize-lm-head", show_default="the checkpoint's",
    help="store and run the LM head at the weights' dtype, group size and scales, as "
         "TorchAO's quantize_ and GPTQ's \"lm_head\": true do; default: as the model's "
         "checkpoint (quantization_config), else 16-bit; no effect on 16-bit weights")]
Graphs = Annotated[bool, typer.Option(help="decode launched as a CUDA graph")]
MemFrac = Annotated[float, typer.Option(
    min=0.01, max=1.0, help="share of device memory usable by the server")]
KvBlock = Annotated[int, typer.Option(min=1, help="paged-KV block, tokens")]
SharedPrefix = Annotated[int, typer.Option(
    min=0, help="prompt tokens shared by every request (a system prompt), cached once")]
HitRate = Annotated[float, typer.Option(
    min=0.0, max=1.0, help="share of requests that find the shared prefix cached")]
ExpertSkew = Annotated[float, typer.Option(
    min=0.0, max=10.0, help="MoE routing skew: expert popularity ~ 1/rank^S (0: uniform)")]

_SPEC = "speculative decoding"
DraftOpt = Annotated[str | None, typer.Option(
    "--draft", rich_help_panel=_SPEC, help="draft model (shipped name, model YAML or HF "
    "config.json), run on the same device, tensor parallelism and dtypes")]
DraftK = Annotated[int | None, typer.Option(
    "--draft-k", min=1, rich_help_panel=_SPEC, show_default="4",
    help="tokens the --draft model proposes per round")]
AcceptanceOpt = Annotated[str | None, typer.Option(
    "--acceptance", rich_help_panel=_SPEC,
    help="chance a drafted token is accepted: one rate, or K comma-separated rates, one "
         "per drafted position (each given the ones before it were accepted)")]
MtpDepth = Annotated[int | None, typer.Option(
    "--mtp-depth", min=1, rich_help_panel=_SPEC,
    help="draft with the model's MTP modules, D tokens per round")]
DraftHeads = Annotated[int | None, typer.Option(
    "--draft-heads", min=1, rich_help_panel=_SPEC,
    help="draft with K Medusa/EAGLE-style heads on the target, K tokens per round")]


_DIFF = "diffusion language model"
DiffusionSteps = Annotated[int | None, typer.Option(
    "--diffusion-steps", min=1, rich_help_panel=_DIFF,
    help="price a diffusion LM (LLaDA, Mercury): N bidirectional refinement steps over the "
         "whole output replace prefill and decode")]
DiffusionBlock = Annotated[int | None, typer.Option(
    "--diffusion-block", min=1, rich_help_panel=_DIFF,
    help="semi-autoregressive blocks of B output tokens, each refined steps / (gen / B) times")]
DiffusionCache = Annotated[bool, typer.Option(
    "--diffusion-prompt-cache", rich_help_panel=_DIFF,
    help="compute the prompt's (and finished blocks') K/V once and reuse them")]


def diffusion(steps: int | None, block: int | None, prompt_cache: bool) -> Any:
    """The ``Diffusion`` of the diffusion options, or None when --diffusion-steps is unset."""
    if steps is None:
        if block is not None or prompt_cache:
            fail("--diffusion-block and --diffusion-prompt-cache need --diffusion-steps")
        return None
    from perfmodel.schedules.diffusion import Diffusion

    return Diffusion(steps, block, prompt_cache)


def speculation(draft: str | None, draft_k: int | None, acceptance: str | None,
                mtp_depth: int | None, draft_heads: int | None) -> Any:
    """The ``Speculation`` of the speculative-decoding options, or None when none is set;
    a one-line error for options that conflict or a bad acceptance. The draft model is
    loaded here (a SpecError for a bad name reaches the caller)."""
    chosen = [f for f, v in (("--draft", draft), ("--mtp-depth", mtp_depth),
                             ("--draft-heads", draft_heads)) if v is not None]
    if len(chosen) > 1:
        fail(f"{' and '.join(chosen)}: choose one way to draft (--draft, --mtp-depth or "
             f"--draft-heads)")
    if draft_k is not None and draft is None:
        fail("--draft-k sets the tokens a --draft model proposes; --mtp-depth and "
             "--draft-heads set their own")
    if not chosen:
        if acceptance is not None:
            fail("--acceptance needs a way to draft: --draft, --mtp-depth or --draft-heads")
        return None
    if acceptance is None:
        fail(f"{chosen[0]} needs --acceptance (one rate in [0, 1], or K comma-separated)")
    from perfmodel.schedules.speculative import Speculation
    from perfmodel.specs import load
    from perfmodel.specs.errors import SpecError

    k = draft_k or 4 if draft is not None else mtp_depth or draft_heads
    rates = _rates(acceptance, k)
    if draft is not None:
        try:
            drafter = load.model(draft)
        except SpecError as exc:     # the loader names --model; this one is --draft
            fail(str(exc).replace("--model:", "--draft:", 1))
        return Speculation(k, rates, "model", draft_model=drafter)
    return Speculation(k, rates, "mtp" if mtp_depth is not None else "heads")


def _rates(text: str, k: int) -> float | list[float]:
    """'0.7' -> 0.7; '0.9,0.8' -> [0.9, 0.8] (K of them); anything else a one-line error."""
    try:
        values = [float(t) for t in _items("--acceptance", text, "rates")]
    except ValueError:
        fail(f"--acceptance: expected a rate in [0, 1] or {k} comma-separated rates, "
             f"got {text!r}")
    bad = [v for v in values if not 0.0 <= v <= 1.0]     # NaN fails too
    if bad:
        fail(f"--acceptance: rates must be in [0, 1], got {bad[0]:g} in {text!r}")
    if len(values) not in (1, k):
        fail(f"--acceptance: expected one rate or K = {k} (one per drafted token), got "
             f"{len(values)} in {text!r}")
    return values[0] if len(values) == 1 else values


# --- comma lists -------------------------------------------------------

def _unique(option: str, values: list, text: str) -> list:
    """``values`` without repeats (first kept); one ``warning:`` line says what was dropped
    (the intent of '1,1,4' is plain, so it is not an error)."""
    seen: set = set()
    dropped = [v for v in values if v in seen or seen.add(v)]
    if dropped:
        typer.echo(f"warning: {option}: dropped repeated {', '.join(map(str, dropped))} "
                   f"from {text!r}", err=True)
    return list(dict.fromkeys(values))


def _items(option: str, text: str, what: str) -> list[str]:
    out = [t.strip() for t in text.split(",")]
    if not text.strip() or any(not n for n in out):
        fail(f"{option}: expected a comma-separated list of {what}, got {text!r}")
    return out


def names(option: str, text: str, what: str = "names") -> list[str]:
    """'a, b' -> ['a', 'b']; an empty list or an empty item is a one-line error, a repeated
    item is dropped with a warning."""
    return _unique(option, _items(option, text, what), text)


def ints(option: str, text: str) -> list[int]:
    """'1,16,128' -> [1, 16, 128]; anything else is a one-line error, a repeat a warning."""
    values = []
    for t in _items(option, text, "positive integers"):
        if not t.isdigit() or int(t) < 1:
            fail(f"{option}: expected comma-separated positive integers, got {t!r} in {text!r}")
        values.append(int(t))
    return _unique(option, values, text)


def numbers(option: str, text: str, kind: type = float, minimum: float = 0.0) -> list:
    """'0,1024' -> [0, 1024] (``kind`` int or float, each >= ``minimum``); anything else is a
    one-line error."""
    values = []
    for t in names(option, text, "numbers"):
        try:
            value = kind(t)
        except ValueError:
            value = None
        if value is None or value != value or value < minimum:
            fail(f"{option}: expected comma-separated {kind.__name__}s >= {minimum:g}, got "
                 f"{t!r} in {text!r}")
        values.append(value)
    return values


def flags(option: str, text: str) -> list[bool]:
    """'false,true' -> [False, True]; anything else is a one-line error, a repeat a warning."""
    values = []
    for t in _items(option, text, "true or false values"):
        if t.lower() not in ("true", "false"):
            fail(f"{option}: expected comma-separated true or false, got {t!r} in {text!r}")
        values.append(t.lower() == "true")
    return _unique(option, values, text)


def dtypes(option: str, text: str) -> list[str]:
    """'bf16,fp8' -> ['bf16', 'fp8']; an unknown dtype is a one-line error."""
    out = names(option, text)
    for d in out:
        if d not in DTYPES:
            fail(f"{option}: unknown dtype {d!r}, expected one of {', '.join(DTYPES)}")
    return out
