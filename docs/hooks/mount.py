"""MkDocs hook: files that live beside the code join the site at their repository paths, so
the links between them, and from the docs pages, are checked by ``mkdocs build --strict``.

- ``reports/``: every report (Markdown, its figures, HTML pages and text tables);
- ``perfmodel/hardware/README.md``, ``perfmodel/models/README.md``: the spec schemas;
- ``validate/README.md``: the measurement harness.

Nothing is copied into docs/: the files stay where the code that writes them puts them.
"""

from __future__ import annotations

from pathlib import Path

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[2]
TREES = {"reports": (".md", ".png", ".svg", ".html", ".txt")}
SINGLES = ("perfmodel/hardware/README.md", "perfmodel/models/README.md", "validate/README.md")


def _mounted() -> list[str]:
    out = list(SINGLES)
    for tree, suffixes in TREES.items():
        out += sorted(str(p.relative_to(ROOT)) for p in (ROOT / tree).rglob("*")
                      if p.is_file() and p.suffix in suffixes)
    return out


def _title(path: Path) -> str:
    """A Markdown file's first heading, else its name."""
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("#"):
            return line.lstrip("#").strip().replace("|", "/")
    return path.name


def reports_page() -> str:
    """The "Every report" page: each Markdown report under reports/, by folder, with its
    title (made at build time, so a new report appears without an edit here)."""
    out = ["# Every report", "",
           "Each report under `reports/`, written by the script or command its page names; "
           "the figures the docs quote come from these files.", ""]
    folders: dict[str, list[Path]] = {}
    for path in sorted((ROOT / "reports").rglob("*.md")):
        folders.setdefault(str(path.parent.relative_to(ROOT)), []).append(path)
    for folder, paths in folders.items():
        out += [f"## `{folder}/`", ""]
        out += [f"- [{_title(p)}]({p.relative_to(ROOT)}) (`{p.name}`)" for p in paths]
        out.append("")
    return "\n".join(out)


def on_files(files: Files, config) -> Files:
    for path in _mounted():
        files.append(File(path, str(ROOT), config["site_dir"], config["use_directory_urls"]))
    files.append(File.generated(config, "reports.md", content=reports_page()))
    return files
