"""What checks keep in memory: reloaded after its time or an invalidation, never kept
when an invalidation came during its load."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from guard.cache import Cached, CachedMap
from tests.waiting import wait_until


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Source:
    """A value that changes, counting how often it was read."""

    def __init__(self) -> None:
        self.value = "v1"
        self.reads = 0

    def __call__(self) -> str:
        self.reads += 1
        return self.value


def test_a_value_is_read_once_until_it_expires() -> None:
    clock, source = Clock(), Source()
    cached = Cached(source, ttl=1.0, clock=clock)
    assert [cached.get() for _ in range(5)] == ["v1"] * 5
    assert source.reads == 1
    source.value = "v2"
    clock.now += 0.99
    assert cached.get() == "v1"  # a change nobody told of waits for the ttl
    clock.now += 0.01
    assert cached.get() == "v2" and source.reads == 2


def test_invalidate_makes_the_next_get_read_again() -> None:
    source = Source()
    cached = Cached(source, ttl=60.0, clock=Clock())
    assert cached.get() == "v1"
    source.value = "v2"
    cached.invalidate()
    assert cached.get() == "v2" and source.reads == 2


def test_an_invalidation_during_a_load_is_not_lost() -> None:
    """A load that may have read the state before a commit is not kept past it."""
    clock = Clock()
    reads: list[str] = []
    state = {"value": "old"}
    holder: dict[str, Cached[str]] = {}

    def load() -> str:
        seen = state["value"]
        if not reads:
            # The commit lands after this load read, and invalidates.
            state["value"] = "new"
            holder["c"].invalidate()
        reads.append(seen)
        return seen

    holder["c"] = cached = Cached(load, ttl=60.0, clock=clock)
    assert cached.get() == "old"  # this caller gets what it read
    assert cached.get() == "new"  # the next one does not get it kept
    assert reads == ["old", "new"]


def test_refresh_reads_now_with_its_own_loader_and_keeps_it() -> None:
    source = Source()
    cached = Cached(source, ttl=60.0, clock=Clock())
    cached.get()
    assert cached.refresh(lambda: "special") == "special"
    assert cached.get() == "special" and source.reads == 1
    assert cached.peek() == "special"


def test_peek_keeps_the_last_value_through_an_invalidation() -> None:
    cached = Cached(Source(), ttl=60.0, clock=Clock())
    assert cached.peek() is None
    cached.get()
    cached.invalidate()
    assert cached.peek() == "v1"


def test_one_thread_loads_while_others_wait() -> None:
    started = threading.Event()
    release = threading.Event()
    loads: list[int] = []

    def load() -> int:
        loads.append(1)
        started.set()
        release.wait(5)
        return len(loads)

    cached = Cached(load, ttl=60.0)
    results: list[int] = []
    threads = [threading.Thread(target=lambda: results.append(cached.get())) for _ in range(8)]
    threads[0].start()
    started.wait(5)
    for t in threads[1:]:
        t.start()
    release.set()
    for t in threads:
        t.join(5)
    assert results == [1] * 8 and len(loads) == 1


def test_ttl_must_be_positive() -> None:
    with pytest.raises(ValueError, match="ttl"):
        Cached(Source(), ttl=0)
    with pytest.raises(ValueError, match="ttl"):
        CachedMap(lambda k: k, ttl=-1)


def test_map_keeps_found_keys_for_the_ttl_and_asks_again_about_unknown_ones() -> None:
    clock = Clock()
    asked: list[str] = []
    table = {"a": "alice"}

    def load(key: str) -> Any:
        asked.append(key)
        return table.get(key)

    found = CachedMap(load, ttl=1.0, clock=clock)
    assert found.get("a") == "alice" and found.get("a") == "alice"
    assert found.get("z") is None and found.get("z") is None
    assert asked == ["a", "z", "z"]
    table["a"] = "anna"
    clock.now += 1.0
    assert found.get("a") == "anna"
    del table["a"]
    found.invalidate()
    assert found.get("a") is None


def test_map_holds_at_most_its_size() -> None:
    clock = Clock()
    found = CachedMap(lambda k: k * 2, ttl=1.0, clock=clock, size=3)
    for k in range(3):
        found.get(k)
    clock.now += 2  # all stale
    found.get(10)
    assert len(found._entries) == 1
    for k in range(20, 30):
        found.get(k)
    assert len(found._entries) <= 3


class Later:
    """A background runner that keeps jobs until told to run them."""

    def __init__(self) -> None:
        self.jobs: list[Any] = []

    def __call__(self, job: Any) -> None:
        self.jobs.append(job)

    def run(self) -> None:
        jobs, self.jobs = self.jobs, []
        for job in jobs:
            job()


def test_past_half_its_ttl_a_value_is_returned_and_read_again_in_the_background() -> None:
    clock, source, later = Clock(), Source(), Later()
    cached = Cached(source, ttl=1.0, clock=clock, ahead=later)
    assert cached.get() == "v1"
    clock.now += 0.4
    assert cached.get() == "v1" and later.jobs == []
    source.value = "v2"
    clock.now += 0.2  # 0.6 s old
    assert cached.get() == "v1" and cached.get() == "v1"
    assert len(later.jobs) == 1  # one refresh at a time
    later.run()
    assert source.reads == 2
    assert cached.get() == "v2" and later.jobs == []
    clock.now += 0.6
    cached.get()
    assert len(later.jobs) == 1
    # Nobody ran it: past the ttl a reader waits for it at most ``wait``, then is
    # served the last value, and the cache says it is stale.
    source.value = "v3"
    clock.now += 0.4
    cached.wait = 0.01
    assert cached.get() == "v2" and cached.stale
    later.run()  # the late load lands: fresh again
    assert source.reads == 3 and not cached.stale
    assert cached.get() == "v3" and later.jobs == []


def test_a_refresh_ahead_does_not_keep_what_an_invalidation_made_old() -> None:
    clock, later = Clock(), Later()
    state = {"value": "old"}
    cached = Cached(lambda: state["value"], ttl=1.0, clock=clock, ahead=later)
    cached.get()
    clock.now += 0.6
    cached.get()
    cached.invalidate()
    state["value"] = "new"
    later.run()  # the entry it was asked for is gone: read again
    assert cached.get() == "new"


def test_map_reads_a_key_again_in_the_background_and_drops_one_gone() -> None:
    clock, later = Clock(), Later()
    table = {"a": "alice"}
    found = CachedMap(table.get, ttl=1.0, clock=clock, ahead=later)
    assert found.get("a") == "alice"
    clock.now += 0.5
    assert found.get("a") == "alice" and found.get("a") == "alice"
    assert len(later.jobs) == 1
    del table["a"]  # revoked
    later.run()
    assert found.get("a") is None


def test_a_refresh_that_cannot_start_leaves_the_fresh_value_to_its_reader() -> None:
    def no_threads(job: Any) -> None:
        raise RuntimeError("can't start new thread")

    clock, source = Clock(), Source()
    cached = Cached(source, ttl=1.0, clock=clock, ahead=no_threads)
    found = CachedMap(lambda k: k, ttl=1.0, clock=clock, ahead=no_threads)
    cached.get()
    found.get("a")
    clock.now += 0.7
    assert cached.get() == "v1" and found.get("a") == "a"
    clock.now += 0.3
    source.value = "v2"
    assert cached.get() == "v2"


# The source fails: the last good value is served, boundedly, and the cache says so.


class Threads:
    """A background runner that starts a thread per job, as the lead's does."""

    def __init__(self) -> None:
        self.started = 0

    def __call__(self, job: Any) -> None:
        self.started += 1
        threading.Thread(target=job, daemon=True).start()


class Flaky:
    """A source that answers, fails at once (a database refusing) or hangs (one hung)
    until released."""

    def __init__(self) -> None:
        self.value = "v1"
        self.mode = "ok"
        self.reads = 0
        self.release = threading.Event()

    def __call__(self, *key: Any) -> str:
        self.reads += 1
        if self.mode == "refuse":
            raise ConnectionError("connection refused")
        if self.mode == "hang":
            self.release.wait(30)
        return self.value


def test_a_value_whose_source_refuses_keeps_being_served_and_says_it_is_stale() -> None:
    clock, source, runner = Clock(), Flaky(), Threads()
    cached = Cached(source, ttl=1.0, clock=clock, ahead=runner, retry=5.0)
    assert cached.get() == "v1" and not cached.stale and cached.age() == 0
    source.mode, source.value = "refuse", "v2"
    clock.now += 3
    assert cached.get() == "v1"  # the load failed: the last value, no error
    assert cached.stale and cached.age() == 3
    cached.invalidate()  # a change committed meanwhile: still nothing better to serve
    assert cached.get() == "v1" and cached.fresh() == "v1" and cached.refresh() == "v1"
    # Stale: a load is tried again at most every ``retry`` seconds, not per reader.
    assert source.reads == 2
    source.mode = "ok"

    def later() -> bool:
        clock.now += 5
        return cached.get() == "v2"

    # The source is back: a reader tries again (served the last value meanwhile: a
    # stale cache never waits), and the load it started brings the new one.
    wait_until(later, what="the cache to read its source again")
    clock.now += 0.1
    assert not cached.stale and cached.age() == pytest.approx(0.1)


def test_a_hung_source_holds_one_reader_for_at_most_wait_then_none() -> None:
    clock, source, runner = Clock(), Flaky(), Threads()
    cached = Cached(source, ttl=1.0, clock=clock, ahead=runner, wait=0.2)
    cached.get()
    source.mode, source.value = "hang", "v2"
    clock.now += 2
    waited = threading.Event()
    result: list[str] = []

    def read() -> None:
        result.append(cached.get())
        waited.set()

    threading.Thread(target=read, daemon=True).start()
    assert waited.wait(10), "a reader waited on a hung load past its bound"
    assert result == ["v1"] and cached.stale
    # Stale: the next readers do not wait at all (a hung load never returns in 10 s).
    assert [cached.get() for _ in range(100)] == ["v1"] * 100
    assert cached.fresh() == "v1" and runner.started == 1  # the one load, still hung
    source.release.set()  # the database answers again
    source.mode = "ok"
    wait_until(lambda: cached.get() == "v2", what="the hung load to land")
    assert not cached.stale


def test_the_first_load_has_nothing_to_fall_back_on_and_raises() -> None:
    source = Flaky()
    source.mode = "refuse"
    cached = Cached(source, ttl=1.0, clock=Clock(), ahead=Threads())
    with pytest.raises(ConnectionError):
        cached.get()
    assert cached.fresh() is None and cached.age() is None


def test_without_a_runner_a_failed_load_serves_the_last_value() -> None:
    clock, source = Clock(), Flaky()
    cached = Cached(source, ttl=1.0, clock=clock)
    cached.get()
    source.mode = "refuse"
    clock.now += 2
    assert cached.get() == "v1" and cached.stale


def test_keep_loads_in_its_own_thread_and_notes_a_failure() -> None:
    clock, source = Clock(), Flaky()
    cached = Cached(source, ttl=1.0, clock=clock, ahead=Threads())
    cached.keep()
    assert source.reads == 1
    clock.now += 0.3
    cached.keep()  # younger than half its ttl: nothing read
    assert source.reads == 1
    clock.now += 0.3
    source.value = "v2"
    cached.keep()
    assert source.reads == 2 and cached.fresh() == "v2"
    source.mode = "refuse"
    clock.now += 5
    cached.keep()  # never raises
    assert cached.stale and cached.get() == "v2"


def test_a_map_serves_a_key_found_before_while_its_source_fails() -> None:
    clock, source = Clock(), Flaky()
    found = CachedMap(source, ttl=1.0, clock=clock, ahead=Threads(), wait=0.2)
    assert found.get("a") == "v1"
    source.mode = "refuse"
    clock.now += 2
    assert found.get("a") == "v1" and found.stale
    assert found.fresh("a") == "v1"  # stale: served without waiting
    with pytest.raises(ConnectionError):
        found.get("z")  # never found: nothing to serve, its reader asks
    found.invalidate()  # a revocation is never served from the last value
    assert found.fresh("a") is None
    with pytest.raises(ConnectionError):
        found.get("a")


def test_after_an_invalidation_a_reader_waits_longer_for_the_change() -> None:
    """A change committed in this process is owed to its next reader: a slow load (a busy
    database, not a failing one) is waited for up to ``wait_changed``, not ``wait``."""
    source = Flaky()
    cached = Cached(source, ttl=60.0, ahead=Threads(), wait=0.01, wait_changed=30.0)
    cached.get()
    source.value = "v2"
    source.mode = "hang"  # slow: answers when released
    cached.invalidate()
    threading.Timer(0.3, source.release.set).start()
    assert cached.get() == "v2" and not cached.stale
