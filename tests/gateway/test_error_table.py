"""The docs' error table (docs/gateway.md) and gateway/path/errors.py say the same: each status
and code an error of the module can carry is a row, and each row is one it makes. And no
module of the gateway makes an error of its own: each is one of ``gateway.path.errors``'."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path
from typing import Any

from gateway.path import errors
from gateway.path.errors import ApiError

ROOT = Path(__file__).resolve().parents[2]
# A value for each parameter type the constructors take.
SAMPLES: dict[str, Any] = {"str": "m", "int": 7, "float": 1.5, "list[str]": ["S1"],
                           "bytes | None": b"h", "str | None": None, "int | None": None}  # fmt: skip


def made() -> set[tuple[int, str | None]]:
    """The (status, code) of every error the module's constructors make."""
    out: set[tuple[int, str | None]] = set()
    for name, fn in vars(errors).items():
        if name.startswith("_") or not inspect.isfunction(fn) or fn.__module__ != errors.__name__:
            continue
        if fn.__annotations__.get("return") != "ApiError":
            continue
        params = inspect.signature(fn).parameters.values()
        args = [SAMPLES[p.annotation] for p in params if p.default is inspect.Parameter.empty]
        error = fn(*args)
        out.add((error.status, error.code))
        if "code" in inspect.signature(fn).parameters:
            # A constructor that takes the code: each code the gateway gives it.
            out |= {(error.status, code) for code in given_codes(name)}
    return out


def given_codes(constructor: str) -> set[str | None]:
    """The codes gateway/path/errors.py passes to ``constructor`` (by keyword or in place)."""
    tree = ast.parse((ROOT / "gateway" / "path" / "errors.py").read_text())
    codes: set[str | None] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == constructor:
            for kw in node.keywords:
                if kw.arg == "code" and isinstance(kw.value, ast.Constant):
                    codes.add(kw.value.value)
            if len(node.args) >= 3 and isinstance(node.args[2], ast.Constant):
                codes.add(node.args[2].value)
    return codes


def documented() -> set[tuple[int, str | None]]:
    text = (ROOT / "docs" / "gateway.md").read_text()
    table = text.split("| status | code | when |", 1)[1].split("\n\n", 1)[0]
    rows = re.findall(r"^\| (\d{3}) \| `([a-z_]+)` \|", table, flags=re.M)
    assert len(rows) == len(table.strip().splitlines()) - 1, "a row the test cannot read"
    return {(int(status), None if code == "null" else code) for status, code in rows}


def test_the_docs_table_lists_every_status_and_code_the_module_makes_and_no_other() -> None:
    ours, docs = made(), documented()
    assert ours - docs == set(), (
        f"made by gateway/path/errors.py, not in docs/gateway.md: {ours - docs}"
    )
    assert docs - ours == set(), f"in docs/gateway.md, made by no constructor: {docs - ours}"
    # The table knows the statuses once found missing from it.
    assert {413, 405, 404, 500} <= {status for status, _ in docs}


def test_no_module_of_the_gateway_makes_an_error_of_its_own() -> None:
    """Every ``ApiError(...)`` is made in gateway/path/errors.py."""
    found = []
    for path in sorted((ROOT / "gateway").rglob("*.py")):
        if path.name == "errors.py" and path.parent.name == "path":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
                if name == ApiError.__name__:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert found == [], f"ApiError made outside gateway/path/errors.py: {found}"
