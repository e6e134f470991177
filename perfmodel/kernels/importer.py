"""Build a corpus folder: aiconfigurator-core's tables, or measurement CSVs of the shared
schema (Vidur's profiling, LLMCompass's, our ``validate`` harness's), one file per device x
engine and a manifest (``kernels.corpus``)."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from pathlib import Path

from perfmodel.compare.rows import check_values
from perfmodel.kernels import aiconfigurator as aic
from perfmodel.kernels.corpus import COLUMNS, file_name, write_frame, write_manifest
from perfmodel.specs.errors import SpecError, read_user_file


def _need_pyarrow() -> None:
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        raise SpecError("pyarrow: not installed; expected pip install 'perfmodel[corpus]' "
                        "to read parquet tables") from None


def _ops(df) -> dict[str, int]:
    return {str(k): int(v) for k, v in df["op"].value_counts().sort_index().items()}


def _write(groups: dict[tuple[str, str], list], out: Path, manifest: dict,
           progress: Callable[[str], None]) -> None:
    import pandas as pd

    for (device, engine), parts in sorted(groups.items()):
        df = pd.concat(parts, ignore_index=True)
        name = file_name(device, engine)
        write_frame(df, out / name)
        manifest["files"][name] = {"rows": len(df), "ops": _ops(df)}
        progress(f"wrote {out / name}: {len(df)} rows")


def import_aiconfigurator(out: str | Path, devices: Iterable[str] | None = None,
                          engines: Iterable[str] | None = None, root: str | Path | None = None,
                          progress: Callable[[str], None] = lambda s: None) -> dict:
    """Read every table of the installed aiconfigurator-core (or ``root``) into ``out``;
    the manifest written (files, rows per op, rows left out by reason)."""
    _need_pyarrow()
    data = Path(root) if root else aic.data_root()
    if not data.is_dir():
        raise SpecError(f"{data}: expected aiconfigurator-core's systems/data folder")
    devices, engines = list(devices or []), list(engines or [])
    paths = aic.tables(data, devices, engines)
    if not paths:
        raise SpecError(f"{data}: no parquet table for device {devices or 'any'} engine "
                        f"{engines or 'any'}")
    out = Path(out)
    skipped: Counter = Counter()
    reuse = sorted(str(p.relative_to(data)) for p in data.glob("*/*/*/*/reuse.yaml"))
    manifest = {"source": aic.SOURCE, "source_version": aic.package_version(),
                "data": str(data), "columns": list(COLUMNS), "files": {}, "skipped": {},
                "tables": {},
                "not_read": {"reuse.yaml (another version's data, resolved at query time)":
                             reuse}}
    by_device: dict[str, list[Path]] = defaultdict(list)
    for path in paths:          # one device at a time: its rows in memory, then written
        by_device[path.parts[-5]].append(path)
    for device_paths in by_device.values():
        groups: dict[tuple[str, str], list] = defaultdict(list)
        for path in device_paths:
            df = aic.read_table(path, skipped)
            manifest["tables"][str(path.relative_to(data))] = {
                "rows": len(df), "collection": aic.collection(path.parent)}
            if len(df):
                groups[(str(df["device"].iloc[0]), str(df["engine"].iloc[0]))].append(df)
        _write(groups, out, manifest, progress)
    manifest["skipped"] = {k: v for k, v in sorted(skipped.items()) if v}
    write_manifest(out, manifest)
    return manifest


# device labels of measurement files -> hardware file names
CSV_DEVICES = {"a100-80gb": "a100-80gb-sxm", "a100": "a100-80gb-sxm", "h100": "h100-sxm"}


def import_csv(paths: Iterable[str | Path], out: str | Path, engine: str = "",
               engine_version: str = "", timing: str = "",
               progress: Callable[[str], None] = lambda s: None) -> dict:
    """Measurement CSVs of the shared schema into ``out`` (one file per device x engine,
    ``engine`` naming the framework that ran them, blank: the file's ``engine`` column or
    ``unknown``); the manifest written."""
    import pandas as pd

    groups: dict[tuple[str, str], list] = defaultdict(list)
    for path in map(Path, paths):
        df = read_user_file(path, "a readable CSV",
                            lambda p: pd.read_csv(p, dtype=str, keep_default_na=False),
                            (pd.errors.ParserError, pd.errors.EmptyDataError,
                             UnicodeDecodeError))
        for column in ("device", "op", "measured_s"):
            if column not in df.columns:
                raise SpecError(f"{path}: column {column}: missing (expected the shared "
                                "measurement schema)")
        check_values(df, str(path))
        df["device"] = df["device"].map(lambda d: CSV_DEVICES.get(d, d))
        if engine or "engine" not in df.columns:
            df["engine"] = engine or "unknown"
        if engine_version:
            df["engine_version"] = engine_version
        if timing or "timing" not in df.columns:
            df["timing"] = timing or "kernel"
        df["table"] = path.name
        df["source"] = df["source"].where(df["source"] != "", path.name) \
            if "source" in df.columns else path.name
        for key, part in df.groupby(["device", "engine"]):
            groups[(str(key[0]), str(key[1]))].append(part)
    manifest = {"source": "measurement CSVs", "columns": list(COLUMNS), "files": {}}
    _write(groups, Path(out), manifest, progress)
    write_manifest(Path(out), manifest) if not (Path(out) / "manifest.yaml").exists() \
        else _merge_manifest(Path(out), manifest)
    return manifest


def _merge_manifest(folder: Path, extra: dict) -> None:
    """Add ``extra``'s files to the folder's manifest (a CSV import beside another)."""
    import yaml

    path = folder / "manifest.yaml"
    old = yaml.safe_load(path.read_text()) or {}
    old.setdefault("files", {}).update(extra["files"])
    old.setdefault("also", []).append({"source": extra["source"],
                                       "files": sorted(extra["files"])})
    write_manifest(folder, old)


def aiconfigurator_rows(devices: Iterable[str], engines: Iterable[str],
                        tables: Iterable[str] | None = None, root: str | Path | None = None):
    """The rows ``import_aiconfigurator`` writes for ``devices`` x ``engines`` (only the
    ``tables`` named, e.g. ``gemm_perf``), in memory as one pandas frame, without a corpus
    folder: the same reader (``aiconfigurator.read_table``) builds them."""
    import pandas as pd

    _need_pyarrow()
    data = Path(root) if root else aic.data_root()
    wanted = set(tables) if tables is not None else None
    paths = [p for p in aic.tables(data, list(devices), list(engines))
             if wanted is None or p.stem in wanted]
    frames = [aic.read_table(p, Counter()) for p in paths]
    frames = [f for f in frames if len(f)]
    return pd.concat(frames, ignore_index=True) if frames \
        else pd.DataFrame({c: pd.Series(dtype=str) for c in COLUMNS})
