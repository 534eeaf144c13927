"""The mirror keeps each file's content once (``blobs/<sha256>``, each revision a folder of
links to them), and so does a node: an update that changes one file of eight fetches one
file from the registry and a node takes one from the mirror (the Hub stand-in through
``huggingface_hub``, a live server, the node's own agent code); ``prune`` keeps a blob a kept
revision links; a damaged blob is not served and is fetched again; folders from before the
blobs keep working and are turned into links."""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
from pathlib import Path
from typing import Any

import httpx
import pytest

from agent.mirror import VERIFIED, MirrorClient
from tests.catalog.samples import gpu_model, store
from tests.updates.hubstandin import HubStandIn
from tests.updates.test_agent_mirror import _node
from updates import mirror
from updates.models import Fetch, FetchState

pytestmark = pytest.mark.django_db(transaction=True)

SHARD = 256 * 1024


@pytest.fixture
def served(hub: HubStandIn, settings: Any, live_server: Any) -> Any:
    """The live server runs a fetch in a thread of its own (the embedded way)."""
    settings.REDIS_URL = ""
    return live_server


def _shard(i: int, version: int = 1) -> bytes:
    return hashlib.sha256(f"{i}:{version}".encode()).digest() * (SHARD // 32)


def _eight(version_of_last: int = 1) -> dict[str, bytes]:
    """A model of eight files: six shards (LFS: sha256 published) and two files kept in git
    (only their git blob id published)."""
    files = {f"model-{i:05d}-of-00006.safetensors": _shard(i) for i in range(1, 6)}
    files["model-00006-of-00006.safetensors"] = _shard(6, version_of_last)
    files["config.json"] = b'{"architectures": ["LlamaForCausalLM"]}'
    files["tokenizer.json"] = b'{"version": "1.0"}' * 100
    return files


def _promote(name: str, revision: str, previous: str) -> None:
    """Move a model to ``revision``, ``previous`` kept as its previous (an update's
    promote)."""
    from catalog import spec
    from catalog.services import SYSTEM, save_model, stored_specs

    m = stored_specs(names=[name])[0]
    m.origin = spec.Origin(
        repo=m.origin.repo,
        revision=revision,
        files=m.origin.files,
        previous=spec.PreviousOrigin(source=m.source, revision=previous),
    )
    save_model(m, SYSTEM, replacing=name)


def _fetch(name: str = "chat", revision: str | None = None) -> Fetch:
    f = mirror.run_fetch(mirror.request_fetch(name, revision, start=False).pk)
    assert f is not None and f.state == FetchState.DONE, f and f.reason
    return f


def _blobs(folder: Path) -> set[str]:
    return {p.name for p in (folder / "blobs").iterdir()} if (folder / "blobs").is_dir() else set()


def _resolved(hub: HubStandIn, commit: str) -> list[str]:
    """The files downloaded from the registry at ``commit``."""
    marker = f"/resolve/{commit}/"
    return [p.split(marker, 1)[1] for m, p, _ in hub.requests if m == "GET" and marker in p]


def test_an_update_of_one_file_of_eight_fetches_one_on_the_mirror_and_one_on_the_node(
    hub: HubStandIn, served: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    v1 = hub.commit("org/chat", _eight())
    store(gpu_model("chat"))
    token = _node("n1", "chat")
    node = tmp_path / "weights"
    client = MirrorClient(served.url, token, node, poll_s=0.1)
    first = Path(client.fetch("chat", "org/chat", "vllm") or "")
    assert len(_resolved(hub, v1)) == 8 and client.took.files == 8

    v2 = hub.commit("org/chat", _eight(version_of_last=2))
    _promote("chat", v2, v1)
    with caplog.at_level(logging.INFO, logger="agent.mirror"):
        second = Path(client.fetch("chat", "org/chat", "vllm") or "")
    # The mirror fetched the one file that changed; the node took that one from it.
    assert _resolved(hub, v2) == ["model-00006-of-00006.safetensors"]
    assert (client.took.files, client.took.bytes, client.took.held) == (1, SHARD, 0)
    assert "took 1 of 8 files of org/chat" in caplog.text
    assert second != first
    for name, data in _eight(version_of_last=2).items():
        assert (second / name).read_bytes() == data
    assert (first / "model-00006-of-00006.safetensors").read_bytes() == _shard(6, 1)
    # One copy of each content, on the mirror and on the node: nine, not sixteen.
    assert len(_blobs(mirror.root())) == 9 and len(_blobs(node / "mirror")) == 9
    assert os.stat(first / "config.json").st_ino == os.stat(second / "config.json").st_ino
    # What the pages and the API say of a revision is unchanged: its size, whole.
    done = Fetch.objects.get(commit=v2)
    assert done.bytes_total == done.bytes_done == sum(len(d) for d in _eight().values())
    # Asked again (a replica restarted): nothing is taken.
    assert client.fetch("chat", "org/chat", "vllm") == str(second)
    assert (client.took.files, client.took.held) == (0, 8)


def test_prune_keeps_a_blob_a_kept_revision_links(hub: HubStandIn, viewer: Any) -> None:
    from django.test import Client

    shared = b"s" * 5000
    v1 = hub.commit("org/chat", {"a.safetensors": shared, "b.safetensors": b"1" * 5000})
    store(gpu_model("chat"))
    _fetch()
    v2 = hub.commit("org/chat", {"a.safetensors": shared, "b.safetensors": b"2" * 5000})
    _fetch(revision=v2)
    _promote("chat", v2, v1)
    v3 = hub.commit("org/chat", {"a.safetensors": shared, "b.safetensors": b"3" * 5000})
    _fetch(revision=v3)  # the candidate: v1, v2 and v3 kept
    sha = {d: hashlib.sha256(d).hexdigest() for d in (shared, b"1" * 5000, b"2" * 5000)}
    assert {sha[shared], sha[b"1" * 5000]} <= _blobs(mirror.root())
    # v3 current, v2 previous: v1 is dropped, and with it the one file only v1 held.
    _promote("chat", v3, v2)
    dropped = mirror.prune()
    assert dropped == [mirror.folder_for("org/chat", v1)]
    held = _blobs(mirror.root())
    assert sha[shared] in held and sha[b"2" * 5000] in held and sha[b"1" * 5000] not in held
    assert len(held) == 3
    assert (mirror.local_path("chat", v2) / "a.safetensors").read_bytes() == shared
    assert (mirror.local_path("chat", v3) / "b.safetensors").read_bytes() == b"3" * 5000
    assert mirror.local_path("chat", v1) is None
    # The mirror's page and API count what two revisions share once.
    c = Client()
    c.force_login(viewer)
    held_api = c.get("/api/v1/updates/mirror/").json()
    assert held_api["bytes"] == mirror.held_bytes() == 3 * 5000
    assert sorted(h["bytes"] for h in held_api["held"]) == [10_000, 10_000]


def _damage(path: Path) -> None:
    """Other bytes of the same length, written over a blob in place (what a disk or a
    hand that writes through a link does)."""
    blob = path.resolve()
    data = bytearray(blob.read_bytes())
    data[100] ^= 0xFF
    os.chmod(blob, 0o644)
    blob.write_bytes(bytes(data))


def test_a_damaged_blob_is_not_served_and_is_fetched_again(
    hub: HubStandIn, served: Any, tmp_path: Path
) -> None:
    files = _eight()
    v1 = hub.commit("org/chat", files)
    store(gpu_model("chat"))
    token = _node("n1", "chat")
    f = _fetch()
    damaged = "model-00003-of-00006.safetensors"
    _damage(mirror.local_path("chat", v1) / damaged)
    # The file route does not send it (nor anything of it).
    r = httpx.get(
        f"{served.url}/api/v1/updates/mirror/files/{f.pk}/{damaged}",
        headers={"Authorization": f"Bearer {token}"},
    )
    assert r.status_code == 404 and files[damaged][:200] not in r.content
    # A node's ask has it fetched again (that one file), then takes the right bytes.
    client = MirrorClient(served.url, token, tmp_path / "weights", poll_s=0.1)
    path = Path(client.fetch("chat", "org/chat", "vllm") or "")
    assert (path / damaged).read_bytes() == files[damaged]
    assert _resolved(hub, v1).count(damaged) == 2 and len(_resolved(hub, v1)) == 9
    assert (mirror.local_path("chat", v1) / damaged).read_bytes() == files[damaged]
    assert not list((mirror.root() / "suspect").iterdir())


def test_a_blob_written_to_but_whole_is_hashed_again_not_fetched(hub: HubStandIn) -> None:
    v1 = hub.commit("org/chat", {"model.safetensors": b"w" * 5000})
    store(gpu_model("chat"))
    _fetch()
    blob = (mirror.local_path("chat", v1) / "model.safetensors").resolve()
    os.chmod(blob, 0o644)
    blob.write_bytes(b"w" * 5000)  # the same bytes, written again: its record no longer holds
    assert mirror.local_path("chat", v1) is None  # not trusted: set aside
    _fetch(revision=v1)
    assert _resolved(hub, v1) == ["model.safetensors"]  # hashed again, not fetched
    assert (mirror.local_path("chat", v1) / "model.safetensors").read_bytes() == b"w" * 5000


def _as_before(folder: Path, blobs: Path) -> None:
    """Make a folder of links what a folder from before the blobs was: its files in it."""
    for place in folder.rglob("*"):
        if place.is_symlink():
            data = place.read_bytes()
            place.unlink()
            place.write_bytes(data)
    shutil.rmtree(blobs, ignore_errors=True)


def test_folders_from_before_the_blobs_are_served_then_turned_into_links(
    hub: HubStandIn, served: Any, tmp_path: Path
) -> None:
    v1 = hub.commit("org/chat", _eight())
    store(gpu_model("chat"))
    token = _node("n1", "chat")
    node = tmp_path / "weights"
    client = MirrorClient(served.url, token, node, poll_s=0.1)
    first = Path(client.fetch("chat", "org/chat", "vllm") or "")
    _as_before(mirror.local_path("chat", v1), mirror.root() / "blobs")
    _as_before(first, node / "mirror" / "blobs")
    assert (first / VERIFIED).is_file()
    # Served as it is.
    again = MirrorClient(served.url, token, tmp_path / "other", poll_s=0.1)
    assert again.fetch("chat", "org/chat", "vllm") is not None and again.took.files == 8
    # An update of one file: the mirror and the node take that one, their old files
    # become blobs linked from both revisions.
    v2 = hub.commit("org/chat", _eight(version_of_last=2))
    _promote("chat", v2, v1)
    client = MirrorClient(served.url, token, node, poll_s=0.1)
    second = Path(client.fetch("chat", "org/chat", "vllm") or "")
    assert _resolved(hub, v2) == ["model-00006-of-00006.safetensors"]
    assert client.took.files == 1
    assert (first / "config.json").is_symlink() and (second / "config.json").is_symlink()
    assert (mirror.local_path("chat", v1) / "config.json").is_symlink()
    assert (first / "model-00006-of-00006.safetensors").read_bytes() == _shard(6, 1)
    assert (second / "model-00006-of-00006.safetensors").read_bytes() == _shard(6, 2)
