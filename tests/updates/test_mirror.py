"""The weights mirror against the Hub stand-in, through the real library: fetched once,
resumed, checked against the sha256 published, renamed into place, the origin written."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest

from tests.catalog.samples import gpu_model, store
from tests.updates.hubstandin import Blob, HubStandIn
from updates import mirror, registry
from updates.models import Fetch, FetchState

pytestmark = pytest.mark.django_db

WEIGHTS = bytes(range(256)) * 4096  # 1 MiB


def _fetch(name: str = "chat", revision: str | None = None) -> Fetch:
    f = mirror.request_fetch(name, revision, by="test", surface="cli", start=False)
    out = mirror.run_fetch(f.pk)
    assert out is not None
    return out


def _origin(name: str = "chat") -> Any:
    from catalog.services import stored_specs

    return stored_specs(names=[name])[0].origin


def test_a_fetch_puts_every_file_in_place_and_writes_the_origin(hub: HubStandIn) -> None:
    sha = hub.commit(
        "org/chat",
        {"model.safetensors": WEIGHTS, "config.json": b"{}", "README.md": b"# chat"},
    )
    store(gpu_model("chat"))
    f = _fetch()
    assert f.state == FetchState.DONE, f.reason
    assert f.commit == sha
    folder = mirror.local_path("chat", sha)
    assert folder is not None and (folder / "model.safetensors").read_bytes() == WEIGHTS
    assert (folder / "config.json").read_bytes() == b"{}"
    assert not list(folder.parent.glob("*.part"))
    origin = _origin()
    assert origin.repo == "org/chat" and origin.revision == sha
    assert [(o.path, o.sha256, o.bytes) for o in origin.files] == [
        ("model.safetensors", hashlib.sha256(WEIGHTS).hexdigest(), len(WEIGHTS))
    ]
    from catalog.models import ChangeRecord

    record = ChangeRecord.objects.filter(model_name="chat").order_by("-id").first()
    assert record.surface == "updates" and "origin" in record.summary
    assert record.actor_name == "mirror (test)"
    assert f.bytes_done == f.bytes_total == len(WEIGHTS) + 2 + 6


def test_asking_again_while_queued_gets_the_same_fetch(hub: HubStandIn) -> None:
    hub.commit("org/chat", {"model.safetensors": WEIGHTS})
    store(gpu_model("chat"))
    first = mirror.request_fetch("chat", start=False)
    assert all(mirror.request_fetch("chat", start=False).pk == first.pk for _ in range(3))
    assert Fetch.objects.count() == 1


def test_four_nodes_asking_cost_one_download(hub: HubStandIn) -> None:
    hub.commit("org/chat", {"model.safetensors": WEIGHTS, "config.json": b"{}"})
    store(gpu_model("chat"))
    answers = [mirror.manifest("chat", by=f"node-{i}") for i in range(4)]
    assert {a.fetch.pk for a in answers} == {answers[0].fetch.pk}
    mirror.run_fetch(answers[0].fetch.pk)
    for _ in range(4):
        m = mirror.manifest("chat")
        assert m.state == "done" and {f["path"] for f in m.files} == {
            "model.safetensors",
            "config.json",
        }
    assert hub.count("GET", "/resolve/") == 2  # each file once
    assert hub.count("GET", "/api/models/org/chat") == 1


def test_a_download_broken_halfway_is_resumed_with_range(hub: HubStandIn) -> None:
    big = WEIGHTS * 4
    hub.commit("org/chat", {"model.safetensors": big})
    store(gpu_model("chat"))
    hub.break_after["model.safetensors"] = len(big) // 2
    f = _fetch()
    assert f.state == FetchState.DONE, f.reason
    ranges = [r for m, p, r in hub.requests if m == "GET" and "/resolve/" in p]
    assert ranges == ["", f"bytes={len(big) // 2}-"]
    assert (mirror.local_path("chat") / "model.safetensors").read_bytes() == big


def test_a_fetch_that_failed_halfway_resumes_from_its_part_file(hub: HubStandIn) -> None:
    hub.commit("org/chat", {"model.safetensors": WEIGHTS})
    store(gpu_model("chat"))
    # A partial download left by an earlier try (a worker that died): the same folder.
    state = registry.latest("org/chat")
    part_dir = mirror.root() / (mirror.folder_for("org/chat", state.commit) + ".part")
    part_dir.mkdir(parents=True)
    (part_dir / "model.safetensors.part").write_bytes(WEIGHTS[:300_000])
    f = _fetch()
    assert f.state == FetchState.DONE, f.reason
    assert [r for m, p, r in hub.requests if m == "GET" and "/resolve/" in p] == ["bytes=300000-"]


def test_bytes_that_do_not_match_their_sha256_are_refused_and_nothing_is_renamed(
    hub: HubStandIn,
) -> None:
    sha = hub.commit("org/chat", {"model.safetensors": WEIGHTS, "config.json": b"{}"})
    store(gpu_model("chat"))
    hub.wrong_bytes.add("model.safetensors")
    f = _fetch()
    assert f.state == FetchState.FAILED
    assert "model.safetensors" in f.reason and "sha256" in f.reason
    assert mirror.local_path("chat", sha) is None
    final = mirror.root() / mirror.folder_for("org/chat", sha)
    assert not final.exists()
    assert not list(final.parent.rglob("model.safetensors*"))
    assert _origin() is None  # nothing written


def test_a_repository_gone_fails_the_fetch_with_the_reason_and_changes_nothing(
    hub: HubStandIn,
) -> None:
    store(gpu_model("chat"))
    f = _fetch()
    assert f.state == FetchState.FAILED and "is not there" in f.reason
    assert _origin() is None


def test_the_size_cap_refuses_a_fetch_with_the_reason(hub: HubStandIn, settings: Any) -> None:
    settings.LLMGW_MIRROR_MAX_GB = 0.0005  # 500 kB
    hub.commit("org/chat", {"model.safetensors": WEIGHTS})
    store(gpu_model("chat"))
    f = _fetch()
    assert f.state == FetchState.FAILED
    assert "LLMGW_MIRROR_MAX_GB" in f.reason and "needs 1.0 MB" in f.reason
    assert hub.count("GET", "/resolve/") == 0


def test_a_url_source_is_mirrored_and_checked_against_its_sha256(hub: HubStandIn) -> None:
    hub.plain["small.gguf"] = Blob(WEIGHTS)
    store(gpu_model("chat", source=f"{hub.url}/plain/small.gguf"))
    f = _fetch()
    assert f.state == FetchState.DONE, f.reason
    assert (mirror.local_path("chat") / "small.gguf").read_bytes() == WEIGHTS
    origin = _origin()
    assert origin.revision == hashlib.sha256(WEIGHTS).hexdigest()
    assert origin.files[0].path == "small.gguf"


def test_the_mirror_keeps_the_current_and_previous_revision_and_drops_others(
    hub: HubStandIn,
) -> None:
    from catalog import spec
    from catalog.services import SYSTEM, save_model, stored_specs

    first = hub.commit("org/chat", {"model.safetensors": b"1" * 1000})
    store(gpu_model("chat"))
    assert _fetch().state == FetchState.DONE
    second = hub.commit("org/chat", {"model.safetensors": b"2" * 1000})
    assert _fetch(revision=second).state == FetchState.DONE
    third = hub.commit("org/chat", {"model.safetensors": b"3" * 1000})
    # An update's promote: the origin moves to the second, the first kept as previous.
    m = stored_specs(names=["chat"])[0]
    m.origin = spec.Origin(
        repo="org/chat",
        revision=second,
        files=m.origin.files,
        previous=spec.PreviousOrigin(source="org/chat", revision=first),
    )
    save_model(m, SYSTEM, replacing="chat")
    assert _fetch(revision=third).state == FetchState.DONE  # the next candidate
    held = {h.commit: h.roles for h in mirror.holdings()}
    assert held == {first: ["previous"], second: ["current"], third: ["candidate"]}
    m = stored_specs(names=["chat"])[0]
    m.origin.previous = spec.PreviousOrigin(source="org/chat", revision=second)
    m.origin.revision = third
    save_model(m, SYSTEM, replacing="chat")
    mirror.prune()
    assert mirror.local_path("chat", first) is None
    assert not (mirror.root() / mirror.folder_for("org/chat", first)).exists()
    assert mirror.local_path("chat", second) is not None
    assert mirror.local_path("chat", third) is not None


def test_a_model_without_a_registry_source_is_refused(hub: HubStandIn) -> None:
    from tests.catalog.samples import cpu_model

    store(cpu_model("small"))
    with pytest.raises(mirror.MirrorError, match="nothing to mirror"):
        mirror.request_fetch("small")


def test_the_mirror_off_refuses_a_fetch(hub: HubStandIn, settings: Any) -> None:
    settings.LLMGW_MIRROR = False
    store(gpu_model("chat"))
    with pytest.raises(mirror.MirrorError, match="LLMGW_MIRROR=off"):
        mirror.request_fetch("chat")


def test_the_newest_asked_right_after_a_fetch_is_the_registry_s_newest_commit(
    hub: HubStandIn,
) -> None:
    v1 = hub.commit("org/chat", {"model.safetensors": WEIGHTS})
    store(gpu_model("chat"))
    first = _fetch("chat", "")
    assert (first.state, first.commit) == ("done", v1)
    # Asked again at once with nothing new: that fetch is it (no second download).
    assert mirror.request_fetch("chat", "", start=False).pk == first.pk
    v2 = hub.commit("org/chat", {"model.safetensors": WEIGHTS[::-1]})
    asked = mirror.request_fetch("chat", "", start=False)
    assert asked.pk != first.pk
    again = mirror.run_fetch(asked.pk)
    assert again is not None and (again.state, again.commit) == ("done", v2)
    assert mirror.request_fetch("chat", "", start=False).pk == again.pk
    # The model pins v1 (its origin): asked with no revision, that is what it gets.
    assert mirror.request_fetch("chat", start=False).pk == first.pk


def test_the_newest_asked_while_an_older_commit_is_being_fetched_is_its_own_fetch(
    hub: HubStandIn,
) -> None:
    v1 = hub.commit("org/chat", {"model.safetensors": WEIGHTS})
    store(gpu_model("chat"))
    older = mirror.request_fetch("chat", "", start=False)
    Fetch.objects.filter(pk=older.pk).update(state=FetchState.FETCHING, commit=v1)
    v2 = hub.commit("org/chat", {"model.safetensors": WEIGHTS[::-1]})
    # A node's ask takes the fetch in progress as it is; one asking for the newest by
    # name gets a fetch of the newer commit.
    assert mirror.request_fetch("chat", None, start=False).pk == older.pk
    newer = mirror.request_fetch("chat", "", start=False)
    assert newer.pk != older.pk and newer.revision == v2
    assert mirror.request_fetch("chat", "", start=False).pk == newer.pk


def test_the_newest_asked_of_a_registry_that_does_not_answer_fails_with_its_reason(
    hub: HubStandIn,
) -> None:
    hub.commit("org/chat", {"model.safetensors": WEIGHTS})
    store(gpu_model("chat"))
    first = _fetch("chat", "")
    hub.delete("org/chat")
    f = _fetch("chat", "")
    assert f.pk != first.pk and f.state == "failed" and "is not there" in f.reason


@pytest.mark.parametrize(
    "name",
    ["evil\r\nX-Injected: 1.safetensors", "a\x1b[31m.bin", "<img src=x onerror=alert(1)>.gguf"],
)
def test_a_file_name_with_a_line_break_a_control_or_html_is_refused_at_the_registry(
    hub: HubStandIn, name: str
) -> None:
    hub.commit("org/chat", {"model.safetensors": WEIGHTS, name: b"x"})
    store(gpu_model("chat"))
    f = _fetch()
    assert f.state == FetchState.FAILED
    assert "is not a file's name" in f.reason and "nothing was taken" in f.reason
    assert hub.count("GET", "/resolve/") == 0  # nothing downloaded
    assert not (mirror.root() / "hf").exists() or not list((mirror.root() / "hf").rglob("*.*"))
    assert _origin() is None  # nothing written to the catalog


def test_a_file_name_with_a_space_is_fetched(hub: HubStandIn) -> None:
    sha = hub.commit("org/chat", {"my model.safetensors": WEIGHTS})
    store(gpu_model("chat"))
    f = _fetch()
    assert f.state == FetchState.DONE, f.reason
    folder = mirror.local_path("chat", sha)
    assert folder is not None and (folder / "my model.safetensors").read_bytes() == WEIGHTS
    assert [o.path for o in _origin().files] == ["my model.safetensors"]


def _disk(monkeypatch: pytest.MonkeyPatch, free: int) -> None:
    """The mirror's disk as having ``free`` bytes free."""
    import shutil
    from collections import namedtuple

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10**9, 10**9 - free, free))


def test_a_resume_with_room_for_the_rest_is_allowed(
    hub: HubStandIn, monkeypatch: pytest.MonkeyPatch
) -> None:
    hub.commit("org/chat", {"model.safetensors": WEIGHTS})
    store(gpu_model("chat"))
    state = registry.latest("org/chat")
    part_dir = mirror.root() / (mirror.folder_for("org/chat", state.commit) + ".part")
    part_dir.mkdir(parents=True)
    (part_dir / "model.safetensors.part").write_bytes(WEIGHTS[:800_000])
    _disk(monkeypatch, len(WEIGHTS) - 700_000)  # not the whole file: the rest, and more
    f = _fetch()
    assert f.state == FetchState.DONE, f.reason
    assert [r for m, p, r in hub.requests if m == "GET" and "/resolve/" in p] == ["bytes=800000-"]


def test_a_resume_without_room_for_the_rest_says_what_is_held(
    hub: HubStandIn, monkeypatch: pytest.MonkeyPatch
) -> None:
    hub.commit("org/chat", {"model.safetensors": WEIGHTS})
    store(gpu_model("chat"))
    state = registry.latest("org/chat")
    part_dir = mirror.root() / (mirror.folder_for("org/chat", state.commit) + ".part")
    part_dir.mkdir(parents=True)
    (part_dir / "model.safetensors.part").write_bytes(WEIGHTS[:500_000])
    _disk(monkeypatch, 100_000)
    f = _fetch()
    assert f.state == FetchState.FAILED
    assert f"needs {(len(WEIGHTS) - 500_000) / 1e6:.1f} MB more (0.5 MB of it held" in f.reason
    assert hub.count("GET", "/resolve/") == 0
    assert (part_dir / "model.safetensors.part").stat().st_size == 500_000  # kept


def test_a_disk_that_fills_up_mid_fetch_is_freed_and_the_mirror_page_says_so(
    hub: HubStandIn, monkeypatch: pytest.MonkeyPatch, viewer: Any
) -> None:
    import errno

    from django.test import Client

    from agent import transfer

    hub.commit("org/chat", {"model.safetensors": WEIGHTS * 8})
    store(gpu_model("chat"))
    monkeypatch.setattr(transfer, "CHUNK", 1 << 20, raising=False)
    real = transfer._Part._write
    calls = []

    def write(self: Any, view: memoryview) -> int:
        calls.append(len(view))
        if len(calls) > 1:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, view)

    monkeypatch.setattr(transfer._Part, "_write", write)
    f = _fetch()
    assert f.state == FetchState.FAILED, f.reason
    assert f.reason.startswith("the mirror's disk filled up while fetching org/chat")
    assert "No space left on device" in f.reason and "deleted the " in f.reason
    assert not [p for p in mirror.root().rglob("*") if p.is_file() and ".locks" not in p.parts]
    c = Client()
    c.force_login(viewer)
    page = c.get("/updates/mirror/").content.decode()
    assert 'data-role="disk-filled"' in page and 'data-role="mirror-disk"' in page
    assert "deleted the " in page


def test_a_fetch_a_dead_worker_left_is_said_so_then_failed(hub: HubStandIn, viewer: Any) -> None:
    from datetime import timedelta

    from django.test import Client
    from django.utils import timezone

    from updates import run

    hub.commit("org/chat", {"model.safetensors": WEIGHTS})
    store(gpu_model("chat"))
    f = mirror.request_fetch("chat", start=False)
    gone = timezone.now() - timedelta(seconds=mirror.fetches.STALE_AFTER_S + 5)
    Fetch.objects.filter(pk=f.pk).update(state="fetching", bytes_total=len(WEIGHTS), updated=gone)
    from updates import signals

    assert signals.worth_a_look()  # a tick looks while a fetch is under way
    run.advance_all()  # every tick's look
    f.refresh_from_db()
    assert f.state == "fetching" and f.reason.startswith("its worker stopped (no progress for")
    assert "queued again" in f.reason
    c = Client()
    c.force_login(viewer)
    assert 'data-role="fetch-note"' in c.get("/updates/mirror/").content.decode()
    run.advance_all()  # moved just now: not stale
    f.refresh_from_db()
    assert f.state == "fetching"
    Fetch.objects.filter(pk=f.pk).update(updated=gone)
    run.advance_all()
    f.refresh_from_db()
    assert f.state == "failed" and f.reason.startswith("its worker stopped again")
    assert f.finished is not None
