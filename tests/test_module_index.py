"""Each app's module → tests index (``tests/<app>/README.md``) names every module of the
app, and every test file it names exists: a newcomer changing a module finds its tests
there. A new module fails this until its line is added (which tests hold it)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Each app's index; the framework's (llmgw_core) tests live with llmgw_admin's.
INDEX = {app: f"tests/{app}/README.md" for app in
         ("agent", "catalog", "cluster", "guard", "gateway", "updates", "llmgw_admin")}  # fmt: skip
INDEX["llmgw_core"] = "tests/llmgw_admin/README.md"


def _modules(app: str) -> list[str]:
    out = []
    for path in sorted((ROOT / app).rglob("*.py")):
        rel = path.relative_to(ROOT)
        if "migrations" in rel.parts or (path.name == "__init__.py" and path.stat().st_size < 200):
            continue
        out.append(str(rel))
    return out


@pytest.mark.parametrize("app", sorted(INDEX))
def test_the_index_names_every_module_and_only_tests_that_exist(app: str) -> None:
    index = ROOT / INDEX[app]
    text = index.read_text()
    listed = set(re.findall(r"^\| `([^`]+\.py)` \|", text, re.MULTILINE))
    missing = [m for m in _modules(app) if m not in listed]
    assert not missing, f"{INDEX[app]} lacks a line for {missing}: add which tests hold each"
    rows = "\n".join(line for line in text.splitlines() if line.startswith("| `"))
    named = set(re.findall(r"`([\w/]+\.py)`", rows)) - listed
    gone = sorted(t for t in named if not (ROOT / "tests" / t).exists())
    assert not gone, f"{INDEX[app]} names tests that do not exist: {gone}"
