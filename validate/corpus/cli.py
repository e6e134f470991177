"""``perfmodel calibrate --from``: the command body (no torch; see ``corpus.calibrate``).

``--from``: ``aiconfigurator`` (the installed aiconfigurator-core's tables, read in memory
by ``perfmodel.kernels``), a corpus folder ``perfmodel kernels import aiconfigurator``
wrote (the same rows), or aiconfigurator-core's ``systems/data`` folder (``corpus.rows``).
One device: ``perfmodel calibrate --from aiconfigurator -H h100-sxm [--engine vllm]
--out FILE.yaml`` writes a variant YAML (``base: h100-sxm``) with the fitted constants and
prints the before / held-out errors. Every device: ``perfmodel calibrate --from
aiconfigurator --all [--write-hardware]`` fits each shipped device the tables cover under
vLLM (the top-level ``efficiency:``) and SGLang and TensorRT-LLM (``engines:``), adds the
leave-one-device-out errors per family, writes the report (``--report``, default
runs/calibration: README.md with the tables, one YAML of blocks per device) and, with
``--write-hardware``, the shipped files (each engine's ``uncertainty:`` band included, and a
device of a family without measurements of its own gets the family's leave-one-device-out
band). This is the command that regenerates them.
"""

from __future__ import annotations

from pathlib import Path

import typer

from perfmodel.cli.common import fail, out_dir, out_file
from perfmodel.specs.errors import SpecError
from validate.corpus.rows import ENGINES, Rows


def _print(cal) -> None:
    typer.echo(f"{cal.name} ({cal.engine}): " + ", ".join(
        f"{k}={v:.4g}" for k, v in cal.values.items()))
    for cls, b in cal.before.items():
        h = cal.held.get(cls, {})
        line = (f"  {cls:18s} rows {b['n']:6d}  before {b['median_abs']:6.1%}  held-out "
                f"{h.get('median_abs', float('nan')):6.1%} (bias {h.get('median', 0):+.1%})")
        if cls in cal.lodo:
            line += f"  leave-one-device-out {cal.lodo[cls]['median_abs']:6.1%}"
        typer.echo(line)


def calibrate_from(spec: str, hardware: str | None, engine: str, all_devices: bool,
                   write_hardware: bool, out: Path, report: Path) -> None:
    from validate.corpus import calibrate as kc
    from validate.corpus import write as kw

    if engine not in ENGINES:
        fail(f"--engine: expected one of {', '.join(ENGINES)}, got {engine!r}")
    if not all_devices and hardware is None:
        fail("--hardware: expected the shipped device to fit (or --all)")
    if write_hardware and not all_devices:
        fail("--write-hardware: expected --all (the shipped files are written together)")
    try:
        rows = Rows(spec)
        if not all_devices:
            out_file(out, "--out", (".yaml", ".yml"))
            cal = kc.calibrate(hardware, engine, rows)
            _print(cal)
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(kw.variant_text(hardware, kc.blocks(cal)))
            typer.echo(f"wrote {out}")
            return
        out_dir(report, "--report")
        run_all(rows, report, write_hardware)
    except (SpecError, ValueError) as exc:
        fail(str(exc))


def run_all(rows: Rows, report: Path, write_hardware: bool) -> None:
    """Every device x engine; report; the shipped files when asked."""
    import yaml

    from validate.corpus import calibrate as kc
    from validate.corpus import write as kw
    from validate.corpus.rows import load_sets

    by_engine = {}
    for engine in ENGINES:
        cals = {}
        for name in kc.shipped(rows):
            sets = load_sets(name, engine, rows)
            if sets[0]:
                cals[name] = kc.calibrate(name, engine, rows, sets=sets)
        kc.leave_one_out(cals)
        for cal in cals.values():
            _print(cal)
        by_engine[engine] = cals
    report.mkdir(parents=True, exist_ok=True)
    text = ["# Calibrated from measured kernels", "",
            "Regenerate: `perfmodel calibrate --from aiconfigurator --all --write-hardware`",
            "", "Median |predicted/measured - 1|: before (the file's constants when the fit ran: "
            "on a rerun, the previous fit's), held out (5 folds by shape family), held-out "
            "signed median, leave one device out (the family's other devices' fit).", ""]
    for engine, cals in by_engine.items():
        text += [f"## {engine}", "", kc.table(cals), ""]
    (report / "README.md").write_text("\n".join(text))
    for name, cal in by_engine["vllm"].items():
        blocks = kc.blocks(cal)
        engines, engine_links = {}, {}
        for engine in ("sglang", "trtllm"):
            other = by_engine[engine].get(name)
            if other is not None:
                b = kc.blocks(other)
                # an engine block overrides efficiency, calibration and uncertainty; its
                # all-reduce figures (interconnect) stay in the report; the block's figures
                # the fit does not set (its kernels' tiles and dispatch) are kept
                kept = {k: v for k, v in kw.engine_efficiency(name, engine).items()
                        if k not in b["efficiency"]}
                engines[engine] = {"efficiency": kept | b["efficiency"],
                                   "calibration": b["calibration"],
                                   "uncertainty": b["uncertainty"]}
                engine_links[engine] = b["interconnect"]
        (report / f"{name}.yaml").write_text(yaml.safe_dump(
            blocks | {"engines": engines, "engine_interconnect": engine_links},
            sort_keys=False, width=100))
        if write_hardware:
            path = kw.shipped_path(name)
            path.write_text(kw.shipped_text(path.read_text(), blocks, engines))
            pending = kw.pending_blocks(blocks, engines)
            typer.echo(f"wrote {path}" + (f" ({', '.join(pending)} in {report}/{name}.yaml: "
                                          "the loader does not read them yet)"
                                          if pending else ""))
    for name, band in kc.family_bands(by_engine["vllm"]).items():
        (report / f"{name}.yaml").write_text(yaml.safe_dump({"uncertainty": band},
                                                            sort_keys=False, width=100))
        if write_hardware:
            path = kw.shipped_path(name)
            path.write_text(kw.band_text(path.read_text(), band))
            typer.echo(f"wrote {path} (the {band['source']} band)")
    typer.echo(f"wrote {report}/README.md")
