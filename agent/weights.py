"""Where an engine's weights come from: a local path, an http(s) URL, a Hugging Face id.

No Django here. A URL is downloaded into the weights folder: into a ``.part`` file first,
resumed with a Range request after a broken transfer, checked against its sha256 when
the replica or the origin gives one, then renamed into place in one step. A Hugging Face
id goes to engines that fetch it themselves (vLLM, SGLang, TensorRT-LLM) as it is.
``sources.json`` in the weights folder records which URL each file came from, which is
what the node reports it holds.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from agent import transfer
from agent.state import write_atomic

MANIFEST = "sources.json"
# Where a URL source may point when the agent is given no --weights-hosts: the origins
# the known judges' and most models' files come from.
DEFAULT_HOSTS = ("https://huggingface.co",)
# A reason's part after this is for operators: the path, the host, what the origin said.
# Viewers are shown what failed, not what a probe of the node's files and ports wants to
# learn (cluster.reasons).
DETAIL = "\n-- "
# Engines that take a Hugging Face id and fetch the repository themselves.
HF_ENGINES = frozenset({"vllm", "sglang", "trtllm"})
_HF_ID = re.compile(r"[A-Za-z0-9][\w.\-]*/[\w.\-]+")
_SHA256 = re.compile(r"[0-9a-f]{64}")
# Broken transfers resumed within one download before giving up; the caller (the
# supervisor) tries again later, resuming from what is on disk.
_ATTEMPTS = 4
# Seconds a download waits to connect, and for each read, before it resumes.
_READ_TIMEOUT_S = 60.0

Progress = Callable[[int, "int | None"], None]

# One download of a URL at a time in this process: two replicas of a model on one node
# share the file, and two writers of one .part file would corrupt it.
_url_locks: dict[str, threading.Lock] = {}
_url_locks_guard = threading.Lock()


class WeightsError(Exception):
    """Refuse or fail to provide weights; the message says why, for a person.

    ``retry`` is true when trying again later may succeed (a broken transfer, an origin
    that answered 5xx), false when it cannot (no such file, a sha256 that differs).
    ``detail`` is what only operators are shown (the message carries it after
    ``DETAIL``).
    """

    def __init__(self, message: str, *, retry: bool = False, detail: str = "") -> None:
        super().__init__(f"{message}{DETAIL}{detail}" if detail else message)
        self.retry = retry
        self.summary = message
        self.detail = detail

    def reason(self, then: str = "") -> str:
        """Return the message with ``then`` said after what failed, before the detail."""
        text = f"{self.summary}; {then}" if then else self.summary
        return f"{text}{DETAIL}{self.detail}" if self.detail else text


def origin_of(url: str) -> str:
    """Return a URL's origin as the allowed hosts are written: ``scheme://host[:port]``.

    The port is left out when it is the scheme's own; the host is lower-case.
    """
    parts = urlsplit(url.strip())
    scheme = parts.scheme.lower()
    try:
        port = parts.port
    except ValueError:
        port = -1
    host = (parts.hostname or "").lower()
    if ":" in host:
        host = f"[{host}]"
    default = {"http": 80, "https": 443}.get(scheme)
    return f"{scheme}://{host}" + (f":{port}" if port and port != default else "")


def allowed_origins(hosts: Sequence[str] | None) -> set[str]:
    """Return the origins a list of allowed hosts names (``DEFAULT_HOSTS`` for None)."""
    return {origin_of(h) for h in (DEFAULT_HOSTS if hosts is None else hosts) if h.strip()}


def check_source(
    source: str,
    folders: Sequence[str | os.PathLike[str]],
    hosts: Sequence[str] | None = None,
) -> None:
    """Refuse a source this node may not read, before anything is opened or connected to.

    A local path must lie under one of ``folders`` once every link in it is followed;
    a URL's scheme and host must be one of ``hosts`` (``DEFAULT_HOSTS`` for None). The
    refusal says nothing of whether the file exists or the port is open.

    Raises:
        WeightsError: not under a weights folder, or not an allowed origin.
    """
    what = kind(source)
    if what == "url":
        origin = origin_of(source)
        allowed = allowed_origins(hosts)
        if origin not in allowed:
            raise WeightsError(
                "the weights source is a URL this node does not fetch from",
                detail=f"{origin} is not one of the agent's --weights-hosts "
                f"({', '.join(sorted(allowed)) or 'none'}): add it there, or use a mirror "
                "that is",
            )
    elif what == "path":
        real = os.path.realpath(os.path.expanduser(source))
        roots = [os.path.realpath(os.path.expanduser(str(f))) for f in folders]
        if not any(real == r or real.startswith(r.rstrip(os.sep) + os.sep) for r in roots):
            raise WeightsError(
                "the weights source is outside this node's weights folders",
                detail=f"{source} is not under {', '.join(roots) or 'no folder'}: put the file "
                "in one of them, or start the agent with --weights-folder naming its folder",
            )


class DownloadCancelled(WeightsError):
    """Stop a download because its replica is no longer wanted."""


def kind(source: str) -> str:
    """Return what a source is: "url", "hf" (a Hugging Face id) or "path".

    Read from the text alone: whether a file of that name exists is never asked (a
    source is not a probe of the node's files).
    """
    if "://" in source:
        return "url"
    if source.startswith(("/", "./", "../", "~")):
        return "path"
    if _HF_ID.fullmatch(source):
        return "hf"
    return "path"


def resolve(
    source: str,
    engine: str,
    weights_dir: str | os.PathLike[str],
    *,
    sha256: str | None = None,
    progress: Progress | None = None,
    cancel: threading.Event | None = None,
    folders: Sequence[str | os.PathLike[str]] | None = None,
    hosts: Sequence[str] | None = None,
    mirror: Any = None,
    model: str = "",
) -> str:
    """Return what to hand the engine for a source: a local path or a Hugging Face id.

    ``folders`` are where local sources may be (the weights folder alone for None), and
    ``hosts`` the origins URLs may name (``check_source``). With ``mirror`` (an
    ``agent.mirror.MirrorClient``) a URL or a Hugging Face id is taken from the control
    plane's mirror when it serves ``model``: the file, or the mirrored folder (so an engine
    that would fetch a Hugging Face id itself is given the folder); the node fetches as
    below only when the mirror does not serve it.

    Raises:
        WeightsError: the source cannot be had on this node, or failed its check.
    """
    if mirror is not None and kind(source) in ("url", "hf"):
        got = mirror.fetch(model, source, engine, progress=progress, cancel=cancel)
        if got is not None:
            return str(got)
    if engine == "sim":
        # The simulator makes its answers up: it reads no weights (but those the mirror
        # holds, above).
        return source
    check_source(source, [weights_dir] if folders is None else folders, hosts)
    what = kind(source)
    if what == "url":
        return str(download(source, weights_dir, sha256=sha256, progress=progress, cancel=cancel))
    if what == "hf":
        if engine in HF_ENGINES:
            return source
        raise WeightsError(
            f'"{source}" is a Hugging Face id, and llama.cpp cannot fetch a repository: '
            "give the model's source as a local path or an http(s) URL of its .gguf file"
        )
    path = Path(source).expanduser()
    if not path.is_file() and not path.is_dir():
        raise WeightsError("the weights were not found on this node", detail=f"no {source}")
    return str(path)


def file_name(url: str) -> str:
    """Return the name a URL's download is stored under: unique per URL, readable."""
    base = unquote(Path(urlsplit(url).path).name) or "weights"
    base = re.sub(r"[^\w.\-]", "_", base)
    return f"{hashlib.sha256(url.encode()).hexdigest()[:12]}-{base}"


def load_manifest(weights_dir: str | os.PathLike[str]) -> dict[str, dict[str, object]]:
    """Return the downloads recorded in the weights folder, by URL."""
    try:
        data = json.loads((Path(weights_dir) / MANIFEST).read_text(encoding="utf-8"))
    except (FileNotFoundError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def held_sources(weights_dir: str | os.PathLike[str]) -> list[str]:
    """Return the URLs whose downloads are complete in the weights folder, and the sources
    (URLs, Hugging Face ids) whose files the node took whole from the control plane's
    mirror (``agent.mirror``: ``mirror/<folder>/.llmgw-source``)."""
    folder = Path(weights_dir)
    held = {
        url
        for url, entry in load_manifest(folder).items()
        if (folder / str(entry.get("file", ""))).is_file()
    }
    for marker in (folder / "mirror").glob("**/.llmgw-source"):
        try:
            held.add(marker.read_text(encoding="utf-8").strip())
        except (OSError, UnicodeDecodeError):
            continue
    return sorted(s for s in held if s)


def _record(folder: Path, url: str, name: str, digest: str, size: int) -> None:
    manifest = load_manifest(folder)
    manifest[url] = {"file": name, "sha256": digest, "bytes": size}
    write_atomic(folder / MANIFEST, json.dumps(manifest, indent=1, sort_keys=True))


def _lock_for(url: str) -> threading.Lock:
    with _url_locks_guard:
        return _url_locks.setdefault(url, threading.Lock())


def download(
    url: str,
    weights_dir: str | os.PathLike[str],
    *,
    sha256: str | None = None,
    progress: Progress | None = None,
    cancel: threading.Event | None = None,
) -> Path:
    """Download a URL into the weights folder, or find it there, and return its path.

    The file is received by ``agent.transfer`` (resumed with Range, hashed as it arrives,
    put on disk as it goes), as the mirror's files are.

    Raises:
        WeightsError: the origin refused, the transfer kept breaking, or the file's
            sha256 is not the one expected.
        DownloadCancelled: ``cancel`` was set.
    """
    folder = Path(weights_dir)
    folder.mkdir(parents=True, exist_ok=True)
    name = file_name(url)
    final = folder / name
    expected = sha256.lower() if sha256 else None
    with _lock_for(url):
        recorded = load_manifest(folder).get(url)
        if final.is_file() and recorded:
            if expected is None or recorded.get("sha256") == expected:
                return final
            # The replica now expects other content than was fetched: fetch again.
            final.unlink()
        part = folder / f"{name}.part"
        digest, origin_sha = _fetch(url, part, progress, cancel)
        want = expected or origin_sha
        if want and digest != want:
            part.unlink()
            raise WeightsError(
                "the downloaded weights are not the expected ones (their sha256 differs)",
                detail=f"the file downloaded from {url} has sha256 {digest}, not the expected "
                f"{want}: deleted it; check the source and its sha256",
            )
        size = part.stat().st_size
        os.replace(part, final)
        _record(folder, url, name, digest, size)
        return final


def _fetch(
    url: str,
    part: Path,
    progress: Progress | None,
    cancel: threading.Event | None,
) -> tuple[str, str | None]:
    """Fill ``part`` with the URL's content, resuming what it holds; return the whole
    file's sha256 and the one the origin gives for it, if it gives one.

    Raises:
        WeightsError: the origin refused, or the transfer kept breaking.
        DownloadCancelled: ``cancel`` was set.
    """
    origin_sha: str | None = None

    def answered(headers: Mapping[str, str], whole: int | None) -> None:
        nonlocal origin_sha
        linked = headers.get("x-linked-etag", "").strip('"').lower()
        if _SHA256.fullmatch(linked):
            origin_sha = linked  # Hugging Face gives a large file's sha256 here

    digest = receive(
        url,
        part,
        size=None,
        progress=progress,
        cancel=cancel,
        refused="the weights' origin refused the download",
        failed="downloading the weights failed",
        timeout_s=_READ_TIMEOUT_S,
        attempts=_ATTEMPTS,
        answered=answered,
    )
    return digest, origin_sha


def receive(
    url: str,
    part: Path,
    *,
    size: int | None,
    progress: Progress | None,
    cancel: threading.Event | None,
    refused: str,
    failed: str,
    timeout_s: float,
    attempts: int,
    headers: Mapping[str, str] | None = None,
    answered: Callable[[Mapping[str, str], int | None], None] | None = None,
) -> str:
    """Receive a file into ``part`` (``agent.transfer.receive``) as a node does: ``cancel``
    looked at before and after each buffer, ``progress(held, whole length)`` told, and
    the transfer's failures said as ``WeightsError`` (``refused`` or ``failed``, then
    what happened); return the whole file's sha256. A node's own download and its take
    from the control plane's mirror (agent.mirror) both come here.

    Raises:
        WeightsError: the server refused (retry for a 5xx or 429), or the transfer kept
            breaking (retry).
        DownloadCancelled: ``cancel`` was set.
    """
    whole = size

    def on_answer(said: Mapping[str, str], length: int | None) -> None:
        nonlocal whole
        if size is None:
            whole = length
        if answered is not None:
            answered(said, length)

    def moved(have: int) -> None:
        if cancel is not None and cancel.is_set():
            raise DownloadCancelled("download cancelled", detail=url)
        if progress:
            progress(have, whole)

    if cancel is not None and cancel.is_set():
        raise DownloadCancelled("download cancelled", detail=url)
    try:
        return transfer.receive(
            url,
            part,
            size=size,
            headers=headers,
            timeout_s=timeout_s,
            attempts=attempts,
            moved=moved,
            answered=on_answer,
        )
    except transfer.TransferRefused as exc:
        raise WeightsError(
            refused,
            retry=exc.status >= 500 or exc.status == 429,
            detail=f"{url} answered HTTP {exc.status}",
        ) from None
    except transfer.Broken as exc:
        raise WeightsError(
            failed,
            retry=True,
            detail=f"downloading {url} failed: {exc.reason} (holding {exc.have} bytes to "
            "resume from)",
        ) from None
