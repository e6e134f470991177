"""The kernel corpus: measurement rows of many sources in one format, with provenance.

A corpus is a folder of CSV files (gzip), one per device x engine (``<device>__<engine>.csv.gz``),
and a ``manifest.yaml`` (files, rows per op, rows left out and why). Its columns are the
shared measurement schema (``compare.rows.SCHEMA``; ``source`` names the source), then
``PROVENANCE`` (the source's version, the engine and its version that ran the kernel, the
kernel's name, how it was timed: ``compare.rows.TIMINGS``, and the source table) and the
op's own columns ``compare.forms`` reads (``EXTRA``). ``device`` is a hardware file name
(``perfmodel/hardware/<device>.yaml``) where we have one, else the source's own name. A file holds
only the columns some row of it fills; readers see a missing column as blanks.

Rows whose op the model has no formula for (MLA modules, sparse attention, ...) are kept
with their op name and time: ``compare`` counts them as skipped.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from perfmodel.compare.rows import SCHEMA
from perfmodel.specs.errors import SpecError

PROVENANCE = ("source_version", "engine", "engine_version", "kernel", "timing", "table")
EXTRA = ("weight_dtype", "weight_format", "act_quant", "kv_dtype", "window", "kv_write",
         "v_dim", "cache_dim", "experts", "topk", "ep", "skew", "distribution",
         "message_bytes", "n_devices", "algorithm", "width", "calls", "chunk", "l2norm",
         "channel_gates", "mode", "nodes", "sms", "groups", "topk_groups")
COLUMNS = (*SCHEMA, *PROVENANCE, *EXTRA)
SUFFIX = ".csv.gz"
MANIFEST = "manifest.yaml"


def file_name(device: str, engine: str) -> str:
    """``<device>__<engine>.csv.gz``."""
    return f"{device}__{engine}{SUFFIX}"


def split_name(path: Path) -> tuple[str, str]:
    """(device, engine) of a corpus file name."""
    stem = path.name[: -len(SUFFIX)]
    device, _, engine = stem.partition("__")
    return device, engine


def write_frame(df, path: Path) -> int:
    """Write ``df`` (pandas) as one corpus file, only the columns some row fills, in
    ``COLUMNS`` order; the number of rows."""
    keep = [c for c in COLUMNS if c in df.columns and _filled(df[c])]
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        import pyarrow as pa
        import pyarrow.csv as pacsv
    except ImportError:
        df[keep].to_csv(path, index=False, compression={"method": "gzip", "compresslevel": 1})
        return len(df)
    table = pa.Table.from_pandas(df[keep], preserve_index=False)
    with pa.CompressedOutputStream(str(path), "gzip") as stream:
        pacsv.write_csv(table, stream, pacsv.WriteOptions(quoting_style="needed"))
    return len(df)


def _filled(column) -> bool:
    """Whether some value of a pandas column is neither missing nor blank text."""
    present = column.dropna()
    if present.dtype.kind in "biuf":
        return len(present) > 0
    return bool((present.astype(str) != "").any()) if len(present) < 10**5 \
        else bool((present.head(10**5).astype(str) != "").any() or (present != "").any())


def corpus_files(folder: str | Path, devices: Iterable[str] | None = None,
                 engines: Iterable[str] | None = None) -> list[Path]:
    """The corpus files of ``folder`` (filtered by device and engine); SpecError naming
    the folder when it is not a corpus or nothing matches."""
    folder = Path(folder)
    if not folder.is_dir():
        raise SpecError(f"{folder}: expected a corpus folder (perfmodel kernels import ...), "
                        "found none")
    files = sorted(folder.glob(f"*{SUFFIX}"))
    if not files:
        raise SpecError(f"{folder}: expected corpus files <device>__<engine>{SUFFIX}, "
                        "found none")
    want_d = set(devices) if devices else None
    want_e = set(engines) if engines else None
    picked = [f for f in files if (want_d is None or split_name(f)[0] in want_d)
              and (want_e is None or split_name(f)[1] in want_e)]
    if not picked:
        have = sorted({f"{d}/{e}" for d, e in map(split_name, files)})
        raise SpecError(f"{folder}: no corpus file for device {sorted(want_d or [])} engine "
                        f"{sorted(want_e or [])}; the folder holds {', '.join(have)}")
    return picked


def read_file(path: Path):
    """One corpus file as a pandas DataFrame of text (blanks ''), every ``COLUMNS`` column
    present."""
    import pandas as pd

    try:
        import pyarrow as pa
        import pyarrow.csv as pacsv
    except ImportError:
        df = pd.read_csv(path, dtype=str, keep_default_na=False)
    else:               # several times faster; every column as text, blanks ''
        table = pacsv.read_csv(str(path), convert_options=pacsv.ConvertOptions(
            column_types={c: pa.string() for c in COLUMNS}, strings_can_be_null=False,
            quoted_strings_can_be_null=False))
        df = table.to_pandas()
    for column in COLUMNS:
        if column not in df.columns:
            df[column] = ""
    return df


def write_manifest(folder: Path, manifest: dict) -> Path:
    """``manifest.yaml`` in ``folder``."""
    import yaml

    path = folder / MANIFEST
    path.write_text(yaml.safe_dump(manifest, sort_keys=False, width=100))
    return path


def read_rows(folder: str | Path, devices: Iterable[str], engines: Iterable[str]):
    """The rows of ``folder``'s files of ``devices`` x ``engines`` as one pandas frame of
    text (no file of them: no rows); SpecError when ``folder`` is not a corpus."""
    import pandas as pd

    want_d, want_e = set(devices), set(engines)
    files = [f for f in corpus_files(folder)
             if split_name(f)[0] in want_d and split_name(f)[1] in want_e]
    frames = [read_file(f) for f in files]
    return pd.concat(frames, ignore_index=True) if frames \
        else pd.DataFrame({c: pd.Series(dtype=str) for c in COLUMNS})
