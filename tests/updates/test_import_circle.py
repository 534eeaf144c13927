"""No import circle across the files of ``updates/``: every import, at module level or in a
function, points one way (the tasks call the mirror and the flow, which reach the workers
through them, set as the app starts; the mirror's modules build on one another, ``store``
first)."""

from __future__ import annotations

import ast
from pathlib import Path

from updates import run, tasks
from updates.mirror import fetches

ROOT = Path(__file__).resolve().parents[2]


def _graph() -> dict[str, set[str]]:
    mods: dict[str, Path] = {}
    for path in (ROOT / "updates").rglob("*.py"):
        if "migrations" in path.parts:
            continue
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        mods[name] = path
    graph: dict[str, set[str]] = {name: set() for name in mods}
    for name, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text())):
            targets = []
            if isinstance(node, ast.ImportFrom) and node.module:
                targets = [f"{node.module}.{a.name}" for a in node.names] + [node.module]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            for t in targets:
                if t in mods and t != name:
                    graph[name].add(t)
                    break
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Return the groups of modules that import one another, round (Tarjan's components)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
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

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_search_finds_a_circle() -> None:
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_circle_across_the_files_of_updates() -> None:
    assert circles(_graph()) == []


def test_the_mirror_and_the_flow_reach_the_workers_through_their_tasks() -> None:
    assert fetches.to_worker == tasks.fetch_into_mirror.delay
    assert run.eval_to_worker == tasks.run_update_eval.delay
