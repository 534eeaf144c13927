"""The schedule editor and the GPU class picker in a real browser, against a live server."""

from __future__ import annotations

from typing import Any

import pytest

from catalog.models import ChangeRecord, ServedModel
from cluster.choices import NodeHealth
from cluster.models import Assignment, Card, Node, Replica
from tests.browser.conftest import wait_js
from tests.catalog.samples import cpu_model, gpu_model, store

pytestmark = pytest.mark.django_db(transaction=True)

SCREENSHOT = "/tmp/llmgw-schedule-editor.png"
PICKER_SCREENSHOT = "/tmp/llmgw-class-picker.png"
L4 = "nvidia-l4-24gb"
MIG = "nvidia-a100-80gb-mig-1g.10gb"


def store_small() -> ServedModel:
    """A CPU model, on demand outside a weekday window that wants 2 replicas 08:00-18:00."""
    store(
        cpu_model(
            "small",
            scaling={
                "min": 0,
                "max": 1,
                "schedule": [{"days": ["weekdays"], "from": "08:00", "to": "18:00", "min": 2}],
            },
        )
    )
    return ServedModel.objects.get(name="small")


def week(page: Any, day: str, hours: range) -> list[str]:
    """Return the counts the week picture shows for a day's hours."""
    row = page.locator(f'.week-picture tr[data-day="{day}"]')
    return [row.locator(f'td[data-hour="{h}"]').inner_text() for h in hours]


def test_bad_time_shows_at_the_field_unsaved_then_fixed_the_week_redraws(
    signed_in: Any, operator: Any, live_server: Any
) -> None:
    obj = store_small()
    page = signed_in(operator)
    page.goto(f"{live_server.url}/catalog/models/small/")
    page.click("a:text('Schedule')")
    page.wait_for_url(f"{live_server.url}/catalog/models/small/schedule/")
    page.evaluate("window.notReloaded = true")
    evening = range(18, 24)
    assert week(page, "Mon", evening) == ["0", "0", "0", "0", "0", "0"]
    assert week(page, "Mon", range(8, 10)) == ["2", "2"]

    # A second window, on Monday evenings, with a time that is not one.
    page.click("text=+ Add a window")
    page.locator("#id_windows-1-days").fill("mon")
    page.locator("#id_windows-1-to_time").fill("23:00")
    page.locator("#id_windows-1-min").fill("3")
    page.locator("#id_windows-1-from_time").click()
    page.keyboard.type("25:00")  # typed, not left: the check runs after a pause
    error = page.locator("#err-windows-1-from_time")
    error.get_by_text('scaling.schedule[1]: from "25:00" is not HH:MM, like 08:00').wait_for()
    assert page.locator("#id_windows-1-from_time").evaluate("el => el === document.activeElement")
    # Not drawn, and nothing saved.
    assert "not drawn: fix its errors first" in page.locator(".week-legend").inner_text()
    assert week(page, "Mon", evening) == ["0", "0", "0", "0", "0", "0"]
    assert obj.windows.count() == 1
    assert ChangeRecord.objects.filter(action="update").count() == 0
    page.locator(".week-picture").scroll_into_view_if_needed()
    page.screenshot(path=SCREENSHOT, full_page=True)

    # Save refuses it, at the same field, and still saves nothing.
    page.click("button:text('Save')")
    # The answer replaces the form; its _touched is "*" (every error shown).
    wait_js(
        page,
        "document.querySelector('#schedule-form input[name=_touched]').value === '*'",
        what="the refused save's form (_touched '*')",
    )
    page.locator("#err-windows-1-from_time").get_by_text("is not HH:MM").wait_for()
    assert "problem" in page.locator("#form-status").inner_text()
    assert page.url == f"{live_server.url}/catalog/models/small/schedule/"
    assert obj.windows.count() == 1
    assert ChangeRecord.objects.filter(action="update").count() == 0

    # Fixed: the error goes and Monday evening wants 3 until 23:00.
    page.locator("#id_windows-1-from_time").fill("20:00")
    wait_js(
        page,
        'document.querySelector(\'.week-picture tr[data-day="Mon"] td[data-hour="20"]\')'
        ".textContent.trim() === '3'",
        what="Monday 20:00 to want 3",
    )
    assert page.locator("#err-windows-1-from_time").inner_text() == ""
    assert week(page, "Mon", evening) == ["0", "0", "3", "3", "3", "0"]
    assert week(page, "Tue", evening) == ["0", "0", "0", "0", "0", "0"]
    assert "No problems" in page.locator("#form-status").inner_text()
    assert page.evaluate("window.notReloaded") is True
    assert obj.windows.count() == 1  # still a draft

    page.click("button:text('Save')")
    page.wait_for_url(f"{live_server.url}/catalog/models/small/")
    assert week(page, "Mon", evening) == ["0", "0", "3", "3", "3", "0"]
    m = ServedModel.objects.get(name="small").to_spec()
    assert [(w.days, w.from_, w.to, w.min) for w in m.scaling.schedule] == [
        (["weekdays"], "08:00", "18:00", 2),
        (["mon"], "20:00", "23:00", 3),
    ]
    record = ChangeRecord.objects.get(action="update")
    assert (record.surface, record.actor_name, record.summary) == ("console", "otto", "scaling")


def test_prewarm_shows_hours_opened_early(signed_in: Any, operator: Any, live_server: Any) -> None:
    store_small()
    page = signed_in(operator)
    page.goto(f"{live_server.url}/catalog/models/small/schedule/")
    assert week(page, "Mon", range(6, 8)) == ["0", "0"]
    page.locator("#id_scaling_prewarm").fill("2h")
    wait_js(
        page,
        'document.querySelector(\'.week-picture tr[data-day="Mon"] td[data-hour="6"]\')'
        ".textContent.trim() === '2'",
        what="Monday 06:00 to want 2 (prewarm)",
    )
    cell = page.locator('.week-picture tr[data-day="Mon"] td[data-hour="6"]')
    assert "warm" in cell.get_attribute("class")
    assert "opened early by prewarm" in cell.get_attribute("title")
    assert week(page, "Mon", range(5, 8)) == ["0", "2", "2"]


def cluster() -> None:
    """Two L4 nodes with 2 free cards each (a third card held), and a MIG node."""
    for name, classes in (
        ("a", [L4, L4]),
        ("b", [L4, L4, L4]),
        ("c", ["nvidia-a100-80gb", MIG, MIG]),
    ):
        n = Node.objects.create(name=name, health=NodeHealth.READY)
        Card.objects.bulk_create(Card(node=n, index=i, gpu_class=c) for i, c in enumerate(classes))
    Card.objects.filter(gpu_class=MIG).update(mig_of=0)
    held = Replica.objects.create(model_name="other")
    Assignment.objects.create(replica=held, node=Node.objects.get(name="b"), cards=[2])


def test_class_picker_lists_the_clusters_classes_and_warns_as_tp_is_typed(
    signed_in: Any, operator: Any, live_server: Any
) -> None:
    cluster()
    store(
        gpu_model(
            "chat", profiles=[{"name": "gpu", "engine": "vllm", "gpu_class": "nvidia-h100-80gb"}]
        )
    )
    page = signed_in(operator)
    page.goto(f"{live_server.url}/catalog/models/chat/edit/")
    note = page.locator("#profiles-0-gpu_class-note")
    assert note.inner_text() == "no node has nvidia-h100-80gb: replicas will be unplaced"

    picker = page.locator("#profiles-0 details.class-picker")
    picker.locator("summary").click()
    items = [" ".join(t.split()) for t in picker.locator("button.pick").all_inner_texts()]
    assert items == [f"{MIG} 2/2 free MIG", f"{L4} 4/5 free"]
    picker.locator(f'button[data-pick="{L4}"]').click()
    assert page.locator("#id_profiles-0-gpu_class").input_value() == L4
    note.get_by_text(f"{L4}: 4 free of 5 on 2 nodes").wait_for()

    # Four cards on one node: typed, not left; checked after a pause.
    page.locator("#id_profiles-0-gpus_per_node").fill("")
    page.locator("#id_profiles-0-tp").click()
    page.keyboard.press("Control+A")
    page.keyboard.type("4")
    note.get_by_text(
        "no node has 4 free nvidia-l4-24gb; the best has 2: replicas will be unplaced"
    ).wait_for()
    assert page.locator("#err-profiles-0-tp").inner_text() == ""
    page.locator("#profiles-0").screenshot(path=PICKER_SCREENSHOT)
    # Two nodes of two: fits again.
    page.locator("#id_profiles-0-nodes").click()
    page.keyboard.press("Control+A")
    page.keyboard.type("2")
    wait_js(
        page,
        "!document.getElementById('profiles-0-gpu_class-note').textContent.includes('unplaced')",
        what="the class note to drop 'unplaced'",
    )
    # One node again with two cards each: the rule's message at tp, as typed.
    page.locator("#id_profiles-0-gpus_per_node").click()
    page.keyboard.type("1")
    page.locator("#err-profiles-0-tp").get_by_text(
        "2 nodes x 1 GPUs does not match tp 4 x pp 1"
    ).wait_for()
    page.locator("#id_profiles-0-gpus_per_node").fill("4")
    page.locator("#id_profiles-0-nodes").fill("1")
    page.press("#id_profiles-0-nodes", "Tab")
    note.get_by_text("no node has 4 free").wait_for()

    # Allowed: the catalog does not know the cluster.
    page.click("button:text('Save')")
    page.wait_for_url(f"{live_server.url}/catalog/models/chat/")
    p = ServedModel.objects.get(name="chat").to_spec().profiles[0]
    assert (p.gpu_class, p.tp, p.gpus_per_node, p.nodes) == (L4, 4, 4, 1)


def test_viewer_sees_no_editor_and_is_refused(
    signed_in: Any, viewer: Any, live_server: Any
) -> None:
    obj = store_small()
    page = signed_in(viewer)
    page.goto(f"{live_server.url}/catalog/models/small/")
    assert page.locator("h1").inner_text() == "small"
    assert page.locator(".week-picture td").count() == 7 * 24  # the picture, read-only
    assert page.locator("a:text('Schedule')").count() == 0
    assert page.locator("a:text('Edit schedule')").count() == 0
    response = page.goto(f"{live_server.url}/catalog/models/small/schedule/")
    assert response.status == 403
    assert "operator role" in page.locator("main").inner_text()
    assert page.locator("#schedule-form").count() == 0
    # A post made by hand, with a valid CSRF token, is refused for the role.
    page.goto(f"{live_server.url}/catalog/models/small/")
    token = page.evaluate("JSON.parse(document.body.getAttribute('hx-headers'))['X-CSRFToken']")
    form = {
        "scaling_min": "5",
        "scaling_max": "5",
        "windows-TOTAL_FORMS": "0",
        "windows-INITIAL_FORMS": "0",
    }
    for url in ("/catalog/models/small/schedule/", "/catalog/models/small/schedule/check/"):
        r = page.request.post(f"{live_server.url}{url}", form=form, headers={"X-CSRFToken": token})
        assert r.status == 403
        assert "needs the operator role" in r.text()
    obj.refresh_from_db()
    assert (obj.scaling_min, obj.scaling_max, obj.windows.count()) == (0, 1, 1)
    assert not ChangeRecord.objects.filter(action="update").exists()
