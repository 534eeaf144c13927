"""Saving each console form breaks none of the page's Content-Security-Policy:
the catalog's model form, its schedule, the guard policy and the Keys page, with a textarea
resized first as an operator does (Chromium keeps the new size in the element's style
attribute, which htmx copied back with setAttribute as it swapped the form: refused by
the policy on every save). Every violation and console error is collected."""

from __future__ import annotations

from typing import Any

import pytest

from tests.browser.conftest import wait_js
from tests.catalog.samples import gpu_model, store

pytestmark = pytest.mark.django_db(transaction=True)

# Kept from before the page's own scripts, across every page the test opens.
WATCH = """
window.__csp = [];
document.addEventListener("securitypolicyviolation", (e) => {
  window.__csp.push(e.violatedDirective + " " + (e.blockedURI || "inline") + " " + e.sourceFile);
});
"""


def unplanned(errors: list[str]) -> list[str]:
    """The page's errors but those of a request aborted on purpose: a Save cancels the
    form's live check in flight (``hx-sync="closest form:abort"``), and htmx logs the
    aborted request as two console errors, ``htmx:sendAbort`` and its ``htmx:afterRequest``
    (on a loaded machine the check sometimes starts before the click). Any other error,
    and an ``htmx:afterRequest`` without an abort, stays."""
    left = list(errors)
    for e in errors:
        if e.startswith("error: htmx:sendAbort, "):
            left.remove(e)
            paired = e.replace("htmx:sendAbort", "htmx:afterRequest", 1)
            if paired in left:
                left.remove(paired)
    return left


def test_an_aborted_check_is_planned_and_any_other_error_is_not() -> None:
    abort = ["error: htmx:afterRequest, [object HTMLFormElement]",
             "error: htmx:sendAbort, [object HTMLFormElement]"]  # fmt: skip
    assert unplanned(abort) == []
    failed = ["error: htmx:responseError, [object HTMLFormElement]",
              "error: htmx:afterRequest, [object HTMLFormElement]"]  # fmt: skip
    assert unplanned(failed) == failed
    assert unplanned(["pageerror: boom", *abort]) == ["pageerror: boom"]


def resize(page: Any, selector: str) -> None:
    """Drag a textarea's corner down as a user would: it then has a style attribute."""
    box = page.locator(selector).bounding_box()
    assert box is not None, selector
    page.mouse.move(box["x"] + box["width"] - 3, box["y"] + box["height"] - 3)
    page.mouse.down()
    page.mouse.move(box["x"] + box["width"] - 3, box["y"] + box["height"] + 60, steps=5)
    page.mouse.up()
    assert "height" in (page.locator(selector).get_attribute("style") or ""), selector


def watched(open_page: Any, user: Any, path: str) -> Any:
    page = open_page(user, path)
    page.add_init_script(WATCH)  # for the pages a save leads to
    page.evaluate(WATCH)  # and for this one, already loaded
    return page


def quiet(page: Any) -> None:
    assert unplanned(page.errors) == [], page.errors
    assert page.evaluate("window.__csp") == []


def test_saving_the_model_form_refused_then_saved_breaks_no_policy(
    open_page: Any, operator: Any, live_server: Any
) -> None:
    store(gpu_model("chat"))
    page = watched(open_page, operator, "/catalog/models/chat/edit/")
    resize(page, "#id_description")
    page.fill("#id_source", "")
    page.click("button:text('Save')")
    page.locator("#err-source p").first.wait_for()  # refused: the form again, with its error
    quiet(page)
    page.fill("#id_source", "org/chat-2")
    page.click("button:text('Save')")
    page.wait_for_url(f"{live_server.url}/catalog/models/chat/")
    quiet(page)


def test_saving_the_schedule_refused_then_saved_breaks_no_policy(
    open_page: Any, operator: Any, live_server: Any
) -> None:
    store(gpu_model("chat"))
    page = watched(open_page, operator, "/catalog/models/chat/schedule/")
    page.fill("#id_scaling_min", "9")  # above max
    page.click("#schedule-form button[type=submit]")
    page.locator("#schedule-form .field-errors p").first.wait_for()
    quiet(page)
    page.fill("#id_scaling_min", "0")
    page.click("#schedule-form button[type=submit]")
    page.wait_for_url(f"{live_server.url}/catalog/models/chat/")
    quiet(page)


def test_saving_the_guard_policy_breaks_no_policy(open_page: Any, operator: Any) -> None:
    page = watched(open_page, operator, "/guard/")
    areas = page.locator("#guard-policy textarea")
    assert areas.count() >= 1
    resize(page, f"#{areas.first.get_attribute('id')}")
    page.locator("#guard-policy button[type=submit]").click()
    page.locator("#guard-policy .saved", has_text="Saved").wait_for()
    wait_js(page, "!document.querySelector('#guard-policy.htmx-settling')", what="the swap")
    quiet(page)


def test_making_a_key_breaks_no_policy(open_page: Any, operator: Any) -> None:
    page = watched(open_page, operator, "/gateway/keys/")
    page.fill("#id_name", "saved-app")
    page.click("#key-form button[type=submit]")
    page.locator("#key-secret").wait_for()
    quiet(page)
