"""In Chromium: an operator checks a model for updates on its page and sees "update
available"; a viewer sees it too, with no button; the mirror's page shows what it holds."""

from __future__ import annotations

from typing import Any

import pytest

from tests.browser import conftest as browser_conftest
from tests.browser.conftest import wait_js
from tests.catalog.samples import gpu_model, store
from tests.updates.hubstandin import HubStandIn
from updates import mirror

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

# The browser suite's fixtures (its conftest is not this folder's).
browser = browser_conftest.browser
open_page = browser_conftest.open_page

PANEL = "document.querySelector('[data-role=updates-panel]')"


def _mirrored(hub: HubStandIn) -> None:
    hub.commit("org/chat", {"model.safetensors": b"1" * 1000, "README.md": b"# chat"})
    store(gpu_model("chat"))
    assert mirror.run_fetch(mirror.request_fetch("chat", start=False).pk).state == "done"


def test_an_operator_sees_update_available_and_a_viewer_no_button(
    hub: HubStandIn, open_page: Any, operator: Any, viewer: Any
) -> None:
    _mirrored(hub)
    hub.commit("org/chat", {"model.safetensors": b"2" * 1000}, keep=True)
    page = open_page(operator, "/catalog/models/chat/")
    wait_js(page, f"{PANEL} && {PANEL}.textContent.includes('not checked yet')",
            timeout=30, what="the updates panel")  # fmt: skip
    page.click("[data-role=check-updates]")
    text = wait_js(
        page,
        "document.querySelector('[data-role=update-available]')?.textContent",
        timeout=30,
        what="update available after the check",
    )
    assert text == "update available"
    assert "model.safetensors" in page.inner_text("[data-role=update-state]")
    assert page.errors == []

    seen = open_page(viewer, "/catalog/models/chat/")
    wait_js(seen, "document.querySelector('[data-role=update-available]')",
            timeout=30, what="update available for the viewer")  # fmt: skip
    assert seen.query_selector("[data-role=check-updates]") is None
    assert seen.errors == []


def test_the_mirror_page_shows_what_it_holds(hub: HubStandIn, open_page: Any, viewer: Any) -> None:
    _mirrored(hub)
    page = open_page(viewer, "/updates/mirror/")
    held = page.inner_text("[data-role=held]")
    assert "org/chat" in held and "chat (current)" in held
    assert page.errors == []


def test_a_model_never_fetched_is_checked_and_fetched_now_from_its_page(
    hub: HubStandIn, open_page: Any, operator: Any, settings: Any
) -> None:
    settings.REDIS_URL = ""  # the fetch runs in a thread of the web process (embedded)
    newest = hub.commit("org/chat", {"model.safetensors": b"1" * 1000})
    store(gpu_model("chat"))  # its nodes never fetched it: no origin
    page = open_page(operator, "/catalog/models/chat/")
    wait_js(page, f"{PANEL} && {PANEL}.textContent.includes('not checked yet')",
            timeout=30, what="the updates panel")  # fmt: skip
    page.click("[data-role=check-updates]")
    wait_js(page, "document.querySelector('[data-role=never-fetched]')",
            timeout=30, what="never fetched after the check")  # fmt: skip
    said = page.inner_text("[data-role=update-state]")
    assert f"never fetched: {newest[:8]} is the newest revision of org/chat" in said
    assert page.query_selector("[data-role=update-available]") is None
    # On a phone the panel and its button stay within the screen.
    page.set_viewport_size({"width": 390, "height": 844})
    box = page.query_selector("[data-role=fetch-now]").bounding_box()
    assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= 390, box
    panel = page.query_selector("[data-role=updates-panel]").bounding_box()
    assert panel is not None and panel["x"] + panel["width"] <= 390, panel
    page.click("[data-role=fetch-now]")
    wait_js(page, "document.querySelector('[data-role=origin]')?.textContent"
            f".includes('{newest[:8]}')", timeout=60, what="the origin fetched")  # fmt: skip
    assert page.query_selector("[data-role=fetch-now]") is None
    assert page.errors == []
