"""The update flow's console: the Updates page, the model panel's Update, Promote and
Rollback, by role."""

from __future__ import annotations

from typing import Any

import pytest

from tests.updates.test_flow_run import chat, fetched, ready  # noqa: F401 - fixtures
from updates import run, views
from updates.models import UpdateRun

pytestmark = pytest.mark.django_db

PANEL = "/updates/models/chat/panel/"


def test_the_updates_page_lists_each_models_state_filtered(
    chat: str,  # noqa: F811
    client_for: Any,
    viewer: Any,
) -> None:
    c = client_for(viewer)
    page = c.get("/updates/")
    assert page.status_code == 200
    body = page.content.decode()
    assert 'data-model="chat" data-state="current"' in body
    r = run.start("chat", via="ops")
    region = c.get("/updates/?region=1&state=fetching", HTTP_HX_REQUEST="true").content.decode()
    assert "<html" not in region and 'data-model="chat" data-state="fetching"' in region
    assert (
        'data-model="chat"'
        not in c.get("/updates/?region=1&state=failed", HTTP_HX_REQUEST="true").content.decode()
    )
    r = ready(fetched(r))
    assert views.rows()[0].state == "ready"
    assert 'data-state="ready"' in c.get("/updates/?q=CHA").content.decode()
    assert 'data-model="chat"' not in c.get("/updates/?q=other").content.decode()
    # A candidate is not a row of its own.
    assert [row.model for row in views.rows()] == ["chat"]


def test_an_operator_starts_and_rolls_back_from_the_panel_a_viewer_sees_no_button(
    chat: str,  # noqa: F811
    client_for: Any,
    operator: Any,
    viewer: Any,
) -> None:
    ops, view = client_for(operator), client_for(viewer)
    assert 'data-role="update-start"' in ops.get(PANEL).content.decode()
    assert 'data-role="update-start"' not in view.get(PANEL).content.decode()
    assert view.post("/updates/models/chat/update/", HTTP_HX_REQUEST="true").status_code == 403
    assert UpdateRun.objects.count() == 0
    started = ops.post("/updates/models/chat/update/", HTTP_HX_REQUEST="true").content.decode()
    assert "update #" in started and 'data-role="update-said"' in started
    assert 'data-role="update-start"' not in started  # one at a time
    r = UpdateRun.objects.get()
    assert (r.surface, r.started_by) == ("console", f"{operator.username} (console)")
    again = ops.post("/updates/models/chat/update/", HTTP_HX_REQUEST="true").content.decode()
    assert "is running already" in again
    r = ready(fetched(r))
    promoted = ops.post("/updates/models/chat/promote/", HTTP_HX_REQUEST="true").content.decode()
    assert "promoted to" in promoted
    panel = view.get(PANEL).content.decode()
    assert 'data-state="promoted"' in panel and 'data-role="update-rollback"' not in panel
    assert 'data-role="update-rollback"' in ops.get(PANEL).content.decode()
    back = ops.post("/updates/models/chat/rollback/", HTTP_HX_REQUEST="true").content.decode()
    assert "chat is back at" in back
    # Without htmx: the model's page, with the message.
    answer = ops.post("/updates/models/chat/rollback/")
    assert answer.status_code == 302 and answer.url.endswith("/catalog/models/chat/")


def test_the_admin_bulk_action_update_starts_one_a_model_and_says_why_not(
    chat: str,  # noqa: F811
    client_for: Any,
    operator: Any,
    viewer: Any,
) -> None:
    from catalog.models import ServedModel
    from tests.catalog.samples import gpu_model, store

    store(gpu_model("local", source="/models/local.gguf"))
    pks = list(ServedModel.objects.values_list("pk", flat=True))
    assert (
        "update_models"
        not in client_for(viewer).get("/admin/catalog/servedmodel/").content.decode()
    )
    c = client_for(operator)
    answer = c.post("/admin/catalog/servedmodel/",
                    {"action": "update_models", "_selected_action": pks}, follow=True)  # fmt: skip
    text = answer.content.decode()
    assert "Update started: chat (#" in text
    assert "local: " in text and "no registry" in text
    r = UpdateRun.objects.get()
    assert (r.model, r.surface, r.started_by) == ("chat", "admin", f"{operator.username} (admin)")
    refused = client_for(viewer).post("/admin/catalog/servedmodel/",
                                      {"action": "update_models", "_selected_action": pks})  # fmt: skip
    assert refused.status_code == 403 and UpdateRun.objects.count() == 1  # refused, not run


def test_the_update_runs_admin_cancels_in_bulk_for_operators(
    chat: str,  # noqa: F811
    client_for: Any,
    operator: Any,
    viewer: Any,
) -> None:
    r = run.start("chat")
    page = client_for(viewer).get("/admin/updates/updaterun/").content.decode()
    assert "chat" in page and "cancel_updates" not in page
    answer = client_for(operator).post(
        "/admin/updates/updaterun/", {"action": "cancel_updates", "_selected_action": [r.pk]},
        follow=True,
    )  # fmt: skip
    assert "Cancelled: chat." in answer.content.decode()
    r.refresh_from_db()
    assert (r.state, r.surface) == ("failed", "cli") and r.reason.startswith(
        f"cancelled by {operator.username}"
    )
    again = client_for(operator).post(
        "/admin/updates/updaterun/", {"action": "promote_updates", "_selected_action": [r.pk]},
        follow=True,
    )  # fmt: skip
    assert "no update of &quot;chat&quot; is running" in again.content.decode()


def test_a_model_never_checked_is_not_called_current(
    hub: Any, client_for: Any, viewer: Any
) -> None:
    """The first start's walk found every model "current", the baseline judge too while
    the mirror failed to fetch its weights: a state no check had said."""
    from tests.catalog.samples import gpu_model, sim_model, store
    from updates import mirror

    hub.commit("org/fetched", {"model.safetensors": b"w" * 100})
    for name in ("fetched", "never", "broken", "sim-only", "under-way"):
        source = {"sim-only": "./weights/local", "broken": "org/gone"}.get(name, f"org/{name}")
        store(gpu_model(name, source=source))
    done = mirror.request_fetch("fetched", start=False)
    assert mirror.run_fetch(done.pk).state == "done"
    failed = mirror.request_fetch("broken", start=False)
    assert mirror.run_fetch(failed.pk).state == "failed"
    mirror.request_fetch("under-way", start=False)  # queued: the worker has not taken it
    store(sim_model("demo", 1, most=2))  # as the first start's
    rows = {row.model: row for row in views.rows()}
    assert (rows["never"].state, rows["never"].line) == (
        "unchecked",
        "not checked yet: its origin is written when the mirror first fetches it",
    )
    assert rows["sim-only"].state == "unchecked"
    assert rows["sim-only"].line.startswith("no registry to check: source ./weights/local is not")
    assert rows["broken"].state == "failed"
    assert rows["broken"].line.startswith("the mirror could not fetch its weights: org/gone")
    assert rows["under-way"].state == "fetching"
    assert (rows["demo"].state, rows["demo"].line) == (
        "unchecked",
        "never fetched (a sim engine needs no weights): Check for updates asks the registry; Fetch now or Update fetches them",
    )
    assert rows["fetched"].state == "current"
    assert rows["fetched"].line.startswith("as fetched at ")
    page = client_for(viewer).get("/updates/?state=unchecked").content.decode()
    assert 'data-model="never" data-state="unchecked"' in page
    assert 'data-model="fetched"' not in page
