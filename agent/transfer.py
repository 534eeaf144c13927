"""A file received over HTTP into a ``.part`` file: resumed with Range, hashed as it arrives.

No Django here: the control plane's mirror taking a file from its registry
(updates.mirror) and a node taking it from the mirror (agent.mirror) both call
``receive``. What a ``.part`` holds already is hashed first and asked for no more (``Range:
bytes=<held>-``); a server that ignores the Range (200) sends the whole file again; 416 to
that Range means all of it was held. A transfer that breaks (the connection lost, a read
that times out, fewer bytes than the length) is resumed from what arrived, up to
``attempts`` times, then ``Broken`` says why with the bytes held; any other answer than the
file is ``TransferRefused`` with its HTTP status. The file's sha256 is computed as the bytes arrive,
on a thread of its own (``agent.sha``), so checking it costs no second pass.

The request goes through ``urllib.request`` (the standard library): redirects followed
(the Hub sends an LFS file to its CDN; ``Authorization`` is kept to a redirect within the
same origin only), the proxy the environment names, TLS trusting what httpx trusts (the
agent's other calls), and one timeout on connecting and on every read. Its answer is
``http.client``'s, whose ``readinto`` receives straight into ``agent.sha``'s 1 MB buffers:
one copy of each byte from the socket. httpx's stream hands over 64 KB chunks through h11's
receive buffer, two copies more and about twice the CPU a byte (bench/mirror.py,
docs/updates.md: on this 2-core machine, shared, that CPU is the fetch's time).

What arrives is put on disk as it goes, around the page cache (``O_DIRECT``, in whole
blocks of ``ALIGN`` bytes from ``agent.sha``'s page-aligned buffers) where the filesystem
takes it: a weights file of many gigabytes neither pushes everything else out of the
machine's memory nor costs the kernel a copy of every byte into it (on this 2-core VM,
fresh page-cache pages cost the fetch up to 2 CPU seconds a GB more; bench/mirror.py,
docs/updates.md). Only a local disk's filesystem is (``DIRECT_FILESYSTEMS``). A piece shorter than a block (the file's end, a transfer cut short, a
``.part`` resumed mid-block) goes through the page cache, and the transfer is back to
whole blocks from the next block's start. Through the page cache, ``fdatasync`` is asked
every ``FLUSH_EVERY`` bytes on a thread of its own. Either way the file is synced when the
transfer ends: a file the caller renames into place (or records as checked) is whole on
disk.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import http.client
import os
import queue
import re
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from functools import cache
from pathlib import Path
from typing import Any

from agent.sha import BackgroundSha256

# Bytes written through the page cache between two asks to put them on disk (``_Flusher``).
FLUSH_EVERY = 16 << 20
# The block a write around the page cache is made of: its offset and length a multiple of
# it (4096 covers disks of 512- and 4096-byte sectors), from a page-aligned buffer.
ALIGN = 4096
# A buffer is read into this many bytes at a time (a multiple of ``ALIGN``), and handed on
# part full once this many seconds have passed.
STEP = 1 << 20
SLOW_S = 0.25
# ``os.O_DIRECT`` where the system has it (0: every write goes through the page cache).
_DIRECT = getattr(os, "O_DIRECT", 0)
# The filesystems written around the page cache: local disks'. Over NFS or FUSE a direct
# write is a round trip to the server each, and tmpfs is the page cache.
DIRECT_FILESYSTEMS = frozenset({"ext4", "xfs", "btrfs", "f2fs"})
_MOUNT_ESCAPE = re.compile(r"\\([0-7]{3})")
# Headers sent to the URL asked and to a redirect within its origin, never to another
# (a registry's token is not the CDN's business).
PRIVATE = ("Authorization",)


class TransferRefused(Exception):
    """The server answered something other than the file: ``status`` is its HTTP status."""

    def __init__(self, url: str, status: int) -> None:
        super().__init__(f"{url} answered HTTP {status}")
        self.url = url
        self.status = status


class Broken(Exception):
    """The transfer kept breaking; ``have`` bytes are held in the ``.part`` to resume from."""

    def __init__(self, reason: str, have: int) -> None:
        super().__init__(reason)
        self.reason = reason
        self.have = have


class _Lost(Exception):
    """A read from the server failed (the connection, a timeout): resume from ``have``
    (None: from where the attempt started)."""

    def __init__(self, reason: str, have: int | None = None) -> None:
        super().__init__(reason)
        self.have = have


def receive(
    url: str,
    part: Path,
    *,
    size: int | None,
    headers: Mapping[str, str] | None = None,
    timeout_s: float = 60.0,
    attempts: int = 5,
    moved: Callable[[int], None] | None = None,
    answered: Callable[[Mapping[str, str], int | None], None] | None = None,
) -> str:
    """Fill ``part`` with the file at ``url``, resuming what it holds, and return the whole
    file's sha256.

    ``size`` is the file's length when known (more held than that is thrown away, and a
    transfer is whole when it is reached; unknown, the answer's length says when it is
    whole); ``moved(bytes held)`` is called after each buffer written (it may raise to
    stop: a cancelled download); ``answered(headers, whole length or None)`` is called for
    each answer that carries the file (200 or 206), before its body, with the headers of
    that answer (the last one, past redirects), their names lower-case. ``timeout_s``
    bounds the connecting and every read.

    Raises:
        TransferRefused: the server answered another status than 200, 206 (or 416 to a Range).
        Broken: the transfer broke ``attempts`` times.
    """
    digest = BackgroundSha256()
    try:
        return _fill(
            url, part, size, dict(headers or {}), timeout_s, attempts, moved, answered, digest
        )
    finally:
        digest.close()


def _fill(
    url: str,
    part: Path,
    size: int | None,
    headers: dict[str, str],
    timeout_s: float,
    attempts: int,
    moved: Callable[[int], None] | None,
    answered: Callable[[Mapping[str, str], int | None], None] | None,
    digest: BackgroundSha256,
) -> str:
    have = part.stat().st_size if part.exists() else 0
    if size is not None and have > size:
        part.unlink()
        have = 0
    if have:
        with open(part, "rb") as held:
            while digest.fill(held.readinto):
                pass
    last = ""
    for _ in range(attempts):
        try:
            with _open(url, headers, have, timeout_s) as r:
                if r.status == 416:
                    return digest.hexdigest()  # all of it was held already
                if r.status not in (200, 206):
                    raise TransferRefused(url, r.status)
                if r.status == 200 and have:
                    # The server ignored the Range: start over.
                    have = 0
                    digest.reset()
                    part.unlink(missing_ok=True)
                whole = _whole_length(r)
                if answered is not None:
                    answered({k.lower(): v for k, v in r.headers.items()}, whole)
                with _Part(part, have, digest) as out:
                    have = _body(r, out, digest, have, moved)
            # Unknown to the caller, the file's length is the answer's (http.client ends a
            # body cut short as if it were whole).
            expect = size if size is not None else whole
            if expect is None or have >= expect:
                return digest.hexdigest()
            last = f"the transfer stopped at {have} of {expect} bytes"
        except _Lost as exc:
            last = str(exc)
            if exc.have is not None:
                have = exc.have  # what this attempt wrote before it broke
    raise Broken(last, have)


def _open(url: str, headers: dict[str, str], have: int, timeout_s: float) -> Any:
    """Ask for the file from byte ``have``; return the answer (200, 206, or 416 to a Range).

    Raises:
        TransferRefused: any other status.
        _Lost: the server could not be reached, or broke off before answering.
    """
    request = urllib.request.Request(url, method="GET")
    for name, value in headers.items():
        if name.lower() in (p.lower() for p in PRIVATE):
            request.add_unredirected_header(name, value)
        else:
            request.add_header(name, value)
    request.add_header("Accept-Encoding", "identity")
    if have:
        request.add_header("Range", f"bytes={have}-")
    try:
        return _opener().open(request, timeout=timeout_s)
    except urllib.error.HTTPError as exc:
        exc.close()
        if exc.code == 416 and have:
            return _Answered(416)
        raise TransferRefused(url, exc.code) from None
    except urllib.error.URLError as exc:
        raise _Lost(f"{type(exc.reason).__name__}: {exc.reason}") from None
    except (OSError, http.client.HTTPException) as exc:
        raise _Lost(f"{type(exc).__name__}: {exc}") from None


def _whole_length(r: http.client.HTTPResponse) -> int | None:
    """Return the whole file's length an answer gives (a 206's ``Content-Range``, a 200's
    ``Content-Length``), or None when it gives none."""
    if r.status == 206:
        total = r.headers.get("Content-Range", "").rpartition("/")[2].strip()
        return int(total) if total.isdigit() else None
    length = r.headers.get("Content-Length", "").strip()
    return int(length) if length.isdigit() else None


class _Answered:
    """An answer with no body to read (416 to a Range: nothing past what is held)."""

    def __init__(self, status: int) -> None:
        self.status = status

    def __enter__(self) -> _Answered:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


def _body(
    r: http.client.HTTPResponse,
    out: _Part,
    digest: BackgroundSha256,
    have: int,
    moved: Callable[[int], None] | None,
) -> int:
    """Write the answer's body to ``out``, hashed as it arrives; return the bytes held.

    Raises:
        _Lost: a read failed, with the bytes held by then.
    """

    def read_into(view: memoryview) -> int:
        # A buffer is filled ``STEP`` bytes at a time, and handed on part full once
        # ``SLOW_S`` have passed: over a slow link the file still goes to disk, and its
        # progress is still told, every few seconds at the most.
        view = view[: out.room(len(view))]
        got = 0
        since = time.monotonic()
        try:
            while got < len(view):
                n = r.readinto(view[got : got + STEP])
                got += n
                if n < STEP or time.monotonic() - since > SLOW_S:
                    break
        except (OSError, http.client.HTTPException) as exc:
            raise _Lost(f"{type(exc).__name__}: {exc}", have) from None
        return got

    while view := digest.fill(read_into, keep=True):
        out.write(view)
        have += len(view)
        if moved is not None:
            moved(have)
    return have


_datasync = getattr(os, "fdatasync", os.fsync)  # macOS has no fdatasync


class _Part:
    """A ``.part`` file written on from byte ``have`` (what it holds), on a thread of its
    own so that the disk writes while the next bytes arrive and are hashed: around the
    page cache where it can be, in whole blocks, through it otherwise (``_Flusher``), and
    synced when the block ends well. ``write`` hands it a view ``digest.fill(keep=True)``
    gave, released once written."""

    def __init__(self, path: Path, have: int, digest: BackgroundSha256) -> None:
        self._fd = -1
        self._can_direct = bool(_DIRECT) and filesystem(path) in DIRECT_FILESYSTEMS
        if self._can_direct:
            try:
                self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | _DIRECT, 0o644)
            except OSError:  # a filesystem that takes no O_DIRECT (EINVAL)
                self._can_direct = False
        if self._fd < 0:
            self._fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
        self._direct = self._can_direct
        try:
            os.ftruncate(self._fd, have)
            os.lseek(self._fd, have, os.SEEK_SET)
        except OSError:
            os.close(self._fd)
            raise
        self._queued = have  # bytes handed to ``write`` (the file's end once written)
        self._digest = digest
        self._pieces: queue.SimpleQueue[tuple[memoryview, int] | None] = queue.SimpleQueue()
        self._failed: OSError | None = None
        self._flusher = _Flusher(self._fd)
        self._thread = threading.Thread(target=self._run, name="write", daemon=True)

    def __enter__(self) -> _Part:
        self._flusher.start()
        self._thread.start()
        return self

    def room(self, n: int) -> int:
        """Return how many of ``n`` bytes to read next: up to the next block's start when
        the file stands mid-block and could be written around the page cache from there."""
        if self._can_direct and self._queued % ALIGN:
            return min(n, ALIGN - self._queued % ALIGN)
        return n

    def write(self, view: memoryview) -> None:
        """Have ``view`` (from the start of a page-aligned buffer, or a piece the length
        ``room`` said) written where the file will stand.

        Raises:
            OSError: an earlier write failed (the disk full, say).
        """
        if self._failed is not None:
            self._digest.release(view)
            raise self._failed
        self._pieces.put((view, self._queued))
        self._queued += len(view)

    def _run(self) -> None:
        while (item := self._pieces.get()) is not None:
            view, at = item
            try:
                if self._failed is None:
                    self._put(view, at)
            except OSError as exc:
                self._failed = exc
            finally:
                self._digest.release(view)

    def _put(self, view: memoryview, at: int) -> None:
        if self._can_direct and at % ALIGN == 0:
            whole = len(view) - len(view) % ALIGN
            if whole:
                self._set_direct(True)
                view = view[self._write(view[:whole]) :]
        if view:
            # A piece shorter than a block, or one the filesystem would not take directly.
            self._set_direct(False)
            self._write(view)
            self._flusher.wrote(len(view))

    def _write(self, view: memoryview) -> int:
        """Write ``view``; return the bytes written (fewer, around the page cache, when
        a write there was short or refused: the rest goes through it)."""
        n = len(view)
        while view:
            try:
                wrote = os.write(self._fd, view)
            except OSError as exc:
                if not self._direct or exc.errno != errno.EINVAL:
                    raise
                # O_DIRECT taken at open and refused on writing (some filesystems): the
                # page cache from here on.
                self._can_direct = False
                return n - len(view)
            view = view[wrote:]
            if view and self._direct:
                return n - len(view)
        return n

    def _set_direct(self, on: bool) -> None:
        if self._direct != on:
            flags = fcntl.fcntl(self._fd, fcntl.F_GETFL)
            fcntl.fcntl(self._fd, fcntl.F_SETFL, flags | _DIRECT if on else flags & ~_DIRECT)
            self._direct = on

    def __exit__(self, kind: object, *exc: object) -> None:
        """Write what was handed over (a transfer cut short keeps what arrived), then sync
        the file when the block ended well.

        Raises:
            OSError: a write failed.
        """
        try:
            self._pieces.put(None)
            self._thread.join()
            self._flusher.stop()
            if self._failed is not None:
                raise self._failed  # the disk's failure before the transfer's
            if kind is None:
                _datasync(self._fd)
        finally:
            os.close(self._fd)


def filesystem(path: Path, mounts: str | None = None) -> str:
    """Return the type of the filesystem ``path``'s folder is on (``ext4``, ``nfs4``,
    ``tmpfs``...), from ``mounts`` (``/proc/self/mounts``'s text when None), or "" when
    that is not known (no such file: not Linux)."""
    if mounts is None:
        try:
            mounts = Path("/proc/self/mounts").read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""
    folder = os.path.realpath(path.parent)
    best, kind = "", ""
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) < 3:
            continue
        point = _MOUNT_ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), fields[1])
        under = folder == point or folder.startswith(point.rstrip("/") + "/")
        if under and len(point) >= len(best):  # the last of a point mounted twice is on top
            best, kind = point, fields[2]
    return kind


class _Flusher:
    """Put what a file was written through the page cache on disk as the transfer goes (a
    thread of its own, asked every ``FLUSH_EVERY`` bytes): the disk writes the file while
    the next bytes arrive, not all at the end (bench/mirror.py: the copy it is measured
    against spends half its time in the final sync)."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._since = 0
        self._asked = threading.Event()
        self._done = False
        self._thread = threading.Thread(target=self._run, name="flush", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def wrote(self, n: int) -> None:
        self._since += n
        if self._since >= FLUSH_EVERY:
            self._since = 0
            self._asked.set()

    def _run(self) -> None:
        while True:
            self._asked.wait()
            self._asked.clear()
            if self._done:
                return
            with contextlib.suppress(OSError):  # a disk error: the end's sync raises it
                _datasync(self._fd)

    def stop(self) -> None:
        self._done = True
        self._asked.set()
        if self._thread.is_alive():
            self._thread.join()


class _SameOriginRedirects(urllib.request.HTTPRedirectHandler):
    """Follow redirects as urllib does, sending the ``PRIVATE`` headers on to a redirect
    within the same origin (urllib sends them to none)."""

    def redirect_request(
        self,
        req: urllib.request.Request,
        fp: Any,
        code: int,
        msg: str,
        headers: Any,
        newurl: str,
    ) -> urllib.request.Request | None:
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is not None and _origin(newurl) == _origin(req.full_url):
            for name, value in req.unredirected_hdrs.items():
                if name.lower() in (p.lower() for p in PRIVATE):
                    new.add_unredirected_header(name, value)
        return new


def _origin(url: str) -> str:
    # Imported here: agent.weights imports this module.
    from agent.weights import origin_of  # noqa: PLC0415

    return origin_of(url)


def _opener() -> urllib.request.OpenerDirector:
    """Return an opener: the environment's proxies as they are now, httpx's trust for TLS."""
    return urllib.request.build_opener(
        urllib.request.ProxyHandler(),
        urllib.request.HTTPSHandler(context=tls()),
        _SameOriginRedirects(),
    )


@cache
def tls() -> Any:
    """Return httpx's TLS context (certifi, or ``SSL_CERT_FILE``/``SSL_CERT_DIR``), made once
    a process (making one reads every CA: 60 ms here). An httpx client given it
    (``verify=tls()``) makes none of its own."""
    # Imported here: the agent's urllib transfers need none of httpx.
    import httpx  # noqa: PLC0415

    return httpx.create_ssl_context()
