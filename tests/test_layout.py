"""The package's layout: every import points down the pipeline, and no module imports itself
back through another.

The stage order is written here once. A module may import its own top-level package and the
packages of lower stages; importing a package of the same stage (tasks <-> models) or of a
higher one fails, and so does any import cycle between modules (function-level imports
included: a cycle hidden in a function is still a cycle; so is one through imports for type
checkers only, which the stage order leaves out).
"""

from __future__ import annotations

import ast
from pathlib import Path

import mecheval

#: Lowest first. The first name of a module's path below ``mecheval`` decides its stage.
STAGES: tuple[tuple[str, ...], ...] = (
    ("__init__", "errors", "io", "schema"),
    ("tasks", "models"),
    ("training", "interventions"),
    ("report",),
    ("experiments", "contract"),
    ("cli",),
)
ROOT = Path(mecheval.__file__).parent


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _imports(path: Path, name: str, known: set[str], typing_only: bool = False) -> set[str]:
    """The mecheval modules ``path`` imports (a name imported from a package counts as its
    submodule when it is one); with ``typing_only``, those under ``if TYPE_CHECKING:`` too."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    tree = ast.parse(path.read_text(encoding="utf-8"))
    # Imports under ``if TYPE_CHECKING:`` never run: they name a type for annotations only.
    for_type_checkers = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and ast.unparse(node.test).endswith("TYPE_CHECKING")
        for inner in ast.walk(node)
    }
    for node in ast.walk(tree):
        if id(node) in for_type_checkers and not typing_only:
            continue
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("mecheval"))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            if not base.startswith("mecheval"):
                continue
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.add(sub if sub in known else base)
    return {m for m in found if m in known and m != name}


def _stage(module: str) -> int:
    head = module.split(".")[1] if "." in module else "__init__"
    for i, names in enumerate(STAGES):
        if head in names:
            return i
    raise AssertionError(f"{module}: its package {head!r} is in no stage of STAGES")


def _graph(typing_only: bool = False) -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    return {name: _imports(path, name, known, typing_only) for name, path in modules.items()}


def _package(module: str) -> str:
    return module.split(".")[1] if "." in module else ""


def test_every_import_points_down_the_pipeline() -> None:
    wrong = []
    for module, imported in _graph().items():
        for target in sorted(imported):
            if _package(target) == _package(module):
                continue
            if _stage(target) >= _stage(module):
                wrong.append(f"{module} -> {target}")
    assert not wrong, "imports that do not point down the pipeline:\n" + "\n".join(wrong)


def test_the_kernels_import_no_module_above_them() -> None:
    """models/ops/ holds the recurrences; the mixer modules wire them, never the reverse."""
    below = ("mecheval.models.ops", "mecheval.models.native", "mecheval.models.kernels")
    wrong = [
        f"{module} -> {target}"
        for module, imported in _graph().items()
        if module.startswith("mecheval.models.ops")
        for target in sorted(imported)
        if not target.startswith(below) and _package(target) == "models"
    ]
    assert [m for m in _graph() if m.startswith("mecheval.models.ops.")], "no models/ops/"
    assert not wrong, "kernels that import modules above them:\n" + "\n".join(wrong)


def test_no_import_cycle() -> None:
    """Not even through imports for type checkers: a module that names another's type only
    still depends on it, and a reader follows the names round in a circle."""
    graph = _graph(typing_only=True)
    # Package __init__ files re-export their submodules; an edge from a submodule back to its
    # own package's __init__ is how a package is assembled, not a design cycle.
    edges = {
        m: {t for t in ts if not (m.startswith(t + ".") and graph.get(t) is not None)}
        for m, ts in graph.items()
    }
    cycles = _cycles(edges)
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_the_checker_sees_an_upward_import_and_a_cycle() -> None:
    """The two checks above can fail: an upward edge and a two-module cycle are reported."""
    assert _stage("mecheval.tasks.ar") < _stage("mecheval.training.run")
    assert _cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []
    graph = _graph()
    # A real edge the parser must see: the trainer imports the task registry's package.
    assert "mecheval.tasks" in graph["mecheval.training.trainer"]
    assert "mecheval.contract" in graph["mecheval.cli.models"]
    # An import under ``if TYPE_CHECKING:`` is an edge of the cycle check's graph only.
    for_types = {
        module: sorted(targets - graph[module])
        for module, targets in _graph(typing_only=True).items()
        if targets - graph[module]
    }
    assert for_types, "no import for type checkers seen"


def test_no_module_imports_its_own_package_back() -> None:
    """A package's __init__ assembles it from its modules; a module that imports the
    ``__init__`` back (the CLI's commands taking ``app`` from ``mecheval.cli``) points up
    its own package, and importing it alone runs the whole package first."""
    back = [
        f"{module} -> {target}"
        for module, imported in _graph().items()
        for target in sorted(imported)
        if module.startswith(target + ".")
    ]
    assert not back, "modules that import their own package back:\n" + "\n".join(back)
