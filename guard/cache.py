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

Refresh ahead: given ``ahead`` (a function that runs a job in the background; the lead's
starts a thread), a value read when past half its ``ttl`` is returned as it is and loaded
again in the background, so a steady stream of readers never waits for a load; the
``ttl`` still bounds how old a value returned can be.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

T = TypeVar("T")
K = TypeVar("K", bound=Hashable)

# Runs a job in the background (the job catches nothing: the runner reports failures).
Ahead = Callable[[Callable[[], None]], None]


class Cached(Generic[T]):
    """One value, loaded on first use and again after ``ttl`` seconds or an invalidation.

    Thread-safe: readers of a fresh value take no lock; one thread at a time loads.
    """

    def __init__(
        self,
        load: Callable[[], T],
        ttl: float,
        clock: Callable[[], float] = time.monotonic,
        ahead: Ahead | None = None,
    ) -> None:
        if not ttl > 0:
            raise ValueError("ttl must be positive")
        self._load = load
        self.ttl = ttl
        self._clock = clock
        self._ahead = ahead
        self._generation = 0
        # (value, generation it was loaded under, when), replaced whole: readers see
        # either the old entry or the new one.
        self._entry: tuple[T, int, float] | None = None
        # The last value loaded, kept through invalidations (``peek``).
        self._last: T | None = None
        self._loading = threading.Lock()
        self._refreshing = threading.Lock()  # held while a refresh ahead is under way

    def get(self) -> T:
        """Return the value, loading it when there is none fresh."""
        entry = self._current()
        if entry is not None:
            return entry[0]
        with self._loading:
            # Another thread may have loaded it while this one waited.
            entry = self._entry
            if entry is not None and self._fresh(entry):
                return entry[0]
            return self._reload()

    def fresh(self) -> T | None:
        """Return the value when it is fresh (refreshing ahead as ``get`` does), None
        otherwise: never loads, so never waits for a load."""
        entry = self._current()
        return None if entry is None else entry[0]

    def _current(self) -> tuple[T, int, float] | None:
        entry = self._entry
        if entry is not None and entry[1] == self._generation:
            age = self._clock() - entry[2]
            if age < self.ttl:
                if self._ahead is not None and age >= self.ttl / 2:
                    self._refresh_ahead(entry)
                return entry
        return None

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

    def _refresh_ahead(self, seen: tuple[T, int, float]) -> None:
        if self._ahead is None or not self._refreshing.acquire(blocking=False):
            return  # one refresh at a time

        def job() -> None:
            try:
                with self._loading:
                    if self._entry is seen:  # nobody loaded it meanwhile
                        self._reload()
            finally:
                self._refreshing.release()

        try:
            self._ahead(job)
        except Exception:
            # No refresh (no thread to be had, at exit): the value is still fresh, and
            # the reader past the ttl loads it.
            self._refreshing.release()


class CachedMap(Generic[K, T]):
    """Values by key, each loaded on first use and again after ``ttl`` seconds.

    ``load(key)`` returning None keeps nothing (an unknown key is asked about every time).
    ``invalidate`` forgets every key. At most ``size`` keys are held: past that the
    stale ones go, and if that is not enough, all of them. ``ahead`` as ``Cached``'s.
    """

    def __init__(
        self,
        load: Callable[[K], T | None],
        ttl: float,
        clock: Callable[[], float] = time.monotonic,
        size: int = 10_000,
        ahead: Ahead | None = None,
    ) -> None:
        if not ttl > 0:
            raise ValueError("ttl must be positive")
        self._load = load
        self.ttl = ttl
        self._clock = clock
        self._size = size
        self._ahead = ahead
        self._generation = 0
        self._entries: dict[K, tuple[T, int, float]] = {}
        self._refreshing: set[K] = set()
        self._lock = threading.Lock()  # guards _refreshing

    def get(self, key: K) -> T | None:
        """Return the value for ``key``, loading it when there is none fresh."""
        found = self.fresh(key)
        return self._reload(key) if found is None else found

    def fresh(self, key: K) -> T | None:
        """Return the value for ``key`` when it is fresh (refreshing ahead as ``get``
        does), None otherwise: never loads."""
        entry = self._entries.get(key)
        if entry is not None and entry[1] == self._generation:
            age = self._clock() - entry[2]
            if age < self.ttl:
                if self._ahead is not None and age >= self.ttl / 2:
                    self._refresh_ahead(key)
                return entry[0]
        return None

    def invalidate(self) -> None:
        """Forget every key."""
        self._generation += 1
        self._entries = {}

    def _reload(self, key: K) -> T | None:
        generation = self._generation
        value = self._load(key)
        if value is None:
            self._entries.pop(key, None)
            return None
        if generation == self._generation:
            now = self._clock()
            if len(self._entries) >= self._size:
                self._prune(now)
            self._entries[key] = (value, generation, now)
        return value

    def _refresh_ahead(self, key: K) -> None:
        with self._lock:
            if self._ahead is None or key in self._refreshing:
                return
            self._refreshing.add(key)

        def job() -> None:
            try:
                self._reload(key)
            finally:
                with self._lock:
                    self._refreshing.discard(key)

        try:
            self._ahead(job)
        except Exception:
            with self._lock:  # as Cached's: the value is still fresh
                self._refreshing.discard(key)

    def _prune(self, now: float) -> None:
        fresh = {
            k: e
            for k, e in list(self._entries.items())
            if e[1] == self._generation and now - e[2] < self.ttl
        }
        self._entries = fresh if len(fresh) < self._size else {}
