"""``manage.py catalog update check`` and the admin's "Check for updates"."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest
from django.core.management import call_command
from django.test import Client

from tests.catalog.samples import gpu_model, store
from tests.updates.hubstandin import HubStandIn
from updates import mirror

pytestmark = pytest.mark.django_db


def _mirrored(hub: HubStandIn, name: str, repo: str) -> str:
    sha = hub.commit(repo, {"model.safetensors": b"1" * 100, "README.md": b"a"})
    store(gpu_model(name, source=repo))
    assert mirror.run_fetch(mirror.request_fetch(name, start=False).pk).state == "done"
    return sha


def _run(*args: str) -> tuple[int, list[str]]:
    out = io.StringIO()
    try:
        call_command("catalog", "update", "check", *args, stdout=out)
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    return code, out.getvalue().splitlines()


def test_check_json_prints_one_object_a_line(hub: HubStandIn) -> None:
    first = _mirrored(hub, "chat", "org/chat")
    _mirrored(hub, "docs", "org/docs")
    latest = hub.commit("org/chat", {"model.safetensors": b"2" * 100}, keep=True)
    hub.commit("org/docs", {"README.md": b"b"}, keep=True)  # not an update
    code, lines = _run("--json")
    assert code == 0
    rows = {r["model"]: r for r in map(json.loads, lines)}
    assert rows["chat"] == {
        "model": "chat",
        "state": "available",
        "revision": first,
        "latest": latest,
        "changed": ["model.safetensors"],
        "added": [],
        "removed": [],
        "message": rows["chat"]["message"],
    }
    assert rows["docs"]["state"] == "current" and rows["docs"]["changed"] == []


def test_a_repository_gone_is_an_error_line_and_exit_1_and_changes_nothing(
    hub: HubStandIn,
) -> None:
    from catalog.services import stored_specs

    _mirrored(hub, "chat", "org/chat")
    before = stored_specs()
    hub.delete("org/chat")
    code, lines = _run("chat")
    assert code == 1
    assert lines[0].startswith("chat: error: ") and "is not there" in lines[0]
    assert stored_specs() == before


def test_the_admin_bulk_action_checks_the_selected_models(
    hub: HubStandIn, operator: Any, viewer: Any
) -> None:
    from catalog.models import ServedModel

    _mirrored(hub, "chat", "org/chat")
    hub.commit("org/chat", {"model.safetensors": b"2" * 100}, keep=True)
    pk = ServedModel.objects.get(name="chat").pk
    c = Client()
    c.force_login(viewer)
    listing = c.get("/admin/catalog/servedmodel/").content.decode()
    assert "check_for_updates" not in listing
    c.force_login(operator)
    assert "check_for_updates" in c.get("/admin/catalog/servedmodel/").content.decode()
    answer = c.post(
        "/admin/catalog/servedmodel/",
        {"action": "check_for_updates", "_selected_action": [pk]},
        follow=True,
    )
    assert "chat: available" in answer.content.decode()
    from updates.models import UpdateCheck

    assert UpdateCheck.objects.get(model="chat").checked_by == "otto (admin)"


def test_a_code_only_commit_is_an_update_for_a_model_that_runs_its_code(
    hub: HubStandIn,
) -> None:
    # Both repositories ship model code; only "custom" runs it (trust_remote_code).
    for name, trusted in (("custom", True), ("plain", False)):
        hub.commit(f"org/{name}", {"model.safetensors": b"1" * 100, "modeling_x.py": b"a"})
        store(gpu_model(name, trust_remote_code=trusted))
        assert mirror.run_fetch(mirror.request_fetch(name, start=False).pk).state == "done"
    for name in ("custom", "plain"):
        hub.commit(f"org/{name}", {"modeling_x.py": b"import os  # changed"}, keep=True)
    code, lines = _run("--json")
    assert code == 0
    rows = {r["model"]: r for r in map(json.loads, lines)}
    assert rows["custom"]["state"] == "available"
    assert rows["custom"]["changed"] == ["modeling_x.py"]
    assert rows["plain"]["state"] == "current" and rows["plain"]["changed"] == []
