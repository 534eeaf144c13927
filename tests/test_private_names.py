"""No module of the project reads another module's private names.

A name that starts with one underscore is its module's own: another module that needs it
asks for a public name instead (the module says what it offers). This walks every
module's AST (nothing is imported) and fails naming the file, the line and the name,
for ``from x import _name`` and for ``x._name`` where ``x`` is a project module the file
imported. Tests may reach into what they test; the project's code may not.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
APPS = ("agent", "catalog", "cluster", "guard", "gateway", "updates", "llmgw_admin", "llmgw_core")


# Django's public API keeps an underscore: a model's ``_meta``.
PUBLIC = {"_meta"}


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__") and name not in PUBLIC


def _module_of(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def problems(path: Path) -> list[str]:
    """Where ``path`` reads a private name of another project module."""
    tree = ast.parse(path.read_text(), str(path))
    here = _module_of(path)
    found: list[str] = []
    aliases: dict[str, str] = {}  # a local name bound to a project module -> that module
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] in APPS:
                    aliases[a.asname or a.name.split(".")[0]] = (
                        a.name if a.asname else a.name.split(".")[0]
                    )
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.split(".")[0] not in APPS:
                continue
            for a in node.names:
                if _private(a.name) and node.module != here:
                    found.append(
                        f"{path.relative_to(ROOT)}:{node.lineno} imports {node.module}.{a.name}"
                    )
                elif not _private(a.name):
                    aliases[a.asname or a.name] = f"{node.module}.{a.name}"
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and _private(node.attr)
            and isinstance(node.value, ast.Name)
            and node.value.id in aliases
            and aliases[node.value.id] != here
        ):
            found.append(
                f"{path.relative_to(ROOT)}:{node.lineno} reads {aliases[node.value.id]}.{node.attr}"
            )
    return found


def _project_modules() -> list[Path]:
    return sorted(
        p for app in APPS for p in (ROOT / app).rglob("*.py") if "migrations" not in p.parts
    )


def test_no_module_reads_another_modules_private_names() -> None:
    found = [f for path in _project_modules() for f in problems(path)]
    assert not found, "private names read across modules (offer a public one):\n" + "\n".join(found)


def test_the_walk_finds_both_kinds(tmp_path: Path) -> None:
    """The check can fail: a file that imports one private name and reads another."""
    bad = ROOT / "gateway" / "_private_names_probe.py"
    bad.write_text(
        "from cluster.benchrun import _x\nfrom gateway.records import metrics\nmetrics._setup()\n"
    )
    try:
        got = problems(bad)
    finally:
        bad.unlink()
    assert got == [
        "gateway/_private_names_probe.py:1 imports cluster.benchrun._x",
        "gateway/_private_names_probe.py:3 reads gateway.records.metrics._setup",
    ]
