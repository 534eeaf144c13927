"""The catalog's admin in a real Chromium: what a deletion says, widths, names."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from catalog.models import ServedModel
from tests.browser.conftest import PASSWORD
from tests.catalog.samples import cpu_model, gpu_model, store

pytestmark = pytest.mark.django_db(transaction=True)

SCREEN = {"width": 1280, "height": 800}


@pytest.fixture
def admin_page(browser: Any, live_server: Any, admin_user: Any) -> Iterator[Any]:
    """Return a 1280 px wide page signed in to the admin as an admin."""
    context = browser.new_context(viewport=SCREEN)
    page = context.new_page()
    page.set_default_timeout(10_000)
    page.goto(f"{live_server.url}/admin/login/?next=/admin/")
    page.fill("#id_username", admin_user.username)
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_url(f"{live_server.url}/admin/")
    yield page
    context.close()


def _messages(page: Any) -> list[str]:
    return [m.strip() for m in page.locator("ul.messagelist li").all_inner_texts()]


def test_a_bulk_delete_says_only_what_it_did(admin_page: Any, live_server: Any) -> None:
    store(cpu_model("base"), cpu_model("spare"), cpu_model("dep", fallbacks=["base"]))
    page = admin_page
    page.goto(f"{live_server.url}/admin/catalog/servedmodel/")
    for name in ("base", "spare"):
        pk = ServedModel.objects.get(name=name).pk
        page.check(f"input[name=_selected_action][value='{pk}']")
    page.select_option("select[name=action]", "delete_selected")
    page.click("button[name=index]")
    page.click("input[type=submit]")  # "Yes, I'm sure"
    page.wait_for_url("**/admin/catalog/servedmodel/")
    shown = _messages(page)
    assert any("base: not deleted" in m and "dep" in m for m in shown), shown
    assert "Deleted 1 catalog model: spare." in shown, shown
    assert not any("Successfully deleted" in m for m in shown), shown
    assert set(ServedModel.objects.values_list("name", flat=True)) == {"base", "dep"}

    # Alone, from its own page: refused, and not said to be deleted.
    pk = ServedModel.objects.get(name="base").pk
    page.goto(f"{live_server.url}/admin/catalog/servedmodel/{pk}/delete/")
    page.click("input[type=submit]")
    page.wait_for_url(f"**/admin/catalog/servedmodel/{pk}/change/")
    shown = _messages(page)
    assert any("base: not deleted" in m for m in shown), shown
    assert not any("deleted successfully" in m for m in shown), shown
    assert ServedModel.objects.filter(name="base").exists()


def test_the_model_page_fits_a_1280_px_screen_and_names_keep_their_case(
    admin_page: Any, live_server: Any
) -> None:
    store(
        gpu_model(
            "wide",
            profiles=[
                {
                    "name": name,
                    "engine": "vllm",
                    "gpu_class": "nvidia-h100-80gb",
                    "tp": 2,
                    "args": ["--max-num-seqs", "64"],
                    "env": {"VLLM_LOGGING_LEVEL": "INFO"},
                    "node_selector": {"llmgw.io/rack": "r7"},
                }
                for name in ("h100", "h100-b")
            ],
            scaling={
                "min": 1,
                "max": 2,
                "schedule": [{"days": ["weekdays"], "from": "08:00", "to": "18:00", "min": 2}],
            },
        )  # fmt: skip
    )
    page = admin_page
    pk = ServedModel.objects.get(name="wide").pk
    page.goto(f"{live_server.url}/admin/catalog/servedmodel/{pk}/change/")
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= SCREEN["width"], f"the change page is {width} px wide"
    # The file's keys, as written: not "Gpu class", "Tp", "Scaling min".
    for field, label in (
        ("profiles-0-gpu_class", "gpu_class"),
        ("profiles-0-tp", "tp"),
        ("profiles-0-pp", "pp"),
        ("windows-0-from_time", "from"),
        ("scaling_min", "scaling.min"),
        ("scaling_idle_timeout", "scaling.idle_timeout"),
    ):
        assert page.locator(f"label[for=id_{field}]").inner_text().rstrip(":") == label, field

    page.goto(f"{live_server.url}/admin/")
    index = page.locator("#content-main").inner_text()
    assert "Guard policy" in index and "Guard policys" not in index
