"""A client key's admission band: set by the console, the API and
``gateway key create --priority``, normal by default, shown in the list, the admin and the
command's list, refused when it is none of the bands, and carried to the gateway's table."""

from __future__ import annotations

import io
from typing import Any

import pytest
from django.core.management import CommandError, call_command

from cluster.models import ClusterAction
from gateway.models import ClientKey
from gateway.records.state import load_table

pytestmark = pytest.mark.django_db


def test_console_sets_the_band_shows_it_and_defaults_to_normal(
    operator: Any, client_for: Any
) -> None:
    web = client_for(operator)
    page = web.post("/gateway/keys/create/", {"name": "batch", "priority": "low"})
    assert page.status_code == 200
    assert web.post("/gateway/keys/create/", {"name": "plain"}).status_code == 200
    assert dict(ClientKey.objects.values_list("name", "priority")) == {
        "batch": "low", "plain": "normal",
    }  # fmt: skip
    listing = web.get("/gateway/keys/").content.decode()
    assert '<span class="badge" data-role="priority">low</span>' in listing
    bad = web.post("/gateway/keys/create/", {"name": "odd", "priority": "urgent"})
    assert bad.status_code == 400 and b"urgent is not one of the available choices" in bad.content
    assert not ClientKey.objects.filter(name="odd").exists()
    assert ClusterAction.objects.filter(
        action="client key create", detail__contains="priority low"
    ).exists()


def test_api_takes_and_lists_the_band_and_refuses_another(operator: Any, api_for: Any) -> None:
    api = api_for(operator)
    made = api.post("/api/v1/gateway/keys/", {"name": "prod", "priority": "high"}, format="json")
    assert made.status_code == 201, made.content
    assert made.json()["priority"] == "high"
    listed = api.get("/api/v1/gateway/keys/").json()["results"]
    assert [(k["name"], k["priority"]) for k in listed] == [("prod", "high")]
    bad = api.post("/api/v1/gateway/keys/", {"name": "x", "priority": "top"}, format="json")
    assert bad.status_code == 400
    assert [e["field"] for e in bad.json()["errors"]] == ["priority"]
    assert not ClientKey.objects.filter(name="x").exists()


def test_the_command_sets_the_band_and_lists_it(db: Any) -> None:
    out = io.StringIO()
    call_command("gateway", "key", "create", "nightly", "--priority", "low", stdout=out)
    assert "priority low" in out.getvalue()
    listed = io.StringIO()
    call_command("gateway", "key", "list", stdout=listed)
    assert "\tlow\t" in listed.getvalue()
    with pytest.raises(CommandError):
        call_command("gateway", "key", "create", "y", "--priority", "urgent", stderr=io.StringIO())
    assert list(ClientKey.objects.values_list("name", flat=True)) == ["nightly"]


def test_the_admin_shows_the_band(operator: Any, client_for: Any) -> None:
    call_command("gateway", "key", "create", "k", "--priority", "high", stdout=io.StringIO())
    page = client_for(operator).get("/admin/gateway/clientkey/")
    assert page.status_code == 200 and b"field-priority" in page.content


def test_the_gateways_table_carries_the_band(db: Any) -> None:
    call_command("gateway", "key", "create", "k", "--priority", "low", stdout=io.StringIO())
    assert [k.priority for k in load_table().keys.values()] == ["low"]
