"""The console's details in a real Chromium, each as an operator met it.

Each page collects what Chromium's console says (``page.errors``): htmx's errors, the
Content-Security-Policy's, the page's exceptions.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.catalog.samples import gpu_model, store
from tests.waiting import wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_new_windows_min_takes_what_is_typed(open_page: Any, operator: Any) -> None:
    store(gpu_model("windowless"))
    page = open_page(operator, "/catalog/models/windowless/schedule/")
    page.locator("button", has_text="Add a window").click()
    box = page.locator("#id_windows-0-min")
    box.click()
    page.keyboard.type("5")
    assert box.input_value() == "5"
    assert page.locator("#id_windows-0-max").get_attribute("placeholder") == "0"
    assert page.errors == [], page.errors


def test_roll_asks_first_as_restart_and_drain_do(open_page: Any, operator: Any) -> None:
    from cluster.models import Replica
    from tests.cluster.test_rolls_drains import edit_profile, started

    started("rolled", 2)
    edit_profile("rolled")
    before = set(Replica.objects.values_list("pk", flat=True))
    page = open_page(operator, "/cluster/")
    asked: list[str] = []

    def answer(dialog: Any) -> None:
        asked.append(dialog.message)
        dialog.dismiss()

    page.on("dialog", answer)
    block = page.locator("#cluster-models article", has_text="rolled")
    block.get_by_role("button", name="Roll", exact=True).click()
    wait_until(lambda: page.evaluate("1") and asked, what="Roll's question")  # evaluate: events
    assert "Roll rolled?" in asked[0] and "2 outdated" in asked[0]
    assert set(Replica.objects.values_list("pk", flat=True)) == before  # dismissed: nothing
    assert page.errors == [], page.errors


def test_the_policy_opened_directly_is_the_whole_guard_page(
    open_page: Any, operator: Any, live_server: Any
) -> None:
    page = open_page(operator, "/guard/")
    page.goto(f"{live_server.url}/guard/policy/")
    assert page.url == f"{live_server.url}/guard/#guard-policy"
    assert page.locator("link[rel=stylesheet]").count() >= 1  # the console's page, styled
    page.locator("#guard-policy form").wait_for()
    assert page.errors == [], page.errors


def test_the_guard_pages_evaluations_card_starts_one_in_the_console(
    open_page: Any, operator: Any, viewer: Any
) -> None:
    page = open_page(operator, "/guard/")
    card = page.locator("#guard-evals")
    assert "manage.py" not in card.locator("h2").inner_text()
    card.locator("[data-role=eval-run]").click()
    page.locator("#guard-eval-start", has_text="Run an evaluation").wait_for()
    assert page.errors == [], page.errors
    # A viewer starts none: no button, and the way is said (operators, the page).
    card = open_page(viewer, "/guard/").locator("#guard-evals")
    assert card.locator("[data-role=eval-run]").count() == 0
    assert "operators start one on the Evaluations page" in card.inner_text()
