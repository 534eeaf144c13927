"""The import circles across the files of one folder of the project: an AST walk of every
import, at module level or in a function (nothing is imported or run)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def graph(folder: str) -> dict[str, set[str]]:
    """Return which modules of ``folder`` each of its modules imports (migrations left out).

    ``from package import a, b`` names each of ``a`` and ``b`` that is a module, else the
    package itself; ``from module import name`` names the module."""
    mods: dict[str, Path] = {}
    for path in (ROOT / folder).rglob("*.py"):
        if "migrations" in path.parts:
            continue
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        mods[name] = path
    found: dict[str, set[str]] = {name: set() for name in mods}
    for name, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.module:
                targets = [f"{node.module}.{a.name}" for a in node.names]
                if not any(t in mods for t in targets):
                    targets = [node.module]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            found[name].update(t for t in targets if t in mods and t != name)
    return found


def circles(imports: dict[str, set[str]]) -> list[list[str]]:
    """Return the groups of modules that import one another, round (Tarjan's components)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(imports[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(imports):
        if v not in index:
            visit(v)
    return found
