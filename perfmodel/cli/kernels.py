"""``perfmodel kernels import aiconfigurator|csv`` and ``perfmodel kernels compare``: the
kernel corpus (``perfmodel.kernels``).

Module level: typer and the standard library only. No ``from __future__ import
annotations``: typer reads the Annotated option types at registration time. Bad input
prints one line, ``error: ...``, and exits with code 2.
"""

from pathlib import Path
from typing import Annotated

import typer

from perfmodel.cli.common import fail, out_dir, out_path, writing

app = typer.Typer(no_args_is_help=True, add_completion=False, rich_markup_mode=None,
                  help="The kernel corpus: import measured kernels, compare the model.")
importer = typer.Typer(no_args_is_help=True, add_completion=False, rich_markup_mode=None,
                       help="Import measurement tables into a corpus folder.")
app.add_typer(importer, name="import")

Out = Annotated[Path, typer.Option("--out", parser=out_path, metavar="<path>",
                                  help="corpus folder to write")]
Devices = Annotated[list[str] | None, typer.Option(
    "--device", help="only this device (our hardware name, e.g. h100-sxm); repeatable")]
Engines = Annotated[list[str] | None, typer.Option(
    "--engine", help="only this engine (vllm, sglang, trtllm, nccl); repeatable")]


def _run(call, out: Path):
    """``call()``, its SpecError one line; ``out`` checked writable first (before any work:
    /proc/x was a FileNotFoundError traceback), and written through ``writing``."""
    from perfmodel.specs.errors import SpecError

    out_dir(out)

    try:
        with writing(out):
            return call()
    except SpecError as exc:
        fail(str(exc))


@importer.command("aiconfigurator")
def import_aiconfigurator_cmd(
        out: Out = Path("runs/corpus"), device: Devices = None, engine: Engines = None,
        data: Annotated[Path | None, typer.Option(
            "--data", help="aiconfigurator's systems/data folder (default: the installed "
                           "aiconfigurator-core's)")] = None) -> None:
    """Read the measured kernel tables of an installed aiconfigurator-core (NVIDIA,
    Apache-2.0) into corpus files, one per device x engine, and a manifest."""
    from perfmodel.kernels.importer import import_aiconfigurator

    manifest = _run(lambda: import_aiconfigurator(out, device, engine, data, typer.echo), out)
    rows = sum(f["rows"] for f in manifest["files"].values())
    left = sum(manifest["skipped"].values())
    typer.echo(f"{rows} rows in {len(manifest['files'])} files under {out} "
               f"({left} left out: {out / 'manifest.yaml'})")


@importer.command("csv")
def import_csv_cmd(
        files: Annotated[list[Path], typer.Argument(help="measurement CSVs (shared schema)")],
        out: Out = Path("runs/corpus"),
        engine: Annotated[str, typer.Option(
            "--engine", help="the framework that ran the kernels (e.g. vidur)")] = "",
        engine_version: Annotated[str, typer.Option("--engine-version")] = "",
        timing: Annotated[str, typer.Option(
            "--timing", help="kernel | stream | host, where the file has no timing column")
        ] = "") -> None:
    """Import measurement CSVs of the shared schema (Vidur's profiling, the validate
    harness's output) into corpus files beside the others."""
    from perfmodel.compare.rows import TIMINGS
    from perfmodel.kernels.importer import import_csv

    if timing and timing not in TIMINGS:
        fail(f"--timing: expected one of {', '.join(TIMINGS)}, got {timing!r}")
    manifest = _run(lambda: import_csv(files, out, engine, engine_version, timing, typer.echo),
                    out)
    rows = sum(f["rows"] for f in manifest["files"].values())
    typer.echo(f"{rows} rows in {len(manifest['files'])} files under {out}")


@app.command("compare")
def compare_cmd(
        corpus: Annotated[Path, typer.Argument(help="corpus folder (perfmodel kernels import)")],
        device: Devices = None, engine: Engines = None,
        sample: Annotated[int, typer.Option(
            "--sample", min=0, help="rows scored per device x engine x class (0: all)")] = 3000,
        seed: Annotated[int, typer.Option("--seed")] = 0,
        out: Annotated[Path, typer.Option("--out", parser=out_path, metavar="<path>",
                                          help="report folder")] = Path(
            "reports/kernels"),
        figures: Annotated[bool, typer.Option(
            "--figures/--no-figures", help="predicted-vs-measured PNG per device")] = True,
) -> None:
    """Predict every corpus row with the device's shipped hardware file and report median
    and p90 |error| and the signed median per device x engine x class x regime."""
    from perfmodel.kernels.report import compare_corpus

    summary = _run(lambda: compare_corpus(corpus, out, device, engine, sample, seed, figures,
                                          typer.echo), out)
    typer.echo(f"{summary['scored']} rows scored; wrote {out / 'summary.md'}")
