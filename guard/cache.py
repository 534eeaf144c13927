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
again in the background, so a steady stream of readers never waits for a load.

The last good value is served when the source fails (the database away or hung): once a
value was loaded, a reader never waits on a load for longer than ``wait`` seconds, and
never raises a load's error. With ``ahead``, a value past its ``ttl`` (or invalidated) is
loaded in the background and its reader waits for it at most ``wait`` seconds; a load that
fails, or takes longer, turns the cache ``stale`` (after an ``invalidate`` the wait is
``WAIT_CHANGED``, 5 s: a change this process committed is owed to its next reader): from then on readers get the last
value at once (no wait at all) while a load is tried again in the background, at most
every ``retry`` seconds, until one succeeds. ``age()`` says how old the value served is;
a failure is logged whole once, then a line a minute at most. Only the first load (there
is nothing to serve yet) is done by its reader and may raise. Without ``ahead`` a reader
loads itself, and a load that raises serves the last value (it cannot be bounded in time).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Hashable
from typing import Any, Generic, TypeVar

T = TypeVar("T")
K = TypeVar("K", bound=Hashable)

log = logging.getLogger(__name__)

# Runs a job in the background (the job catches nothing: the runner reports failures).
Ahead = Callable[[Callable[[], None]], None]

# How long a reader waits for a load when it holds a value to fall back on (seconds).
WAIT = 0.5
# How long, when the value was invalidated (a change committed in this process, so the
# database answered a moment ago): its readers are owed the change.
WAIT_CHANGED = 5.0
# How often a stale cache tries to load again (seconds).
RETRY = 1.0
# How often a cache that keeps failing says so again (seconds).
LOG_EVERY = 60.0


class _Job:
    """A load under way in the background: readers may wait for it, boundedly."""

    __slots__ = ("done", "ok", "value")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.ok = False
        self.value: Any = None


# What ``_background`` returns when its runner could start no job.
_NO_RUNNER: Any = _Job()


class _Health:
    """Whether the source answered lately, and the log lines that say so."""

    def __init__(self, name: str, clock: Callable[[], float], retry: float) -> None:
        self.name = name
        self.clock = clock
        self.retry = retry
        self.stale = False
        self.failures = 0  # failed loads since the last good one
        self.good_at: float | None = None  # the clock's time of the last good load
        self.retry_at = -float("inf")
        self._logged = -float("inf")

    def good(self) -> None:
        now = self.clock()
        was, failures, before = self.stale, self.failures, self.good_at
        self.stale, self.failures, self.good_at = False, 0, now
        if was:
            log.warning("%s read again after %d failed reads (%.0f s stale)", self.name,
                        failures, now - before if before is not None else 0.0)  # fmt: skip

    def failed(self, error: BaseException | str) -> None:
        now = self.clock()
        self.stale = True
        self.failures += 1
        self.retry_at = now + self.retry
        if self.failures == 1 or now - self._logged >= LOG_EVERY:
            self._logged = now
            age = "" if self.good_at is None else f", {now - self.good_at:.0f} s old"
            log.error("%s could not be read (%d failed reads so far); serving the last%s: %s",
                      self.name, self.failures, age, error,
                      exc_info=isinstance(error, BaseException) and self.failures == 1)  # fmt: skip

    def may_try(self) -> bool:
        return not self.stale or self.clock() >= self.retry_at

    def age(self) -> float | None:
        return None if self.good_at is None else self.clock() - self.good_at


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
        wait: float = WAIT,
        retry: float = RETRY,
        name: str = "a cached value",
        wait_changed: float = WAIT_CHANGED,
    ) -> None:
        if not ttl > 0:
            raise ValueError("ttl must be positive")
        self._load = load
        self.ttl = ttl
        self.wait = wait
        self.wait_changed = wait_changed
        self._changed = False  # invalidated since the last load
        self._clock = clock
        self._ahead = ahead
        self._generation = 0
        # (value, generation it was loaded under, when), replaced whole: readers see
        # either the old entry or the new one.
        self._entry: tuple[T, int, float] | None = None
        # The last value loaded, kept through invalidations and failures (``peek``).
        self._last: T | None = None
        self._has = False
        self._loading = threading.Lock()
        self._lock = threading.Lock()  # guards _job
        self._job: _Job | None = None
        self.health = _Health(name, clock, retry)

    @property
    def stale(self) -> bool:
        """Whether the last load failed (or outlasted ``wait``) and none succeeded since."""
        return self.health.stale

    def age(self) -> float | None:
        """Seconds since the last good load; None before the first."""
        return self.health.age()

    def get(self) -> T:
        """Return the value: fresh, or loaded now (waiting at most ``wait`` when there is
        a last value to serve), or the last one while the source fails."""
        entry = self._current()
        if entry is not None:
            return entry[0]
        if not self._has or self._ahead is None:
            return self._load_here()
        return self._from_background()

    def fresh(self) -> T | None:
        """Return what ``get`` would without waiting for a load: the value when fresh,
        the last one while stale (a load is tried again in the background); None
        otherwise. Never loads here, so never waits."""
        entry = self._current()
        if entry is not None:
            return entry[0]
        if self._has and self.health.stale and self._ahead is not None:
            self._background(None)
            return self._last
        return None

    def refresh(self, load: Callable[[], T] | None = None) -> T:
        """Load the value now (with ``load`` if given), keep it and return it; the last
        value when that fails or, with ``ahead``, takes longer than ``wait``."""
        if not self._has or self._ahead is None:
            return self._load_here(load, force=True)
        return self._from_background(load)

    def keep(self) -> None:
        """Load the value in this thread when it is not fresh or past half its ``ttl``:
        its owner's periodic refresh (a thread of its own), so readers find it fresh and
        never wait. A failure is noted (``stale``), never raised."""
        entry = self._entry
        if self._fresh(entry) and self._clock() - entry[2] < self.ttl / 2:  # type: ignore[index]
            return
        with self._loading:
            try:
                self._reload()
            except Exception as error:
                self.health.failed(error)

    def peek(self) -> T | None:
        """Return the last value loaded (fresh or not, invalidated or not) without
        loading; None before the first load."""
        return self._last

    def invalidate(self) -> None:
        """Forget the value: the next ``get`` loads it again."""
        self._generation += 1
        self._changed = True
        self._entry = None

    def _current(self) -> tuple[T, int, float] | None:
        entry = self._entry
        if entry is not None and entry[1] == self._generation:
            age = self._clock() - entry[2]
            if age < self.ttl:
                if self._ahead is not None and age >= self.ttl / 2:
                    self._background(None, seen=entry)
                return entry
        return None

    def _fresh(self, entry: tuple[T, int, float] | None) -> bool:
        return (entry is not None and entry[1] == self._generation
                and self._clock() - entry[2] < self.ttl)  # fmt: skip

    def _load_here(self, load: Callable[[], T] | None = None, force: bool = False) -> T:
        """Load in this thread (one at a time); the last value when that fails."""
        with self._loading:
            entry = self._entry
            if not force and self._fresh(entry):
                assert entry is not None
                return entry[0]  # another thread loaded it while this one waited
            if self._has and not self.health.may_try():
                return self._last  # type: ignore[return-value]
            try:
                return self._reload(load)
            except Exception as error:
                self.health.failed(error)
                if not self._has:
                    raise
                return self._last  # type: ignore[return-value]

    def _from_background(self, load: Callable[[], T] | None = None) -> T:
        job = self._background(load)
        if job is _NO_RUNNER:
            return self._load_here(load, force=load is not None)
        wait = self.wait_changed if self._changed else self.wait
        if job is not None and not self.health.stale and wait > 0:
            if not job.done.wait(wait):
                self.health.failed(f"no answer within {wait:g} s")
            elif job.ok:
                return job.value  # type: ignore[no-any-return]
        entry = self._entry
        if self._fresh(entry):
            assert entry is not None
            return entry[0]
        return self._last  # type: ignore[return-value]

    def _reload(self, load: Callable[[], T] | None = None) -> T:
        generation = self._generation
        value = (load or self._load)()
        self.health.good()  # before the value is seen: who sees it sees it fresh
        self._last, self._has = value, True
        if generation == self._generation:
            self._changed = False
            self._entry = (value, generation, self._clock())
        return value

    def _background(
        self, load: Callable[[], T] | None, seen: tuple[T, int, float] | None = None
    ) -> _Job | None:
        """Start a load in the background unless one is under way (returned then), or a
        stale cache tried too recently (None)."""
        with self._lock:
            if self._job is not None:
                return self._job
            if not self.health.may_try():
                return None
            job = self._job = _Job()

        def run() -> None:
            try:
                # Under the lock, the failure too: a failure noted after a later load's
                # success would say stale what is not.
                with self._loading:
                    if seen is not None and self._entry is not seen and self._fresh(self._entry):
                        return  # a refresh ahead, and somebody loaded it meanwhile
                    try:
                        job.value = self._reload(load)
                        job.ok = True
                    except Exception as error:
                        self.health.failed(error)
            finally:
                with self._lock:
                    self._job = None
                job.done.set()

        try:
            assert self._ahead is not None
            self._ahead(run)
        except Exception:
            # No thread to be had (at exit): a reader with a fresh value keeps it, and
            # one past the ttl loads it itself.
            with self._lock:
                self._job = None
            job.done.set()
            return _NO_RUNNER
        return job


class CachedMap(Generic[K, T]):
    """Values by key, each loaded on first use and again after ``ttl`` seconds.

    ``load(key)`` returning None keeps nothing (an unknown key is asked about every time,
    and a key found gone is dropped). ``invalidate`` forgets every key. At most ``size``
    keys are held: past that the stale ones go, and if that is not enough, all of them.
    ``ahead``, ``wait`` and ``retry`` as ``Cached``'s: a key found before is served from
    its last value while the source fails; an unknown key is loaded by its reader.
    """

    def __init__(
        self,
        load: Callable[[K], T | None],
        ttl: float,
        clock: Callable[[], float] = time.monotonic,
        size: int = 10_000,
        ahead: Ahead | None = None,
        wait: float = WAIT,
        retry: float = RETRY,
        name: str = "a cached value",
    ) -> None:
        if not ttl > 0:
            raise ValueError("ttl must be positive")
        self._load = load
        self.ttl = ttl
        self.wait = wait
        self._clock = clock
        self._size = size
        self._ahead = ahead
        self._generation = 0
        # Every key found, with its generation and when; kept past the ttl (the last
        # value, served while the source fails) until invalidated or pruned.
        self._entries: dict[K, tuple[T, int, float]] = {}
        self._jobs: dict[K, _Job] = {}
        self._lock = threading.Lock()  # guards _jobs
        self.health = _Health(name, clock, retry)

    @property
    def stale(self) -> bool:
        return self.health.stale

    def get(self, key: K) -> T | None:
        """Return the value for ``key``: fresh, loaded now (waiting at most ``wait`` when
        the key has a last value), or its last value while the source fails."""
        entry = self._entries.get(key)
        if entry is None or entry[1] != self._generation:
            return self._reload(key)  # never found: its reader asks (and may raise)
        if self._clock() - entry[2] < self.ttl:
            return self.fresh(key)
        if self._ahead is None:
            if not self.health.may_try():
                return entry[0]
            try:
                return self._reload(key)
            except Exception as error:
                self.health.failed(error)
                return entry[0]
        job = self._background(key)
        if job is _NO_RUNNER:
            try:
                return self._reload(key)
            except Exception as error:
                self.health.failed(error)
                return entry[0]
        if job is not None and not self.health.stale and self.wait > 0:
            if not job.done.wait(self.wait):
                self.health.failed(f"no answer within {self.wait:g} s")
            elif job.ok:
                return job.value  # type: ignore[no-any-return]
        now = self._entries.get(key)
        return None if now is None else now[0]

    def fresh(self, key: K) -> T | None:
        """Return the value for ``key`` when fresh (refreshing ahead as ``get`` does), or
        its last value while the source fails; None otherwise: never loads, never waits."""
        entry = self._entries.get(key)
        if entry is None or entry[1] != self._generation:
            return None
        age = self._clock() - entry[2]
        if age < self.ttl:
            if self._ahead is not None and age >= self.ttl / 2:
                self._background(key)
            return entry[0]
        if self.health.stale and self._ahead is not None:
            self._background(key)
            return entry[0]
        return None

    def invalidate(self) -> None:
        """Forget every key (their last values too: a revocation is never served stale)."""
        self._generation += 1
        self._entries = {}

    def _reload(self, key: K) -> T | None:
        generation = self._generation
        value = self._load(key)
        self.health.good()
        if value is None:
            self._entries.pop(key, None)
            return None
        if generation == self._generation:
            now = self._clock()
            if len(self._entries) >= self._size and key not in self._entries:
                self._prune(now)
            self._entries[key] = (value, generation, now)
        return value

    def _background(self, key: K) -> _Job | None:
        with self._lock:
            if key in self._jobs:
                return self._jobs[key]
            if not self.health.may_try():
                return None
            job = self._jobs[key] = _Job()

        def run() -> None:
            try:
                job.value = self._reload(key)
                job.ok = True
            except Exception as error:
                self.health.failed(error)
            finally:
                with self._lock:
                    self._jobs.pop(key, None)
                job.done.set()

        try:
            assert self._ahead is not None
            self._ahead(run)
        except Exception:
            with self._lock:  # as Cached's
                self._jobs.pop(key, None)
            job.done.set()
            return _NO_RUNNER
        return job

    def _prune(self, now: float) -> None:
        fresh = {
            k: e
            for k, e in list(self._entries.items())
            if e[1] == self._generation and now - e[2] < self.ttl
        }
        self._entries = fresh if len(fresh) < self._size else {}
