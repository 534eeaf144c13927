"""The catalog API: CRUD with everything nested, refusals with paths, filters, roles."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from catalog.models import ChangeRecord, ServedModel
from tests.catalog.samples import cpu_model, gpu_model, store

pytestmark = pytest.mark.django_db

URL = "/api/v1/catalog/models/"


def test_create_read_update_delete_nested(api_for: Any, operator: Any) -> None:
    api = api_for(operator)
    body = gpu_model(
        "chat",
        aliases=["chat-latest"],
        scaling={
            "min": 1,
            "max": 3,
            "schedule": [{"days": ["weekdays"], "from": "08:00", "to": "18:00", "min": 2}],
            "prewarm": "30m",
        },
        adapters=[{"name": "chat-sql", "source": "/lora/sql"}],
    )
    r = api.post(URL, body, format="json")
    assert r.status_code == 201, r.json()
    got = r.json()
    assert got["aliases"] == ["chat-latest"]
    assert got["scaling"]["schedule"][0]["from"] == "08:00"
    assert got["scaling"]["prewarm"] == "30m"
    # Defaults the rules fill in are stored and shown.
    assert got["profiles"][0]["gpus_per_node"] == 2
    assert got["profiles"][0]["startup_timeout"] == "20m"
    assert got["meta"]["effective_class"] == "standard"
    assert len(got["meta"]["fingerprints"]["h100"]) == 16

    body["description"] = "general chat"
    r = api.put(URL + "chat/", body, format="json")
    assert r.status_code == 200, r.json()
    assert api.get(URL + "chat/").json()["description"] == "general chat"

    r = api.patch(URL + "chat/", {"scaling": {"max": 5}, "aliases": None}, format="json")
    assert r.status_code == 200, r.json()
    got = r.json()
    assert got["scaling"]["max"] == 5 and got["scaling"]["min"] == 1
    assert "aliases" not in got

    r = api.delete(URL + "chat/")
    assert r.status_code == 204
    assert not ServedModel.objects.exists()
    actions = list(
        ChangeRecord.objects.order_by("id").values_list("action", "surface", "actor_name")
    )
    assert actions == [
        ("create", "api", "otto"),
        ("update", "api", "otto"),
        ("update", "api", "otto"),
        ("delete", "api", "otto"),
    ]


def test_refused_change_answers_400_with_path_and_writes_nothing(
    api_for: Any, operator: Any
) -> None:
    api = api_for(operator)
    body = gpu_model("chat")
    body["profiles"][0].update({"nodes": 2, "gpus_per_node": 4, "tp": 4})
    r = api.post(URL, body, format="json")
    assert r.status_code == 400
    errors = r.json()["errors"]
    assert any(e["field"] == "profiles[0].tp" for e in errors), errors
    assert not ServedModel.objects.exists()
    assert not ChangeRecord.objects.exists()


def test_unknown_key_and_wrong_type_are_refused_with_paths(api_for: Any, operator: Any) -> None:
    api = api_for(operator)
    body = gpu_model("chat")
    body["profiles"][0]["gpu_clas"] = "x"
    body["scaling"]["min"] = "one"
    r = api.post(URL, body, format="json")
    assert r.status_code == 400
    fields = {e["field"]: e for e in r.json()["errors"]}
    assert "gpu_class" in fields["profiles[0].gpu_clas"]["message"]
    assert fields["scaling.min"]["code"] == "wrong_type"
    r = api.post(URL, ["not", "an", "object"], format="json")
    assert r.status_code == 400
    assert not ServedModel.objects.exists()


def test_delete_refused_while_a_fallback_names_the_model(api_for: Any, operator: Any) -> None:
    store(cpu_model("small"), gpu_model("chat", fallbacks=["small"]))
    api = api_for(operator)
    r = api.delete(URL + "small/")
    assert r.status_code == 400
    assert "chat" in r.json()["errors"][0]["message"]
    assert ServedModel.objects.filter(name="small").exists()
    # Renaming it is refused the same way.
    r = api.put(URL + "small/", cpu_model("small-2"), format="json")
    assert r.status_code == 400
    assert 'model "chat" names "small"' in r.json()["errors"][0]["message"]
    assert api.get(URL + "small/").json()["meta"]["depended_on_by"] == [
        {"model": "chat", "via": "fallbacks"}
    ]


def test_filters(api_for: Any, viewer: Any) -> None:
    store(
        cpu_model("small"),
        gpu_model("chat", owner="team:ml"),
        gpu_model("judge", role="guard", guard={"format": "qwen3guard"}),
    )
    api = api_for(viewer)

    def names(query: str) -> list[str]:
        return [m["name"] for m in api.get(URL + "?" + query).json()["results"]]

    assert names("role=guard") == ["judge"]
    assert names("class=critical") == ["judge"]
    assert names("class=opportunistic") == ["small"]
    assert names("engine=llamacpp") == ["small"]
    assert names("gpu_class=nvidia-h100-80gb") == ["chat", "judge"]
    assert names("owner=team:ml") == ["chat"]
    assert names("on_demand=true") == ["small"]
    assert names("search=CHA") == ["chat"]


def test_list_queries_do_not_grow_with_models(api_for: Any, viewer: Any) -> None:
    api = api_for(viewer)
    store(*[gpu_model(f"m{i}", aliases=[f"a{i}"]) for i in range(3)])
    api.get(URL)  # the first request also learns the user's role
    with CaptureQueriesContext(connection) as few:
        assert api.get(URL).status_code == 200
    store(*[gpu_model(f"n{i}", aliases=[f"b{i}"]) for i in range(30)])
    with CaptureQueriesContext(connection) as many:
        assert len(api.get(URL).json()["results"]) == 33
    assert len(many) == len(few)


def test_roles_viewer_reads_operator_writes(api_for: Any, viewer: Any, outsider: Any) -> None:
    assert api_for(viewer).get(URL).status_code == 200
    assert api_for(viewer).post(URL, gpu_model(), format="json").status_code == 403
    assert api_for(outsider).get(URL).status_code == 403
    from rest_framework.test import APIClient

    assert APIClient().get(URL).status_code == 401


def test_revert_restores_the_before_side(api_for: Any, operator: Any) -> None:
    api = api_for(operator)
    api.post(URL, gpu_model("chat"), format="json")
    api.patch(URL + "chat/", {"description": "changed"}, format="json")
    change = ChangeRecord.objects.filter(action="update").get()
    r = api.post(f"/api/v1/catalog/changes/{change.pk}/revert/")
    assert r.status_code == 200, r.json()
    assert "description" not in api.get(URL + "chat/").json()
    assert ChangeRecord.objects.filter(action="revert", reverts=change).exists()
    log = api.get(URL + "chat/changes/").json()
    assert [e["action"] for e in log] == ["revert", "update", "create"]


def test_revert_refused_when_the_result_breaks_a_rule(api_for: Any, operator: Any) -> None:
    api = api_for(operator)
    store(cpu_model("small"))
    created = ChangeRecord.objects.get(model_name="small", action="create")
    api.post(URL, gpu_model("chat", fallbacks=["small"]), format="json")
    # Reverting the creation of "small" would delete a model "chat" falls back to.
    r = api.post(f"/api/v1/catalog/changes/{created.pk}/revert/")
    assert r.status_code == 400
    assert ServedModel.objects.filter(name="small").exists()


def test_tokens_issue_use_revoke_expire(api_for: Any, admin_user: Any, operator: Any) -> None:
    from django.contrib.auth.models import User
    from rest_framework.test import APIClient

    # A token for another user is a superuser's to issue (an admin issues its own).
    root = User.objects.create_superuser("root", "root@example.com", "x")
    admin_api = api_for(root)
    r = admin_api.post("/api/v1/tokens/", {"user": "otto", "name": "ci"}, format="json")
    assert r.status_code == 201, r.json()
    secret = r.json()["token"]
    assert secret.startswith("llmgw_")
    from llmgw_core.models import ApiToken

    stored = ApiToken.objects.get()
    assert secret not in (stored.digest, stored.prefix)
    assert "token" not in admin_api.get("/api/v1/tokens/").json()["results"][0]

    script = APIClient()
    script.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    r = script.post(URL, gpu_model("chat"), format="json")
    assert r.status_code == 201
    assert ChangeRecord.objects.get().actor_name == "otto (token ci)"
    # Operators may not issue tokens.
    assert (
        api_for(operator)
        .post("/api/v1/tokens/", {"user": "otto", "name": "x"}, format="json")
        .status_code
        == 403
    )

    admin_api.post(f"/api/v1/tokens/{stored.pk}/revoke/")
    r = script.get(URL)
    assert r.status_code == 401 and "revoked" in r.json()["detail"]

    from datetime import timedelta

    from django.utils import timezone

    token, secret2 = ApiToken.issue(operator, "short", timezone.now() + timedelta(seconds=30))
    ApiToken.objects.filter(pk=token.pk).update(expires=timezone.now() - timedelta(seconds=1))
    script.credentials(HTTP_AUTHORIZATION=f"Bearer {secret2}")
    r = script.get(URL)
    assert r.status_code == 401 and "expired" in r.json()["detail"]
    script.credentials(HTTP_AUTHORIZATION="Bearer llmgw_nope")
    assert script.get(URL).status_code == 401


def test_openapi_schema_validates(viewer: Any, api_for: Any) -> None:
    from django.core.management import call_command

    call_command("spectacular", "--validate", "--fail-on-warn", "--file", "/dev/null")
    r = api_for(viewer).get("/api/schema/")
    assert r.status_code == 200
    assert b"/api/v1/catalog/models/" in r.content


def test_api_docs_page_serves_its_assets_locally(client_for: Any, viewer: Any) -> None:
    """The docs page must work air-gapped: no asset from a CDN."""
    import re

    r = client_for(viewer).get("/api/docs/")
    assert r.status_code == 200
    html = r.content.decode()
    assets = re.findall(r'(?:src|href)="([^"]+)"', html)
    assert any("swagger-ui" in a for a in assets), assets
    assert all(a.startswith("/") for a in assets), assets


def test_api_docs_page_needs_sign_in(client: Any, db: Any) -> None:
    r = client.get("/api/docs/")
    assert r.status_code == 302 and r["Location"].startswith("/login/")


def test_a_whole_model_put_without_the_origin_keeps_it_and_a_patch_may_drop_it(
    api_for: Any, operator: Any
) -> None:
    origin = {"repo": "org/chat", "revision": "abc123",
              "files": [{"path": "m.safetensors", "sha256": "11" * 32, "bytes": 9}]}  # fmt: skip
    store(gpu_model("chat", source="org/chat", origin=origin))
    api = api_for(operator)
    body = gpu_model("chat", source="org/chat", description="general chat")
    r = api.put(URL + "chat/", body, format="json")
    assert r.status_code == 200, r.json()
    got = api.get(URL + "chat/").json()
    assert got["description"] == "general chat" and got["origin"]["revision"] == "abc123"
    r = api.patch(URL + "chat/", {"origin": None}, format="json")
    assert r.status_code == 200, r.json()
    assert "origin" not in api.get(URL + "chat/").json()


def test_a_model_runs_its_own_code_only_by_its_trust_remote_code_field(
    api_for: Any, operator: Any, client_for: Any
) -> None:
    api = api_for(operator)
    # The engine's flag in a profile is refused, naming the field to set instead.
    flagged = gpu_model("custom")
    flagged["profiles"][0]["args"] = ["--trust-remote-code"]
    r = api.post(URL, flagged, format="json")
    assert r.status_code == 400, r.json()
    assert "trust_remote_code: true" in str(r.json()) and not ServedModel.objects.exists()
    # The field, set on purpose: stored, answered, shown on the model's page.
    r = api.post(URL, gpu_model("custom", trust_remote_code=True), format="json")
    assert r.status_code == 201, r.json()
    assert r.json()["trust_remote_code"] is True
    assert api.get(f"{URL}custom/").json()["trust_remote_code"] is True
    page = client_for(operator).get("/catalog/models/custom/").content.decode()
    assert 'id="trust-remote-code"><strong class="warn">yes</strong>' in page
    r = api.post(URL, gpu_model("plain"), format="json")
    assert r.status_code == 201 and not r.json().get("trust_remote_code")  # a default: left out
    assert ">no <span" in client_for(operator).get("/catalog/models/plain/").content.decode()
