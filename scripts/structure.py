"""The structure figures of the package, as its design is held to them (docs/architecture.md):
its size, its functions over 50 lines, the import levels inside each package, and the modules
that import their own package back. The import graph is tests/test_layout.py's.

    python scripts/structure.py [--functions]
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from test_layout import ROOT as PACKAGE  # noqa: E402
from test_layout import _graph  # noqa: E402

LONG = 50


def long_functions() -> list[tuple[int, str]]:
    """(lines, "file:function") of every function longer than :data:`LONG` lines."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = node.end_lineno - node.lineno + 1
                if lines > LONG:
                    found.append((lines, f"{path.relative_to(PACKAGE)}:{node.name}"))
    return sorted(found, reverse=True)


def import_levels(graph: dict[str, set[str]], package: str, own: bool = False) -> int:
    """The longest chain of imports between the modules of ``package``, its subpackages
    included (``own``: its own modules only): 1 where none imports another."""
    inside = {
        m
        for m in graph
        if m.startswith(package + ".") and not (own and "." in m[len(package) + 1 :])
    }
    depth: dict[str, int] = {}

    def level(module: str) -> int:
        if module not in depth:
            depth[module] = 1  # a cycle (tests/test_layout.py refuses them) counts once
            below = [level(t) for t in graph[module] if t in inside and t != module]
            depth[module] = 1 + max(below, default=0)
        return depth[module]

    return max((level(m) for m in inside), default=0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--functions", action="store_true", help="list the long functions")
    args = parser.parse_args()
    files = sorted(PACKAGE.rglob("*.py"))
    lines = sum(len(p.read_text(encoding="utf-8").splitlines()) for p in files)
    graph = _graph()
    longest = long_functions()
    back = [(m, t) for m, targets in graph.items() for t in targets if m.startswith(t + ".")]
    print(f"src: {len(files)} files, {lines:,} lines")
    print(f"functions over {LONG} lines: {len(longest)}")
    if args.functions:
        for n, name in longest:
            print(f"  {n:4d}  {name}")
    packages = sorted({m.split(".")[1] for m in graph if m.count(".") >= 2})
    print("import levels inside each package:")
    for package in packages:
        name = f"mecheval.{package}"
        levels = import_levels(graph, name)
        own = import_levels(graph, name, own=True)
        beside = f" ({own} in its own modules, its subpackages aside)" if own != levels else ""
        print(f"  {package + '/':<15} {levels}{beside}")
    print(f"modules importing their own package back: {len(back)}")


if __name__ == "__main__":
    main()
