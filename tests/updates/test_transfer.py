"""A file received over HTTP into a .part file (agent.transfer), against real servers on
loopback: the Hub stand-in (Range, a transfer broken halfway) and a redirecting one."""

from __future__ import annotations

import hashlib
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from agent import transfer
from tests.updates.hubstandin import Blob, HubStandIn

WEIGHTS = bytes(range(256)) * 12_000  # about 3 MB: several of agent.sha's buffers
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
    with pytest.raises(transfer.Refused) as refused:
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
