"""The package's shape: one-way imports, no cycles, a light ``import perfmodel``, small files.

Read from the source (every import statement, at module level or inside a function), so a
lazy import that breaks the layering is caught too.
"""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "perfmodel"
# subpackages in data-path order: a module may import its own subpackage and those before it
LAYERS = ("specs", "cost", "schedules", "serving", "compare", "report", "kernels", "cli",
          "ui")
# serving's rooms in data-path order, the same rule inside it: the core's records (requests,
# traffic, KV pool, forks, results, host time), the engines built on them, the event loop
# that drives an engine, the fleet of replicas, the simulator's entries, the planner
ROOMS = ("core", "engines", "loop", "fleet", "entry", "planner")
LOOP = ("pricing", "lookahead", "engine_loop", "pipeline")
ENTRY = ("simulate", "disagg")


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """Every perfmodel/validate module ``path`` imports (``from a.b import c`` -> a.b and
    a.b.c when that is a module)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
            out |= {f"{node.module}.{a.name}" for a in node.names}
    return {m for m in out if m.split(".")[0] in ("perfmodel", "validate")}


SOURCES = {_module(p): p for p in sorted(PACKAGE.rglob("*.py"))}
GRAPH = {m: {i for i in _imports(p) if i in SOURCES} for m, p in SOURCES.items()}


def _layer(module: str) -> int | None:
    parts = module.split(".")
    return LAYERS.index(parts[1]) if len(parts) > 2 and parts[1] in LAYERS else None


def _room(module: str) -> int | None:
    parts = module.split(".")
    if parts[:2] != ["perfmodel", "serving"] or len(parts) < 3:
        return None
    name = parts[2]
    room = name if name in ROOMS else "loop" if name in LOOP else \
        "entry" if name in ENTRY else "core"
    return ROOMS.index(room)


def test_perfmodel_never_imports_validate():
    offenders = {m: sorted(i for i in _imports(p) if i.startswith("validate"))
                 for m, p in SOURCES.items()}
    assert not {m: v for m, v in offenders.items() if v}


def test_subpackages_import_only_their_own_layer_and_earlier_ones():
    bad = []
    for module, targets in GRAPH.items():
        here = _layer(module)
        for target in targets:
            there = _layer(target)
            if here is not None and there is not None and there > here:
                bad.append(f"{module} -> {target}")
    assert not bad


def test_serving_rooms_import_only_their_own_room_and_earlier_ones():
    bad = [f"{module} -> {target}" for module, targets in GRAPH.items()
           for target in targets
           if None not in (here := _room(module), there := _room(target)) and there > here]
    assert not bad


def test_the_rooms_name_real_modules():
    """A top-level serving module is core unless LOOP or ENTRY lists it: the lists name
    modules that exist."""
    top = {m.split(".")[2] for m in SOURCES if m.count(".") == 2 and m.startswith(
        "perfmodel.serving.")}
    assert set(LOOP) | set(ENTRY) <= top
    assert {"engines", "fleet", "planner"} <= top


def test_no_import_cycles():
    state: dict[str, int] = {}

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for target in sorted(GRAPH[module]):
            if state.get(target) == 1:
                pytest.fail("import cycle: " + " -> ".join([*path, module, target]))
            if target not in state:
                visit(target, [*path, module])
        state[module] = 2

    for module in sorted(GRAPH):
        if module not in state:
            visit(module, [])


def test_sweep_does_not_import_the_report():
    assert not {i for i in GRAPH["perfmodel.schedules.sweep"] if ".report" in i}


def test_files_stay_under_400_lines():
    long = {str(p.relative_to(ROOT)): n for p in [*PACKAGE.rglob("*.py"),
                                                  *(ROOT / "validate").rglob("*.py"),
                                                  *(ROOT / "tests").glob("*.py")]
            if (n := len(p.read_text().splitlines())) > 400}
    assert not long


def test_import_perfmodel_is_light():
    code = ("import sys, perfmodel; "
            "heavy = [m for m in ('torch', 'matplotlib', 'pandas', 'scipy', 'typer', 'pyarrow') "
            "if m in sys.modules]; print(','.join(heavy))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=ROOT)
    assert out.stdout.strip() == ""
