"""One fetch run (the worker's part): a revision's files that the mirror does not hold yet
downloaded, resumed, checked against the registry's hashes and kept as blobs; the
revision's folder of links to them renamed into place in one step.

A file whose content the mirror holds already (the registry's sha256 of an LFS file, or a
file kept in git by the blob id a done fetch recorded) is linked, not fetched: an update
that changes one file of eight fetches that one."""

from __future__ import annotations

import errno
import logging
import os
import shutil
import time
from pathlib import Path

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from agent import transfer
from agent.weights import origin_of
from updates import registry
from updates.mirror.origin import write_origin
from updates.mirror.store import (
    MirrorError,
    adopt,
    adopt_legacy,
    blob_path,
    blobs_lock,
    complete,
    content,
    file_in,
    folder_for,
    folder_lock,
    gb,
    git_blob_id,
    held_contents,
    held_for_resume,
    known_contents,
    link_to_blob,
    linked_sha,
    mark,
    prune,
    put_blob,
    root,
    sha256_of,
    sweep_blobs,
    take,
    whole,
)
from updates.models import ACTIVE, Fetch, FetchState

log = logging.getLogger(__name__)

# Seconds between writes of a fetch's progress to its row.
PROGRESS_EVERY_S = 0.5
# Seconds a download may take to connect, and each read of it to arrive.
READ_TIMEOUT_S = 60.0
# Broken transfers of one file resumed within one fetch before it fails (and is resumed
# by the next fetch, from what is held).
ATTEMPTS = 5


# -- fetching (the worker's part) ----------------------------------------------------------


class Progress:
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
        mark(self.fetch.model)


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
    mark(fetch.model)
    try:
        state = registry.latest(fetch.source, fetch.revision or None)
        fetch.commit = state.commit
        fetch.folder = folder_for(fetch.source, state.commit)
        fetch.bytes_total = state.total_bytes
        fetch.save(update_fields=["commit", "folder", "bytes_total", "updated"])
        final = root() / fetch.folder
        try:
            adopt_legacy()
        except OSError:
            # The old folders stay served as they are; this fetch links what it can.
            log.warning("keeping the mirror's folders from before as blobs failed", exc_info=True)
        known = known_contents()
        hashed: dict[str, str] = {}
        with folder_lock(fetch.folder, fetch):
            if not complete(final, state, known):
                _check_room(fetch, state, final, known)
                hashed = _download_or_free(fetch, state, final, known)
        fetch.files = [
            {
                "path": f.path,
                # A file the registry gave no sha256 for: the one hashed as it arrived, or
                # the blob's it links.
                "sha256": f.sha256
                or hashed.get(f.path)
                or linked_sha(file_in(final, f.path))
                or sha256_of(file_in(final, f.path)),
                "bytes": f.size or 0,
                "blob_id": f.blob_id,
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
    mark(fetch.model)
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
    mark(fetch.model)
    return fetch


def _check_room(
    fetch: Fetch, state: registry.RepoState, final: Path, known: dict[str, str]
) -> None:
    """Refuse a fetch past the size cap or the disk's free space, saying by how much. Only
    the files whose content the mirror does not hold are needed (each content counts once);
    what a resume holds already (its ``.part`` folder) is on the disk: only the rest is."""
    cap_gb = float(settings.LLMGW_MIRROR_MAX_GB or 0)
    if cap_gb:
        prune()
    held = held_contents(exclude=fetch.pk)
    new = [f for f in state.files if content(f, known) not in held]
    need = 0 if f"folder:{fetch.folder}" in held else sum(f.size or 0 for f in new)
    if cap_gb:
        cap = int(cap_gb * 1e9)
        now = sum(held.values())
        if now + need > cap:
            raise MirrorError(
                f"the mirror's cap is {cap_gb:g} GB (LLMGW_MIRROR_MAX_GB): it holds "
                f"{gb(now)} (the current and previous revisions of its models) and "
                f"{fetch.source} at {fetch.commit[:8]} needs {gb(need)}: raise the cap, or "
                "remove models from the catalog"
            )
    on_disk = sum(f.size or 0 for f in state.files if not _on_disk(f, known))
    resumed = held_for_resume(final, state)
    root().mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(root()).free
    if on_disk - resumed > free:
        was = f" ({gb(resumed)} of it held from an earlier try)" if resumed else ""
        raise MirrorError(
            f"{fetch.source} at {fetch.commit[:8]} needs {gb(on_disk - resumed)} more{was} "
            f"and the mirror's disk has {gb(free)} free: free some, or move LLMGW_MIRROR_DIR"
        )


def _on_disk(f: registry.RepoFile, known: dict[str, str]) -> bool:
    sha = content(f, known)
    return bool(sha) and blob_path(sha).is_file()


def _download_or_free(
    fetch: Fetch, state: registry.RepoState, final: Path, known: dict[str, str]
) -> dict[str, str]:
    """``_download``; when the disk fills up meanwhile, delete what this fetch wrote (its
    ``.part`` folder, and the blobs it put that nothing links) so the disk is not left full,
    and fail saying so."""
    try:
        return _download(fetch, state, final, known)
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        part_dir = final.with_name(final.name + ".part")
        written = sum(
            p.stat().st_size for p in part_dir.rglob("*") if p.is_file() and not p.is_symlink()
        )
        linked = {s for p in part_dir.rglob("*") if (s := linked_sha(p)) is not None}
        shutil.rmtree(part_dir, ignore_errors=True)
        left = "" if not part_dir.exists() else f"; {part_dir} could not be deleted"
        sizes = {s: blob_path(s).stat().st_size for s in linked if blob_path(s).is_file()}
        written += sum(sizes.get(s, 0) for s in sweep_blobs())
        try:
            usage = shutil.disk_usage(root())
            disk = f" ({gb(usage.free)} free of {gb(usage.total)} now)"
        except OSError:
            disk = ""
        raise MirrorError(
            f"the mirror's disk filled up while fetching {fetch.source} at "
            f"{fetch.commit[:8]} ({os.strerror(exc.errno)}): deleted the {gb(written)} this "
            f"fetch had written, so the disk is not left full{left}{disk}; free some space "
            "(or move LLMGW_MIRROR_DIR, or lower LLMGW_MIRROR_MAX_GB under the disk's size) "
            "and fetch again"
        ) from None


def _download(
    fetch: Fetch, state: registry.RepoState, final: Path, known: dict[str, str]
) -> dict[str, str]:
    """Put every file of ``state`` into ``final``'s ``.part`` folder as a link to its blob:
    a content held already is linked (``take``), any other downloaded, checked and put in
    the blobs; then rename the folder into place in one step (or, when ``final`` is there
    already and lost a file, each link into it). Return the sha256 of each file placed, by
    path."""
    part_dir = final.with_name(final.name + ".part")
    part_dir.mkdir(parents=True, exist_ok=True)
    progress = Progress(fetch)
    hub_origin = _origin(registry.endpoint())
    token = registry.token()
    hashed: dict[str, str] = {}
    for f in state.files:
        sha = content(f, known)
        target = file_in(part_dir, f.path)
        if whole(file_in(final, f.path), f.size, sha) or whole(target, f.size, sha):
            # In place already (a folder that lost another file), or linked by an earlier
            # try of this fetch.
            progress.base += f.size or 0
            continue
        if (
            f.size is not None
            and not target.is_symlink()
            and target.is_file()
            and target.stat().st_size == f.size
        ):
            # A whole file an earlier try left in a ``.part`` folder from before the blobs
            # (checked when it was renamed there).
            got = sha or sha256_of(target)
            adopt(target, got)
            hashed[f.path] = got
            progress.base += f.size or 0
            continue
        if sha and take(target, sha, f.size):
            hashed[f.path] = sha
            progress.base += f.size or 0
            progress.at(progress.base, force=True)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        part = target.with_name(target.name + ".part")
        headers: dict[str, str] = {}
        if token and _origin(f.url) == hub_origin:
            headers["Authorization"] = f"Bearer {token}"
        got = _get(f, part, headers, progress)
        _verify(f, part, fetch, got)
        size = part.stat().st_size
        with blobs_lock():
            put_blob(part, got)
            link_to_blob(target, got)
        hashed[f.path] = got
        progress.base += size
        progress.at(progress.base, force=True)
    if final.exists():
        _merge(part_dir, final)
    else:
        os.replace(part_dir, final)
    return hashed


def _merge(part_dir: Path, final: Path) -> None:
    """Put a ``.part`` folder's links into a folder that exists already (a fetch of the same
    commit that was done and then lost a file): each renamed into place (at the same depth,
    so a relative link still leads to its blob)."""
    for path in sorted(part_dir.rglob("*")):
        if path.is_symlink() or path.is_file():
            dest = final / path.relative_to(part_dir)
            dest.parent.mkdir(parents=True, exist_ok=True)
            os.replace(path, dest)
    shutil.rmtree(part_dir, ignore_errors=True)


def _origin(url: str) -> str:
    return origin_of(url)


def _get(f: registry.RepoFile, part: Path, headers: dict[str, str], progress: Progress) -> str:
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
    except transfer.TransferRefused as exc:
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
