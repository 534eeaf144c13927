# ruff: noqa: F811  (the control plane fixtures are imported from tests/e2e)
"""The catalog list a page at a time, in Chromium against ``manage.py serve``: an operator
goes to page 2 of a 150-model catalog, searched, and its rows, count and address follow;
a model on that page scaled up through the API shows its new ready cell there without a
reload, and the page keeps its 50 rows (nothing of another page is pushed into it)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest

from catalog import codec, services
from catalog.choices import Surface
from llmgw_core.models import ApiToken
from tests.catalog.samples import cpu_model
from tests.e2e.conftest import ControlPlane, chromium, console, control_plane  # noqa: F401

pytestmark = [pytest.mark.e2e]

ROWS = "#served-model-rows tr"


def cell(name: str) -> str:
    return f"#served-model-rows tr:has(a:text-is('{name}')) [data-role=ready]"


def test_an_operator_goes_to_page_2_and_a_change_there_shows_live(
    console: Callable[..., Any], control_plane: ControlPlane, operator: Any
) -> None:
    models = []
    for i in range(150):
        m, problems = codec.decode_model(cpu_model(f"m{i:03d}"))  # on demand: 0/0
        assert not problems, problems
        models.append(m)
    services.import_catalog(
        models, services.Actor(user=None, surface=Surface.FILE, name="fixture"), replace=True
    )
    page = console(operator, "/catalog/?search=m")
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type in ("error", "warning") else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    assert page.locator(ROWS).count() == 100
    assert "150 models match, 1–100" in page.inner_text("#served-model-table p.count")

    page.click("[data-role=pager] a:text-is('2')")
    page.locator("#served-model-table p.count", has_text="101–150").wait_for()
    assert page.url.endswith("/catalog/?search=m&page=2")  # the address follows: Back works
    assert page.input_value("input[name=search]") == "m"
    assert page.locator(ROWS).count() == 50
    assert page.locator("#served-model-rows a").first.inner_text() == "m100"
    page.wait_for_selector("[data-live-status].on")  # the socket, opened for page 2's rows
    assert page.inner_text(cell("m120")) == "0/0"

    _, secret = ApiToken.issue(operator, "paging")
    for name in ("m120", "m005"):  # one on this page, one on page 1
        r = httpx.patch(
            f"{control_plane.url}/api/v1/catalog/models/{name}/",
            json={"scaling": {"min": 1, "max": 1}},
            headers={"Authorization": f"Bearer {secret}"},
            timeout=30,
        )
        assert r.status_code == 200, r.text
    # Wanted now, with no node to place it on: 0 ready of 1, without a reload.
    page.locator(cell("m120"), has_text="0/1").wait_for(timeout=30_000)
    assert page.locator(ROWS).count() == 50
    assert page.locator("#served-model-rows a:text-is('m005')").count() == 0
    assert errors == [], errors
