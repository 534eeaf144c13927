"""What checks keep in memory: reloaded after its time or an invalidation, never kept
when an invalidation came during its load."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from guard.cache import Cached, CachedMap


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
    # Nobody ran it: at the ttl the reader loads itself, never older than the ttl.
    source.value = "v3"
    clock.now += 0.4
    assert cached.get() == "v3"
    later.run()  # the late refresh finds it loaded: no read
    assert source.reads == 3


def test_a_refresh_ahead_does_not_keep_what_an_invalidation_made_old() -> None:
    clock, later = Clock(), Later()
    state = {"value": "old"}
    cached = Cached(lambda: state["value"], ttl=1.0, clock=clock, ahead=later)
    cached.get()
    clock.now += 0.6
    cached.get()
    cached.invalidate()
    state["value"] = "new"
    later.run()  # the entry it was asked for is gone: nothing read
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
