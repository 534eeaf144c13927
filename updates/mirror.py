"""The weights mirror: a model's files fetched once into the control plane, for every node.

The mirror is a folder every web and worker process reaches (``LLMGW_MIRROR_DIR``;
embedded, ``var/mirror``). A model whose source is a Hugging Face repository or an
http(s) file is fetched into it once, whatever the number of nodes that need it:

- ``request_fetch(model, revision=None, by=..., surface=...)`` queues a fetch (a
  ``Fetch`` row) and has it run in the background (a Celery worker in production, a
  thread embedded); a second request for the same model and revision while one is queued
  or fetching gets that one, so four nodes asking cost one download;
- ``run_fetch(pk)`` (the worker's part) asks the registry (``updates.registry.latest``)
  for the revision's commit and files, refuses a fetch the size cap
  (``LLMGW_MIRROR_MAX_GB``) or the disk cannot take, with the reason, then downloads every
  file into ``<commit>.part/`` (each file into ``<name>.part`` first, resumed with HTTP
  Range after a broken transfer, hashed as it arrives), checks each
  against the sha256 the registry published (an LFS file's, a URL's ``X-Linked-Etag``),
  or git's blob id for a file kept in git, and renames the folder into place in one step.
  A file whose bytes differ is deleted and nothing is renamed. Done, the model's catalog
  ``origin`` is written through ``catalog.services`` (logged like any edit) when it is at
  that commit or has none yet (moving a model to another revision is the update's
  promote, never a fetch's);
- ``local_path(model, revision)`` is the folder a done fetch's files are in;
- ``manifest(model)`` is what a node is told to download from the mirror
  (``updates/api.py``), queueing the fetch when the mirror does not hold it yet;
- ``prune()`` drops what is neither a model's current nor its previous revision, nor its
  newest fetch (an update's candidate); ``holdings()`` says what the mirror holds, for
  whom and how much.

Progress (bytes done of the total) is on the row, moved at most every half second, and
marked live for the model's page (``events.changed(models=[name])``).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import logging
import os
import shutil
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path, PurePosixPath
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from updates import registry
from updates.models import ACTIVE, Fetch, FetchState

log = logging.getLogger(__name__)

# Seconds between writes of a fetch's progress to its row.
PROGRESS_EVERY_S = 0.5
# A "fetching" row not moved for this long was being fetched by a worker that died.
STALE_AFTER_S = 120
# A fetch that ended this many seconds ago answers a node's ask racing its end.
FRESH_S = 60
# How a fetch a dead worker left says so (``resume_stale``).
STALE_MARK = "its worker stopped"
# A failed fetch is queued again by a node's ask only after this many seconds.
RETRY_FAILED_AFTER_S = 300
_CHUNK = 1024 * 1024
# Seconds a download may take to connect, and each read of it to arrive.
READ_TIMEOUT_S = 60.0
# Broken transfers of one file resumed within one fetch before it fails (and is resumed
# by the next fetch, from what is held).
ATTEMPTS = 5


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


def _file_in(folder: Path, rel: str) -> Path:
    """Return a repository file's place in ``folder``, refusing a path that leaves it."""
    parts = PurePosixPath(rel).parts
    if not parts or any(p in ("", ".", "..") for p in parts) or rel.startswith("/"):
        raise MirrorError(f"the registry named a file {rel!r}, which is not a path in a folder")
    return folder.joinpath(*parts)


# -- asking for a fetch -----------------------------------------------------------------------


def _model_spec(name: str) -> Any:
    from catalog.services import stored_specs

    found = stored_specs(names=[name])
    if not found:
        raise MirrorError(f'model "{name}" is not in the catalog')
    return found[0]


def pinned_revision(m: Any) -> str:
    """Return the revision a model's files are taken at: its origin's, or "" (the newest)."""
    origin = getattr(m, "origin", None)
    return str(origin.revision) if origin is not None and origin.revision else ""


def request_fetch(
    model_name: str,
    revision: str | None = None,
    *,
    by: str = "",
    surface: str = "",
    start: bool = True,
) -> Fetch:
    """Queue a fetch of a model's files into the mirror and return its row.

    ``revision`` None is the one the model pins (its origin's), or the newest; "" is the
    newest. A fetch of the same model and revision that is queued or fetching is
    returned instead of a new one; so is a done one at that commit whose files are still
    there. ``start`` False leaves it queued (a test, or a caller that runs it itself).

    Raises:
        MirrorError: the mirror is off, the model is not in the catalog, or its source
            has no registry (a local path).
    """
    if not enabled():
        raise MirrorError("the mirror is off (LLMGW_MIRROR=off): nodes fetch weights themselves")
    m = _model_spec(model_name)
    source = str(m.source or "").strip()
    why = registry.mirrored(source)
    if why:
        raise MirrorError(f'model "{model_name}": {why}')
    wanted = pinned_revision(m) if revision is None else revision.strip()
    if wanted:
        done = _done_at(model_name, source, wanted)
        if done is not None:
            return done
        fetch = _active(model_name, source, wanted)
        if fetch is not None:
            return fetch
    else:
        found, newest = _newest(model_name, source, asked=revision is not None)
        if found is not None:
            return found
        if newest and _active(model_name, source, "") is not None:
            # One of "the newest" is being fetched at an older commit: this one is the
            # newer commit's, by name.
            wanted = newest
    try:
        with transaction.atomic():
            fetch = Fetch.objects.create(
                model=model_name,
                source=source,
                revision=wanted,
                requested_by=by[:300],
                surface=surface[:20],
            )
    except IntegrityError:
        # Another process queued it between the look and the insert: that one is it.
        found = _active(model_name, source, wanted)
        if found is None:
            raise
        return found
    _mark(model_name)
    if start:
        dispatch(fetch.pk)
    return fetch


def _newest(model_name: str, source: str, *, asked: bool) -> tuple[Fetch | None, str]:
    """Return the fetch that answers an ask for the newest revision, or None (queue one),
    and the newest commit when the registry was asked ("" when not, or when it failed).

    A fetch of the newest that is still queued is it (it asks the registry when it runs).
    Asked for by name (``asked``: an operator, an update), the registry is asked for the
    newest commit first, so a fetch that just finished at an older one is not taken for
    it: a done fetch, or one fetching, at that commit is. A node's ask (the model pins
    nothing) takes a fetch of the newest in progress as it is, or one that just ended
    (``_just_done``), asking no registry at each of its asks (the fetch queued for it asks when it runs). A registry that does not answer leaves only a fetch in progress to take:
    a new one fails with the registry's reason.
    """
    active = _active(model_name, source, "")
    if not asked:
        return active or _just_done(model_name, source), ""
    if active is not None and active.state == FetchState.QUEUED:
        return active, ""
    try:
        commit = registry.latest(source, None).commit
    except registry.RegistryError:
        return active, ""
    done = _done_at(model_name, source, commit)
    if done is not None:
        return done, commit
    if active is not None and active.commit in ("", commit):
        return active, commit
    return _active(model_name, source, commit), commit


def _just_done(model_name: str, source: str) -> Fetch | None:
    """Return a fetch of the model that ended in the last ``FRESH_S`` seconds with its
    folder in place: a node's ask racing that fetch's end (its manifest looked before the
    fetch was done, and asks here after) is answered by it, not by a second download."""
    recent = (
        Fetch.objects.filter(
            model=model_name,
            source=source,
            state=FetchState.DONE,
            finished__gte=timezone.now() - timedelta(seconds=FRESH_S),
        )
        .order_by("-finished")
        .first()
    )
    return recent if recent is not None and (root() / recent.folder).is_dir() else None


def _active(model_name: str, source: str, revision: str) -> Fetch | None:
    return (
        Fetch.objects.filter(model=model_name, source=source, revision=revision, state__in=ACTIVE)
        .order_by("-id")
        .first()
    )


def _done_at(model_name: str, source: str, revision: str) -> Fetch | None:
    for f in Fetch.objects.filter(model=model_name, source=source, state=FetchState.DONE).filter(
        models_q_commit_or_revision(revision)
    ):
        if (root() / f.folder).is_dir():
            return f
    return None


def models_q_commit_or_revision(revision: str) -> Any:
    from django.db.models import Q

    return Q(commit=revision) | Q(revision=revision)


def dispatch(pk: int) -> None:
    """Have a queued fetch run in the background once the transaction commits."""
    if settings.REDIS_URL:
        from updates.tasks import fetch_into_mirror

        transaction.on_commit(lambda: fetch_into_mirror.delay(pk))
    else:
        transaction.on_commit(
            lambda: threading.Thread(
                target=_in_thread, args=(pk,), name=f"mirror-fetch-{pk}", daemon=True
            ).start()
        )


def _in_thread(pk: int) -> None:
    from django.db import close_old_connections

    try:
        run_fetch(pk)
    except Exception:
        log.exception("mirror fetch %s failed", pk)
    finally:
        close_old_connections()


def resume_stale() -> list[int]:
    """Say what a dead worker left, and act on it: a fetch queued or fetching, unmoved for
    ``STALE_AFTER_S``, is queued again once, its reason saying so (it resumes from its
    ``.part`` files); one that a worker left again after that fails, saying why (a node's
    ask or Fetch now queues a new one, resuming from what arrived). Return their ids.

    Every tick's look (``updates.signals``) and the periodic check call this, so a fetch
    is never shown "fetching" for longer than that with nothing said.
    """
    now = timezone.now()
    cutoff = now - timedelta(seconds=STALE_AFTER_S)
    ids = []
    for f in Fetch.objects.filter(state__in=ACTIVE, updated__lt=cutoff):
        unmoved = int((now - f.updated).total_seconds())
        where = f"{_gb(f.bytes_done)} of {_gb(f.bytes_total)}" if f.bytes_total else ""
        seen = f"no progress for {unmoved} s" + (f" at {where}" if where else "")
        if f.reason.startswith(STALE_MARK):
            claimed = Fetch.objects.filter(pk=f.pk, updated=f.updated).update(
                updated=now,
                state=FetchState.FAILED,
                finished=now,
                reason=(
                    f"its worker stopped again ({seen}) after it was queued again: what "
                    "arrived is kept; a node's ask or Fetch now resumes it from there "
                    "(see the workers' logs for why they stop)"
                ),
            )
        else:
            claimed = Fetch.objects.filter(pk=f.pk, updated=f.updated).update(
                updated=now,
                reason=(
                    f"{STALE_MARK} ({seen}): queued again at {now:%H:%M:%S} UTC, resuming "
                    "from what arrived"
                ),
            )
            if claimed:
                dispatch(f.pk)
        if claimed:
            ids.append(f.pk)
            _mark(f.model)
    return ids


# -- reading what is held -----------------------------------------------------------------------


def latest_fetch(model_name: str) -> Fetch | None:
    """Return a model's newest fetch (any state), or None."""
    return Fetch.objects.filter(model=model_name).order_by("-id").first()


def local_path(model_name: str, revision: str | None = None) -> Path | None:
    """Return the folder holding a model's files at ``revision`` (its pinned one for
    None), or None when the mirror does not hold them (not fetched, failed, dropped)."""
    if revision is None:
        try:
            revision = pinned_revision(_model_spec(model_name))
        except MirrorError:
            return None
    q = Fetch.objects.filter(model=model_name, state=FetchState.DONE)
    q = q.filter(models_q_commit_or_revision(revision)) if revision else q
    for f in q.order_by("-finished", "-id"):
        path = root() / f.folder
        if path.is_dir():
            return path
    return None


@dataclass
class Manifest:
    """What a node is told of a model's files in the mirror."""

    state: str
    fetch: Fetch | None = None
    files: list[dict[str, Any]] = field(default_factory=list)
    message: str = ""


def manifest(model_name: str, *, enqueue: bool = True, by: str = "") -> Manifest:
    """Return a model's files as the mirror holds them at its pinned revision.

    ``state`` "done" with the files; "queued"/"fetching" (queued now when ``enqueue``, or
    when the model has an origin) with the fetch's progress; "failed" with why; "absent"
    when not held and not asked.

    Raises:
        MirrorError: the mirror is off, or the model has nothing to mirror.
    """
    if not enabled():
        raise MirrorError("the mirror is off (LLMGW_MIRROR=off): nodes fetch weights themselves")
    m = _model_spec(model_name)
    revision = pinned_revision(m)
    source = str(m.source or "").strip()
    why = registry.mirrored(source)
    if why:
        raise MirrorError(f'model "{model_name}": {why}')
    done = (
        _done_at(model_name, source, revision)
        if revision
        else Fetch.objects.filter(model=model_name, source=source, state=FetchState.DONE)
        .order_by("-finished", "-id")
        .first()
    )
    if done is not None and (root() / done.folder).is_dir():
        return Manifest("done", done, list(done.files))
    if not enqueue and not revision:
        # Asked by a node that needs no weights to start (a sim engine): a model with no
        # origin yet is not fetched for it; one with an origin is (its files are what the
        # model runs from).
        active = _active(model_name, source, revision)
        if active is not None:
            return Manifest(active.state, active)
        return Manifest("absent", None, message="the mirror does not hold this model")
    failed = (
        Fetch.objects.filter(model=model_name, source=source, revision=revision)
        .order_by("-id")
        .first()
    )
    if (
        failed is not None
        and failed.state == FetchState.FAILED
        and failed.finished is not None
        and (timezone.now() - failed.finished).total_seconds() < RETRY_FAILED_AFTER_S
    ):
        # Every node asks again every few seconds: a failed fetch is tried again after a
        # while, not at each ask (an operator's "fetch" or an update asks at once).
        return Manifest("failed", failed, message=failed.reason)
    fetch = request_fetch(model_name, by=by, surface="node")
    if fetch.state in ACTIVE and (timezone.now() - fetch.updated).total_seconds() > STALE_AFTER_S:
        # Left by a worker that died: said so, and taken up again (or failed, the second
        # time); it resumes from its .part files.
        resume_stale()
        fetch.refresh_from_db()
    if fetch.state == FetchState.DONE:
        return Manifest("done", fetch, list(fetch.files))
    if fetch.state == FetchState.FAILED:
        return Manifest("failed", fetch, message=fetch.reason)
    return Manifest(fetch.state, fetch)


# -- fetching (the worker's part) ----------------------------------------------------------


class _Progress:
    """Write a fetch's bytes done to its row, at most every ``PROGRESS_EVERY_S``."""

    def __init__(self, fetch: Fetch) -> None:
        self.fetch = fetch
        self.base = 0  # bytes of the files before the one being fetched
        self.last = 0.0

    def at(self, done: int, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self.last < PROGRESS_EVERY_S:
            return
        self.last = now
        self.fetch.bytes_done = done
        Fetch.objects.filter(pk=self.fetch.pk).update(bytes_done=done, updated=timezone.now())
        _mark(self.fetch.model)


# While a fetch waits for another writer of its folder, its row is moved this often (so
# it is not taken for one a dead worker left), and it waits this long at most.
LOCK_POLL_S = 1.0
LOCK_TOUCH_S = 30.0
LOCK_WAIT_S = 6 * 3600.0


@contextlib.contextmanager
def _folder_lock(rel: str, fetch: Fetch | None = None) -> Iterator[None]:
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


def run_fetch(pk: int) -> Fetch | None:
    """Fetch a queued fetch's files into the mirror (the worker's part); return the row.

    A fetch already done or failed is left as it is. Every failure ends the row "failed"
    with the reason, and changes nothing else: no file renamed into place, no origin
    written.
    """
    with transaction.atomic():
        fetch = Fetch.objects.select_for_update().filter(pk=pk).first()
        if fetch is None or fetch.state not in ACTIVE:
            return fetch
        fetch.state = FetchState.FETCHING
        fetch.started = fetch.started or timezone.now()
        fetch.save(update_fields=["state", "started", "updated"])
    _mark(fetch.model)
    try:
        state = registry.latest(fetch.source, fetch.revision or None)
        fetch.commit = state.commit
        fetch.folder = folder_for(fetch.source, state.commit)
        fetch.bytes_total = state.total_bytes
        fetch.save(update_fields=["commit", "folder", "bytes_total", "updated"])
        final = root() / fetch.folder
        hashed: dict[str, str] = {}
        with _folder_lock(fetch.folder, fetch):
            if not _complete(final, state):
                _check_room(fetch, state, final)
                hashed = _download_or_free(fetch, state, final)
        fetch.files = [
            {
                "path": f.path,
                # A file the registry gave no sha256 for: the one hashed as it arrived.
                "sha256": f.sha256 or hashed.get(f.path) or _sha256(final / f.path),
                "bytes": f.size or 0,
            }
            for f in state.files
        ]
        fetch.bytes_done = state.total_bytes
        fetch.state = FetchState.DONE
        fetch.reason = ""
        fetch.finished = timezone.now()
        # Named fields: a row deleted meanwhile is an error here, never inserted again.
        fetch.save(update_fields=["files", "bytes_done", "state", "reason", "finished", "updated"])
    except (registry.RegistryError, MirrorError) as exc:
        return _fail(fetch, str(exc))
    except Exception as exc:
        log.exception("mirror fetch %s failed", pk)
        return _fail(fetch, f"the fetch failed: {type(exc).__name__}: {exc}")
    _mark(fetch.model)
    try:
        write_origin(fetch, state)
    except Exception:
        log.exception("writing %s's origin after fetch %s failed", fetch.model, pk)
    try:
        prune()
    except Exception:
        log.exception("pruning the mirror failed")
    return fetch


def _fail(fetch: Fetch, reason: str) -> Fetch:
    fetch.state = FetchState.FAILED
    fetch.reason = reason[:4000]
    fetch.finished = timezone.now()
    fetch.save(update_fields=["state", "reason", "finished", "updated"])
    _mark(fetch.model)
    return fetch


def _complete(final: Path, state: registry.RepoState) -> bool:
    """Return whether a folder holds every file of a state already (an earlier fetch)."""
    if not final.is_dir():
        return False
    for f in state.files:
        path = _file_in(final, f.path)
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
            target = _file_in(part_dir, f.path)
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


def _check_room(fetch: Fetch, state: registry.RepoState, final: Path | None = None) -> None:
    """Refuse a fetch past the size cap or the disk's free space, saying by how much. What
    a resume holds already (its ``.part`` folder) is on the disk: only the rest is needed."""
    need = state.total_bytes
    resumed = held_for_resume(final, state) if final is not None else 0
    cap_gb = float(settings.LLMGW_MIRROR_MAX_GB or 0)
    if cap_gb:
        prune()
        held = used_bytes(exclude=fetch.pk) - _bytes_with_folder(fetch.folder, fetch.pk)
        cap = int(cap_gb * 1e9)
        if held + need > cap:
            raise MirrorError(
                f"the mirror's cap is {cap_gb:g} GB (LLMGW_MIRROR_MAX_GB): it holds "
                f"{_gb(held)} (the current and previous revisions of its models) and "
                f"{fetch.source} at {fetch.commit[:8]} needs {_gb(need)}: raise the cap, or "
                "remove models from the catalog"
            )
    root().mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(root()).free
    if need - resumed > free:
        held = f" ({_gb(resumed)} of it held from an earlier try)" if resumed else ""
        raise MirrorError(
            f"{fetch.source} at {fetch.commit[:8]} needs {_gb(need - resumed)} more{held} and "
            f"the mirror's disk has {_gb(free)} free: free some, or move LLMGW_MIRROR_DIR"
        )


def _bytes_with_folder(folder: str, exclude: int) -> int:
    """Return the bytes counted for ``folder`` by other fetches (shared: not counted twice)."""
    totals = (
        Fetch.objects.filter(folder=folder, state__in=(*ACTIVE, FetchState.DONE))
        .exclude(pk=exclude)
        .values_list("bytes_total", flat=True)
    )
    return max((int(t or 0) for t in totals), default=0)


def _gb(n: int) -> str:
    """Return a size as a person reads it: GB from 1 GB, MB below."""
    return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB"


def _download_or_free(fetch: Fetch, state: registry.RepoState, final: Path) -> dict[str, str]:
    """``_download``; when the disk fills up meanwhile, delete what this fetch wrote (its
    ``.part`` folder) so the disk is not left full, and fail saying so."""
    try:
        return _download(fetch, state, final)
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        part_dir = final.with_name(final.name + ".part")
        written = sum(p.stat().st_size for p in part_dir.rglob("*") if p.is_file())
        shutil.rmtree(part_dir, ignore_errors=True)
        left = "" if not part_dir.exists() else f"; {part_dir} could not be deleted"
        try:
            usage = shutil.disk_usage(root())
            disk = f" ({_gb(usage.free)} free of {_gb(usage.total)} now)"
        except OSError:
            disk = ""
        raise MirrorError(
            f"the mirror's disk filled up while fetching {fetch.source} at "
            f"{fetch.commit[:8]} ({os.strerror(exc.errno)}): deleted the {_gb(written)} this "
            f"fetch had written, so the disk is not left full{left}{disk}; free some space "
            "(or move LLMGW_MIRROR_DIR, or lower LLMGW_MIRROR_MAX_GB under the disk's size) "
            "and fetch again"
        ) from None


def _download(fetch: Fetch, state: registry.RepoState, final: Path) -> dict[str, str]:
    """Download every file of ``state`` into ``final``'s ``.part`` folder, check each, and
    rename the folder into place in one step. Return the sha256 of each file downloaded
    (hashed as it arrived), by path."""
    part_dir = final.with_name(final.name + ".part")
    part_dir.mkdir(parents=True, exist_ok=True)
    progress = _Progress(fetch)
    hub_origin = _origin(registry.endpoint())
    token = registry.token()
    hashed: dict[str, str] = {}
    for f in state.files:
        target = _file_in(part_dir, f.path)
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.is_file() and f.size is not None and target.stat().st_size == f.size:
            progress.base += f.size  # checked when it was renamed into this folder
            continue
        part = target.with_name(target.name + ".part")
        headers: dict[str, str] = {}
        if token and _origin(f.url) == hub_origin:
            headers["Authorization"] = f"Bearer {token}"
        got = _get(f, part, headers, progress)
        _verify(f, part, fetch, got)
        hashed[f.path] = got
        os.replace(part, target)
        progress.base += target.stat().st_size
        progress.at(progress.base, force=True)
    if final.exists():
        _merge(part_dir, final)
    else:
        os.replace(part_dir, final)
    return hashed


def _merge(part_dir: Path, final: Path) -> None:
    """Put a ``.part`` folder's files into a folder that exists already (a fetch of the same
    commit that was done and then lost a file): each file renamed into place."""
    for path in sorted(part_dir.rglob("*")):
        if path.is_file():
            dest = final / path.relative_to(part_dir)
            dest.parent.mkdir(parents=True, exist_ok=True)
            os.replace(path, dest)
    shutil.rmtree(part_dir, ignore_errors=True)


def _origin(url: str) -> str:
    from agent.weights import origin_of

    return origin_of(url)


def _get(f: registry.RepoFile, part: Path, headers: dict[str, str], progress: _Progress) -> str:
    """Fill ``part`` with a file's bytes, resuming what it holds (HTTP Range), and return the
    whole file's sha256, hashed as the bytes arrive (``agent.transfer``: on a thread of its
    own, so receiving and hashing overlap, and no second pass over the file).

    The mirror's own stream rather than ``huggingface_hub``'s ``http_get``: that one reads
    through httpx in 10 MB chunks it joins from 64 KB ones, hashes nothing (its sha256 would
    be a second pass over the file), and on loopback here took 71 MB/s where a plain stream
    of the same file took 198 (bench/mirror.py, docs/updates.md). A broken transfer is
    resumed from what arrived, up to ``ATTEMPTS`` times; what is held stays for the next
    fetch.
    """
    from agent import transfer

    try:
        return transfer.receive(
            f.url,
            part,
            size=f.size,
            headers=headers,
            timeout_s=READ_TIMEOUT_S,
            attempts=ATTEMPTS,
            moved=lambda have: progress.at(progress.base + have),
        )
    except transfer.Refused as exc:
        have = part.stat().st_size if part.exists() else 0
        raise MirrorError(
            f"downloading {f.path} failed (HTTP {exc.status}); {have} bytes are kept to resume "
            "from on the next try"
        ) from None
    except transfer.Broken as exc:
        raise MirrorError(
            f"downloading {f.path} failed ({exc.reason}); {exc.have} bytes are kept to resume "
            "from on the next try"
        ) from None


def _verify(f: registry.RepoFile, part: Path, fetch: Fetch, got: str) -> None:
    """Refuse a downloaded file (of sha256 ``got``) whose bytes are not the ones the
    registry published: it is deleted, and nothing is renamed into place."""
    if f.sha256:
        if got != f.sha256:
            part.unlink(missing_ok=True)
            raise MirrorError(
                f"{f.path} from {fetch.source} is not what the registry published: its "
                f"sha256 is {got}, not {f.sha256}; deleted it and kept nothing of this fetch"
            )
    elif f.blob_id and len(f.blob_id) == 40:
        got = git_blob_id(part)
        if got != f.blob_id:
            part.unlink(missing_ok=True)
            raise MirrorError(
                f"{f.path} from {fetch.source} is not what the registry published: its git "
                f"blob id is {got}, not {f.blob_id}; deleted it and kept nothing of this fetch"
            )
    elif f.size is not None and part.stat().st_size != f.size:
        raise MirrorError(
            f"{f.path} from {fetch.source} has {part.stat().st_size} bytes, not {f.size}"
        )


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def git_blob_id(path: Path) -> str:
    digest = hashlib.sha1(f"blob {path.stat().st_size}\0".encode(), usedforsecurity=False)
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


# -- the origin --------------------------------------------------------------------------------


def origin_files(state: registry.RepoState) -> list[Any]:
    """Return a state's weights files, and its code files (compared for a model that trusts
    remote code), as the catalog's origin records them."""
    from catalog import spec

    return [
        spec.OriginFile(path=f.path, sha256=f.sha256, bytes=int(f.size or 0))
        for f in state.compared(code=True)
    ]


def write_origin(fetch: Fetch, state: registry.RepoState) -> bool:
    """Write a model's ``origin`` from what the registry said of a done fetch, through the
    catalog's services (checked, logged with who asked for the fetch). Only a model with no
    origin yet, or at that commit, is written, and never from a running update's fetch
    (the update's promote writes it); True when written."""
    from catalog import spec
    from catalog.choices import Surface
    from catalog.services import Actor, Refused, save_model, stored_queryset

    with transaction.atomic():
        row = stored_queryset().select_for_update().filter(name=fetch.model).first()
        if row is None:
            return False
        m = row.to_spec()
        if str(m.source or "").strip() != fetch.source:
            return False  # its source changed since: the fetch is not of it
        old = m.origin
        if old is not None and old.revision and old.revision != state.commit:
            return False  # the update's promote moves a model, not a fetch
        if (old is None or not old.revision) and _for_update(fetch):
            # An update's new revision, of a model never fetched: its origin is what serves,
            # written at the update's promote, not while the update is at its eval.
            return False
        repo = fetch.source if registry.kind(fetch.source) == "hf" else ""
        new = spec.Origin(
            repo=repo,
            revision=state.commit,
            files=origin_files(state),
            previous=old.previous if old is not None else None,
        )
        if old == new:
            return False
        m.origin = new
        actor = Actor(
            user=None,
            surface=Surface.UPDATES,
            name="mirror",
            via=fetch.requested_by or "",
        )
        try:
            save_model(m, actor, replacing=fetch.model, note=f"fetched at {state.commit[:8]}")
        except Refused as exc:
            log.warning("the catalog refused %s's origin: %s", fetch.model, exc)
            return False
    return True


def _for_update(fetch: Fetch) -> bool:
    """Return whether a fetch is a running update's (its new revision)."""
    from updates.models import UpdateRun, UpdateState

    return UpdateRun.objects.filter(
        fetch_id=fetch.pk, model=fetch.model, state__in=(UpdateState.RUNNING, UpdateState.WAITING)
    ).exists()


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
        _mark(f.model)
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


def _mark(model_name: str) -> None:
    """Tell the open consoles that a model's fetch moved (its page shows the progress)."""
    try:
        from llmgw_core import events

        events.changed(models=[model_name])
    except Exception:
        log.debug("marking %s changed failed", model_name, exc_info=True)
