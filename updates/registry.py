"""The registry a model's weights come from, asked what a repository holds at a revision.

Two kinds of source have a registry:

- a Hugging Face repository id (``owner/name``): the Hub's HTTP API at ``HF_ENDPOINT``
  (the public hub by default; a site's own mirror, or a test's stand-in), spoken through
  ``huggingface_hub`` (``HfApi.model_info(files_metadata=True)``: the commit and every
  file with its size, git blob id and, for a file kept in LFS, its sha256), with the token
  read from ``LLMGW_HF_TOKEN_FILE`` (read again when the file changes; never logged);
- a plain http(s) URL: its own registry of one file. Its "commit" is what its server says
  identifies the content (the sha256 Hugging Face gives in ``X-Linked-Etag``, else the
  ETag), read with a HEAD request.

``latest`` answers a ``RepoState`` or raises ``RegistryError`` with a reason a person can
act on (a repository gone, a revision unknown, a registry that does not answer, a host not
allowed): never anything else, and it changes nothing.
"""

from __future__ import annotations

import hashlib
import os
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from urllib.parse import unquote, urlsplit

import httpx
from django.conf import settings

from agent.simweights import FILE_NAME as SIM_WEIGHTS
from agent.weights import allowed_origins, origin_of

# Files an engine loads weights from: a commit that changes none of them (a README, a
# config the engine does not read) is not an update. By how their names end.
WEIGHTS_SUFFIXES = (
    ".safetensors",
    ".gguf",
    ".bin",
    ".pt",
    ".pth",
    ".ckpt",
    ".h5",
    ".msgpack",
    ".onnx",
    ".engine",
    ".plan",
)
# A registry call's limit, in seconds: one that takes longer is an error with that reason.
TIMEOUT_S = 20.0
_HF_ID = re.compile(r"[A-Za-z0-9][\w.\-]*/[\w.\-]+")
_SHA256 = re.compile(r"[0-9a-f]{64}")
# A commit as a registry names it: a git object id (a site's own mirror may name it
# otherwise, within these characters).
_COMMIT = re.compile(r"[A-Za-z0-9._\-]{1,128}")
# What a file's name from a registry may not hold: control characters (CR/LF split headers
# and log lines), line and paragraph separators, and the angle brackets of HTML.
_BAD_NAME = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029<>]")
# A path's length in characters a registry may name (git allows 4,096 bytes).
PATH_MAX_CHARS = 1024


class RegistryError(Exception):
    """A registry that cannot say what a repository holds; the message says why."""


@dataclass(frozen=True)
class RepoFile:
    """One file of a repository at a commit, as the registry published it.

    ``sha256`` is the registry's (an LFS file's, or a URL's) or "" when it gives none;
    ``blob_id`` is git's object id of a file kept in git itself (sha1 of ``blob <n>\\0``
    and the bytes), "" when unknown. ``url`` is where its bytes are downloaded from.
    """

    path: str
    size: int | None = None
    sha256: str = ""
    blob_id: str = ""
    url: str = ""

    @property
    def weights(self) -> bool:
        """Return whether an engine loads weights from this file (by its name)."""
        return is_weights(self.path)


@dataclass(frozen=True)
class RepoState:
    """A repository at one revision: its commit and its files."""

    source: str
    commit: str
    files: tuple[RepoFile, ...] = field(default_factory=tuple)

    @property
    def weights(self) -> tuple[RepoFile, ...]:
        """Return the files an engine loads weights from (a URL's one file, whatever its
        name)."""
        if kind(self.source) == "url":
            return self.files
        return tuple(f for f in self.files if f.weights)

    def compared(self, code: bool = False) -> tuple[RepoFile, ...]:
        """Return the files the update check compares: the weights, and the code files
        too for a model that trusts remote code."""
        if kind(self.source) == "url":
            return self.files
        return tuple(f for f in self.files if is_compared(f.path, code))

    @property
    def total_bytes(self) -> int:
        """Return the size of every file, those of unknown size counted as 0."""
        return sum(f.size or 0 for f in self.files)


# Files an engine imports as code when a model trusts remote code (its catalog field
# trust_remote_code): compared as its weights are, as a change to them is an update.
CODE_SUFFIXES = (".py",)


def is_code(path: str) -> bool:
    """Return whether a file of a repository is Python code an engine would import for a
    model that trusts remote code."""
    return path.lower().endswith(CODE_SUFFIXES)


def is_compared(path: str, code: bool = False) -> bool:
    """Return whether the update check compares a file: weights, and code files too for a
    model that trusts remote code (``code``)."""
    return is_weights(path) or (code and is_code(path))


def is_weights(path: str) -> bool:
    """Return whether a file of a repository holds weights: by how its name ends, or the
    sim engine's weights file (``sim-weights.json``: its content sets how the sim answers,
    so a commit that changes it is an update)."""
    return path.lower().endswith(WEIGHTS_SUFFIXES) or PurePosixPath(path).name == SIM_WEIGHTS


def kind(source: str) -> str | None:
    """Return "hf" (a Hugging Face repository id), "url", or None: no registry."""
    text = source.strip()
    if "://" in text:
        return "url" if urlsplit(text).scheme.lower() in ("http", "https") else None
    if text.startswith(("/", "./", "../", "~")):
        return None
    return "hf" if _HF_ID.fullmatch(text) else None


def mirrored(source: str) -> str | None:
    """Return why the mirror does not fetch ``source``, or None when it does: a Hugging
    Face repository always; an http(s) URL when its host is one of ``LLMGW_MIRROR_HOSTS``
    (a URL elsewhere is fetched by the nodes themselves, each under its own
    ``--weights-hosts``, as before)."""
    what = kind(source)
    if what == "hf":
        return None
    if what == "url":
        allowed = allowed_origins(list(settings.LLMGW_MIRROR_HOSTS))
        if origin_of(source) in allowed:
            return None
        return (
            f"{origin_of(source)} is not a host the mirror fetches from: add it to "
            f"LLMGW_MIRROR_HOSTS (now {', '.join(sorted(allowed)) or 'none'})"
        )
    return (
        f"source {source or '(none)'} is not a Hugging Face repository or an http(s) URL: "
        "there is nothing to mirror"
    )


# -- the token ------------------------------------------------------------------------------

_token_lock = threading.Lock()
_token_cache: dict[str, tuple[tuple[int, int], str]] = {}


def token() -> str | None:
    """Return the registry's token from ``LLMGW_HF_TOKEN_FILE``, read again when it changes.

    None without one (anonymous). A file that cannot be read is an error naming the
    variable and the file, never the token.
    """
    path = str(settings.LLMGW_HF_TOKEN_FILE or "")
    if not path:
        return None
    try:
        st = os.stat(path)
    except OSError as exc:
        raise RegistryError(
            f"LLMGW_HF_TOKEN_FILE names {path}, which cannot be read ({exc.strerror}): "
            "put the registry's token there, or unset the variable"
        ) from None
    stamp = (st.st_mtime_ns, st.st_size)
    with _token_lock:
        cached = _token_cache.get(path)
        if cached and cached[0] == stamp:
            return cached[1] or None
        try:
            value = Path(path).read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError):
            raise RegistryError(
                f"LLMGW_HF_TOKEN_FILE names {path}, which cannot be read as text: "
                "put the registry's token there, or unset the variable"
            ) from None
        _token_cache[path] = (stamp, value)
        return value or None


def endpoint() -> str:
    """Return the Hub's address (``HF_ENDPOINT``), without a trailing slash."""
    return str(settings.HF_ENDPOINT).rstrip("/")


# -- asking ------------------------------------------------------------------------------


def latest(source: str, revision: str | None = None) -> RepoState:
    """Return what ``source`` holds at ``revision`` (its newest commit for None or "").

    Raises:
        RegistryError: no registry for that source, the repository or revision is gone,
            the registry refused the token, or it did not answer in time.
    """
    what = kind(source)
    if what == "hf":
        return _hub_state(source.strip(), revision or None)
    if what == "url":
        return _url_state(source.strip())
    raise RegistryError(
        f"{source} has no registry: only a Hugging Face repository id (owner/name) or an "
        "http(s) URL can be checked for updates or mirrored"
    )


def _hub_state(repo: str, revision: str | None) -> RepoState:
    # Imported here: huggingface_hub's client takes 140 ms to import, which no process
    # that never asks the Hub (the gateway, a web process serving pages) should pay.
    from huggingface_hub import HfApi, hf_hub_url  # noqa: PLC0415
    from huggingface_hub.errors import (  # noqa: PLC0415
        GatedRepoError,
        HfHubHTTPError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    api = HfApi(endpoint=endpoint(), token=token() or False)
    where = f"{repo} at {endpoint()}"
    try:
        info = api.model_info(repo, revision=revision, files_metadata=True, timeout=TIMEOUT_S)
    except RevisionNotFoundError:
        raise RegistryError(f"{where} has no revision {revision}") from None
    except GatedRepoError:
        raise RegistryError(
            f"{where} is gated: the token in LLMGW_HF_TOKEN_FILE has no access to it"
        ) from None
    except RepositoryNotFoundError:
        raise RegistryError(
            f"{where} is not there (deleted, renamed, or private to the token given)"
        ) from None
    except HfHubHTTPError as exc:
        status = getattr(getattr(exc, "response", None), "status_code", "?")
        raise RegistryError(f"{where} answered HTTP {status}") from None
    except Exception as exc:  # the transport's own errors (refused, timed out, reset)
        raise RegistryError(f"{where} did not answer: {type(exc).__name__}: {exc}") from None
    commit = str(info.sha or "")
    if not commit:
        raise RegistryError(f"{where} answered without a commit")
    if not _COMMIT.fullmatch(commit):
        raise RegistryError(
            f"{where} named its commit {commit[:80]!r}, which is not a commit id (letters, "
            "digits, '.', '_' and '-'): nothing was taken from it"
        )
    files = []
    for s in info.siblings or []:
        lfs = s.lfs
        why = unfit_path(str(s.rfilename))
        if why:
            raise RegistryError(f"{where} at {commit[:8]} {why}: nothing was taken from it")
        files.append(
            RepoFile(
                path=s.rfilename,
                size=(lfs.size if lfs else s.size),
                sha256=(str(lfs.sha256).lower() if lfs else ""),
                blob_id=str(s.blob_id or ""),
                url=hf_hub_url(repo, s.rfilename, revision=commit, endpoint=endpoint()),
            )
        )
    return RepoState(source=repo, commit=commit, files=tuple(sorted(files, key=lambda f: f.path)))


def unfit_path(path: str) -> str:
    """Return why a file's path named by a registry is refused, or "" when it is fit: one
    holding a control character (CR/LF among them), a line separator or HTML's ``<``/``>``
    would be written into the catalog's origin, the mirror's folder, logs and pages."""
    if not path:
        return "named a file with no name"
    if len(path) > PATH_MAX_CHARS:
        return f"named a file of {len(path)} characters (at most {PATH_MAX_CHARS})"
    bad = _BAD_NAME.search(path)
    if bad:
        return (
            f"named a file {path[:120]!r} holding {bad.group()!r}: a control character, a line "
            "break or HTML is not a file's name"
        )
    return ""


def _url_state(url: str) -> RepoState:
    allowed = allowed_origins(list(settings.LLMGW_MIRROR_HOSTS))
    if origin_of(url) not in allowed:
        raise RegistryError(
            f"{origin_of(url)} is not a host the mirror fetches from: add it to "
            f"LLMGW_MIRROR_HOSTS (now {', '.join(sorted(allowed)) or 'none'})"
        )
    headers = {"Accept-Encoding": "identity"}
    hf = token()
    if hf and origin_of(url) == origin_of(endpoint()):
        headers["Authorization"] = f"Bearer {hf}"
    try:
        with httpx.Client(timeout=TIMEOUT_S, follow_redirects=True) as http:
            response = http.head(url, headers=headers)
    except httpx.HTTPError as exc:
        raise RegistryError(f"{url} did not answer: {type(exc).__name__}: {exc}") from None
    if response.status_code == 404 or response.status_code == 410:
        raise RegistryError(f"{url} is not there (HTTP {response.status_code})")
    if response.status_code >= 400:
        raise RegistryError(f"{url} answered HTTP {response.status_code}")
    linked = response.headers.get("x-linked-etag", "").strip().strip('"').lower()
    etag = response.headers.get("etag", "").strip()
    if etag.startswith("W/"):
        etag = etag[2:]
    etag = etag.strip('"')
    sha = linked if _SHA256.fullmatch(linked) else (etag if _SHA256.fullmatch(etag) else "")
    commit = sha or etag or response.headers.get("last-modified", "")
    if not commit:
        raise RegistryError(
            f"{url} gives no ETag, sha256 or Last-Modified: there is no telling whether it changed"
        )
    size_text = response.headers.get("x-linked-size") or response.headers.get("content-length")
    size = (
        int(size_text)
        if size_text and size_text.isascii() and size_text.isdigit() and len(size_text) < 20
        else None
    )
    name = unquote(PurePosixPath(urlsplit(url).path).name) or "weights"
    name = re.sub(r"[^\w.\-]", "_", name)
    return RepoState(
        source=url,
        commit=_short_commit(commit),
        files=(RepoFile(path=name, size=size, sha256=sha, url=url),),
    )


def _short_commit(value: str) -> str:
    """Return an ETag or date fit to be a folder's name (a sha256 kept as it is)."""
    clean = re.sub(r"[^\w.\-]", "_", value)
    if len(clean) <= 64 and clean == value:
        return clean
    return hashlib.sha256(value.encode()).hexdigest()[:40]
