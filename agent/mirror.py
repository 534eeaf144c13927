"""A node's side of the weights mirror: a model's files taken from the control plane.

No Django here. When the control plane mirrors a model's weights (docs/updates.md), a node
takes them from it, never from the internet: it asks for the model's manifest with its
node token (``GET /api/v1/updates/mirror/models/<name>/``), waits while the mirror is
fetching (its progress is the replica's), then takes each file over the control
plane's HTTP into ``<weights folder>/mirror/<the mirror's folder>/``: into a ``.part`` file
first, resumed with a Range request after a broken transfer, its sha256 checked again here,
then kept as the mirror keeps it (updates.mirror.store): once by content, in
``<weights folder>/mirror/blobs/<sha256>`` (read-only), the revision's folder holding a
relative symbolic link to it. A file whose blob the node holds already (the same content in
another revision) is linked, not taken again: a node that holds a model's revision N takes
only the files of N+1 that changed. ``.llmgw-verified.json`` in the folder records the
files checked, so a replica started again reads nothing twice.

Folders from before the blobs (files in each revision's folder) are turned into links at
the first fetch of a client (``adopt_legacy``), each file hard-linked into the blobs under
the sha256 it was checked against, then the link swapped in: no byte copied, and the file
at its place throughout (an engine running from it reads on).

The control plane answering 404 (the mirror off, ``LLMGW_MIRROR=off``, or a source with
nothing to mirror) means the node fetches as it did before (``agent.weights``); so does
this node's own ``LLMGW_MIRROR=off`` (``enabled``).
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import quote

import httpx

from agent import transfer, weights
from agent.state import write_atomic

log = logging.getLogger(__name__)

VERIFIED = ".llmgw-verified.json"
# Under the node's mirror folder: each content once, by its sha256.
BLOBS = "blobs"
_SHA256 = re.compile(r"[0-9a-f]{64}")
# Written once every file of a folder is checked: the source the folder holds.
SOURCE = ".llmgw-source"
# Broken transfers of one file resumed within one fetch before it fails.
ATTEMPTS = 4
# Seconds between asks while the mirror is fetching.
POLL_S = 2.0


@dataclass
class Took:
    """What one fetch from the mirror took: ``files`` received over the network and their
    ``bytes``; ``held``, the files its revision's folder held already (a replica started
    again). The rest were linked to blobs the node held for another revision."""

    files: int = 0
    bytes: int = 0
    held: int = 0


def enabled(environ: Any = os.environ) -> bool:
    """Return whether this node takes weights from the mirror (``LLMGW_MIRROR``)."""
    return str(environ.get("LLMGW_MIRROR", "on")).strip().lower() not in ("off", "false", "0")


class MirrorClient:
    """Fetch models' files from the control plane's mirror for one node (its token)."""

    def __init__(
        self,
        server: str,
        token: Any,
        weights_dir: str | os.PathLike[str],
        *,
        timeout_s: float = 30.0,
        poll_s: float = POLL_S,
    ) -> None:
        """``token`` is a callable returning the node token now (it changes on a rejoin)."""
        self.server = server.rstrip("/")
        self._token = token
        self.folder = Path(weights_dir) / "mirror"
        self.timeout = httpx.Timeout(timeout_s, connect=min(timeout_s, 5.0))
        self.timeout_s = timeout_s
        self.poll_s = poll_s
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()
        self._adopted = False
        # What the last fetch took (the files it received, their bytes, the files held).
        self.took = Took()

    def _headers(self) -> dict[str, str]:
        token = self._token() if callable(self._token) else self._token
        return {"Authorization": f"Bearer {token or ''}", "User-Agent": "llmgw-agent"}

    def _client(self, headers: dict[str, str]) -> httpx.Client:
        return httpx.Client(
            base_url=self.server, timeout=self.timeout, headers=headers, verify=transfer.tls()
        )

    def fetch(
        self,
        model: str,
        source: str,
        engine: str,
        *,
        progress: weights.Progress | None = None,
        cancel: threading.Event | None = None,
    ) -> str | None:
        """Return the path to hand the engine, from the mirror; None when the mirror does
        not serve this model (the node fetches as before).

        A sim engine needs no weights to start: it asks without having a fetch queued,
        which the control plane then queues only for a model with an origin (whose files
        are what it runs from), and waits only for such a fetch.

        Raises:
            weights.WeightsError: the mirror failed the fetch, a file's sha256 differs, or
                the control plane cannot be reached (``retry``).
        """
        if not model or weights.kind(source) not in ("url", "hf"):
            return None
        wait = engine != "sim"
        headers = self._headers()
        with self._client(headers) as http:
            while True:
                if cancel is not None and cancel.is_set():
                    raise weights.DownloadCancelled("download cancelled", detail=model)
                body, code = self._manifest(http, model, wait)
                if code == 200:
                    return self._download(headers, body, source, engine, progress, cancel)
                if code == 202:
                    if progress:
                        total = body.get("bytes_total")
                        progress(int(body.get("bytes_done") or 0), int(total) if total else None)
                    if cancel is not None:
                        cancel.wait(self.poll_s)
                    else:
                        threading.Event().wait(self.poll_s)
                    continue
                if code == 404:
                    return None
                if code == 409:
                    raise weights.WeightsError(
                        "the control plane's mirror could not fetch the weights",
                        retry=True,
                        detail=str(body.get("reason") or ""),
                    )
                raise weights.WeightsError(
                    "the control plane's mirror refused this node",
                    retry=True,
                    detail=f"HTTP {code}: {body.get('detail', '')}",
                )

    def _manifest(self, http: httpx.Client, model: str, wait: bool) -> tuple[dict[str, Any], int]:
        try:
            r = http.get(
                f"/api/v1/updates/mirror/models/{quote(model, safe='')}/",
                params={"enqueue": "1" if wait else "0"},
            )
        except httpx.HTTPError as exc:
            raise weights.WeightsError(
                "the control plane's mirror cannot be reached",
                retry=True,
                detail=f"{type(exc).__name__}: {exc}",
            ) from None
        try:
            body = r.json()
        except ValueError:
            body = {}
        if r.status_code >= 500:
            raise weights.WeightsError(
                "the control plane's mirror is failing", retry=True, detail=f"HTTP {r.status_code}"
            )
        return (body if isinstance(body, dict) else {}), r.status_code

    def _url(self, url: str) -> str:
        """Return a file's URL as the manifest gave it (a path on the control plane, or
        whole)."""
        return url if "://" in url else self.server + "/" + url.lstrip("/")

    def _adopt_once(self) -> None:
        with self._guard:
            if self._adopted:
                return
            self._adopted = True
        try:
            adopt_legacy(self.folder)
        except OSError:
            log.warning(
                "keeping the mirror's files of %s as blobs failed", self.folder, exc_info=True
            )

    def _lock(self, key: str) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(key, threading.Lock())

    def _download(
        self,
        headers: dict[str, str],
        manifest: dict[str, Any],
        source: str,
        engine: str,
        progress: weights.Progress | None,
        cancel: threading.Event | None,
    ) -> str:
        dest = self.folder.joinpath(*_parts(str(manifest.get("folder") or "")))
        files = [f for f in manifest.get("files") or [] if isinstance(f, dict)]
        total = sum(int(f.get("bytes") or 0) for f in files) or None
        took = Took()
        with self._lock(str(dest)):
            self._adopt_once()
            dest.mkdir(parents=True, exist_ok=True)
            verified = _load(dest / VERIFIED)
            done = 0
            for f in files:
                rel = str(f.get("path") or "")
                target = dest.joinpath(*_parts(rel))
                sha = str(f.get("sha256") or "").lower()
                size = int(f.get("bytes") or 0)
                blob = self.folder / BLOBS / sha if _SHA256.fullmatch(sha) else None
                if _whole(target, blob, size) and verified.get(rel) == sha:
                    done += size
                    took.held += 1
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                if blob is not None and _held(blob, size):
                    # The same content in another revision: linked, not taken again.
                    _link(target, blob)
                else:
                    part = target.with_name(target.name + ".part")
                    base = done

                    def moved(have: int, _total: int | None, base: int = base) -> None:
                        if progress:
                            progress(base + have, total)

                    got = _stream(
                        self._url(str(f.get("url") or "")),
                        part,
                        size,
                        headers,
                        self.timeout_s,
                        moved,
                        cancel,
                    )
                    if sha and got != sha:
                        part.unlink(missing_ok=True)
                        raise weights.WeightsError(
                            "the weights from the mirror are not the expected ones (their "
                            "sha256 differs)",
                            detail=f"{rel} from the control plane has sha256 {got}, not {sha}: "
                            "deleted it",
                        )
                    took.files += 1
                    took.bytes += part.stat().st_size
                    if blob is not None:
                        _keep(part, blob)
                        _link(target, blob)
                    else:
                        os.replace(part, target)
                verified[rel] = sha
                write_atomic(dest / VERIFIED, json.dumps(verified, indent=1, sort_keys=True))
                done += size
            # Every file is here and checked: the node holds this source's weights (its
            # inventory says so: agent.weights.held_sources).
            marker = dest / SOURCE
            if not marker.is_file() or marker.read_text(encoding="utf-8") != source:
                write_atomic(marker, source)
        self.took = took
        if took.files:
            log.info(
                "took %d of %d files of %s (%d bytes) from the mirror; %d held already",
                took.files,
                len(files),
                source,
                took.bytes,
                len(files) - took.files,
            )
        return str(_for_engine(dest, [str(f.get("path") or "") for f in files], source, engine))


def _stream(
    url: str,
    part: Path,
    size: int,
    headers: dict[str, str],
    timeout_s: float,
    progress: weights.Progress,
    cancel: threading.Event | None,
) -> str:
    """Fill ``part`` with a file from the control plane, resuming what it holds (Range),
    and return the whole file's sha256, hashed as the bytes arrive (``agent.transfer``: one
    pass over them, the hash on a thread of its own).

    Raises:
        weights.WeightsError: the control plane refused, or the transfer kept breaking.
        weights.DownloadCancelled: ``cancel`` was set.
    """

    return weights.receive(
        url,
        part,
        size=size,
        progress=progress,
        cancel=cancel,
        refused="the control plane's mirror refused a file",
        failed="downloading the weights from the control plane's mirror failed",
        timeout_s=timeout_s,
        attempts=ATTEMPTS,
        headers=headers,
    )


def _held(blob: Path, size: int) -> bool:
    """Return whether a blob is held whole (its name is its checked sha256)."""
    try:
        return blob.stat().st_size == size
    except OSError:
        return False


def _whole(target: Path, blob: Path | None, size: int) -> bool:
    """Return whether a file's place holds it: a link to its blob, held whole, or (a
    folder from before the blobs, or a file of no sha256) a file of its size."""
    if blob is not None and target.is_symlink():
        try:
            linked = os.readlink(target)
        except OSError:
            return False
        return os.path.basename(linked) == blob.name and _held(blob, size)
    return not target.is_symlink() and target.is_file() and target.stat().st_size == size


def _keep(checked: Path, blob: Path) -> None:
    """Put a file whose sha256 was checked into the blobs (renamed, read-only), or drop it
    when that blob is held already."""
    blob.parent.mkdir(parents=True, exist_ok=True)
    if _held(blob, checked.stat().st_size):
        checked.unlink()
        return
    os.chmod(checked, 0o444)
    os.replace(checked, blob)


def _link(place: Path, blob: Path) -> None:
    """Make ``place`` a relative link to ``blob``, in one step over what was there."""
    target = os.path.relpath(blob, place.parent)
    try:
        if os.readlink(place) == target:
            return
    except OSError:
        pass
    tmp = place.with_name(f".{uuid.uuid4().hex[:12]}.link")
    os.symlink(target, tmp)
    os.replace(tmp, place)


def adopt_legacy(folder: Path) -> int:
    """Turn the files of a node's mirror folders from before the blobs into links to blobs
    (those ``.llmgw-verified.json`` records as checked, by their sha256); return how many."""
    turned = 0
    blobs = folder / BLOBS
    for record in folder.rglob(VERIFIED):
        if blobs in record.parents:
            continue
        for rel, sha in _load(record).items():
            try:
                place = record.parent.joinpath(*_parts(str(rel)))
            except weights.WeightsError:
                continue
            if not _SHA256.fullmatch(str(sha)) or place.is_symlink() or not place.is_file():
                continue
            blob = blobs / str(sha)
            if not _held(blob, place.stat().st_size):
                blobs.mkdir(parents=True, exist_ok=True)
                tmp = blobs / f".{sha}.{uuid.uuid4().hex[:12]}"
                try:
                    os.link(place, tmp)
                except OSError:
                    shutil.copyfile(place, tmp)
                os.chmod(tmp, 0o444)
                os.replace(tmp, blob)
            _link(place, blob)
            turned += 1
    if turned:
        log.info("kept %d files of %s from before as blobs", turned, folder)
    return turned


def _parts(rel: str) -> tuple[str, ...]:
    """Return a relative path's parts, refusing one that leaves its folder."""
    parts = PurePosixPath(rel).parts
    if not parts or rel.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise weights.WeightsError(
            "the control plane's mirror named a file outside its folder", detail=repr(rel)
        )
    return parts


def _load(path: Path) -> dict[str, str]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _for_engine(dest: Path, paths: list[str], source: str, engine: str) -> Path:
    """Return what the engine is given: the file of a URL source; llama.cpp's one .gguf of
    a repository; the folder of a repository otherwise (engines that would have fetched a
    Hugging Face id themselves are given the mirrored folder instead)."""
    if weights.kind(source) == "url" and len(paths) == 1:
        return dest.joinpath(*_parts(paths[0]))
    if engine == "llamacpp":
        ggufs = sorted(p for p in paths if p.lower().endswith(".gguf"))
        if len(ggufs) == 1:
            return dest.joinpath(*_parts(ggufs[0]))
        raise weights.WeightsError(
            f"llama.cpp loads one .gguf file and {source} holds "
            f"{len(ggufs) or 'no'} ({', '.join(ggufs[:5]) or 'none'}): give the model's source "
            "as the URL of the one to load"
        )
    return dest
