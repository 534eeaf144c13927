"""The console in a real browser: the rule's message at the field as it is left, then save."""

from __future__ import annotations

from typing import Any

import pytest

from catalog.models import ChangeRecord, ServedModel
from tests.browser.conftest import wait_js
from tests.catalog.samples import cpu_model, store

pytestmark = pytest.mark.django_db(transaction=True)

SCREENSHOT = "/tmp/llmgw-console-error.png"
TP_MISMATCH = "2 nodes x 4 GPUs does not match tp 4 x pp 1"


def test_new_model_checked_as_fields_are_left_then_saved(
    signed_in: Any, operator: Any, live_server: Any
) -> None:
    page = signed_in(operator)
    page.click("text=New model")
    page.wait_for_url(f"{live_server.url}/catalog/new/")
    # Set on this document: still there later means the page was never reloaded.
    page.evaluate("window.notReloaded = true")

    page.fill("#id_name", "chat")
    page.fill("#id_source", "org/chat")
    page.fill("#id_profiles-0-name", "h100")
    page.select_option("#id_profiles-0-engine", "vllm")
    page.fill("#id_profiles-0-gpu_class", "nvidia-h100-80gb")
    page.fill("#id_profiles-0-tp", "4")
    page.fill("#id_profiles-0-nodes", "2")
    page.fill("#id_profiles-0-gpus_per_node", "4")
    page.press("#id_profiles-0-gpus_per_node", "Tab")

    error = page.locator("#err-profiles-0-tp")
    error.get_by_text(TP_MISMATCH).wait_for()
    # Fields not touched yet show nothing, though the model has more to fill in.
    assert page.locator("#err-scaling_max").inner_text() == ""
    assert page.evaluate("window.notReloaded") is True
    assert page.url == f"{live_server.url}/catalog/new/"
    assert not ServedModel.objects.exists()
    assert not ChangeRecord.objects.exists()
    page.locator("#section-profiles").scroll_into_view_if_needed()
    page.screenshot(path=SCREENSHOT, full_page=False)

    page.fill("#id_profiles-0-tp", "8")
    page.press("#id_profiles-0-tp", "Tab")
    wait_js(
        page,
        "document.getElementById('err-profiles-0-tp').textContent.trim() === ''",
        what="tp's message to clear",
    )
    assert "No problems" in page.locator("#form-status").inner_text()
    assert page.evaluate("window.notReloaded") is True

    page.click("button:text('Save')")
    page.wait_for_url(f"{live_server.url}/catalog/models/chat/")
    profiles = page.locator("table.profiles")
    assert "nvidia-h100-80gb" in profiles.inner_text()
    assert "h100" in profiles.inner_text()
    m = ServedModel.objects.get(name="chat").to_spec()
    assert (m.profiles[0].tp, m.profiles[0].nodes, m.profiles[0].gpus_per_node) == (8, 2, 4)
    record = ChangeRecord.objects.get()
    assert (record.surface, record.actor_name) == ("console", operator.username)


def test_rows_added_in_place_are_saved(signed_in: Any, operator: Any, live_server: Any) -> None:
    store(cpu_model("small"))
    page = signed_in(operator)
    page.goto(f"{live_server.url}/catalog/models/small/edit/")
    page.click("text=+ Add an alias")
    page.locator("#id_aliases-0-name").fill("tiny")
    page.click("text=+ Add an alias")
    page.locator("#id_aliases-1-name").fill("small-latest")
    assert page.locator("#id_aliases-TOTAL_FORMS").input_value() == "2"
    page.click("text=+ Add a window")
    page.locator("#id_windows-0-from_time").fill("08:00")
    page.locator("#id_windows-0-to_time").fill("8pm")
    page.press("#id_windows-0-to_time", "Tab")
    page.locator("#err-windows-0-to_time").get_by_text("is not HH:MM").wait_for()
    page.locator("#id_windows-0-to_time").fill("20:00")
    page.locator("#id_windows-0-min").fill("1")
    page.click("button:text('Save')")
    page.wait_for_url(f"{live_server.url}/catalog/models/small/")
    m = ServedModel.objects.get(name="small").to_spec()
    assert m.aliases == ["tiny", "small-latest"]
    assert (m.scaling.schedule[0].from_, m.scaling.schedule[0].to) == ("08:00", "20:00")
    assert "tiny" in page.locator("main").inner_text()


def test_viewer_sees_no_edit_button_and_is_refused_the_form(
    signed_in: Any, viewer: Any, live_server: Any
) -> None:
    store(cpu_model("small"))
    page = signed_in(viewer)
    page.goto(f"{live_server.url}/catalog/models/small/")
    assert page.locator("h1").inner_text() == "small"
    assert page.locator("a:text('Edit')").count() == 0
    assert page.locator("text=New model").count() == 0
    response = page.goto(f"{live_server.url}/catalog/models/small/edit/")
    assert response.status == 403
    assert "operator role" in page.locator("main").inner_text()


def test_a_check_asked_for_during_another_is_sent_after_it(
    signed_in: Any, operator: Any, live_server: Any
) -> None:
    page = signed_in(operator)
    page.goto(f"{live_server.url}/catalog/new/")
    page.evaluate(
        """() => {
          window.checks = 0;
          window.sent = 0;
          document.addEventListener("htmx:beforeRequest", (e) => {
            if (e.detail.elt.hasAttribute("data-check")) window.sent += 1;
          });
          document.addEventListener("htmx:afterRequest", (e) => {
            if (e.detail.elt.hasAttribute("data-check")) window.checks += 1;
          });
          const check = document.querySelector("[data-check]");
          htmx.trigger(check, "llmgw:recheck");
          htmx.trigger(check, "llmgw:recheck");
        }"""
    )
    wait_js(page, "window.checks === 2", what="both checks to be answered")
    # One more, asked after both answers were in: had an answer started a check of its
    # own, it would have been sent before this one is answered.
    page.evaluate("htmx.trigger(document.querySelector('[data-check]'), 'llmgw:recheck')")
    wait_js(page, "window.checks === 3", what="the third check to be answered")
    assert page.evaluate("[window.sent, window.checks]") == [3, 3]
