"""The package's layers, by its import graph: every module of `vaco_jax/`, `experiments/`,
`benchmarks/` and `tests/`, parsed with `ast`. An import inside a function is an import: a deferred
import still makes the importer depend on the imported module. The graph has no circle, and no
module imports a layer above its own."""

from __future__ import annotations

import sys
from pathlib import Path

from vaco_jax.study.keys import imported_names   # the package's own reader of an import graph

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ("vaco_jax", "experiments", "benchmarks", "tests")

# The layers, lowest first: a module may import its own layer and the layers below it. A module
# belongs to the longest entry that names it or a package above it. `vaco_jax` is the core, one
# layer whose own order the acyclicity check keeps. Above it the analysis (statistics, estimands,
# reports: numeric libraries and `vaco_jax.io` only); then the study layer's sweeps, the analysis
# pipeline (runs, scores: never its tables or figures), its tables and figures, the generic
# figures, then the studies, which draw their own figures with them.
LAYERS = (
    {"vaco_jax"},
    {"vaco_jax.analysis"},
    {"vaco_jax.study"},
    {"vaco_jax.pipeline"},
    {"vaco_jax.pipeline.tables", "vaco_jax.pipeline.figures"},
    {"vaco_jax.study.plotting"},
    {"vaco_jax.study.lag", "vaco_jax.study.lag_by_setting", "vaco_jax.study.scorecard",
     "vaco_jax.study.leaderboard", "vaco_jax.study.robustness",
     "vaco_jax.study.specs"},
    {"vaco_jax.llm"},
    {"vaco_jax.commands"},
    {"experiments", "benchmarks"},
    {"tests"},
)


ANALYSIS = "vaco_jax.analysis"
ANALYSIS_MAY_IMPORT = ("numpy", "scipy", "pandas", "rliable", "matplotlib", "vaco_jax.io", ANALYSIS)
"""Besides Python's standard library, all that `vaco_jax/analysis/` may import: the numeric
libraries, the one reader of result files and itself (never a study, a sweep or the trainer)."""


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    """Every module of SOURCES, by its dotted name (a package by its `__init__.py`)."""
    return {module_name(path): path for source in SOURCES
            for path in sorted((ROOT / source).rglob("*.py"))}


def import_graph() -> dict[str, set[str]]:
    """importer -> the modules of SOURCES it imports. `from a import b` depends on the module
    `a.b` when there is one, else on `a`; a package's `__init__` is not counted as imported by
    its submodules' importers (Python runs it first, but the importer names no dependency)."""
    known = modules()
    graph = {}
    for name, path in known.items():
        targets = set()
        for imported in imported_names(name, path):
            parts = imported.split(".")
            while parts and ".".join(parts) not in known:
                parts.pop()
            if parts:
                targets.add(".".join(parts))
        graph[name] = targets - {name}
    return graph


def layer(name: str) -> int | None:
    """The index in LAYERS of the longest entry naming `name` or a package above it."""
    entries = [(len(entry), index) for index, members in enumerate(LAYERS) for entry in members
               if name == entry or name.startswith(entry + ".")]
    return max(entries)[1] if entries else None


def cycles(graph: dict[str, set[str]]) -> list[tuple[list[str], set[str]]]:
    """(a circle, every module on some circle with it): one for each strongly connected component
    of more than one module (Tarjan)."""
    index, low, stack, on_stack, components = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while not component or component[-1] != node:
                component.append(stack.pop())
                on_stack.discard(component[-1])
            if len(component) > 1:
                components.append(set(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return [(circle(graph, component), component) for component in components]


def circle(graph: dict[str, set[str]], component: set[str]) -> list[str]:
    """A shortest path from the component's first module back to itself, inside the component."""
    start = min(component)
    paths, frontier = {start: [start]}, [start]
    while frontier:
        node = frontier.pop(0)
        for target in sorted(graph[node] & component):
            if target == start:
                return paths[node] + [start]
            if target not in paths:
                paths[target] = paths[node] + [target]
                frontier.append(target)
    raise AssertionError("a strongly connected component always holds a circle")


def test_every_module_belongs_to_a_layer():
    unplaced = [name for name in modules() if layer(name) is None]
    assert not unplaced, f"modules in no layer (add them to LAYERS): {unplaced}"


def test_the_import_graph_has_no_circle():
    found = [" -> ".join(path) + (f"   (and {', '.join(sorted(knot - set(path)))} on circles "
                                  f"with them)" if knot - set(path) else "")
             for path, knot in cycles(import_graph())]
    assert not found, "import circles:\n" + "\n".join(found)


def test_no_module_imports_a_layer_above_its_own():
    upward = [f"{importer} (layer {layer(importer)}) -> {imported} (layer {layer(imported)})"
              for importer, targets in sorted(import_graph().items())
              for imported in sorted(targets) if layer(imported) > layer(importer)]
    order = "; ".join(f"{i}: {', '.join(sorted(members))}" for i, members in enumerate(LAYERS))
    assert not upward, f"imports of a higher layer (layers {order}):\n" + "\n".join(upward)


def foreign_imports(name: str, path: Path) -> list[str]:
    """What the analysis module `name` imports beyond `ANALYSIS_MAY_IMPORT` and the standard
    library."""
    return sorted(n for n in imported_names(name, path)
                  if n.split(".")[0] not in sys.stdlib_module_names
                  and not any(n == a or n.startswith(a + ".") for a in ANALYSIS_MAY_IMPORT))


def test_the_analysis_imports_only_numeric_libraries_and_io(tmp_path):
    found = {name: foreign_imports(name, path) for name, path in modules().items()
             if name == ANALYSIS or name.startswith(ANALYSIS + ".")}
    assert len(found) >= 8 and not any(found.values()), found
    injected = _write(tmp_path / "injected.py", "def late():\n    from vaco_jax.study import stats\n")
    assert foreign_imports(f"{ANALYSIS}.injected", injected) == ["vaco_jax.study.stats"]


def test_the_checks_see_a_deferred_relative_import_and_a_circle(tmp_path):
    source = "def late():\n    from ..study import lag\n"
    names = imported_names("vaco_jax.llm.sampling", _write(tmp_path / "sampling.py", source))
    assert "vaco_jax.study.lag" in names
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [(["a", "b", "c", "a"],
                                                                          {"a", "b", "c"})]


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path
