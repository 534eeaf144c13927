"""Asking for a fetch: a ``Fetch`` row queued once per model and revision, run in the
background, resumed after a dead worker; what a node is told to download."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import IntegrityError, close_old_connections, transaction
from django.db.models import Q
from django.utils import timezone

from updates import registry
from updates.mirror.download import run_fetch
from updates.mirror.store import (
    MirrorError,
    enabled,
    gb,
    intact,
    mark,
    model_spec,
    pinned_revision,
    root,
)
from updates.models import ACTIVE, Fetch, FetchState

log = logging.getLogger(__name__)

# A "fetching" row not moved for this long was being fetched by a worker that died.
STALE_AFTER_S = 120
# How a queued fetch reaches the workers: ``updates.tasks.fetch_into_mirror.delay``, set as
# the app starts (``updates.apps``): the tasks call the mirror, never the other way round.
to_worker: Callable[..., object] | None = None
# A fetch that ended this many seconds ago answers a node's ask racing its end.
FRESH_S = 60
# How a fetch a dead worker left says so (``resume_stale``).
STALE_MARK = "its worker stopped"
# A failed fetch is queued again by a node's ask only after this many seconds.
RETRY_FAILED_AFTER_S = 300


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
    m = model_spec(model_name)
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
    mark(model_name)
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
    return recent if recent is not None and intact(recent) else None


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
        if intact(f):
            return f
    return None


def models_q_commit_or_revision(revision: str) -> Any:
    return Q(commit=revision) | Q(revision=revision)


def dispatch(pk: int) -> None:
    """Have a queued fetch run in the background once the transaction commits."""
    if settings.REDIS_URL:
        send = to_worker
        if send is None:
            raise RuntimeError("the updates app is not ready: no way to the workers is set")
        transaction.on_commit(lambda: send(pk))
    else:
        transaction.on_commit(
            lambda: threading.Thread(
                target=_in_thread, args=(pk,), name=f"mirror-fetch-{pk}", daemon=True
            ).start()
        )


def _in_thread(pk: int) -> None:
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
        where = f"{gb(f.bytes_done)} of {gb(f.bytes_total)}" if f.bytes_total else ""
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
            mark(f.model)
    return ids


# -- reading what is held -----------------------------------------------------------------------


def latest_fetch(model_name: str) -> Fetch | None:
    """Return a model's newest fetch (any state), or None."""
    return Fetch.objects.filter(model=model_name).order_by("-id").first()


def local_path(model_name: str, revision: str | None = None) -> Path | None:
    """Return the folder holding a model's files at ``revision`` (its pinned one for
    None), or None when the mirror does not hold them whole (not fetched, failed, dropped,
    a file lost or damaged: ``store.intact``)."""
    if revision is None:
        try:
            revision = pinned_revision(model_spec(model_name))
        except MirrorError:
            return None
    q = Fetch.objects.filter(model=model_name, state=FetchState.DONE)
    q = q.filter(models_q_commit_or_revision(revision)) if revision else q
    for f in q.order_by("-finished", "-id"):
        if intact(f):
            return root() / f.folder
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
    m = model_spec(model_name)
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
    if done is not None and intact(done):
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
