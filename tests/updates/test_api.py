"""The mirror's node API (node token, Range, one fetch for four nodes) and the update
check's API call, console panel, button and page."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
from django.test import Client

from tests.catalog.samples import gpu_model, store
from tests.cluster.helpers import join_node
from tests.updates.hubstandin import HubStandIn
from updates import mirror
from updates.models import Fetch

pytestmark = pytest.mark.django_db

WEIGHTS = bytes(range(256)) * 2048  # 512 KiB


def _place(name: str, *nodes: Any) -> None:
    """Put a replica of a model on each node, as the reconciler would."""
    from catalog.models import ServedModel
    from cluster.models import Assignment, Replica

    row = ServedModel.objects.get(name=name)
    for node in nodes:
        r = Replica.objects.create(model=row, model_name=name, profile="h100")
        Assignment.objects.create(replica=r, node=node)


def _node_client(token: str) -> Client:
    return Client(HTTP_AUTHORIZATION=f"Bearer {token}")


@pytest.fixture
def placed(hub: HubStandIn) -> list[tuple[Any, str]]:
    hub.commit("org/chat", {"model.safetensors": WEIGHTS, "config.json": b'{"a": 1}'})
    store(gpu_model("chat"))
    nodes = [join_node(f"n{i}") for i in range(4)]
    _place("chat", *(n for n, _ in nodes))
    return nodes


def test_four_nodes_asking_for_a_model_queue_one_fetch(
    hub: HubStandIn, placed: list[tuple[Any, str]]
) -> None:
    answers = [
        _node_client(token).get("/api/v1/updates/mirror/models/chat/") for _, token in placed
    ]
    assert [a.status_code for a in answers] == [202] * 4
    assert Fetch.objects.count() == 1
    mirror.run_fetch(Fetch.objects.get().pk)
    for _, token in placed:
        body = _node_client(token).get("/api/v1/updates/mirror/models/chat/").json()
        assert body["state"] == "done"
    assert hub.count("GET", "/resolve/") == 2
    assert hub.count("GET", "/api/models/") == 1


def test_a_node_reads_a_file_whole_and_by_range(
    hub: HubStandIn, placed: list[tuple[Any, str]]
) -> None:
    _, token = placed[0]
    node = _node_client(token)
    node.get("/api/v1/updates/mirror/models/chat/")
    mirror.run_fetch(Fetch.objects.get().pk)
    files = {f["path"]: f for f in node.get("/api/v1/updates/mirror/models/chat/").json()["files"]}
    f = files["model.safetensors"]
    assert f["sha256"] == hashlib.sha256(WEIGHTS).hexdigest() and f["bytes"] == len(WEIGHTS)
    whole = node.get(f["url"])
    assert whole.status_code == 200 and b"".join(whole) == WEIGHTS
    assert whole["ETag"] == f'"{f["sha256"]}"'
    part = node.get(f["url"], HTTP_RANGE="bytes=1000-")
    assert part.status_code == 206
    assert part["Content-Range"] == f"bytes 1000-{len(WEIGHTS) - 1}/{len(WEIGHTS)}"
    assert b"".join(part) == WEIGHTS[1000:]
    assert node.get(f["url"], HTTP_RANGE=f"bytes={len(WEIGHTS)}-").status_code == 416
    assert node.get(f["url"], HTTP_RANGE="lines=1-2").status_code == 400


def test_a_wrong_node_token_is_401_and_a_node_without_the_model_403(
    hub: HubStandIn, placed: list[tuple[Any, str]]
) -> None:
    assert Client().get("/api/v1/updates/mirror/models/chat/").status_code == 401
    bad = _node_client("llmgw_node_wrong").get("/api/v1/updates/mirror/models/chat/")
    assert bad.status_code == 401 and bad["WWW-Authenticate"]
    _, stranger = join_node("stranger")
    assert _node_client(stranger).get("/api/v1/updates/mirror/models/chat/").status_code == 403
    _node_client(placed[0][1]).get("/api/v1/updates/mirror/models/chat/")
    mirror.run_fetch(Fetch.objects.get().pk)
    url = f"/api/v1/updates/mirror/files/{Fetch.objects.get().pk}/config.json"
    assert _node_client("llmgw_node_wrong").get(url).status_code == 401
    assert _node_client(stranger).get(url).status_code == 403
    assert _node_client(placed[0][1]).get(url.replace("config.json", "../x")).status_code == 404


def test_the_mirror_off_tells_a_node_to_fetch_as_before(
    hub: HubStandIn, placed: list[tuple[Any, str]], settings: Any
) -> None:
    settings.LLMGW_MIRROR = False
    answer = _node_client(placed[0][1]).get("/api/v1/updates/mirror/models/chat/")
    assert answer.status_code == 404 and answer.json()["state"] == "off"
    assert Fetch.objects.count() == 0


def test_a_failed_fetch_is_not_queued_again_by_every_node_at_once(
    hub: HubStandIn, placed: list[tuple[Any, str]]
) -> None:
    hub.wrong_bytes.add("model.safetensors")
    _node_client(placed[0][1]).get("/api/v1/updates/mirror/models/chat/")
    mirror.run_fetch(Fetch.objects.get().pk)
    for _, token in placed:
        answer = _node_client(token).get("/api/v1/updates/mirror/models/chat/")
        assert answer.status_code == 409 and "sha256" in answer.json()["reason"]
    assert Fetch.objects.count() == 1


def test_the_update_check_api(hub: HubStandIn, operator: Any, viewer: Any) -> None:
    first = hub.commit("org/chat", {"model.safetensors": b"1" * 100})
    store(gpu_model("chat"))
    mirror.run_fetch(mirror.request_fetch("chat", start=False).pk)
    latest = hub.commit("org/chat", {"model.safetensors": b"2" * 100})
    c = Client()
    c.force_login(viewer)
    assert c.post("/api/v1/catalog/models/chat/update-check/").status_code == 403
    assert c.get("/api/v1/catalog/models/chat/update-check/").status_code == 404
    c.force_login(operator)
    body = c.post("/api/v1/catalog/models/chat/update-check/").json()
    assert body == {
        "model": "chat",
        "state": "available",
        "revision": first,
        "latest": latest,
        "changed": ["model.safetensors"],
        "added": [],
        "removed": [],
        "message": body["message"],
    }
    c.force_login(viewer)
    assert c.get("/api/v1/catalog/models/chat/update-check/").json()["state"] == "available"
    assert c.post("/api/v1/catalog/models/nope/update-check/").status_code in (403, 404)
    c.force_login(operator)
    assert c.post("/api/v1/catalog/models/nope/update-check/").status_code == 404


def test_the_panel_shows_update_available_and_only_operators_get_the_button(
    hub: HubStandIn, operator: Any, viewer: Any
) -> None:
    hub.commit("org/chat", {"model.safetensors": b"1" * 100})
    store(gpu_model("chat"))
    mirror.run_fetch(mirror.request_fetch("chat", start=False).pk)
    hub.commit("org/chat", {"model.safetensors": b"2" * 100})
    c = Client()
    c.force_login(operator)
    page = c.post("/updates/models/chat/check/", HTTP_HX_REQUEST="true").content.decode()
    assert "update available" in page and 'data-role="check-updates"' in page
    c.force_login(viewer)
    page = c.get("/updates/models/chat/panel/").content.decode()
    assert "update available" in page and 'data-role="check-updates"' not in page
    assert c.post("/updates/models/chat/check/").status_code == 403
    assert 'hx-get="/updates/models/chat/panel/"' in c.get("/catalog/models/chat/").content.decode()


def test_the_mirror_page_says_what_it_holds_for_whom(
    hub: HubStandIn, viewer: Any, settings: Any
) -> None:
    settings.LLMGW_MIRROR_MAX_GB = 1
    hub.commit("org/chat", {"model.safetensors": WEIGHTS})
    store(gpu_model("chat"))
    mirror.run_fetch(mirror.request_fetch("chat", start=False).pk)
    c = Client()
    c.force_login(viewer)
    page = c.get("/updates/mirror/").content.decode()
    assert "org/chat" in page and "chat" in page and "(current)" in page
    assert "of its cap of" in page and "LLMGW_MIRROR_MAX_GB=1.0" in page
    assert str(settings.LLMGW_MIRROR_DIR) not in page  # operators see the folder


def test_a_url_on_a_host_the_mirror_does_not_fetch_from_is_left_to_the_nodes(
    hub: HubStandIn, settings: Any
) -> None:
    settings.LLMGW_MIRROR_HOSTS = ["https://huggingface.co"]
    store(gpu_model("chat", source=f"{hub.url}/plain/w.gguf"))
    node, token = join_node("n1")
    _place("chat", node)
    answer = _node_client(token).get("/api/v1/updates/mirror/models/chat/")
    assert answer.status_code == 404 and "LLMGW_MIRROR_HOSTS" in answer.json()["detail"]
    assert Fetch.objects.count() == 0 and hub.requests == []


def test_the_catalog_list_shows_update_available_as_the_live_view_pushes_it(
    hub: HubStandIn, viewer: Any
) -> None:
    from updates import checking, live

    hub.commit("org/chat", {"model.safetensors": b"1" * 100})
    store(gpu_model("chat"), gpu_model("other"))
    mirror.run_fetch(mirror.request_fetch("chat", start=False).pk)
    hub.commit("org/chat", {"model.safetensors": b"2" * 100})
    checking.check_models(["chat"])
    c = Client()
    c.force_login(viewer)
    page = c.get("/catalog/").content.decode()
    pushed = live.badges_changed(["chat", "other"], False)
    assert pushed["chat"].strip() in page and "update available" in pushed["chat"]
    assert pushed["other"].strip() in page and "update available" not in pushed["other"]
    assert f'id="{live.badge_dom_id("chat")}"' in pushed["chat"]


def test_the_api_shows_a_model_s_fetches_and_what_the_mirror_holds(
    hub: HubStandIn, viewer: Any, outsider: Any
) -> None:
    hub.commit("org/chat", {"model.safetensors": WEIGHTS})
    store(gpu_model("chat"))
    f = mirror.request_fetch("chat", start=False)
    c = Client()
    c.force_login(viewer)
    [queued] = c.get("/api/v1/catalog/models/chat/mirror/").json()
    assert queued["state"] == "queued" and queued["id"] == f.pk
    mirror.run_fetch(f.pk)
    [done] = c.get("/api/v1/catalog/models/chat/mirror/").json()
    assert done["state"] == "done" and done["bytes_done"] == done["bytes_total"] == len(WEIGHTS)
    held = c.get("/api/v1/updates/mirror/").json()
    assert held["bytes"] == len(WEIGHTS)
    assert held["held"][0]["models"] == [{"model": "chat", "as": "current"}]
    assert c.get("/api/v1/catalog/models/nope/mirror/").status_code == 404
    c.force_login(outsider)
    assert c.get("/api/v1/updates/mirror/").status_code == 403


def test_a_node_reads_the_manifest_of_a_model_named_with_a_slash(hub: HubStandIn) -> None:
    # The agent writes the name percent-encoded (agent.mirror): org%2Fchat.
    from urllib.parse import quote

    hub.commit("org/chat", {"model.safetensors": WEIGHTS})
    store(gpu_model("team/chat", source="org/chat"))
    node, token = join_node("n0")
    _place("team/chat", node)
    url = f"/api/v1/updates/mirror/models/{quote('team/chat', safe='')}/"
    assert _node_client(token).get(url).status_code == 202
    assert Fetch.objects.count() == 1
