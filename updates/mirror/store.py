"""The mirror's folder: each file's content kept once (``blobs/<sha256>``), each commit a
folder of links to them, the locks of their writers, the bytes held, and what ``prune``
drops.

A revision's folder (``folder_for``) holds, for each of its files, a symbolic link to the
blob of that file's content, relative (``../../../../blobs/<sha256>``, so the mirror's
folder can move). Symbolic, not hard links: a damaged blob is replaced once, at its one
path, and every revision linking it has the new bytes (a hard link would keep the damaged
inode in each revision's folder until each was linked again), a link says which blob it
is (``prune`` counts references by reading them), and it leads nowhere once its blob is
set aside, so a damaged file is not served. Engines, the file route and ``huggingface_hub``'s
own cache all follow such links.

A blob is put in place only once its bytes were checked against the sha256 it is named by
(a rename, no copy), read-only; ``checked/<sha256>`` records its size, mtime and inode as
they were then. A blob whose record no longer matches (written to since: damaged) is not
trusted: ``intact`` sets it aside (``suspect/<sha256>``) so nothing serves it, and the next
fetch that needs it hashes it again: the same bytes are put back, others deleted and fetched
again.

Folders from before the blobs (one folder of files per commit) are served as they are;
``adopt_legacy`` (each fetch runs it first) turns each done fetch's files into blobs and
links, trusting the sha256 its fetch checked (a hard link then the link swapped in: no byte
copied, and never a moment without the file).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import re
import shutil
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from django.conf import settings
from django.db import connection
from django.utils import timezone

from catalog.services import stored_specs
from llmgw_core import events
from updates import registry
from updates.models import ACTIVE, Fetch, FetchState

log = logging.getLogger(__name__)
CHUNK = 1024 * 1024
# Under the mirror's folder: each content once, by its sha256; what each looked like when its
# bytes were checked; the blobs set aside as damaged until a fetch hashes them again.
BLOBS = "blobs"
CHECKED = "checked"
SUSPECT = "suspect"
# The folders revisions are kept in (``folder_for``).
REVISIONS = ("hf", "url")
_SHA256 = re.compile(r"[0-9a-f]{64}")


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
    name = hashlib.sha256(rel.encode()).hexdigest()[:24]
    with _flock(name, rel, fetch, LOCK_WAIT_S):
        yield


# The blobs' lock is held for a link made or a blob put or swept, never for a transfer.
BLOBS_LOCK_WAIT_S = 600.0


@contextlib.contextmanager
def blobs_lock() -> Iterator[None]:
    """Hold the lock of the blobs, across processes: a blob put in place and linked, or
    taken and linked, in one step against ``sweep_blobs`` (which would otherwise see it
    linked by nothing and delete it)."""
    with _flock("blobs", "the blobs", None, BLOBS_LOCK_WAIT_S):
        yield


@contextlib.contextmanager
def _flock(name: str, what: str, fetch: Fetch | None, wait_s: float) -> Iterator[None]:
    locks = root() / ".locks"
    locks.mkdir(parents=True, exist_ok=True)
    with open(locks / f"{name}.lock", "a+b") as f:
        started = touched = time.monotonic()
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                now = time.monotonic()
                if now - started > wait_s:
                    raise MirrorError(
                        f"another fetch held the lock of {what} for {wait_s / 3600:.1f} "
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


# -- the blobs --------------------------------------------------------------------------------


def blob_path(sha: str) -> Path:
    """Return where the content of sha256 ``sha`` is kept."""
    if not _SHA256.fullmatch(sha):
        raise MirrorError(f"{sha[:80]!r} is not a sha256 (64 lower-case hex digits)")
    return root() / BLOBS / sha


def _checked_path(sha: str) -> Path:
    return root() / CHECKED / sha


def _suspect_path(sha: str) -> Path:
    return root() / SUSPECT / sha


def _look(st: os.stat_result) -> str:
    return f"{st.st_size} {st.st_mtime_ns} {st.st_ino}"


def _record_checked(sha: str) -> None:
    """Record blob ``sha`` as it stands now as checked (its bytes are its name's)."""
    path = _checked_path(sha)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{sha}.{uuid.uuid4().hex[:12]}")
    tmp.write_text(_look(blob_path(sha).stat()), encoding="ascii")
    os.replace(tmp, path)


def trusted(sha: str, size: int | None = None) -> bool:
    """Return whether blob ``sha`` is held, of ``size`` bytes (any for None), and unchanged
    since its bytes were checked (its size, mtime and inode as they were then)."""
    try:
        st = blob_path(sha).stat()
        recorded = _checked_path(sha).read_text(encoding="ascii")
    except (OSError, UnicodeDecodeError, MirrorError):
        return False
    return (size is None or st.st_size == size) and recorded == _look(st)


def linked_sha(place: Path) -> str | None:
    """Return the sha256 of the blob ``place`` links to, or None when it is no link to a
    blob (a file of a folder from before the blobs, or nothing)."""
    try:
        target = os.readlink(place)
    except OSError:
        return None
    name = os.path.basename(target)
    if not _SHA256.fullmatch(name) or os.path.basename(os.path.dirname(target)) != BLOBS:
        return None
    return name


def link_to_blob(place: Path, sha: str) -> None:
    """Make ``place`` (a file's place in a revision's folder) a relative link to blob
    ``sha``, in one step over whatever was there."""
    place.parent.mkdir(parents=True, exist_ok=True)
    target = os.path.relpath(blob_path(sha), place.parent)
    try:
        if os.readlink(place) == target:
            return
    except OSError:
        pass
    tmp = place.with_name(f".{uuid.uuid4().hex[:12]}.link")
    os.symlink(target, tmp)
    os.replace(tmp, place)


def put_blob(checked: Path, sha: str) -> None:
    """Put a file whose bytes were checked to be ``sha``'s into the blobs (renamed: no
    byte copied; read-only), or drop it when that blob is held already. Call it under
    ``blobs_lock`` and link the blob before letting go."""
    if trusted(sha, checked.stat().st_size):
        checked.unlink()
        return
    dest = blob_path(sha)
    dest.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(checked, 0o444)
    os.replace(checked, dest)
    _suspect_path(sha).unlink(missing_ok=True)
    _record_checked(sha)


def take(place: Path, sha: str, size: int | None) -> bool:
    """Link ``place`` to blob ``sha`` when it is held with its bytes (``size`` of them);
    return whether it was. A blob changed since it was checked, or set aside as damaged,
    is hashed again first: the same bytes are trusted again, other bytes deleted (the
    caller fetches the file)."""
    with blobs_lock():
        if trusted(sha, size):
            link_to_blob(place, sha)
            return True
    if not _recheck(sha, size):
        return False
    with blobs_lock():
        if trusted(sha, size):
            link_to_blob(place, sha)
            return True
    return False


def _recheck(sha: str, size: int | None) -> bool:
    """Hash a blob held but not trusted (outside the lock: it may take a while); put it
    back trusted when its bytes are its name's, delete it otherwise. Return whether it
    is trusted now."""
    blob = blob_path(sha)
    for held in (blob, _suspect_path(sha)):
        try:
            if size is not None and held.stat().st_size != size:
                raise ValueError
            same = sha256_of(held) == sha
        except FileNotFoundError:
            continue
        except (OSError, ValueError):
            same = False
        with blobs_lock():
            if not same:
                log.warning("the mirror's copy of %s was damaged: deleted, fetched again", sha)
                held.unlink(missing_ok=True)
                continue
            try:
                if held != blob:
                    os.replace(held, blob)
                _record_checked(sha)
            except OSError:
                return False
            return True
    _checked_path(sha).unlink(missing_ok=True)
    return False


def set_aside(sha: str) -> bool:
    """Move a blob that changed since it was checked out of the links' way
    (``suspect/<sha256>``): nothing serves it until a fetch hashes it again. Return False
    when it is trusted after all (put in place by a fetch meanwhile: looked at again under
    the lock)."""
    with blobs_lock():
        if trusted(sha):
            return False
        blob = blob_path(sha)
        if blob.exists():
            log.warning("the mirror's copy of %s changed since it was checked: set aside", sha)
            dest = _suspect_path(sha)
            dest.parent.mkdir(parents=True, exist_ok=True)
            os.replace(blob, dest)
            _checked_path(sha).unlink(missing_ok=True)
        return True


def linked_blobs() -> set[str]:
    """Return the blobs some folder of the mirror links: every revision's, and every
    ``.part`` folder a fetch is filling or left to resume (a link leading nowhere, to a
    blob set aside, counts too)."""
    found = set()
    for top in REVISIONS:
        for folder, dirs, files in os.walk(root() / top):
            for name in (*files, *dirs):
                sha = linked_sha(Path(folder) / name)
                if sha is not None:
                    found.add(sha)
    return found


def sweep_blobs() -> list[str]:
    """Delete the blobs no folder links (reference counting by the links themselves), and
    their records; return their sha256."""
    gone = []
    with blobs_lock():
        linked = linked_blobs()
        for kind in (BLOBS, SUSPECT, CHECKED):
            try:
                names = os.listdir(root() / kind)
            except FileNotFoundError:
                continue
            for name in names:
                if _SHA256.fullmatch(name) and name not in linked:
                    (root() / kind / name).unlink(missing_ok=True)
                    if kind == BLOBS:
                        gone.append(name)
    return gone


def held_bytes() -> int:
    """Return the bytes the blobs take on the mirror's disk (each content once)."""
    total = 0
    for kind in (BLOBS, SUSPECT):
        try:
            with os.scandir(root() / kind) as entries:
                total += sum(e.stat().st_size for e in entries if e.is_file())
        except FileNotFoundError:
            continue
    return total


def whole(place: Path, size: int | None, sha: str = "") -> bool:
    """Return whether a file's place holds it whole: a link to a trusted blob (``sha``'s
    when given), or, in a folder from before the blobs, a file of its size."""
    linked = linked_sha(place)
    if linked is not None:
        return (not sha or linked == sha) and trusted(linked, size)
    if place.is_symlink():
        return False
    try:
        return place.is_file() and (size is None or place.stat().st_size == size)
    except OSError:
        return False


def intact(f: Fetch) -> bool:
    """Return whether a done fetch's folder holds each of its files whole (``whole``). A
    blob it links that changed since it was checked is set aside on the way (``set_aside``):
    nothing serves it, and a fetch hashes it again, or fetches it again."""
    if not f.folder:
        return False
    folder = root() / f.folder
    if not folder.is_dir():
        return False
    ok = True
    for x in f.files or []:
        try:
            place = file_in(folder, str(x.get("path") or ""))
        except MirrorError:
            return False
        size = int(x["bytes"]) if x.get("bytes") else None
        sha = str(x.get("sha256") or "")
        if whole(place, size, sha):
            continue
        linked = linked_sha(place)
        if (
            linked is None
            or (sha and linked != sha)
            or set_aside(linked)
            or not whole(place, size, sha)
        ):
            ok = False
    return ok


def served_file(folder: str, rel: str, sha: str) -> Path | None:
    """Return a done fetch's file to send a node, or None when its place holds nothing
    whole (a blob changed since it was checked is set aside, never sent)."""
    place = file_in(root() / folder, rel)
    linked = linked_sha(place)
    if linked is None:
        return place
    if (sha and linked != sha) or (not trusted(linked) and set_aside(linked)):
        return None
    return place


def known_contents() -> dict[str, str]:
    """Return the sha256 of each file the mirror's done fetches hold by git's blob id: a
    file a registry keeps in git (no sha256 published) is known by it and not fetched
    again when a later commit holds it unchanged."""
    known: dict[str, str] = {}
    for files in Fetch.objects.filter(state=FetchState.DONE).values_list("files", flat=True):
        for x in files or []:
            blob_id, sha = str(x.get("blob_id") or ""), str(x.get("sha256") or "")
            if blob_id and _SHA256.fullmatch(sha):
                known[blob_id] = sha
    return known


def adopt_legacy() -> int:
    """Turn the done fetches' folders from before the blobs (a folder of files per commit)
    into links to blobs, trusting the sha256 each fetch checked; return the files turned."""
    turned = 0
    done = Fetch.objects.filter(state=FetchState.DONE).exclude(folder="")
    for folder, files in done.values_list("folder", "files"):
        base = root() / folder
        if not base.is_dir():
            continue
        for x in files or []:
            sha = str(x.get("sha256") or "")
            try:
                place = file_in(base, str(x.get("path") or ""))
            except MirrorError:
                continue
            if not _SHA256.fullmatch(sha) or place.is_symlink() or not place.is_file():
                continue
            if x.get("bytes") and place.stat().st_size != int(x["bytes"]):
                continue
            adopt(place, sha)
            turned += 1
    if turned:
        log.info("the mirror kept %d files of its folders from before as blobs", turned)
    return turned


def adopt(place: Path, sha: str) -> None:
    """Make a file whose bytes are known to be ``sha``'s a blob, and ``place`` a link to
    it: hard-linked into the blobs, then the link swapped in (no byte copied, and the file
    is at ``place`` throughout; copied where a hard link cannot be made)."""
    with blobs_lock():
        if not trusted(sha, place.stat().st_size):
            blob = blob_path(sha)
            blob.parent.mkdir(parents=True, exist_ok=True)
            tmp = blob.with_name(f".{sha}.{uuid.uuid4().hex[:12]}")
            try:
                os.link(place, tmp)
            except OSError:
                shutil.copyfile(place, tmp)
            os.chmod(tmp, 0o444)
            os.replace(tmp, blob)
            _suspect_path(sha).unlink(missing_ok=True)
            _record_checked(sha)
        link_to_blob(place, sha)


def content(f: registry.RepoFile, known: dict[str, str]) -> str:
    """Return a file's sha256 as known before it is fetched: the registry's, or the one a
    done fetch recorded for its git blob id (``known_contents``); "" when not known."""
    if f.sha256:
        return f.sha256
    return known.get(f.blob_id, "") if f.blob_id else ""


def complete(final: Path, state: registry.RepoState, known: dict[str, str]) -> bool:
    """Return whether a folder holds every file of a state whole already (an earlier
    fetch): each a link to a trusted blob of its content (``whole``)."""
    if not final.is_dir():
        return False
    return all(whole(file_in(final, f.path), f.size, content(f, known)) for f in state.files)


def held_contents(exclude: int | None = None, *, running: bool = True) -> dict[str, int]:
    """Return what the mirror's done and (with ``running``) running fetches hold, each
    content once: its bytes by its sha256 (by its folder and path for a file of no sha256,
    by its folder for a running fetch whose files are not listed yet)."""
    held: dict[str, int] = {}
    states = (*ACTIVE, FetchState.DONE) if running else (FetchState.DONE,)
    q = Fetch.objects.filter(state__in=states).exclude(folder="")
    if exclude is not None:
        q = q.exclude(pk=exclude)
    for folder, total, files in q.values_list("folder", "bytes_total", "files"):
        if not files:
            key = f"folder:{folder}"
            held[key] = max(held.get(key, 0), int(total or 0))
            continue
        for x in files:
            sha = str(x.get("sha256") or "")
            key = sha if _SHA256.fullmatch(sha) else f"folder:{folder}/{x.get('path')}"
            held[key] = int(x.get("bytes") or 0)
    return held


def used_bytes(exclude: int | None = None) -> int:
    """Return the bytes the mirror's done and running fetches take (each content once)."""
    return sum(held_contents(exclude).values())


def kept_bytes() -> int:
    """Return the bytes the mirror's done fetches hold, each content once: what its
    revisions take on the disk (two that share seven files of eight take the seven once)."""
    return sum(held_contents(running=False).values())


def held_for_resume(final: Path, state: registry.RepoState) -> int:
    """Return the bytes of ``state``'s files a ``.part`` folder holds already (the ``.part``
    of one broken off, and whole files of a folder from before the blobs; a link to a blob
    is held in the blobs): a resume writes only the rest."""
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
            if path.is_symlink():
                break
            try:
                got = path.stat().st_size
            except OSError:
                continue
            held += min(got, f.size) if f.size is not None else got
            break
    return held


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
    no kept fetch shares them, then the blobs no folder links any more (``sweep_blobs``: a
    blob a kept revision shares stays); return the folders deleted."""
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
    gone = sweep_blobs()
    if gone:
        log.info("the mirror deleted %d files no kept revision holds", len(gone))
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
        events.changed(models=[model_name])
    except Exception:
        log.debug("marking %s changed failed", model_name, exc_info=True)
