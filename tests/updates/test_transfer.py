"""A file received over HTTP into a .part file (agent.transfer), against real servers on
loopback: the Hub stand-in (Range, a transfer broken halfway) and a redirecting one."""

from __future__ import annotations

import errno
import hashlib
import os
import random
import shutil
import socket
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from agent import transfer
from agent.sha import BUFFER
from agent.transfer import ALIGN
from agent.transfer import STEP as STEP_BYTES
from tests.updates.hubstandin import Blob, HubStandIn

# About 43 s for the file's 86 tests in a full run (load 2 to 10): listed with the
# long files, so that it starts early rather than end the run alone (tests/conftest.py).
pytestmark = pytest.mark.takes(0.5)

# 3 of agent.sha's buffers, and some; no two alike (a buffer written after it was filled
# again would show).
WEIGHTS = random.Random(19).randbytes(3 * BUFFER + 256_000)
SHA = hashlib.sha256(WEIGHTS).hexdigest()


@pytest.fixture
def served(hub: HubStandIn) -> str:
    hub.plain["w.bin"] = Blob(WEIGHTS)
    return f"{hub.url}/plain/w.bin"


def _ranges(hub: HubStandIn) -> list[str]:
    return [r for m, p, r in hub.requests if m == "GET" and p == "/plain/w.bin"]


@pytest.mark.parametrize("flush_every", [transfer.FLUSH_EVERY, 1 << 20])
def test_a_file_arrives_whole_with_its_sha256(
    served: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, flush_every: int
) -> None:
    # Put on disk as it arrives: at the end only (a file smaller than FLUSH_EVERY), or
    # every megabyte too.
    monkeypatch.setattr(transfer, "FLUSH_EVERY", flush_every)
    seen: list[int] = []
    part = tmp_path / "w.bin.part"
    got = transfer.receive(served, part, size=len(WEIGHTS), moved=seen.append)
    assert got == SHA and part.read_bytes() == WEIGHTS
    assert seen == sorted(seen) and seen[-1] == len(WEIGHTS)


def test_a_transfer_broken_halfway_is_resumed_from_what_arrived(
    hub: HubStandIn, served: str, tmp_path: Path
) -> None:
    hub.break_after["w.bin"] = 1_000_000
    part = tmp_path / "w.bin.part"
    assert transfer.receive(served, part, size=len(WEIGHTS)) == SHA
    assert part.read_bytes() == WEIGHTS
    assert _ranges(hub) == ["", "bytes=1000000-"]


def test_what_is_held_is_hashed_and_only_the_rest_asked_for(
    hub: HubStandIn, served: str, tmp_path: Path
) -> None:
    part = tmp_path / "w.bin.part"
    part.write_bytes(WEIGHTS[:12345])
    assert transfer.receive(served, part, size=len(WEIGHTS)) == SHA
    # All of it held: the server answers 416 to the Range, and nothing more is read.
    assert transfer.receive(served, part, size=None) == SHA
    assert part.read_bytes() == WEIGHTS
    assert _ranges(hub) == ["bytes=12345-", f"bytes={len(WEIGHTS)}-"]


def test_more_held_than_the_file_is_thrown_away(
    hub: HubStandIn, served: str, tmp_path: Path
) -> None:
    part = tmp_path / "w.bin.part"
    part.write_bytes(WEIGHTS + b"tail")
    assert transfer.receive(served, part, size=len(WEIGHTS)) == SHA
    assert part.read_bytes() == WEIGHTS and _ranges(hub) == [""]


def test_another_answer_than_the_file_is_refused_with_its_status(
    hub: HubStandIn, tmp_path: Path
) -> None:
    with pytest.raises(transfer.TransferRefused) as refused:
        transfer.receive(f"{hub.url}/plain/none.bin", tmp_path / "x.part", size=10)
    assert refused.value.status == 404 and "HTTP 404" in str(refused.value)


def test_a_transfer_that_keeps_breaking_says_why_and_keeps_what_arrived(
    hub: HubStandIn, served: str, tmp_path: Path
) -> None:
    hub.break_after["w.bin"] = 1_500_000
    part = tmp_path / "w.bin.part"
    with pytest.raises(transfer.Broken) as broken:
        transfer.receive(served, part, size=len(WEIGHTS), attempts=1)
    assert broken.value.have == 1_500_000 == part.stat().st_size
    assert f"stopped at 1500000 of {len(WEIGHTS)} bytes" in broken.value.reason


def test_a_server_not_there_is_broken_naming_the_error(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    with pytest.raises(transfer.Broken, match="ConnectionRefusedError"):
        transfer.receive(f"http://127.0.0.1:{port}/w.bin", tmp_path / "w.part", size=1, attempts=2)


def test_moved_may_stop_the_transfer(served: str, tmp_path: Path) -> None:
    def stop(have: int) -> None:
        raise InterruptedError(f"cancelled at {have}")

    part = tmp_path / "w.bin.part"
    with pytest.raises(InterruptedError):
        transfer.receive(served, part, size=len(WEIGHTS), moved=stop)
    assert 0 < part.stat().st_size < len(WEIGHTS)


# -- around the page cache ---------------------------------------------------------------------

# Where a transfer is cut: in the first block, at and about a block's end, a buffer's end,
# and well into the file.
CUTS = [1, ALIGN - 1, ALIGN, ALIGN + 1, BUFFER - 1, BUFFER, BUFFER + 1, 2 * BUFFER + 12345]


@pytest.mark.parametrize("direct", [True, False], ids=["O_DIRECT", "page-cache"])
@pytest.mark.parametrize("held", [0, 100, ALIGN, BUFFER + 1])
@pytest.mark.parametrize("cut", CUTS)
def test_a_file_is_whole_wherever_it_was_held_and_cut(
    hub: HubStandIn,
    served: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    direct: bool,
    held: int,
    cut: int,
) -> None:
    # Around the page cache a write is whole blocks from a block's start; a .part held,
    # or a transfer cut, mid-block is written through the page cache up to the next
    # block's start. Without O_DIRECT (macOS) every write goes through it.
    if not direct:
        monkeypatch.setattr(transfer, "_DIRECT", 0)
    part = tmp_path / "w.bin.part"
    if held:
        part.write_bytes(WEIGHTS[:held])
    hub.break_after["w.bin"] = held + cut
    assert transfer.receive(served, part, size=len(WEIGHTS)) == SHA
    assert part.read_bytes() == WEIGHTS
    first = f"bytes={held}-" if held else ""
    assert _ranges(hub) == [first, f"bytes={held + cut}-"]


def _resident(path: Path) -> int:
    """Return the bytes of a file in the page cache (util-linux's fincore)."""
    out = subprocess.run(
        ["fincore", "--bytes", "--noheadings", "--output", "RES", str(path)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return int(out.stdout.strip())


def test_a_file_received_leaves_the_page_cache_alone(served: str, tmp_path: Path) -> None:
    # A weights file of many gigabytes written through the page cache would push what
    # the machine holds there out; written around it, only the last piece (shorter than
    # a block) stays. A file written plainly in the same folder is there whole, so the
    # folder's filesystem keeps a page cache to leave alone.
    plain = tmp_path / "plain.bin"
    plain.write_bytes(WEIGHTS)
    assert _resident(plain) >= len(WEIGHTS) - ALIGN
    part = tmp_path / "w.bin.part"
    assert transfer.receive(served, part, size=len(WEIGHTS)) == SHA
    assert _resident(part) <= ALIGN
    assert part.read_bytes() == WEIGHTS


MOUNTS = """\
/dev/vda / ext4 rw,relatime 0 0
tmpfs /dev/shm tmpfs rw 0 0
nas:/export /srv/llmgw nfs4 rw,vers=4.2 0 0
/dev/nvme0n1 /srv/llmgw/local xfs rw 0 0
/dev/sdb /mnt/with\\040space btrfs rw 0 0
/dev/sdc /mnt/over ext4 rw 0 0
overlay /mnt/over fuse.sshfs rw 0 0
"""


@pytest.mark.parametrize(
    ("path", "kind"),
    [
        ("/var/mirror/f.part", "ext4"),
        ("/dev/shm/f.part", "tmpfs"),
        ("/srv/llmgw/mirror/f.part", "nfs4"),
        ("/srv/llmgw/local/f.part", "xfs"),
        ("/srv/llmgw/localer/f.part", "nfs4"),  # a name that starts like a mount point
        ("/mnt/with space/f.part", "btrfs"),
        ("/mnt/over/f.part", "fuse.sshfs"),  # mounted over: the last one is seen
    ],
)
def test_the_filesystem_a_file_is_on_is_read_from_the_mount_table(path: str, kind: str) -> None:
    assert transfer.filesystem(Path(path), MOUNTS) == kind
    # Only a local disk's is written around the page cache.
    assert (kind in transfer.DIRECT_FILESYSTEMS) == (kind in ("ext4", "xfs", "btrfs"))


def test_a_file_on_tmpfs_is_written_through_the_page_cache(
    served: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # tmpfs is the page cache; over NFS or FUSE a direct write would be a round trip each.
    # The files' opening is watched (the real os.open, its flags recorded).
    real_open = os.open
    opened: dict[str, int] = {}

    def watched_open(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        opened[str(path)] = flags
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", watched_open)
    shm = Path("/dev/shm")
    assert transfer.filesystem(shm / "x") == "tmpfs"
    folder = Path(tempfile.mkdtemp(dir=shm))
    try:
        for part in (folder / "w.bin.part", tmp_path / "w.bin.part"):
            assert transfer.receive(served, part, size=len(WEIGHTS)) == SHA
            assert part.read_bytes() == WEIGHTS
    finally:
        shutil.rmtree(folder)
    assert not opened[str(folder / "w.bin.part")] & transfer._DIRECT
    assert opened[str(tmp_path / "w.bin.part")] & transfer._DIRECT  # ext4 here


def test_a_filesystem_refusing_direct_writes_gets_the_page_cache(
    served: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Some filesystems take O_DIRECT when the file is opened and refuse the writes
    # (EINVAL); the transfer goes on through the page cache, whole.
    write = os.write
    refused: list[int] = []

    def write_refusing_direct(fd: int, data: object) -> int:
        if transfer.fcntl.fcntl(fd, transfer.fcntl.F_GETFL) & transfer._DIRECT:
            refused.append(fd)
            raise OSError(errno.EINVAL, "Invalid argument")
        return write(fd, data)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "write", write_refusing_direct)
    part = tmp_path / "w.bin.part"
    assert transfer.receive(served, part, size=len(WEIGHTS)) == SHA
    assert part.read_bytes() == WEIGHTS and len(refused) == 1


class _Stalling(BaseHTTPRequestHandler):
    """Send the whole file, with Range; the first answer stops after ``first`` bytes and
    says nothing more until ``release`` is set (a server that hangs mid-transfer)."""

    protocol_version = "HTTP/1.1"
    first = 0
    asked: list[str]
    release: threading.Event

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802
        rng = self.headers.get("Range", "")
        self.asked.append(rng)
        start = int(rng.removeprefix("bytes=").rstrip("-")) if rng else 0
        self.send_response(206 if rng else 200)
        self.send_header("Content-Length", str(len(WEIGHTS) - start))
        if rng:
            self.send_header("Content-Range", f"bytes {start}-{len(WEIGHTS) - 1}/{len(WEIGHTS)}")
        self.end_headers()
        if len(self.asked) == 1:
            self.wfile.write(WEIGHTS[: self.first])
            self.wfile.flush()
            self.release.wait()
            return
        self.wfile.write(WEIGHTS[start:])


@pytest.mark.parametrize("size", [len(WEIGHTS), None], ids=["size known", "size unknown"])
def test_a_transfer_that_times_out_midway_resumes_from_what_was_written(
    tmp_path: Path, size: int | None
) -> None:
    # The first buffer arrives whole and is written; the second's bytes are cut off by the
    # read's timeout. The next ask starts where the file stands, and the sha256 is the
    # file's (an attempt that broke with an error once resumed from where it had started,
    # with the bytes it wrote hashed already: a wrong sha256, or a file written twice).
    class Handler(_Stalling):
        first = BUFFER + STEP_BYTES
        asked: list[str] = []
        release = threading.Event()

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        part = tmp_path / "w.bin.part"
        url = f"http://127.0.0.1:{server.server_address[1]}/w.bin"
        assert transfer.receive(url, part, size=size, timeout_s=0.5) == SHA
        assert part.read_bytes() == WEIGHTS
        assert Handler.asked == ["", f"bytes={BUFFER}-"]
    finally:
        Handler.release.set()
        server.shutdown()
        server.server_close()


# -- redirects ---------------------------------------------------------------------------------


class _Redirecting(BaseHTTPRequestHandler):
    """``/first`` redirects within its origin to ``/second``, which redirects to
    ``target`` (another origin); every request's path, Authorization and Range recorded."""

    protocol_version = "HTTP/1.1"
    seen: list[tuple[str, str, str]]
    target = ""

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802
        self.seen.append(
            (self.path, self.headers.get("Authorization", ""), self.headers.get("Range", ""))
        )
        self.send_response(302)
        self.send_header("Location", "/second" if self.path == "/first" else self.target)
        self.send_header("Content-Length", "0")
        self.end_headers()


@pytest.fixture
def redirecting(hub: HubStandIn) -> Iterator[tuple[str, list[tuple[str, str, str]]]]:
    hub.plain["w.bin"] = Blob(WEIGHTS)

    class Handler(_Redirecting):
        seen: list[tuple[str, str, str]] = []
        target = f"{hub.url}/plain/w.bin"

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/first", Handler.seen
    finally:
        server.shutdown()
        server.server_close()


def test_authorization_follows_a_redirect_within_its_origin_only(
    hub: HubStandIn, redirecting: tuple[str, list[tuple[str, str, str]]], tmp_path: Path
) -> None:
    url, seen = redirecting
    part = tmp_path / "w.bin.part"
    part.write_bytes(WEIGHTS[:100])
    got = transfer.receive(
        url, part, size=len(WEIGHTS), headers={"Authorization": "Bearer hf_secret"}
    )
    assert got == SHA and part.read_bytes() == WEIGHTS
    assert seen == [
        ("/first", "Bearer hf_secret", "bytes=100-"),
        ("/second", "Bearer hf_secret", "bytes=100-"),
    ]
    # The other origin (the Hub's CDN, say) is asked from where the .part stands, and is
    # never sent the token.
    assert _ranges(hub) == ["bytes=100-"] and hub.tokens_seen == []
