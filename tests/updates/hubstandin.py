"""A stand-in for the Hugging Face Hub: the HTTP endpoints ``huggingface_hub`` calls.

A small threaded HTTP server on loopback holding repositories whose revisions a test
changes (``commit``, ``delete``), serving what the library asks of the Hub:

- ``GET /api/models/<repo>`` and ``/api/models/<repo>/revision/<rev>`` (``model_info``;
  ``?blobs=true`` adds each file's size, git blob id and, for an LFS file, its sha256);
- ``GET /api/models/<repo>/tree/<rev>[/<path>]`` (``list_repo_tree``);
- ``HEAD`` and ``GET /<repo>/resolve/<rev>/<path>`` (``get_hf_file_metadata``,
  ``hf_hub_download``, and a plain URL source): ``X-Repo-Commit``, ``ETag`` (git's blob id,
  or an LFS file's sha256), ``X-Linked-Etag`` and ``X-Linked-Size`` for an LFS file,
  ``Accept-Ranges``, and ``Range`` answered with 206;
- ``GET /plain/<name>``: a file of no repository, with an ``ETag`` that is its sha256.

A repository gone answers 404 with ``X-Error-Code: RepoNotFound``, an unknown revision
``RevisionNotFound``, as the Hub does, so the library raises its own errors. Faults:
``break_after[path] = n`` closes the connection after ``n`` bytes of that file's next
download (once); ``stall_after[path] = n`` holds it open after ``n`` bytes until
``unstall`` is set (a worker killed mid-transfer); ``wrong_bytes`` (paths) serves other
bytes than the ones published; and a
slow registry, ``hold`` (an Event): model info waits until it is set.
``requests`` records every request (method, path, Range) so a test counts them.

Weights files (by ``updates.registry.is_weights``) and any file over 1 MB are "LFS" files.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

WEIGHTS = (".safetensors", ".gguf", ".bin", ".pt", ".pth", ".onnx")


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(f"blob {len(data)}\0".encode() + data, usedforsecurity=False).hexdigest()


@dataclass
class Blob:
    """A file's content: bytes in memory, or a file on disk (a large GGUF)."""

    data: bytes | None = None
    path: Path | None = None
    _sha: str = ""

    @property
    def size(self) -> int:
        return len(self.data) if self.data is not None else self.path.stat().st_size  # type: ignore[union-attr]

    @property
    def sha256(self) -> str:
        if not self._sha:
            h = hashlib.sha256()
            if self.data is not None:
                h.update(self.data)
            else:
                with open(self.path, "rb") as f:  # type: ignore[arg-type]
                    while chunk := f.read(1 << 20):
                        h.update(chunk)
            self._sha = h.hexdigest()
        return self._sha

    def read(self, start: int, end: int) -> bytes:
        if self.data is not None:
            return self.data[start:end]
        with open(self.path, "rb") as f:  # type: ignore[arg-type]
            f.seek(start)
            return f.read(end - start)


@dataclass
class Repo:
    commits: list[tuple[str, dict[str, Blob]]] = field(default_factory=list)

    def at(self, revision: str | None) -> tuple[str, dict[str, Blob]] | None:
        if not self.commits:
            return None
        if revision in (None, "", "main"):
            return self.commits[-1]
        for sha, files in self.commits:
            if sha == revision:
                return sha, files
        return None


def is_lfs(path: str, blob: Blob) -> bool:
    return path.lower().endswith(WEIGHTS) or blob.size > 1_000_000


class HubStandIn:
    """The stand-in's repositories and faults, and its server (``start`` / ``stop``)."""

    def __init__(self) -> None:
        self.repos: dict[str, Repo] = {}
        self.plain: dict[str, Blob] = {}
        self.break_after: dict[str, int] = {}
        # A transfer that stalls: after that many bytes of the file's next download, it
        # waits for ``unstall`` (at most 60 s), the connection held open; ``stalled`` is set
        # once it waits (every byte before it sent).
        self.stall_after: dict[str, int] = {}
        self.unstall = threading.Event()
        self.stalled = threading.Event()
        self.wrong_bytes: set[str] = set()
        # A slow registry: while set, each model info request waits for it (at most 60 s).
        self.hold: threading.Event | None = None
        self.requests: list[tuple[str, str, str]] = []
        self.tokens_seen: list[str] = []
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._n = 0

    # -- what a test changes --------------------------------------------------------------

    def commit(self, repo: str, files: dict[str, bytes | Path], *, keep: bool = False) -> str:
        """Make a new commit of ``repo`` holding ``files`` (with the last commit's files
        too when ``keep``); return its 40-hex id."""
        with self._lock:
            r = self.repos.setdefault(repo, Repo())
            base = dict(r.commits[-1][1]) if keep and r.commits else {}
            for path, content in files.items():
                base[path] = Blob(path=content) if isinstance(content, Path) else Blob(content)
            self._n += 1
            sha = hashlib.sha1(f"{repo}:{self._n}".encode(), usedforsecurity=False).hexdigest()
            r.commits.append((sha, base))
            return sha

    def remove(self, repo: str, *paths: str) -> str:
        """Make a commit of ``repo`` without ``paths``; return its id."""
        with self._lock:
            r = self.repos[repo]
            files = {p: b for p, b in r.commits[-1][1].items() if p not in paths}
            self._n += 1
            sha = hashlib.sha1(f"{repo}:{self._n}".encode(), usedforsecurity=False).hexdigest()
            r.commits.append((sha, files))
            return sha

    def delete(self, repo: str) -> None:
        """Delete a repository: it answers 404 RepoNotFound from now on."""
        with self._lock:
            self.repos.pop(repo, None)

    def count(self, method: str = "GET", contains: str = "") -> int:
        """Return how many requests of ``method`` had ``contains`` in their path."""
        with self._lock:
            return sum(1 for m, p, _ in self.requests if m == method and contains in p)

    # -- the server ------------------------------------------------------------------------

    @property
    def url(self) -> str:
        assert self._server is not None
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> HubStandIn:
        hub = self

        class Handler(_Handler):
            stand_in = hub

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(
            target=self._server.serve_forever, name="hub-stand-in", daemon=True
        ).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> HubStandIn:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


_INFO = re.compile(r"^/api/models/([^/]+/[^/]+?)(?:/revision/([^/]+))?/?$")
_TREE = re.compile(r"^/api/models/([^/]+/[^/]+)/tree/([^/]+)(?:/(.*))?$")
_RESOLVE = re.compile(r"^/([^/]+/[^/]+)/resolve/([^/]+)/(.+)$")
_PLAIN = re.compile(r"^/plain/(.+)$")


class _Handler(BaseHTTPRequestHandler):
    stand_in: HubStandIn
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: object) -> None:
        pass

    def do_HEAD(self) -> None:  # noqa: N802
        self._serve(head=True)

    def do_GET(self) -> None:  # noqa: N802
        self._serve(head=False)

    def _record(self, path: str) -> None:
        hub = self.stand_in
        with hub._lock:
            hub.requests.append((self.command, path, self.headers.get("Range", "")))
            auth = self.headers.get("Authorization", "")
            if auth:
                hub.tokens_seen.append(auth)

    def _json(self, status: int, body: object, error_code: str = "") -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if error_code:
            self.send_header("X-Error-Code", error_code)
            self.send_header("X-Error-Message", str(body))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _repo(self, repo_id: str, revision: str | None) -> tuple[str, dict[str, Blob]] | None:
        hub = self.stand_in
        with hub._lock:
            repo = hub.repos.get(repo_id)
            if repo is None:
                self._json(404, {"error": "Repository not found"}, "RepoNotFound")
                return None
            found = repo.at(revision)
        if found is None:
            self._json(404, {"error": f"Invalid rev id: {revision}"}, "RevisionNotFound")
        return found

    def _serve(self, head: bool) -> None:
        parts = urlsplit(self.path)
        path = unquote(parts.path)
        self._record(path)
        query = parse_qs(parts.query)
        if m := _TREE.match(path):
            found = self._repo(m.group(1), m.group(2))
            if found is not None:
                sha, files = found
                prefix = (m.group(3) or "").strip("/")
                self._json(
                    200, [_entry(p, b) for p, b in sorted(files.items()) if p.startswith(prefix)]
                )
            return
        if m := _INFO.match(path):
            if self.stand_in.hold is not None:
                self.stand_in.hold.wait(60)
            found = self._repo(m.group(1), m.group(2))
            if found is not None:
                sha, files = found
                blobs = query.get("blobs", ["false"])[0].lower() == "true"
                siblings = []
                for p, b in sorted(files.items()):
                    s: dict[str, object] = {"rfilename": p}
                    if blobs:
                        s["size"] = b.size
                        s["blobId"] = (
                            git_blob_id(b.read(0, b.size)) if not is_lfs(p, b) else _lfs_oid(b)
                        )
                        if is_lfs(p, b):
                            s["lfs"] = {"size": b.size, "sha256": b.sha256, "pointerSize": 134}
                    siblings.append(s)
                self._json(200, {"id": m.group(1), "modelId": m.group(1), "sha": sha, "private": False,
                                 "siblings": siblings})  # fmt: skip
            return
        if m := _RESOLVE.match(path):
            found = self._repo(m.group(1), m.group(2))
            if found is None:
                return
            sha, files = found
            blob = files.get(m.group(3))
            if blob is None:
                self._json(404, {"error": "Entry not found"}, "EntryNotFound")
                return
            lfs = is_lfs(m.group(3), blob)
            headers = {"X-Repo-Commit": sha}
            if lfs:
                headers["ETag"] = f'"{blob.sha256}"'
                headers["X-Linked-Etag"] = f'"{blob.sha256}"'
                headers["X-Linked-Size"] = str(blob.size)
            else:
                headers["ETag"] = f'"{git_blob_id(blob.read(0, blob.size))}"'
            self._send_blob(m.group(3), blob, headers, head)
            return
        if m := _PLAIN.match(path):
            with self.stand_in._lock:
                blob = self.stand_in.plain.get(m.group(1))
            if blob is None:
                self._json(404, {"error": "not found"})
                return
            self._send_blob(m.group(1), blob, {"ETag": f'"{blob.sha256}"'}, head)
            return
        self._json(404, {"error": f"no such endpoint in the stand-in: {path}"})

    def _send_blob(self, name: str, blob: Blob, headers: dict[str, str], head: bool) -> None:
        hub = self.stand_in
        size = blob.size
        start, end = 0, size
        status = 200
        rng = self.headers.get("Range", "")
        if rng:
            m = re.fullmatch(r"bytes=(\d+)-(\d*)", rng.strip())
            if m:
                start = int(m.group(1))
                end = min(size, int(m.group(2)) + 1) if m.group(2) else size
                if start >= size:
                    self.send_response(416)
                    self.send_header("Content-Range", f"bytes */{size}")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                status = 206
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(end - start))
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{end - 1}/{size}")
        self.end_headers()
        if head:
            return
        with hub._lock:
            cut = hub.break_after.pop(name, None)
            stall = hub.stall_after.pop(name, None)
            wrong = name in hub.wrong_bytes
        if blob.path is not None and cut is None and stall is None and not wrong:
            # A file on disk, no fault: sent by the kernel (bench/mirror.py measures the
            # mirror, not this server).
            with (
                open(blob.path, "rb") as f,
                contextlib.suppress(BrokenPipeError, ConnectionResetError),
            ):
                self.connection.sendfile(f, start, end - start)
            return
        pos = start
        while pos < end:
            n = min(1 << 20, end - pos)
            if cut is not None:
                n = min(n, max(0, cut - pos))
                if n == 0:
                    # The fault: the connection closes halfway through.
                    self.close_connection = True
                    self.connection.shutdown(2)
                    return
            if stall is not None:
                n = min(n, max(0, stall - pos))
                if n == 0:
                    with contextlib.suppress(OSError):
                        self.wfile.flush()
                    hub.stalled.set()
                    hub.unstall.wait(60)
                    stall = None
                    continue
            data = blob.read(pos, pos + n)
            if wrong:
                data = bytes(b ^ 0x5A for b in data)
            try:
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):
                return
            pos += n


def _lfs_oid(blob: Blob) -> str:
    return hashlib.sha1(blob.sha256.encode(), usedforsecurity=False).hexdigest()


def _entry(path: str, blob: Blob) -> dict[str, object]:
    out: dict[str, object] = {"type": "file", "path": path, "size": blob.size}
    if is_lfs(path, blob):
        out["oid"] = _lfs_oid(blob)
        out["lfs"] = {"oid": blob.sha256, "size": blob.size, "pointerSize": 134}
    else:
        out["oid"] = git_blob_id(blob.read(0, blob.size))
    return out


def main() -> None:
    """Serve files as one repository until killed: ``python -m tests.updates.hubstandin
    REPO FILE...``; prints the address and the commit on one line (bench/mirror.py)."""
    import sys
    import time

    repo, *paths = sys.argv[1:]
    hub = HubStandIn().start()
    sha = hub.commit(repo, {Path(p).name: Path(p) for p in paths})
    sys.stdout.write(f"{hub.url} {sha}\n")
    sys.stdout.flush()
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
