"""The catalog in the admin: inlines save through the rules, bulk actions, roles."""

from __future__ import annotations

from typing import Any

import pytest

from catalog.models import ChangeRecord, ServedModel
from tests.catalog.samples import cpu_model, gpu_model, store
from tests.catalog.test_validation_matrix import post_data

pytestmark = pytest.mark.django_db

CHANGELIST = "/admin/catalog/servedmodel/"


def test_add_with_inlines_is_saved_and_logged(client_for: Any, operator: Any) -> None:
    data = gpu_model(
        "chat",
        aliases=["chat-latest"],
        scaling={
            "min": 1,
            "max": 2,
            "schedule": [{"days": ["mon"], "from": "08:00", "to": "10:00", "min": 2}],
        },
        adapters=[{"name": "chat-sql", "source": "/lora/sql"}],
    )
    r = client_for(operator).post(CHANGELIST + "add/", dict(post_data(data), _save="Save"))
    assert r.status_code == 302, r.context["adminform"].form.errors if r.context else r
    m = ServedModel.objects.get(name="chat").to_spec()
    assert m.aliases == ["chat-latest"]
    assert m.scaling.schedule[0].from_ == "08:00"
    assert m.profiles[0].gpus_per_node == 2  # normalized as every surface does
    record = ChangeRecord.objects.get()
    assert (record.action, record.surface, record.actor_name) == ("create", "admin", "otto")


def _action(client: Any, action: str, names: list[str], **extra: str) -> Any:
    ids = [
        str(pk) for pk in ServedModel.objects.filter(name__in=names).values_list("pk", flat=True)
    ]
    return client.post(
        CHANGELIST, {"action": action, "_selected_action": ids, **extra}, follow=True
    )


def test_bulk_switch_off(client_for: Any, operator: Any) -> None:
    store(gpu_model("chat"), cpu_model("small"))
    r = _action(client_for(operator), "switch_off", ["chat", "small"])
    assert "switched off: chat, small" in r.content.decode()  # as written
    assert set(ServedModel.objects.values_list("scaling_min", "scaling_max")) == {(0, 0)}


def test_bulk_applies_the_allowed_and_reports_the_refused(client_for: Any, operator: Any) -> None:
    store(gpu_model("chat"), gpu_model("judge", role="guard", guard={"format": "qwen3guard"}))
    r = _action(
        client_for(operator), "set_min_max", ["chat", "judge"], scaling_min="0", scaling_max="2"
    )
    text = r.content.decode()
    # A guard model loaded on demand is refused, named as written, and left as it was.
    assert "judge: not changed: scaling.min" in text
    assert "min/max set (0/2): chat" in text
    chat = ServedModel.objects.get(name="chat")
    assert (chat.scaling_min, chat.scaling_max) == (0, 2)
    assert ServedModel.objects.get(name="judge").scaling_min == 1


def test_bulk_set_class_checked_by_the_rules(client_for: Any, operator: Any) -> None:
    store(gpu_model("a"), gpu_model("b"))
    client = client_for(operator)
    r = _action(client, "set_class", ["a", "b"], capacity_class="gold")
    assert "not one of critical, standard, opportunistic" in r.content.decode()
    assert set(ServedModel.objects.values_list("capacity_class", flat=True)) == {""}
    _action(client, "set_class", ["a", "b"], capacity_class="critical")
    assert set(ServedModel.objects.values_list("capacity_class", flat=True)) == {"critical"}
    assert ChangeRecord.objects.filter(action="update", surface="admin").count() == 2


def test_bulk_set_min_max(client_for: Any, operator: Any) -> None:
    store(gpu_model("a"), cpu_model("b"))
    r = _action(client_for(operator), "set_min_max", ["a", "b"], scaling_min="3", scaling_max="2")
    assert r.content.decode().count("below min") == 2
    _action(client_for(operator), "set_min_max", ["a", "b"], scaling_min="2", scaling_max="4")
    assert set(ServedModel.objects.values_list("scaling_min", "scaling_max")) == {(2, 4)}


def test_admin_delete_refused_while_depended_on(client_for: Any, operator: Any) -> None:
    store(cpu_model("small"), gpu_model("chat", fallbacks=["small"]))
    _action(client_for(operator), "delete_selected", ["small"], post="yes")
    assert ServedModel.objects.filter(name="small").exists()


def test_roles_in_the_admin(
    client_for: Any, viewer: Any, operator: Any, admin_user: Any, outsider: Any
) -> None:
    store(gpu_model("chat"))
    pk = ServedModel.objects.get().pk
    assert client_for(viewer).get(CHANGELIST).status_code == 200
    assert client_for(viewer).get(f"{CHANGELIST}{pk}/change/").status_code == 200
    r = client_for(viewer).post(CHANGELIST + "add/", dict(post_data(gpu_model("x")), _save="Save"))
    assert r.status_code == 403
    assert not ServedModel.objects.filter(name="x").exists()
    # Users and tokens are the admin role's.
    assert client_for(operator).get("/admin/auth/user/").status_code == 403
    assert client_for(operator).get("/admin/llmgw_core/apitoken/").status_code == 403
    # The tokens' pages before their model moved to llmgw_core: a bookmark still leads there.
    old = client_for(admin_user).get("/admin/llmgw_admin/apitoken/?q=ci", follow=True)
    assert old.redirect_chain[0] == ("/admin/llmgw_core/apitoken/?q=ci", 302)
    assert old.status_code == 200
    assert client_for(admin_user).get("/admin/auth/user/").status_code == 200
    # No role, no admin (the user is not staff).
    assert client_for(outsider).get(CHANGELIST).status_code == 302
