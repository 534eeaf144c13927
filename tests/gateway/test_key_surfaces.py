"""Client keys in the console, the API and the admin: each surface
lists, creates (the secret shown once) and revokes through ``gateway.services``, logged
with who did it; viewers read and are refused every change."""

from __future__ import annotations

import re
from typing import Any

import pytest

from cluster.models import ClusterAction
from gateway.models import ClientKey
from gateway.path.table import digest
from tests.catalog.samples import sim_model, store

pytestmark = pytest.mark.django_db

SECRET = re.compile(r"llmgw-ck-[A-Za-z0-9_-]{20,}")


def chat_model() -> None:
    store(sim_model("chat", 0, most=0, tp=None))


def test_console_operator_creates_sees_it_once_and_revokes(operator: Any, client_for: Any) -> None:
    chat_model()
    web = client_for(operator)
    page = web.post("/gateway/keys/create/", {
        "name": "support-bot", "owner": "team:support", "models": "chat", "rpm": "60",
        "tpm": "", "expires": "",
    })  # fmt: skip
    assert page.status_code == 200
    assert page["Cache-Control"] == "no-store"
    shown = SECRET.findall(page.content.decode())
    assert len(shown) == 1
    key = ClientKey.objects.get(name="support-bot")
    assert key.digest == digest(shown[0]) and key.owner == "team:support"
    assert key.models == ["chat"] and key.rpm == 60 and key.created_by == operator
    # Listed without the secret ever again.
    listing = web.get("/gateway/keys/").content.decode()
    assert shown[0] not in listing
    assert f"llmgw-ck-{key.prefix}…" in listing and "team:support" in listing
    assert "60 req/min" in listing and 'data-state="live"' in listing
    # Revoke: a confirmation first, then the post.
    confirm = web.get(f"/gateway/keys/{key.pk}/revoke/confirm/")
    assert confirm.status_code == 200 and b"Revoke support-bot" in confirm.content
    done = web.post(f"/gateway/keys/{key.pk}/revoke/", follow=True)
    assert b"Revoked client key support-bot." in done.content
    key.refresh_from_db()
    assert key.state == "revoked"
    logged = list(ClusterAction.objects.values_list("action", "actor_name"))
    assert ("client key create", f"{operator.username} (console)") in logged
    assert ("client key revoke", f"{operator.username} (console)") in logged


def test_console_refusals_say_the_field_and_change_nothing(operator: Any, client_for: Any) -> None:
    chat_model()
    web = client_for(operator)
    for form, field, words in [
        ({"name": "a", "models": "nope"}, "models", "nope not in the catalog"),
        ({"name": "bad name!"}, "name", "letters, digits"),
        ({"name": "a", "owner": "someone"}, "owner", "org:NAME"),
        ({"name": "a", "expires": "2001-01-01T00:00"}, "expires", "in the past"),
        ({"name": "a", "rpm": "-1"}, "rpm", "greater than or equal to 0"),
    ]:
        page = web.post("/gateway/keys/create/", form)
        assert page.status_code == 400, form
        assert words in page.content.decode(), (field, page.content.decode()[-3000:])
    assert not ClientKey.objects.exists()
    web.post("/gateway/keys/create/", {"name": "dup"})
    again = web.post("/gateway/keys/create/", {"name": "dup"})
    assert again.status_code == 400 and b"a live client key already has that name" in again.content
    assert ClientKey.objects.filter(name="dup").count() == 1


def test_console_viewer_reads_without_buttons_and_is_refused(
    viewer: Any, operator: Any, client_for: Any, outsider: Any
) -> None:
    from gateway.services import create_key

    key, _ = create_key("app", owner="org:acme", user=operator)
    web = client_for(viewer)
    page = web.get("/gateway/keys/").content.decode()
    assert 'data-key="app"' in page and "org:acme" in page
    assert "Create client key" not in page and "/revoke/confirm/" not in page
    assert web.post("/gateway/keys/create/", {"name": "x"}).status_code == 403
    assert web.post(f"/gateway/keys/{key.pk}/revoke/").status_code == 403
    assert web.get(f"/gateway/keys/{key.pk}/revoke/confirm/").status_code == 403
    assert not ClientKey.objects.filter(name="x").exists()
    assert ClientKey.objects.get(pk=key.pk).state == "live"
    assert client_for(outsider).get("/gateway/keys/").status_code == 403
    # The navigation links the page.
    assert 'href="/gateway/keys/"' in web.get("/cluster/").content.decode()


def refusal(response: Any, field: str) -> str:
    """The message the API's problems shape gives for ``field``."""
    return " ".join(e["message"] for e in response.json()["errors"] if e["field"] == field)


def test_api_lists_creates_once_and_revokes(operator: Any, viewer: Any, api_for: Any) -> None:
    chat_model()
    api = api_for(operator)
    made = api.post("/api/v1/gateway/keys/", {"name": "ci", "owner": "project:ci",
                                              "models": ["chat"], "tpm": 1000}, format="json")  # fmt: skip
    assert made.status_code == 201, made.content
    body = made.json()
    secret = body["key"]
    assert SECRET.fullmatch(secret)
    assert body["prefix"] == secret[:17] and body["state"] == "live"
    assert ClientKey.objects.get(name="ci").digest == digest(secret)
    listed = api_for(viewer).get("/api/v1/gateway/keys/").json()
    assert [k["name"] for k in listed["results"]] == ["ci"]
    assert secret not in str(listed) and "key" not in listed["results"][0]
    one = api_for(viewer).get(f"/api/v1/gateway/keys/{body['id']}/").json()
    assert one["models"] == ["chat"] and one["tpm"] == 1000 and "digest" not in one
    # Viewers are refused every change.
    assert (
        api_for(viewer).post("/api/v1/gateway/keys/", {"name": "v"}, format="json").status_code
        == 403
    )
    assert api_for(viewer).post(f"/api/v1/gateway/keys/{body['id']}/revoke/").status_code == 403
    # Refusals name the field.
    bad = api.post("/api/v1/gateway/keys/", {"name": "x", "models": ["nope"]}, format="json")
    assert bad.status_code == 400 and "nope not in the catalog" in refusal(bad, "models")
    dup = api.post("/api/v1/gateway/keys/", {"name": "ci"}, format="json")
    assert dup.status_code == 400 and "already has that name" in refusal(dup, "name")
    past = api.post("/api/v1/gateway/keys/", {"name": "y", "expires": "2001-01-01T00:00:00Z"},
                    format="json")  # fmt: skip
    assert past.status_code == 400 and "in the past" in refusal(past, "expires")
    revoked = api.post(f"/api/v1/gateway/keys/{body['id']}/revoke/")
    assert revoked.status_code == 200 and revoked.json()["state"] == "revoked"
    assert ClusterAction.objects.filter(action="client key revoke",
                                        actor_name=f"{operator.username} (api)").exists()  # fmt: skip


def test_admin_is_read_only_and_revokes_for_operators(
    operator: Any, viewer: Any, client_for: Any
) -> None:
    from gateway.services import create_key

    key, secret = create_key("app", user=operator)
    url = "/admin/gateway/clientkey/"
    page = client_for(viewer).get(url)
    assert page.status_code == 200 and b"app" in page.content
    assert b"revoke_selected" not in page.content  # viewers are offered no action
    refused = client_for(viewer).post(url, {"action": "revoke_selected",
                                            "_selected_action": [key.pk]})  # fmt: skip
    assert refused.status_code == 403
    assert ClientKey.objects.get(pk=key.pk).state == "live"
    change = client_for(operator).get(f"{url}{key.pk}/change/").content.decode()
    assert secret not in change and 'name="owner"' not in change  # nothing to edit
    assert client_for(operator).get(f"{url}add/").status_code == 403
    done = client_for(operator).post(url, {"action": "revoke_selected",
                                           "_selected_action": [key.pk]}, follow=True)  # fmt: skip
    assert b"Revoked 1 client key: app." in done.content
    assert ClientKey.objects.get(pk=key.pk).state == "revoked"
    assert ClusterAction.objects.filter(action="client key revoke",
                                        actor_name=f"{operator.username} (admin)").exists()  # fmt: skip


def test_a_model_named_twice_is_kept_once(operator: Any, api_for: Any) -> None:
    chat_model()
    made = api_for(operator).post("/api/v1/gateway/keys/", {"name": "twice",
                                  "models": ["chat", "chat"]}, format="json")  # fmt: skip
    assert made.status_code == 201, made.content
    assert ClientKey.objects.get(name="twice").models == ["chat"]


def test_the_command_says_what_is_wrong_plainly(db: Any) -> None:
    import io

    from django.core.management import CommandError, call_command

    call_command("gateway", "key", "create", "dup", stdout=io.StringIO())
    with pytest.raises(CommandError) as caught:
        call_command("gateway", "key", "create", "dup", stdout=io.StringIO())
    assert str(caught.value) == "a live client key already has that name"
    with pytest.raises(CommandError) as caught:
        call_command("gateway", "key", "create", "x", "--expires", "10", stdout=io.StringIO())
    assert str(caught.value) == (
        "--expires: '10' has no unit: write it with one, like 10s, 10m or 10h; or days, like 30d"
    )
    assert list(ClientKey.objects.values_list("name", flat=True)) == ["dup"]
