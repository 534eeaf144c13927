"""The mirror's folder: where a source's files at a commit are kept, the lock of one
folder's writer, the bytes it holds, and what ``prune`` drops."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import shutil
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from django.conf import settings
from django.utils import timezone

from updates import registry
from updates.models import ACTIVE, Fetch, FetchState

log = logging.getLogger(__name__)
CHUNK = 1024 * 1024


class MirrorError(Exception):
    """A fetch the mirror refuses or cannot make; the message says why, for a person."""


# -- where things are -----------------------------------------------------------------------


def enabled() -> bool:
    """Return whether nodes take weights from the mirror (``LLMGW_MIRROR``)."""
    return bool(settings.LLMGW_MIRROR)


def root() -> Path:
    """Return the mirror's folder (``LLMGW_MIRROR_DIR``)."""
    return Path(settings.LLMGW_MIRROR_DIR)


def folder_for(source: str, commit: str) -> str:
    """Return where a source's files at a commit are kept, relative to the mirror's folder.

    ``hf/<owner>/<name>/<commit>`` for a repository, ``url/<hash of the URL>/<commit>``
    for a URL: two models of one source share one copy.
    """
    if registry.kind(source) == "hf":
        owner, name = source.strip().split("/", 1)
        return f"hf/{_safe(owner)}/{_safe(name)}/{_safe(commit)}"
    digest = hashlib.sha256(source.strip().encode()).hexdigest()[:16]
    return f"url/{digest}/{_safe(commit)}"


def _safe(part: str) -> str:
    clean = "".join(c if c.isalnum() or c in "._-" else "_" for c in part)
    return clean.lstrip(".") or "_"


def file_in(folder: Path, rel: str) -> Path:
    """Return a repository file's place in ``folder``, refusing a path that leaves it."""
    parts = PurePosixPath(rel).parts
    if not parts or any(p in ("", ".", "..") for p in parts) or rel.startswith("/"):
        raise MirrorError(f"the registry named a file {rel!r}, which is not a path in a folder")
    return folder.joinpath(*parts)


# -- asking for a fetch -----------------------------------------------------------------------


def model_spec(name: str) -> Any:
    from catalog.services import stored_specs

    found = stored_specs(names=[name])
    if not found:
        raise MirrorError(f'model "{name}" is not in the catalog')
    return found[0]


def pinned_revision(m: Any) -> str:
    """Return the revision a model's files are taken at: its origin's, or "" (the newest)."""
    origin = getattr(m, "origin", None)
    return str(origin.revision) if origin is not None and origin.revision else ""


# While a fetch waits for another writer of its folder, its row is moved this often (so
# it is not taken for one a dead worker left), and it waits this long at most.
LOCK_POLL_S = 1.0
LOCK_TOUCH_S = 30.0
LOCK_WAIT_S = 6 * 3600.0


@contextlib.contextmanager
def folder_lock(rel: str, fetch: Fetch | None = None) -> Iterator[None]:
    """Hold the lock of one mirror folder: one writer of its ``.part`` files at a time,
    across processes. While another holds it, ``fetch``'s row is moved now and then (its
    worker is alive: waiting); past ``LOCK_WAIT_S`` the fetch fails saying so."""
    locks = root() / ".locks"
    locks.mkdir(parents=True, exist_ok=True)
    path = locks / (hashlib.sha256(rel.encode()).hexdigest()[:24] + ".lock")
    with open(path, "a+b") as f:
        started = touched = time.monotonic()
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                now = time.monotonic()
                if now - started > LOCK_WAIT_S:
                    raise MirrorError(
                        f"another fetch of {rel} held its folder for {LOCK_WAIT_S / 3600:.0f} "
                        "hours: this one gave up waiting; fetch again once that one ended"
                    ) from None
                if fetch is not None and now - touched >= LOCK_TOUCH_S:
                    touched = now
                    Fetch.objects.filter(pk=fetch.pk).update(updated=timezone.now())
                threading.Event().wait(LOCK_POLL_S)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def complete(final: Path, state: registry.RepoState) -> bool:
    """Return whether a folder holds every file of a state already (an earlier fetch)."""
    if not final.is_dir():
        return False
    for f in state.files:
        path = file_in(final, f.path)
        if not path.is_file() or (f.size is not None and path.stat().st_size != f.size):
            return False
    return True


def used_bytes(exclude: int | None = None) -> int:
    """Return the bytes the mirror's done and running fetches take (each folder once)."""
    seen: dict[str, int] = {}
    q = Fetch.objects.filter(state__in=(*ACTIVE, FetchState.DONE)).exclude(folder="")
    if exclude is not None:
        q = q.exclude(pk=exclude)
    for folder, total in q.values_list("folder", "bytes_total"):
        seen[folder] = max(seen.get(folder, 0), int(total or 0))
    return sum(seen.values())


def held_for_resume(final: Path, state: registry.RepoState) -> int:
    """Return the bytes of ``state``'s files a ``.part`` folder holds already (whole files,
    and the ``.part`` of one broken off): a resume writes only the rest."""
    part_dir = final.with_name(final.name + ".part")
    if not part_dir.is_dir():
        return 0
    held = 0
    for f in state.files:
        try:
            target = file_in(part_dir, f.path)
        except MirrorError:
            continue
        for path in (target, target.with_name(target.name + ".part")):
            try:
                got = path.stat().st_size
            except OSError:
                continue
            held += min(got, f.size) if f.size is not None else got
            break
    return held


def bytes_with_folder(folder: str, exclude: int) -> int:
    """Return the bytes counted for ``folder`` by other fetches (shared: not counted twice)."""
    totals = (
        Fetch.objects.filter(folder=folder, state__in=(*ACTIVE, FetchState.DONE))
        .exclude(pk=exclude)
        .values_list("bytes_total", flat=True)
    )
    return max((int(t or 0) for t in totals), default=0)


def gb(n: int) -> str:
    """Return a size as a person reads it: GB from 1 GB, MB below."""
    return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB"


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def git_blob_id(path: Path) -> str:
    digest = hashlib.sha1(f"blob {path.stat().st_size}\0".encode(), usedforsecurity=False)
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


# -- what is kept -------------------------------------------------------------------------------


def kept_revisions() -> dict[str, set[str]]:
    """Return, by model, the commits the mirror keeps: its origin's, its previous one's,
    and its newest done fetch's (an update's candidate, before it is promoted)."""
    from catalog.services import stored_specs

    keep: dict[str, set[str]] = {}
    for m in stored_specs():
        revs = keep.setdefault(m.name, set())
        if m.origin is not None:
            if m.origin.revision:
                revs.add(m.origin.revision)
            if m.origin.previous is not None and m.origin.previous.revision:
                revs.add(m.origin.previous.revision)
    for name, commit in (
        Fetch.objects.filter(state=FetchState.DONE)
        .order_by("model", "-finished", "-id")
        .distinct("model")
        .values_list("model", "commit")
        if _postgres()
        else _newest_done()
    ):
        keep.setdefault(name, set()).add(commit)
    return keep


def _postgres() -> bool:
    from django.db import connection

    return connection.vendor == "postgresql"


def _newest_done() -> list[tuple[str, str]]:
    seen: dict[str, str] = {}
    for name, commit in (
        Fetch.objects.filter(state=FetchState.DONE)
        .order_by("-finished", "-id")
        .values_list("model", "commit")
    ):
        seen.setdefault(name, commit)
    return list(seen.items())


def prune() -> list[str]:
    """Drop the done fetches no model keeps (``kept_revisions``), deleting their folders when
    no kept fetch shares them; return the folders deleted."""
    keep = kept_revisions()
    kept_folders = set()
    drop = []
    for f in Fetch.objects.filter(state=FetchState.DONE):
        if f.commit in keep.get(f.model, set()):
            kept_folders.add(f.folder)
        else:
            drop.append(f)
    active = set(Fetch.objects.filter(state__in=ACTIVE).values_list("folder", flat=True))
    deleted = []
    for f in drop:
        Fetch.objects.filter(pk=f.pk).update(
            state=FetchState.DROPPED,
            reason="neither the model's current nor its previous revision",
        )
        if f.folder and f.folder not in kept_folders and f.folder not in active:
            path = root() / f.folder
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
                deleted.append(f.folder)
        mark(f.model)
    return deleted


@dataclass
class Holding:
    """One folder of the mirror: what it holds, for whom, and how much."""

    source: str
    commit: str
    folder: str
    bytes: int
    models: list[str]
    roles: list[str]  # "current", "previous", "candidate", per model
    fetched: Any

    @property
    def models_roles(self) -> list[tuple[str, str]]:
        """Return each model this folder is for, with what it is to it."""
        return list(zip(self.models, self.roles, strict=True))


def holdings() -> list[Holding]:
    """Return what the mirror holds, a folder a line, largest first."""
    from catalog.services import stored_specs

    specs = {m.name: m for m in stored_specs()}
    by_folder: dict[str, Holding] = {}
    for f in Fetch.objects.filter(state=FetchState.DONE).order_by("-finished"):
        h = by_folder.get(f.folder)
        if h is None:
            h = by_folder[f.folder] = Holding(
                f.source, f.commit, f.folder, int(f.bytes_total or 0), [], [], f.finished
            )
        m = specs.get(f.model)
        role = "candidate"
        if m is not None and m.origin is not None:
            if m.origin.revision == f.commit:
                role = "current"
            elif m.origin.previous is not None and m.origin.previous.revision == f.commit:
                role = "previous"
        if f.model not in h.models:
            h.models.append(f.model)
            h.roles.append(role)
    return sorted(by_folder.values(), key=lambda h: -h.bytes)


def mark(model_name: str) -> None:
    """Tell the open consoles that a model's fetch moved (its page shows the progress)."""
    try:
        from llmgw_core import events

        events.changed(models=[model_name])
    except Exception:
        log.debug("marking %s changed failed", model_name, exc_info=True)
