"""The update check: pure (hypothesis) and against the Hub stand-in through the library."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.catalog.samples import gpu_model, store
from tests.updates.hubstandin import HubStandIn
from updates import check, checking, mirror

paths = st.sampled_from(["a.safetensors", "b.safetensors", "c.gguf", "d.bin"])
shas = st.sampled_from(["1" * 64, "2" * 64, "3" * 64])
files = st.dictionaries(paths, shas, max_size=4)


def _w(d: dict[str, str]) -> list[check.Weights]:
    return [check.Weights(p, s, 10) for p, s in d.items()]


@given(files, files)
def test_an_update_is_exactly_the_weights_changed_added_or_removed(
    have: dict[str, str], published: dict[str, str]
) -> None:
    r = check.compare("m", "r1", _w(have), "r2", _w(published))
    assert r.added == sorted(set(published) - set(have))
    assert r.removed == sorted(set(have) - set(published))
    assert r.changed == sorted(p for p in set(have) & set(published) if have[p] != published[p])
    assert (r.state == check.AVAILABLE) == bool(r.added or r.removed or r.changed)
    assert r.state in (check.AVAILABLE, check.CURRENT)


@given(files)
def test_a_new_commit_with_the_same_weights_is_not_an_update(have: dict[str, str]) -> None:
    r = check.compare("m", "r1", _w(have), "r2", _w(have))
    assert r.state == check.CURRENT and "not an update" in r.message


# -- against the stand-in ----------------------------------------------------------------


def _mirrored(hub: HubStandIn, files: dict[str, bytes]) -> str:
    sha = hub.commit("org/chat", files)
    store(gpu_model("chat"))
    f = mirror.request_fetch("chat", start=False)
    assert mirror.run_fetch(f.pk).state == "done"
    return sha


BASE = {"model.safetensors": b"w1" * 500, "README.md": b"# one", "config.json": b"{}"}


@pytest.mark.django_db
def test_weights_changed_is_an_update(hub: HubStandIn) -> None:
    first = _mirrored(hub, BASE)
    latest = hub.commit("org/chat", {"model.safetensors": b"w2" * 500}, keep=True)
    [r] = checking.check_models(["chat"], by="test")
    assert (r.state, r.revision, r.latest, r.changed) == (
        "available",
        first,
        latest,
        ["model.safetensors"],
    )
    assert checking.last_checks(["chat"])["chat"].state == "available"


@pytest.mark.django_db
def test_a_readme_only_commit_is_not_an_update(hub: HubStandIn) -> None:
    _mirrored(hub, BASE)
    hub.commit("org/chat", {"README.md": b"# two", "config.json": b'{"a": 1}'}, keep=True)
    [r] = checking.check_models(["chat"])
    assert r.state == "current" and r.changed == r.added == r.removed == []
    assert "not an update" in r.message


@pytest.mark.django_db
def test_a_file_added_and_a_file_removed_are_updates(hub: HubStandIn) -> None:
    _mirrored(hub, {**BASE, "extra.safetensors": b"x" * 100})
    hub.commit("org/chat", {"model-2.safetensors": b"y" * 100}, keep=True)
    hub.remove("org/chat", "extra.safetensors")
    [r] = checking.check_models(["chat"])
    assert (r.state, r.added, r.removed, r.changed) == (
        "available",
        ["model-2.safetensors"],
        ["extra.safetensors"],
        [],
    )


@pytest.mark.django_db
def test_a_repository_gone_is_an_error_with_the_reason_and_changes_nothing(
    hub: HubStandIn,
) -> None:
    from catalog.services import stored_specs

    _mirrored(hub, BASE)
    before = stored_specs(names=["chat"])[0]
    hub.delete("org/chat")
    [r] = checking.check_models(["chat"])
    assert r.state == "error" and "is not there" in r.message
    assert stored_specs(names=["chat"])[0] == before


@pytest.mark.django_db
def test_a_model_not_in_the_catalog_is_an_error_and_the_others_are_checked(
    hub: HubStandIn,
) -> None:
    _mirrored(hub, BASE)
    results = checking.check_models(["nope", "chat"])
    assert [(r.model, r.state) for r in results] == [("nope", "error"), ("chat", "current")]


@pytest.mark.django_db
def test_every_model_with_a_registry_is_checked_when_none_is_named(
    hub: HubStandIn, settings: Any
) -> None:
    from tests.catalog.samples import cpu_model

    _mirrored(hub, BASE)
    newest = hub.commit("org/other", {"model.safetensors": b"o" * 10, "README.md": b"o"})
    store(gpu_model("other"))  # never fetched: checked against the registry's newest
    store(cpu_model("local"))  # a local path: no registry
    found = {r.model: r for r in checking.check_models()}
    assert sorted(found) == ["chat", "other"]
    other = found["other"]
    assert (other.state, other.revision, other.latest, other.added) == (
        "available",
        "",
        newest,
        ["model.safetensors"],
    )
    assert other.message.startswith(f"never fetched: {newest[:8]} is the newest revision")
    assert "fetch it now" in other.message


@pytest.mark.django_db
def test_a_model_never_fetched_is_checked_then_fetched_now_through_the_api(
    hub: HubStandIn, operator: Any, viewer: Any, settings: Any
) -> None:
    from django.test import Client

    settings.REDIS_URL = ""
    newest = hub.commit("org/chat", BASE)
    store(gpu_model("chat"))
    c = Client()
    c.force_login(operator)
    body = c.post("/api/v1/catalog/models/chat/update-check/").json()
    assert (body["state"], body["latest"]) == ("available", newest)
    assert "never fetched" in body["message"] and "no origin" not in body["message"]
    c.force_login(viewer)
    assert c.post("/api/v1/catalog/models/chat/mirror/").status_code == 403
    c.force_login(operator)
    answer = c.post("/api/v1/catalog/models/chat/mirror/")
    assert answer.status_code == 202, answer.content
    f = mirror.run_fetch(answer.json()["id"])
    assert f is not None and f.state == "done", f.reason
    from catalog.services import stored_specs

    assert stored_specs(names=["chat"])[0].origin.revision == newest
    [r] = checking.check_models(["chat"])
    assert r.state == "current"
    store(gpu_model("local", source="/models/x"))
    refused = c.post("/api/v1/catalog/models/local/mirror/")
    assert refused.status_code == 400 and "nothing to mirror" in refused.json()["detail"]


@pytest.mark.django_db
def test_the_panel_offers_fetch_now_for_a_model_never_fetched(
    hub: HubStandIn, operator: Any, viewer: Any
) -> None:
    from django.test import Client

    from updates.models import Fetch

    hub.commit("org/chat", BASE)
    store(gpu_model("chat"))
    c = Client()
    c.force_login(viewer)
    assert 'data-role="fetch-now"' not in c.get("/updates/models/chat/panel/").content.decode()
    assert c.post("/updates/models/chat/fetch/").status_code == 403
    c.force_login(operator)
    page = c.post("/updates/models/chat/check/", HTTP_HX_REQUEST="true").content.decode()
    assert 'data-role="never-fetched"' in page and 'data-role="fetch-now"' in page
    assert "update available" not in page
    page = c.post("/updates/models/chat/fetch/", HTTP_HX_REQUEST="true").content.decode()
    assert 'data-role="fetch-now"' not in page  # its fetch is queued: shown instead
    assert Fetch.objects.filter(model="chat", surface="console").count() == 1


@pytest.mark.django_db
def test_the_periodic_job_checks_every_model_with_an_origin_and_resumes_a_dead_fetch(
    hub: HubStandIn,
) -> None:
    from datetime import timedelta

    from django.utils import timezone

    from updates import tasks
    from updates.models import Fetch, UpdateCheck

    _mirrored(hub, BASE)
    hub.commit("org/chat", {"model.safetensors": b"w2" * 500}, keep=True)
    store(gpu_model("left"))
    hub.commit("org/left", {"model.safetensors": b"l" * 10})
    left = mirror.request_fetch("left", start=False)
    Fetch.objects.filter(pk=left.pk).update(
        state="fetching", updated=timezone.now() - timedelta(minutes=10)
    )
    assert tasks.check_for_updates() == 2  # "left", never fetched, against the newest
    assert UpdateCheck.objects.get(model="chat").state == "available"
    # Taken up again (queued for a worker): its row was moved.
    assert Fetch.objects.get(pk=left.pk).updated > timezone.now() - timedelta(minutes=1)


@pytest.mark.django_db
def test_a_url_source_s_new_content_is_an_update_whatever_its_name(hub: HubStandIn) -> None:
    from tests.updates.hubstandin import Blob

    hub.plain["weights"] = Blob(b"v1" * 100)
    store(gpu_model("chat", source=f"{hub.url}/plain/weights"))
    assert mirror.run_fetch(mirror.request_fetch("chat", start=False).pk).state == "done"
    [same] = checking.check_models(["chat"])
    assert same.state == "current"
    hub.plain["weights"] = Blob(b"v2" * 100)
    [r] = checking.check_models(["chat"])
    assert (r.state, r.changed) == ("available", ["weights"])


def test_a_file_kept_in_git_is_compared_by_its_blob_id_before_its_size() -> None:
    have = [check.Weights("sim-weights.json", "", 40, "a" * 40)]
    same_size = [check.Weights("sim-weights.json", "", 40, "b" * 40)]
    assert check.compare("m", "r1", have, "r2", same_size).changed == ["sim-weights.json"]
    unchanged = [check.Weights("sim-weights.json", "", 40, "a" * 40)]
    assert check.compare("m", "r1", have, "r2", unchanged).state == "current"


def test_the_sim_s_weights_file_is_weights_wherever_it_lies() -> None:
    from updates import registry

    assert registry.is_weights("sim-weights.json")
    assert registry.is_weights("v2/sim-weights.json")
    assert not registry.is_weights("config.json")
    assert not registry.is_weights("my-sim-weights.json.md")


SIM_V1 = b'{"llmgw-sim-weights": 1, "name": "v1", "arithmetic": 0.95}'
SIM_V2 = b'{"llmgw-sim-weights": 1, "name": "v2", "arithmetic": 0.50}'


@pytest.mark.django_db
def test_a_sim_repository_whose_weights_file_changed_is_an_update(hub: HubStandIn) -> None:
    # The same size, kept in git (not LFS, as the Hub keeps a small .json): only its
    # git blob id tells the two apart; a README-only commit after it is still current.
    assert len(SIM_V1) == len(SIM_V2)
    first = _mirrored(hub, {"sim-weights.json": SIM_V1, "README.md": b"# sim"})
    [same] = checking.check_models(["chat"])
    assert same.state == "current", same.message
    hub.commit("org/chat", {"README.md": b"# sim, again"}, keep=True)
    assert checking.check_models(["chat"])[0].state == "current"
    latest = hub.commit("org/chat", {"sim-weights.json": SIM_V2}, keep=True)
    [r] = checking.check_models(["chat"])
    assert (r.state, r.revision, r.latest, r.changed) == (
        "available",
        first,
        latest,
        ["sim-weights.json"],
    )


@pytest.mark.django_db(transaction=True)
def test_a_check_against_a_slow_registry_shows_checking_while_it_runs(
    hub: HubStandIn, client_for: Any, viewer: Any
) -> None:
    import threading

    from django.db import connection

    from tests.waiting import wait_until

    _mirrored(hub, BASE)
    hub.commit("org/chat", {"model.safetensors": b"w2" * 500}, keep=True)
    hub.hold = threading.Event()
    found: list[check.Result] = []

    def check_in_a_thread() -> None:
        try:
            found.extend(checking.check_models(["chat"], by="test"))
        finally:
            connection.close()

    thread = threading.Thread(target=check_in_a_thread)
    thread.start()
    try:
        wait_until(lambda: checking.checking_now(["chat"]), 30, "the check to start")
        c = client_for(viewer)
        page = c.get("/updates/").content.decode()
        assert 'data-model="chat" data-state="checking"' in page
        assert 'data-role="checking"' in c.get("/updates/models/chat/panel/").content.decode()
    finally:
        hub.hold.set()
        thread.join(60)
    assert [r.state for r in found] == ["available"]
    assert checking.checking_now(["chat"]) == set()
    page = client_for(viewer).get("/updates/").content.decode()
    assert 'data-model="chat" data-state="available"' in page
    assert (
        'data-role="checking"'
        not in client_for(viewer).get("/updates/models/chat/panel/").content.decode()
    )
