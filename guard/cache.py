"""Values kept in memory for a short time or until invalidated: what every check reads.

Plain Python, no Django and no I/O of its own: the lead passes the loaders (the policy
and the judges from the database, an API token's user) and calls ``invalidate`` when a
change is committed. A value is reloaded when it is older than ``ttl`` seconds (the
safety net for changes this process did not see: another process's, or a bulk update
that sends no signal) or when ``invalidate`` was called after it was loaded.

Invalidation is by generation: a load notes the generation it started under, and what it
loaded is kept only under that one; an ``invalidate`` during a load (a commit the load may
have read before) bumps the generation, so the next reader loads again rather than
keeping what may be the old state.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

T = TypeVar("T")
K = TypeVar("K", bound=Hashable)


class Cached(Generic[T]):
    """One value, loaded on first use and again after ``ttl`` seconds or an invalidation.

    Thread-safe: readers of a fresh value take no lock; one thread at a time loads.
    """

    def __init__(
        self, load: Callable[[], T], ttl: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if not ttl > 0:
            raise ValueError("ttl must be positive")
        self._load = load
        self.ttl = ttl
        self._clock = clock
        self._generation = 0
        # (value, generation it was loaded under, when), replaced whole: readers see
        # either the old entry or the new one.
        self._entry: tuple[T, int, float] | None = None
        # The last value loaded, kept through invalidations (``peek``).
        self._last: T | None = None
        self._loading = threading.Lock()

    def get(self) -> T:
        """Return the value, loading it when there is none fresh."""
        entry = self._entry
        if entry is not None and self._fresh(entry):
            return entry[0]
        with self._loading:
            # Another thread may have loaded it while this one waited.
            entry = self._entry
            if entry is not None and self._fresh(entry):
                return entry[0]
            return self._reload()

    def refresh(self, load: Callable[[], T] | None = None) -> T:
        """Load the value now (with ``load`` if given), keep it and return it."""
        with self._loading:
            return self._reload(load)

    def peek(self) -> T | None:
        """Return the last value loaded (fresh or not, invalidated or not) without
        loading; None before the first load."""
        return self._last

    def invalidate(self) -> None:
        """Forget the value: the next ``get`` loads it again."""
        self._generation += 1
        self._entry = None

    def _fresh(self, entry: tuple[T, int, float]) -> bool:
        return entry[1] == self._generation and self._clock() - entry[2] < self.ttl

    def _reload(self, load: Callable[[], T] | None = None) -> T:
        generation = self._generation
        value = (load or self._load)()
        self._last = value
        if generation == self._generation:
            self._entry = (value, generation, self._clock())
        return value


class CachedMap(Generic[K, T]):
    """Values by key, each loaded on first use and again after ``ttl`` seconds.

    ``load(key)`` returning None keeps nothing (an unknown key is asked about every time).
    ``invalidate`` forgets every key. At most ``size`` keys are held: past that the
    stale ones go, and if that is not enough, all of them.
    """

    def __init__(
        self,
        load: Callable[[K], T | None],
        ttl: float,
        clock: Callable[[], float] = time.monotonic,
        size: int = 10_000,
    ) -> None:
        if not ttl > 0:
            raise ValueError("ttl must be positive")
        self._load = load
        self.ttl = ttl
        self._clock = clock
        self._size = size
        self._generation = 0
        self._entries: dict[K, tuple[T, int, float]] = {}

    def get(self, key: K) -> T | None:
        """Return the value for ``key``, loading it when there is none fresh."""
        entry = self._entries.get(key)
        now = self._clock()
        if entry is not None and entry[1] == self._generation and now - entry[2] < self.ttl:
            return entry[0]
        generation = self._generation
        value = self._load(key)
        if value is None:
            self._entries.pop(key, None)
            return None
        if generation == self._generation:
            if len(self._entries) >= self._size:
                self._prune(now)
            self._entries[key] = (value, generation, self._clock())
        return value

    def invalidate(self) -> None:
        """Forget every key."""
        self._generation += 1
        self._entries = {}

    def _prune(self, now: float) -> None:
        fresh = {
            k: e
            for k, e in list(self._entries.items())
            if e[1] == self._generation and now - e[2] < self.ttl
        }
        self._entries = fresh if len(fresh) < self._size else {}
