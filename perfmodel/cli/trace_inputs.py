"""The trace options ``simulate`` and ``plan`` share: ``--trace-format`` (the published
formats of ``serving.traces``), ``--trace-window`` and ``--trace-speedup``; each reader's
warnings said on stderr.

Module level: typer and the standard library only (``perfmodel --help`` stays fast).
"""

from pathlib import Path
from typing import Annotated, Any

import typer

_PANEL = "public traces (docs/traces.md)"
FormatOpt = Annotated[str, typer.Option(
    "--trace-format", rich_help_panel=_PANEL, help=(
        "auto (told by the file's first line) | native | mooncake | azure | burstgpt | "
        "sharegpt: the format of --trace (or --lengths-from)"))]
WindowOpt = Annotated[str | None, typer.Option(
    "--trace-window", rich_help_panel=_PANEL, metavar="START:END", help=(
        "only the requests arriving from START to END seconds into the trace, moved to "
        "start at 0 (either may be empty)"))]
SpeedupOpt = Annotated[float, typer.Option(
    "--trace-speedup", rich_help_panel=_PANEL, help=(
        "the trace's arrival times divided by X (2: twice the rate)"))]


def shape(p: dict) -> tuple[str, str | None, float]:
    """(format, window, speed-up) of parsed options (a caller without them: the defaults)."""
    return p.get("trace_format", "auto"), p.get("trace_window"), p.get("trace_speedup", 1.0)


def check(trace: Path | None, lengths_from: Path | None, options: tuple) -> None:
    """SpecError for a trace option without a trace to apply to, or a bad format name."""
    from perfmodel.serving import traces
    from perfmodel.specs.errors import SpecError

    fmt, window, speedup = options
    traces.check_format(fmt)
    if trace is None and (window is not None or speedup != 1.0):
        flag = "--trace-window" if window is not None else "--trace-speedup"
        raise SpecError(f"{flag}: applies to --trace, expected a --trace FILE")
    if trace is None and lengths_from is None and fmt != "auto":
        raise SpecError("--trace-format: applies to --trace or --lengths-from, expected one")


def timeless(trace: Path | None, options: tuple) -> bool:
    """Whether ``trace`` is in a format without arrival times (then --rate gives them)."""
    from perfmodel.serving import traces

    return trace is not None and not traces.timed(traces.resolve(trace, options[0]))


def refuse(ctx: typer.Context, trace: Path, options: tuple, generated: tuple[str, ...]
           ) -> None:
    """One error line for a generated-traffic option given with ``--trace``, which sets its
    own arrivals and lengths (a trace without arrival times takes --rate's: then --arrival,
    --burstiness and --seed too), or for a bad --trace-format."""
    from perfmodel.cli.errors import fail
    from perfmodel.specs.errors import SpecError

    try:
        rated = ("arrival", "burstiness", "seed") if timeless(trace, options) else ()
    except SpecError as exc:
        fail(str(exc))
    given = [name for name in generated if name not in rated
             and ctx.get_parameter_source(name).name == "COMMANDLINE"]
    if given:
        fail(f"--{given[0].replace('_', '-')}: a --trace sets its own arrivals and "
             "lengths; drop --" + ", --".join(g.replace("_", "-") for g in given))


def native(trace: Path, options: tuple) -> bool:
    from perfmodel.serving import traces

    return traces.resolve(trace, options[0]) == "native"


def requests(path: Path, options: tuple, flag: str = "--trace") -> Any:
    """The requests of a trace in any format, its window and speed-up applied, and each
    reader's warnings said."""
    from perfmodel.serving import traces

    fmt, window, speedup = options
    loaded = traces.read(path, fmt)
    for note in loaded.notes:
        typer.echo(f"warning: {flag}: {note}", err=True)
    if flag != "--trace":
        return loaded.requests
    return traces.reshape(loaded.requests, traces.parse_window(window), speedup)


def at_rates(reqs: Any, path: Path, rates: list[float], arrival: str, burstiness: float,
             seed: int) -> list:
    """[(rate, requests, label)]: a trace without times sent at each rate's arrivals."""
    from perfmodel.serving import traces
    from perfmodel.specs.errors import SpecError

    if not rates:
        raise SpecError(f"--trace: {path} has no arrival times (a ShareGPT conversation "
                        "file); give --rate R, requests/s: its requests are sent in the "
                        "file's order at the arrival times --rate R draws")
    return [(r, traces.at_rate(reqs, r, arrival, burstiness, seed), f"{path.name} at {r:g} "
             "req/s") for r in rates]
