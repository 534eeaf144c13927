"""Federation's shell: ``federation add|list|remove``, each logged with who made it, and
the refresh that reads a real peer's ``/v1/models`` (a gateway serving its own catalog)
and writes ``PEER/MODEL`` entries through the catalog's services."""

from __future__ import annotations

import json
from collections.abc import Iterator
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from catalog.models import ChangeRecord, ServedModel
from catalog.services import export_specs
from cluster.models import ClusterAction
from cluster.signals import reconcile_tick
from gateway import peers, signals
from gateway.models import Peer
from gateway.path.table import Key, digest
from gateway.records.state import load_table
from tests.gateway.harness import KEY, Harness, model

pytestmark = pytest.mark.django_db


@pytest.fixture
def peer_gateway() -> Iterator[Harness]:
    """The peer: a gateway answering /v1/models with its catalog, for its client key."""
    h = Harness()
    engine = h.engine("peer-chat")
    h.serve([model("chat"), model("embed")], [(1, "chat", engine), (2, "embed", engine)])
    yield h
    h.close()


@pytest.fixture
def key_file(tmp_path: Path, settings: Any) -> str:
    folder = tmp_path / "secrets"
    folder.mkdir()
    (folder / "east").write_text(KEY + "\n")
    settings.LLMGW_SECRETS_DIR = str(folder)
    return "east"


@pytest.fixture
def allowed(settings: Any, peer_gateway: Harness) -> str:
    settings.LLMGW_EXTERNAL_HTTP_HOSTS = [peer_gateway.url.split("//", 1)[1]]
    return peer_gateway.url


def add(url: str, key_file: str, name: str = "east") -> str:
    out = StringIO()
    call_command("federation", "add", name, "--url", url, "--key-file", key_file, stdout=out)
    return out.getvalue()


def test_add_list_remove_logged_and_refused_with_a_clear_reason(
    allowed: str, key_file: str
) -> None:
    assert "appear as east/MODEL" in add(allowed, key_file)
    action = ClusterAction.objects.get(action="federation add")
    assert action.target == "east" and "cli " in action.actor_name
    with pytest.raises(CommandError, match="already added"):
        add(allowed, key_file)
    with pytest.raises(CommandError, match="NAME/MODEL"):
        add(allowed, key_file, name="a/b")
    with pytest.raises(CommandError, match="key_file: key file '/etc/shadow'"):
        add(allowed, "/etc/shadow", name="west")
    with pytest.raises(CommandError, match="url: url 'http://10.9.9.9:1'"):
        add("http://10.9.9.9:1", key_file, name="west")
    assert list(Peer.objects.values_list("name", flat=True)) == ["east"]
    out = StringIO()
    call_command("federation", "list", "--json", stdout=out)
    (row,) = json.loads(out.getvalue())
    assert row["name"] == "east" and row["key_file"] == "east" and row["state"] == "up"
    assert KEY not in out.getvalue()
    call_command("federation", "remove", "east", stdout=StringIO())
    assert not Peer.objects.exists()
    assert ClusterAction.objects.filter(action="federation remove", target="east").exists()
    with pytest.raises(CommandError, match="no peer named 'east'"):
        call_command("federation", "remove", "east", stdout=StringIO())


def test_refresh_adds_what_the_peer_lists_and_removes_what_it_stops_listing(
    peer_gateway: Harness, allowed: str, key_file: str
) -> None:
    add(allowed, key_file)
    peers.refresh(Peer.objects.get())
    row = ServedModel.objects.get(name="east/chat")
    assert (row.external_peer, row.external_model, row.external_api_key_file) == (
        "east",
        "chat",
        "east",
    )
    assert row.external_url == allowed + "/v1"
    assert {m.name for m in export_specs()} >= {"east/chat", "east/embed"}
    logged = ChangeRecord.objects.get(model_name="east/chat")
    assert logged.actor_name == "federation east" and logged.summary == "created"
    # The peer stops listing one: the next refresh removes it, logged.
    peer_gateway.models = [model("chat")]
    peer_gateway.refresh()
    peers.refresh(Peer.objects.get())
    assert list(ServedModel.objects.values_list("name", flat=True)) == ["east/chat"]
    assert ChangeRecord.objects.filter(model_name="east/embed", summary="deleted").exists()
    # Removing the peer removes its models.
    call_command("federation", "remove", "east", stdout=StringIO())
    assert not ServedModel.objects.exists()


def test_a_failed_read_trips_the_peer_keeps_its_models_and_probes_bring_it_back(
    peer_gateway: Harness, allowed: str, key_file: str, settings: Any
) -> None:
    add(allowed, key_file)
    peers.refresh(Peer.objects.get())
    peer_gateway.keys = {}  # the peer no longer knows the key: 401
    peer_gateway.refresh()
    peers.refresh(Peer.objects.get())
    peer = Peer.objects.get()
    assert peer.state == "tripped" and peer.last_error == "its /v1/models answered 401"
    assert ServedModel.objects.filter(external_peer="east").count() == 2
    # Every gateway process reads it with its table: the peer's models leave its list.
    table = load_table()
    assert table.down == {"east": "its /v1/models answered 401"}
    assert table.peer_down(table.models["east/chat"]) == "east"
    key = Key(1, "app", "", ("east/chat", "east/embed"), None)
    assert table.listed(key, timezone.now()) == []
    # The peer takes the key again: back after the probes and the dwell (settings).
    settings.LLMGW_FEDERATION_RECOVER_PROBES, settings.LLMGW_FEDERATION_DWELL = 2, 0
    peer_gateway.keys = {digest(KEY): Key(1, "harness", "", (), None)}
    peer_gateway.refresh()
    peers.refresh(Peer.objects.get())
    assert Peer.objects.get().state == "tripped"
    peers.refresh(Peer.objects.get())
    peer = Peer.objects.get()
    assert peer.state == "up" and peer.last_error == ""
    assert len(load_table().listed(key, timezone.now())) == 2


@pytest.mark.django_db(transaction=True)
def test_the_reconcile_tick_refreshes_a_peer_due_for_it(allowed: str, key_file: str) -> None:
    add(allowed, key_file)
    signals._refreshing.acquire()  # a refresh under way: the tick skips
    try:
        reconcile_tick.send(sender=None, now=None)
    finally:
        signals._refreshing.release()
    assert not ServedModel.objects.exists()
    reconcile_tick.send(sender=None, now=None)
    assert signals.last is not None
    signals.last.join(timeout=15)
    assert not signals.last.is_alive()
    assert set(ServedModel.objects.values_list("name", flat=True)) == {"east/chat", "east/embed"}


def test_api_operators_add_and_remove_viewers_see(
    api_for: Any, operator: Any, viewer: Any, allowed: str, key_file: str
) -> None:
    body = {"name": "east", "url": allowed, "key_file": key_file}
    assert api_for(viewer).post("/api/v1/gateway/peers/", body, format="json").status_code == 403
    bad = api_for(operator).post("/api/v1/gateway/peers/", {**body, "key_file": "/etc/shadow"},
                                 format="json")  # fmt: skip
    assert bad.status_code == 400, bad.json()
    assert "key file '/etc/shadow'" in str(bad.json()) and not Peer.objects.exists()
    made = api_for(operator).post("/api/v1/gateway/peers/", body, format="json")
    assert made.status_code == 201 and made.json()["state"] == "up"
    again = api_for(operator).post("/api/v1/gateway/peers/", body, format="json")
    assert again.status_code == 400 and "already added" in str(again.json())
    peers.refresh(Peer.objects.get())
    seen = api_for(viewer).get("/api/v1/gateway/peers/east/").json()
    assert seen["models"] == ["east/chat", "east/embed"] and KEY not in str(seen)
    assert api_for(viewer).delete("/api/v1/gateway/peers/east/").status_code == 403
    assert api_for(operator).delete("/api/v1/gateway/peers/east/").status_code == 204
    assert not ServedModel.objects.exists()
    (made_by, removed_by) = ClusterAction.objects.order_by("id").values_list(
        "actor_name", flat=True
    )
    assert made_by == removed_by == f"{operator.username} (api)"


def test_admin_operator_adds_and_deletes_viewer_sees(
    client_for: Any, operator: Any, viewer: Any, allowed: str, key_file: str
) -> None:
    web = client_for(operator)
    refused = web.post(
        "/admin/gateway/peer/add/", {"name": "East", "url": allowed, "api_key_file": key_file}
    )
    assert refused.status_code == 200 and "NAME/MODEL" in refused.content.decode()
    assert not Peer.objects.exists()
    done = web.post(
        "/admin/gateway/peer/add/", {"name": "east", "url": allowed, "api_key_file": key_file}
    )
    assert done.status_code == 302
    peer = Peer.objects.get()
    assert (
        ClusterAction.objects.get(action="federation add").actor_name
        == f"{operator.username} (admin)"
    )
    peers.refresh(peer)
    page = client_for(viewer).get(f"/admin/gateway/peer/{peer.pk}/change/")
    assert page.status_code == 200 and "east/chat" in page.content.decode()
    assert (
        client_for(viewer)
        .post(f"/admin/gateway/peer/{peer.pk}/delete/", {"post": "yes"})
        .status_code
        == 403
    )
    assert web.post(f"/admin/gateway/peer/{peer.pk}/delete/", {"post": "yes"}).status_code == 302
    assert not Peer.objects.exists() and not ServedModel.objects.exists()


def test_a_peer_whose_model_another_names_is_kept_with_the_reason(
    allowed: str, key_file: str, api_for: Any, operator: Any
) -> None:
    from catalog import services as catalog_services
    from tests.catalog.samples import sim_model, store

    add(allowed, key_file)
    peers.refresh(Peer.objects.get())
    store(sim_model("chat", 0, most=0, tp=None, fallbacks=["east/chat"]))
    with pytest.raises(CommandError, match="peer 'east' is kept: .*change that model first"):
        call_command("federation", "remove", "east", stdout=StringIO())
    refused = api_for(operator).delete("/api/v1/gateway/peers/east/")
    assert refused.status_code == 400 and "is kept" in str(refused.json())
    assert Peer.objects.exists() and ServedModel.objects.filter(external_peer="east").count() == 2
    assert not ClusterAction.objects.filter(action="federation remove").exists()
    assert catalog_services.delete_blockers("east/chat")


def test_console_operators_add_and_remove_viewers_see(
    client_for: Any, operator: Any, viewer: Any, allowed: str, key_file: str
) -> None:
    web = client_for(operator)
    bad = web.post(
        "/gateway/peers/add/", {"name": "east", "url": allowed, "key_file": "/etc/shadow"}
    )
    assert bad.status_code == 400 and "key file &#x27;/etc/shadow&#x27;" in bad.content.decode()
    assert (
        web.post(
            "/gateway/peers/add/", {"name": "east", "url": allowed, "key_file": key_file}
        ).status_code
        == 302
    )
    assert (
        ClusterAction.objects.get(action="federation add").actor_name
        == f"{operator.username} (console)"
    )
    peers.refresh(Peer.objects.get())
    seen = client_for(viewer).get("/gateway/peers/")
    page = seen.content.decode()
    assert seen.status_code == 200 and "east/chat, east/embed" in page and "Add a peer" not in page
    assert client_for(viewer).post("/gateway/peers/add/", {"name": "west", "url": allowed,
                                                           "key_file": key_file}).status_code == 403  # fmt: skip
    assert client_for(viewer).post("/gateway/peers/east/remove/").status_code == 403
    assert web.post("/gateway/peers/east/remove/").status_code == 302
    assert not Peer.objects.exists() and not ServedModel.objects.exists()
