"""The mirror's sha256 on a thread of its own (agent.sha): the same digest as hashlib's,
whether handed bytes or reading into its own buffers."""

from __future__ import annotations

import hashlib
import io
import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.sha import QUEUED, BackgroundSha256


@given(st.lists(st.binary(max_size=5000), max_size=3 * QUEUED))
def test_the_digest_is_hashlib_s_of_the_chunks_in_order(chunks: list[bytes]) -> None:
    digest = BackgroundSha256()
    for c in chunks:
        digest.update(c)
    assert digest.hexdigest() == hashlib.sha256(b"".join(chunks)).hexdigest()


def test_reset_starts_from_nothing_and_close_ends_its_thread() -> None:
    before = {t.ident for t in threading.enumerate()}
    digest = BackgroundSha256()
    digest.update(b"held bytes the server ignored")
    digest.reset()
    digest.update(b"the whole file")
    assert digest.hexdigest() == hashlib.sha256(b"the whole file").hexdigest()
    digest.close()  # again: nothing to end
    other = BackgroundSha256()
    other.update(b"x" * 100_000)
    other.close()
    assert {t.ident for t in threading.enumerate() if t.name == "sha256"} - before == set()


@given(
    st.binary(max_size=20_000),
    st.lists(st.integers(min_value=1, max_value=3000), min_size=1, max_size=20),
    st.integers(min_value=1, max_value=4),
)
def test_fill_reads_into_its_buffers_and_hashes_what_it_hands_back(
    data: bytes, reads: list[int], buffers: int
) -> None:
    # Reads of many sizes (a socket's), into few small buffers taken again once hashed.
    source = io.BytesIO(data)
    sizes = iter(reads * (len(data) + 1))

    def read_into(view: memoryview) -> int:
        return source.readinto(view[: next(sizes)])

    digest = BackgroundSha256(buffers=buffers, size=1000)
    written = bytearray()
    while view := digest.fill(read_into):
        written += view
    assert bytes(written) == data
    assert digest.hexdigest() == hashlib.sha256(data).hexdigest()


def test_a_read_that_fails_hashes_nothing_of_it() -> None:
    digest = BackgroundSha256(buffers=1, size=10)

    def broken(view: memoryview) -> int:
        view[:3] = b"bad"
        raise ConnectionResetError("lost")

    assert bytes(digest.fill(io.BytesIO(b"good").readinto)) == b"good"
    with pytest.raises(ConnectionResetError):
        digest.fill(broken)
    # Its buffer is free again (there is one): the next read takes it.
    assert bytes(digest.fill(io.BytesIO(b" bytes").readinto)) == b" bytes"
    assert digest.hexdigest() == hashlib.sha256(b"good bytes").hexdigest()
