"""A node's side of the weights mirror: a model's files taken from the control plane.

No Django here. When the control plane mirrors a model's weights (docs/updates.md), a node
takes them from it, never from the internet: it asks for the model's manifest with its
node token (``GET /api/v1/updates/mirror/models/<name>/``), waits while the mirror is
fetching (its progress is the replica's), then downloads each file over the control
plane's HTTP into ``<weights folder>/mirror/<the mirror's folder>/``: into a ``.part`` file
first, resumed with a Range request after a broken transfer, its sha256 checked again here,
then renamed into place. ``.llmgw-verified.json`` in that folder records the files checked,
so a replica started again reads nothing twice.

The control plane answering 404 (the mirror off, ``LLMGW_MIRROR=off``, or a source with
nothing to mirror) means the node fetches as it did before (``agent.weights``); so does
this node's own ``LLMGW_MIRROR=off`` (``enabled``).
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import quote

import httpx

from agent import transfer, weights
from agent.state import write_atomic

VERIFIED = ".llmgw-verified.json"
# Written once every file of a folder is checked: the source the folder holds.
SOURCE = ".llmgw-source"
# Broken transfers of one file resumed within one fetch before it fails.
ATTEMPTS = 4
# Seconds between asks while the mirror is fetching.
POLL_S = 2.0


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
        with self._lock(str(dest)):
            dest.mkdir(parents=True, exist_ok=True)
            verified = _load(dest / VERIFIED)
            done = 0
            for f in files:
                rel = str(f.get("path") or "")
                target = dest.joinpath(*_parts(rel))
                sha = str(f.get("sha256") or "").lower()
                size = int(f.get("bytes") or 0)
                if target.is_file() and verified.get(rel) == sha and target.stat().st_size == size:
                    done += size
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
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
                        "the weights from the mirror are not the expected ones (their sha256 "
                        "differs)",
                        detail=f"{rel} from the control plane has sha256 {got}, not {sha}: "
                        "deleted it",
                    )
                os.replace(part, target)
                verified[rel] = sha
                write_atomic(dest / VERIFIED, json.dumps(verified, indent=1, sort_keys=True))
                done += size
            # Every file is here and checked: the node holds this source's weights (its
            # inventory says so: agent.weights.held_sources).
            marker = dest / SOURCE
            if not marker.is_file() or marker.read_text(encoding="utf-8") != source:
                write_atomic(marker, source)
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
