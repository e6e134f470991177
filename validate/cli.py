"""CLI commands of the validation harness: calibrate, validate, compare.

Module-level imports: typer only. torch (through ``validate``), pandas, scipy and
matplotlib are imported inside the command bodies, so ``perfmodel --help`` and ``estimate``
stay fast. User mistakes print one line, ``error: <file>: <field>: <what was expected>``,
and exit with code 2.
"""

from __future__ import annotations

import time
from dataclasses import replace
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from perfmodel.cli.common import command_line, fail, out_dir, out_file, writing
from perfmodel.cli.devices import EngineOpt, engine_option
from perfmodel.cli.devices import device as load_device


class DeviceKind(str, Enum):
    cpu = "cpu"
    cuda = "cuda"


class SuiteName(str, Enum):
    quick = "quick"
    full = "full"


class TimingChoice(str, Enum):
    auto = "auto"
    kernel = "kernel"
    stream = "stream"
    host = "host"


DeviceOpt = Annotated[DeviceKind, typer.Option(help="where to measure")]
SuiteOpt = Annotated[SuiteName, typer.Option(help="quick (minutes) or full")]
ThreadsOpt = Annotated[int | None, typer.Option(min=1, help="torch threads on CPU "
                                                "(default: all cores)")]
ProgressOpt = Annotated[bool, typer.Option(help="show a progress bar")]
PassesOpt = Annotated[int | None, typer.Option(
    min=1, help="passes over the suite; each configuration keeps its fastest pass "
                "(default 3 on CPU, 2 on CUDA)")]


def _harness() -> None:
    try:
        import torch  # noqa: F401
    except ImportError:
        fail("--device: the harness needs torch: pip install -e '.[harness]'")


def calibrate(
    device: DeviceOpt = DeviceKind.cpu,
    out: Annotated[Path, typer.Option(help="hardware YAML to write (beside it: the measurement "
                                      "CSVs)")] = Path("runs/hardware.yaml"),
    suite: SuiteOpt = SuiteName.quick,
    name: Annotated[str | None, typer.Option(help="hardware name (default: file stem)")] = None,
    threads: ThreadsOpt = None,
    passes: PassesOpt = None,
    measurements: Annotated[Path | None, typer.Option(
        help="CSV of the calibration measurements, resumed if present "
             "(default: OUT with suffix .calibration.csv)")] = None,
    progress: ProgressOpt = True,
    from_: Annotated[str | None, typer.Option(
        "--from", help="fit a shipped device to measured kernels instead of measuring: "
                       "'aiconfigurator' (the installed aiconfigurator-core's tables), a "
                       "corpus folder (perfmodel kernels import aiconfigurator) or its "
                       "systems/data folder; no torch needed")] = None,
    hardware: Annotated[str | None, typer.Option(
        "--hardware", "-H", help="with --from: the shipped device to fit")] = None,
    engine: Annotated[str, typer.Option(callback=engine_option,
                                        help="with --from: vllm, sglang or trtllm")] = "vllm",
    all_devices: Annotated[bool, typer.Option(
        "--all", help="with --from: every shipped device the tables cover, every engine")
    ] = False,
    write_hardware: Annotated[bool, typer.Option(
        help="with --from --all: write the fits into the shipped "
             "perfmodel/hardware/*.yaml")] = False,
    report: Annotated[Path, typer.Option(help="with --from: report folder")] = Path(
        "runs/calibration"),
) -> None:
    """Measure bandwidth, GEMM rates and launch overhead; fit the efficiency; write a YAML.
    With --from, fit a shipped device's constants to measured kernels instead."""
    if from_ is not None:
        from validate.corpus.cli import calibrate_from

        calibrate_from(from_, hardware, engine, all_devices, write_hardware, out, report)
        return
    out_file(out, "--out", (".yaml", ".yml"))
    if measurements is not None:
        out_file(measurements, "--measurements")
    _harness()
    from perfmodel.compare import shape_key
    from perfmodel.specs import SpecError
    from validate import calibrate as cal
    from validate.device import open_device, provenance
    from validate.fit import fit_rows
    from validate.records import (
        KERNEL_COLUMNS,
        KERNEL_KEY,
        STEP_COLUMNS,
        STEP_KEY,
        MeasurementLog,
    )
    from validate.runner import default_passes, run_kernels, run_steps
    from validate.suites import calibration_rows, calibration_steps

    label = name or out.stem
    csv_path = measurements or out.with_suffix(".calibration.csv")
    command = command_line("calibrate", device=device, out=out, suite=suite, name=name,
                           threads=threads, passes=passes)
    try:
        dev = open_device(device.value, threads)
        passes = passes or default_passes(dev)
        wanted = calibration_rows(dev.kind, suite.value)
        log = MeasurementLog(csv_path, KERNEL_COLUMNS, KERNEL_KEY)
        start = time.perf_counter()
        run_kernels(list(wanted), dev, log, label, progress, f"calibrate ({suite.value})",
                    passes)
        this = {"threads": dev.threads}
        measured = log.latest_quiet(r | this for r in wanted)
        # the efficiency is fitted to the sweep; the layer-step kernels only serve the glue
        fit_keys = {shape_key(r) for r in calibration_rows(dev.kind, suite.value, False)}
        rows = [r for r in measured if shape_key(r) in fit_keys]
        base = cal.base_hardware(rows, dev, label)
        result = fit_rows(rows, base)
        step_log = MeasurementLog(out.with_suffix(".calibration-steps.csv"), STEP_COLUMNS,
                                  STEP_KEY)
        wanted_steps = calibration_steps(dev.kind)   # none on CUDA (no glue applied)
        run_steps(list(wanted_steps), dev, step_log, label, progress,
                  f"calibrate ({suite.value}): layers", passes)
        step_rows = step_log.latest_quiet(s.row() | this for s in wanted_steps)
        fitted_hw, overhead = cal.fit_layer_overhead(step_rows, result.hardware, measured)
        if overhead:
            result = replace(result, hardware=fitted_hw, fitted=result.fitted
                             | {"layer_overhead_s": fitted_hw.efficiency.layer_overhead_s})
        doc = cal.hardware_document(base, result, rows, dev, provenance(dev), suite.value,
                                    command, overhead)
        hw = cal.write_hardware(doc, out)
    except (SpecError, RuntimeError, ValueError) as exc:
        fail(str(exc))
    except OSError as exc:   # the paths were checked; the disk can still fill up
        fail(f"--out: cannot write {exc.filename or out}: {exc.strerror or exc}")
    typer.echo(f"measured {len(measured)} calibration rows in {time.perf_counter() - start:.0f} s "
               f"({csv_path})")
    for dtype, rate in hw.peak_flops_per_s.items():
        typer.echo(f"  peak {dtype}: {rate / 1e9:.1f} GFLOP/s (best measured)")
    typer.echo(f"  bandwidth: {hw.memory_bytes_per_s / 1e9:.1f} GB/s (best streaming add)")
    typer.echo("  fitted: " + ", ".join(f"{k}={v:.4g}" for k, v in result.fitted.items()))
    typer.echo(f"  median |error| on the calibration rows: {result.median_abs_error:.1%}")
    typer.echo(f"wrote {out} (loads with perfmodel.specs.load.load_hardware)")


def validate(
    hardware: Annotated[str, typer.Option("--hardware", "-H",
                                          help="hardware name or YAML to predict with")],
    device: DeviceOpt = DeviceKind.cpu,
    engine: EngineOpt = "vllm",
    suite: SuiteOpt = SuiteName.quick,
    out: Annotated[Path, typer.Option(help="report folder")] = Path("runs/validation"),
    threads: ThreadsOpt = None,
    passes: PassesOpt = None,
    progress: ProgressOpt = True,
    plots: Annotated[bool, typer.Option(help="write the PNG figures")] = True,
) -> None:
    """Measure a suite (resuming DIR/measurements.csv), predict it, write the report."""
    from perfmodel.specs import SpecError

    try:
        hw = load_device(hardware, engine)
    except SpecError as exc:
        fail(str(exc))
    out_dir(out)
    _harness()
    from validate.device import open_device, provenance
    from validate.report import write_report
    from validate.runner import default_passes, run_suite
    from validate.suites import validation_suite

    command = command_line("validate", device=device, hardware=hardware,
                           engine=None if engine == "vllm" else engine, suite=suite, out=out,
                           threads=threads, passes=passes)
    try:
        dev = open_device(device.value, threads)
        out.mkdir(parents=True, exist_ok=True)
        start = time.perf_counter()
        passes = passes or default_passes(dev)
        kernels, steps = run_suite(validation_suite(suite.value, dev.kind), dev, out, hw.name,
                                   progress, passes)
        wall = time.perf_counter() - start
        prov = provenance(dev)
        cal_cmd = (hw.calibration or {}).get("command")
        header = [f"# Validation: {dev.name}, {dev.threads or dev.compute_units} "
                  f"{'threads' if dev.kind == 'cpu' else 'SMs'}", "",
                  "Produced by:", "", "```", *([cal_cmd] if cal_cmd else []), command, "```", "",
                  f"Host {prov['hostname']}, {prov['cpu_model']}, torch {prov['torch_version']},"
                  f" {dev.threads} threads, timing `{dev.timing}`, {prov['measured_at']}.",
                  f"This invocation measured for {wall:.0f} s (configurations already in "
                  f"the CSVs are not measured again); each configuration is the fastest "
                  f"of {passes} passes over the suite (a pass's time is the median of its "
                  f"samples).",
                  "Errors below are predicted / measured - 1 on the committed rows."]
        written = write_report(out, hw, hardware, kernels.latest(), steps.latest(), header,
                               plots=plots, suite=suite.value)
    except (SpecError, RuntimeError, ValueError) as exc:
        fail(str(exc))
    except OSError as exc:   # the folder was checked; the disk can still fill up
        fail(f"--out: cannot write {exc.filename or out}: {exc.strerror or exc}")
    typer.echo(f"measured for {wall:.0f} s; wrote {written.path}")
    typer.echo("\n".join(written.held_out))


def _print_summary(df) -> None:
    from perfmodel.compare import summarize

    table = summarize(df)
    typer.echo(f"{'class':<12} {'regime':<8} {'size':<6} {'n':>7} {'median|e|':>10} "
               f"{'p90|e|':>8} {'bias':>8}")
    for _, r in table.iterrows():
        typer.echo(f"{r['op_class']:<12} {r['regime']:<8} {r['size']:<6} {r['n']:>7} "
                   f"{r['median_abs_error']:>10.1%} {r['p90_abs_error']:>8.1%} "
                   f"{r['median_error']:>+8.1%}")
    typer.echo(f"{'all':<28} {len(df):>7} {df['error'].abs().median():>10.1%} "
               f"{df['error'].abs().quantile(0.9):>8.1%} {df['error'].median():>+8.1%}")


def _calibrate_split(rows: list[dict], hw, timing: str, calibrate_on: float | None,
                     split_by: str | None, exclude_fitted_shapes: bool = False):
    """(hardware fitted on the calibration part, evaluation rows, lines describing the split).
    ``exclude_fitted_shapes`` also drops evaluation rows whose shape occurs among the fitted
    rows (different models can share a projection shape)."""
    from perfmodel.compare import shape_key, split_by_model, split_fraction
    from perfmodel.specs import SpecError
    from validate.fit import fit_rows

    if split_by is not None:
        if split_by != "model":
            raise SpecError(f"--split-by: expected model, got {split_by!r}")
        fit, rest, fit_models, eval_models = split_by_model(rows)
        lines = [f"fitted on {len(fit)} rows of models: {', '.join(fit_models)}",
                 f"evaluated on {len(rest)} rows of models: {', '.join(eval_models)}"]
    else:
        fit, rest = split_fraction(rows, calibrate_on)
        lines = [f"fitted on {len(fit)} rows ({len({shape_key(r) for r in fit})} shapes, "
                 f"CRC32 of the shape key below {calibrate_on:g} of its range); evaluated on "
                 f"the other {len(rest)} rows"]
    if exclude_fitted_shapes:
        fitted = {shape_key(r) for r in fit}
        kept = [r for r in rest if shape_key(r) not in fitted]
        lines.append(f"evaluating only the {len(kept)} of {len(rest)} rows whose shape was not "
                     "fitted")
        rest = kept
    if not fit or not rest:
        raise SpecError("the split left nothing to fit or nothing to evaluate")
    result = fit_rows(fit, hw, timing, "fit rows")
    lines.append(f"fitted on a stratified subsample of {result.n_rows} rows: "
                 + ", ".join(f"{k}={v:.4g}" for k, v in result.fitted.items()))
    return result.hardware, rest, lines


def compare(
    measured: Annotated[Path, typer.Argument(help="measurement CSV (shared schema)")],
    hardware: Annotated[str, typer.Option("--hardware", "-H", help="hardware name or YAML")],
    engine: EngineOpt = "vllm",
    out: Annotated[Path | None, typer.Option(help="write every row with predicted_s and "
                                             "error")] = None,
    plot: Annotated[Path | None, typer.Option(help="predicted-vs-measured PNG")] = None,
    summary: Annotated[Path | None, typer.Option(help="markdown summary")] = None,
    timing: Annotated[TimingChoice, typer.Option(
        help="how launch overhead enters (auto: the CSV's timing column, else kernel)")
    ] = TimingChoice.auto,
    device_filter: Annotated[list[str] | None, typer.Option(
        help="keep rows of this device (repeatable)")] = None,
    any_device: Annotated[bool, typer.Option(
        help="predict the rows whatever device their device column names (by default a "
             "label that does not name --hardware is an error)")] = False,
    calibrate_on: Annotated[float | None, typer.Option(
        help="fit the efficiency on this fraction of shapes, report error on the rest")] = None,
    split_by: Annotated[str | None, typer.Option(
        help="'model': fit on half the models (sorted names alternate), report the "
             "other half")] = None,
    exclude_fitted_shapes: Annotated[bool, typer.Option(
        help="with a split: evaluate only rows whose shape was not among the fitted rows")
    ] = False,
    attention_append_kv: Annotated[bool, typer.Option(
        help="prefill attention as flash_attn_with_kvcache appending the chunk's K/V "
             "(Sarathi-Serve's path; sets the hardware's attention_append_kv)")] = False,
) -> None:
    """Predict every row of a measurement CSV and print the error per class and regime."""
    from perfmodel.compare import check_device, drop_unsupported, predict_rows, read_measurements
    from perfmodel.specs import SpecError

    _check_compare_options(calibrate_on, split_by, exclude_fitted_shapes, out, plot, summary)
    try:
        hw = load_device(hardware, engine)
        if attention_append_kv:
            hw = replace(hw, efficiency=replace(hw.efficiency, attention_append_kv=True))
        rows = read_measurements(measured, device_filter)
        if not any_device:
            check_device(rows, hw, str(measured))
        rows, lines = drop_unsupported(rows, str(measured))
        if calibrate_on is not None or split_by is not None:
            hw, rows, split_lines = _calibrate_split(rows, hw, timing.value, calibrate_on,
                                                     split_by, exclude_fitted_shapes)
            lines += split_lines
        import pandas as pd

        df = pd.DataFrame(predict_rows(rows, hw, timing.value, str(measured)))
    except (SpecError, ValueError) as exc:
        fail(str(exc))
    df["measured_s"] = pd.to_numeric(df["measured_s"])
    typer.echo(f"{measured}: {len(df)} rows predicted on {hw.name} (timing {timing.value})")
    for line in lines:
        typer.echo(line)
    _print_summary(df)
    if out is not None:
        with writing(out.parent, "--out"):
            df.to_csv(out, index=False)
    if plot is not None:
        from validate.figures import predicted_vs_measured

        with writing(plot.parent, "--plot"):
            predicted_vs_measured(df, plot, f"{measured.name} on {hw.name}")
    if summary is not None:
        with writing(summary.parent, "--summary"):
            _write_summary(summary, df, measured, hardware, timing.value, lines)


def _check_compare_options(calibrate_on: float | None, split_by: str | None,
                           exclude_fitted_shapes: bool, out: Path | None, plot: Path | None,
                           summary: Path | None) -> None:
    """compare's option mistakes, one line each, before any file is read."""
    if calibrate_on is not None and split_by is not None:
        fail("--calibrate-on and --split-by: choose one")
    if exclude_fitted_shapes and calibrate_on is None and split_by is None:
        fail("--exclude-fitted-shapes: needs a split to know the fitted shapes, expected "
             "--split-by model or --calibrate-on FRACTION with it")
    if out is not None:
        out_file(out, "--out")
    if plot is not None:
        out_file(plot, "--plot", (".png", ".svg", ".pdf"))
    if summary is not None:
        out_file(summary, "--summary")


def _write_summary(path: Path, df, measured: Path, hardware: str, timing: str,
                   lines: list[str]) -> None:
    from perfmodel.compare import summarize
    from validate.report import PCT, markdown_table, target_lines

    text = [f"## {measured.name} on {hardware} (timing {timing})", "", *[f"- {x}" for x in lines],
            *target_lines(df), "", markdown_table(summarize(df), PCT), ""]
    path.write_text("\n".join(text))


def register(app: typer.Typer) -> None:
    """Add this module's commands to ``app``."""
    app.command()(calibrate)
    app.command()(validate)
    app.command()(compare)
