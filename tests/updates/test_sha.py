"""The mirror's sha256 on a thread of its own (agent.sha): the same digest as hashlib's."""

from __future__ import annotations

import hashlib
import threading

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
