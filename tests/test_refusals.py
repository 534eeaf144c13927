"""One family of refusals: every app's "you can fix this" exception is a
``llmgw_core.refused.Refused``, so the API answers each with 400 and what is wrong.

The agent imports no framework: its refusals are its own, named for what was refused
(``TransferRefused``, ``RequestRefused``). ``gateway.path.guarding.GuardRefused`` is the
guard's verdict on a client's text, answered in the client's own dialect, not a change.
"""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path

import pytest
from django.test import RequestFactory

from llmgw_core.refused import Refused, problems_of

ROOT = Path(__file__).resolve().parent.parent
APPS = ("catalog", "cluster", "guard", "gateway", "updates", "llmgw_admin", "llmgw_core")
NOT_A_CHANGE = {"gateway.path.guarding.GuardRefused"}


def _refusal_classes() -> list[tuple[str, type]]:
    found = []
    for app in APPS:
        for path in sorted((ROOT / app).rglob("*.py")):
            if "migrations" in path.parts or "management" in path.parts:
                continue
            text = path.read_text()
            if "Refused(" not in text:
                continue
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
            module = importlib.import_module(name)
            for attr, value in vars(module).items():
                if (
                    inspect.isclass(value)
                    and attr.endswith("Refused")
                    and value.__module__ == name
                    and issubclass(value, BaseException)
                ):
                    found.append((f"{name}.{attr}", value))
    return found


def test_every_apps_refusal_is_the_frameworks() -> None:
    classes = _refusal_classes()
    assert len(classes) >= 12, classes  # the walk finds them
    stray = [n for n, c in classes if n not in NOT_A_CHANGE and not issubclass(c, Refused)]
    assert not stray, f"refusals that are not llmgw_core.refused.Refused: {stray}"
    bare = [
        n
        for n, _ in classes
        if n.rsplit(".", 1)[1] == "Refused" and n != "llmgw_core.refused.Refused"
    ]
    assert bare == ["catalog.services.Refused"], f"name what is refused: {bare}"


class _ByField(Refused):
    def __init__(self, errors: dict[str, list[str]]) -> None:
        super().__init__("; ".join(m for ms in errors.values() for m in ms))
        self.errors = errors


@pytest.mark.parametrize(
    ("exc", "errors"),
    [
        (
            _ByField({"name": ["taken: pick another"], "__all__": ["one more"]}),
            [
                {"field": "name", "message": "taken: pick another", "code": "refused"},
                {"field": "", "message": "one more", "code": "refused"},
            ],
        ),
        (Refused("the port is in use: pick another"),
         [{"field": "", "message": "the port is in use: pick another", "code": "refused"}]),
    ],
)  # fmt: skip
def test_the_api_answers_a_refusal_with_400_and_what_is_wrong(
    exc: Refused, errors: list[dict[str, str]]
) -> None:
    # Imported here, after DRF's views: llmgw_core.api is DRF's parser setting, which
    # DRF's views load as they are made (as the project's urls do).
    import rest_framework.views  # noqa: F401

    from llmgw_core.api import exception_handler

    response = exception_handler(exc, {"request": RequestFactory().get("/")})
    assert response is not None and response.status_code == 400
    assert response.data["errors"] == errors
    assert [p.message for p in problems_of(exc)] == [e["message"] for e in errors]
