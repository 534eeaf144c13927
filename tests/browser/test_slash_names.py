"""A model named with a slash (org/chat) opens from the catalog's list and its page's
buttons act on it, not on the model its last part names; a name a browser would read as
a directory step (../etc) is refused on the New model form with the reason."""

from __future__ import annotations

from typing import Any

import pytest

from catalog.models import ChangeRecord, ServedModel
from tests.catalog.samples import gpu_model, store

pytestmark = pytest.mark.django_db(transaction=True)


def _scaling(name: str) -> tuple[int, int]:
    s = ServedModel.objects.get(name=name).to_spec().scaling
    return s.min, s.max


def test_a_model_named_org_chat_opens_from_the_list_and_scale_acts_on_it(
    open_page: Any, operator: Any, live_server: Any
) -> None:
    # A model named as the last part: a button acting on the wrong model would move it.
    store(gpu_model("chat", scaling={"min": 0, "max": 1, "idle_timeout": "10m"}))
    store(gpu_model("org/chat", scaling={"min": 0, "max": 1, "idle_timeout": "10m"}))
    page = open_page(operator, "/catalog/")
    page.get_by_role("link", name="org/chat", exact=True).first.click()
    page.wait_for_url(f"{live_server.url}/catalog/models/org/chat/")
    assert page.locator("h1").first.inner_text().strip().startswith("org/chat")
    page.fill("#scale-min", "1")
    page.fill("#scale-max", "3")
    page.locator("button[data-role=scale]").click()
    page.locator(".messages", has_text="Scaled org/chat: min 0 → 1, max 1 → 3").wait_for()
    assert _scaling("org/chat") == (1, 3)
    assert _scaling("chat") == (0, 1)
    assert ChangeRecord.objects.filter(model_name="chat").count() == 1
    assert page.errors == []


def test_a_model_named_dot_dot_etc_is_refused_on_the_new_model_form(
    open_page: Any, operator: Any, live_server: Any
) -> None:
    page = open_page(operator, "/catalog/new/")
    page.fill("#id_name", "../etc")
    page.press("#id_name", "Tab")
    page.locator("#err-name", has_text='name "../etc" has a part that is "." or ".."').wait_for()
    page.fill("#id_source", "/models/etc.gguf")
    page.fill("#id_profiles-0-name", "cpu")
    page.select_option("#id_profiles-0-engine", "llamacpp")
    page.fill("#id_profiles-0-cpu_cores", "2")
    page.click("button:text('Save')")
    page.locator("#err-name", has_text="directory step").wait_for()
    assert page.url == f"{live_server.url}/catalog/new/"
    assert not ServedModel.objects.exists()
