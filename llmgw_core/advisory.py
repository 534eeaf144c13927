"""One holder at a time across the processes: PostgreSQL's session advisory locks.

``held(key)`` tries the lock ``key`` (a signed 64-bit number; each user names its own,
see ``cluster.reconciler.LEADER_LOCK``) without waiting and yields whether it got it. A
session lock goes with its connection, so one a dead process held is free again as soon
as the server sees the connection close. The embedded SQLite has one process: a set of
the keys its threads hold stands in for the server's locks there.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from django.db import DatabaseError, connection

_held: set[int] = set()
_held_lock = threading.Lock()


@contextlib.contextmanager
def held(key: int) -> Iterator[bool]:
    """Hold the lock ``key`` for the block if no one else does; yield whether this did."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cur:
            cur.execute("SELECT pg_try_advisory_lock(%s)", [key])
            got = bool(cur.fetchone()[0])
        try:
            yield got
        finally:
            if got:
                # A connection lost meanwhile took the lock with it.
                with contextlib.suppress(DatabaseError), connection.cursor() as cur:
                    cur.execute("SELECT pg_advisory_unlock(%s)", [key])
        return
    with _held_lock:
        got = key not in _held
        _held.add(key)
    try:
        yield got
    finally:
        if got:
            with _held_lock:
                _held.discard(key)
