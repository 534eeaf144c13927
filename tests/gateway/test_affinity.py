"""Session affinity's choice (``gateway.path.affinity.choose``) and its table, exhaustively."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings as django_settings
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.path import balance
from gateway.path.affinity import DEFAULT_SKEW, FLOOR, KEPT, MOVED, NEW, SPREAD, Sessions, choose
from gateway.path.balance import Ring, Target

targets = st.lists(
    st.builds(Target, st.integers(1, 40), st.sampled_from([0.0, 1.0, 1.0, 2.0, 3.0])),
    min_size=1, max_size=6, unique_by=lambda t: t.id,
)  # fmt: skip
counts = st.dictionaries(st.integers(1, 40), st.integers(0, 30), max_size=8)


@settings(max_examples=400, deadline=None)
@given(targets, counts, counts, st.one_of(st.none(), st.integers(1, 40)), st.text(max_size=20),
       st.sets(st.integers(1, 40), max_size=4), st.floats(1.0, 5.0),
       st.sampled_from(balance.ROUTING_PROFILES))  # fmt: skip
def test_the_choice(
    ts: list[Target], in_flight: dict[int, int], held: dict[int, int], last: int | None,
    key: str, exclude: set[int], skew: float, profile: str,
) -> None:  # fmt: skip
    ring = Ring(ts)
    target, outcome = choose(ring, in_flight, held, last, key, skew=skew, profile=profile,
                             exclude=exclude, rng=random.Random(0))  # fmt: skip
    candidates = [t for t in ts if t.id not in exclude]
    # Never an excluded replica; None only when every one is.
    assert (target is None) == (not candidates)
    if target is None:
        return
    assert target in candidates
    total = sum(in_flight.get(t.id, 0) for t in candidates)
    capacity = sum(t.capacity for t in candidates)
    least = min(t.capacity for t in candidates)
    kept = next((t for t in candidates if t.id == last), None)
    if kept is not None and balance.within_bound(kept, in_flight, total, capacity, skew,
                                                  FLOOR, least):  # fmt: skip
        # Its last replica, ready and within the skew: kept.
        assert (target, outcome) == (kept, KEPT)
        return
    assert outcome == (NEW if last is None else MOVED)
    if last is not None and len(candidates) > 1:
        assert target.id != last  # left behind when another is there
    # Else the balancer's pick over the session's key, among the replicas within their
    # share of sessions (all when none is).
    sessions = sum(held.get(t.id, 0) for t in candidates)
    room = [t for t in candidates if t.id != last
            and balance.within_bound(t, held, sessions, capacity, SPREAD, least=least)]  # fmt: skip
    rest = [t for t in candidates if t.id != last] or candidates
    fewest = min(held.get(t.id, 0) / t.capacity for t in rest)
    allowed = room or [t for t in rest if held.get(t.id, 0) / t.capacity == fewest]
    expected = balance.pick(Ring(ts), in_flight, key, profile=profile,
                            exclude=set(exclude) | {t.id for t in ts if t not in allowed},
                            rng=random.Random(0))  # fmt: skip
    assert target == expected


@settings(max_examples=100, deadline=None)
@given(st.integers(2, 8), st.integers(1, 200), st.integers(0, 10_000))
def test_new_sessions_spread_evenly_however_the_keys_hash(replicas: int, n: int, seed: int) -> None:
    ring = Ring([Target(i) for i in range(1, replicas + 1)])
    table = Sessions()
    for s in range(n):
        table.pick("m", f"{seed}-{s}", ring, {}, now=0.0)
    held = [table.held("m").get(i, 0) for i in range(1, replicas + 1)]
    assert sum(held) == n
    # None past SPREAD times its share (one more counted).
    share = (n - 1 + 1) / replicas
    assert max(held) <= max(1, SPREAD * share + 1)


@settings(max_examples=50, deadline=None)
@given(st.integers(0, 10_000))
def test_64_sessions_on_4_replicas_hold_within_one_and_a_half(seed: int) -> None:
    ring = Ring([Target(i) for i in range(1, 5)])
    table = Sessions()
    for s in range(64):
        table.pick("m", f"{seed}-{s}", ring, {}, now=0.0)
    held = [table.held("m").get(i, 0) for i in range(1, 5)]
    assert max(held) / min(held) <= 1.5


def test_new_sessions_are_keyed_by_session_so_every_process_agrees() -> None:
    ring = Ring([Target(i) for i in range(1, 5)])
    firsts = set()
    for s in range(20):
        # A process holding nothing places a session by its key's hash (every process
        # alike), whatever the conversation's text.
        got = Sessions().pick("m", f"s{s}", ring, {}, 0.0)
        assert got == next(ring.walk(balance.hash64(f"m\x00s{s}")))
        firsts.add(got)
    assert len(firsts) > 1  # spread, not one replica for all
    one, two = Sessions(), Sessions()
    for s in range(20):
        assert one.pick("m", f"s{s}", ring, {}, 0.0) == two.pick("m", f"s{s}", ring, {}, 0.0)


def test_a_session_keeps_its_replica_then_moves_with_the_load_or_when_it_goes() -> None:
    ring = Ring([Target(1), Target(2), Target(3)])
    table = Sessions(skew=2.0)
    first = table.pick("m", "s", ring, {}, 0.0)
    assert first is not None
    for turn in range(5):
        # Up to twice its share of what is in flight (one more counted): kept.
        near = {first.id: 2, **{t.id: 1 for t in ring.targets if t != first}}
        assert table.pick("m", "s", ring, near, float(turn)) == first
    # Up to FLOOR in flight it stays, whatever the others hold.
    alone = {first.id: FLOOR - 1}
    assert table.pick("m", "s", ring, alone, 5.5) == first
    # Its replica holds more than twice its share of what is in flight: it moves, and
    # stays where it moved.
    busy = {first.id: 20, **{t.id: 1 for t in ring.targets if t != first}}
    moved = table.pick("m", "s", ring, busy, 6.0)
    assert moved is not None and moved != first
    assert table.pick("m", "s", ring, {}, 7.0) == moved
    # Its replica gone from the ring: it moves again.
    rest = Ring([t for t in ring.targets if t != moved])
    again = table.pick("m", "s", rest, {}, 8.0)
    assert again is not None and again != moved and table.last("m", "s", 8.0) == again.id
    c = table.counts["m"]
    assert (c.new, c.kept, c.moved) == (1, 7, 2)
    assert table.figures(8.0) == {"m": {"sessions": 1, "kept": 7, "moved": 2, "new": 1}}


def test_the_table_is_bounded_in_size_and_age() -> None:
    ring = Ring([Target(1), Target(2)])
    table = Sessions(size=3, age=60)
    for s in range(5):
        table.pick("m", f"s{s}", ring, {}, float(s))
    assert len(table) == 3 and table.last("m", "s0", 5.0) is None  # least recent left first
    assert sum(table.held("m").values()) == 3
    table.pick("m", "s2", ring, {}, 10.0)  # used again: the most recent now
    assert table.last("m", "s3", 63.5) is None and table.last("m", "s2", 63.5) is not None
    assert table.last("m", "s2", 70.5) is None
    assert len(table) == 0 and table.held("m") == {}
    assert table.figures(71.0)["m"]["sessions"] == 0


def test_sessions_of_two_models_never_meet() -> None:
    ring = Ring([Target(1), Target(2)])
    table = Sessions()
    table.pick("a", "s", ring, {}, 0.0)
    assert table.last("b", "s", 0.0) is None
    assert sum(table.held("a").values()) == 1 and table.held("b") == {}


@pytest.mark.parametrize(
    ("name", "value", "said"),
    [("LLMGW_SESSION_SKEW", "lots", "LLMGW_SESSION_SKEW is 'lots': write a number"),
     ("LLMGW_SESSION_SKEW", "0.5", "LLMGW_SESSION_SKEW is 0.5: write a number from 1"),
     ("LLMGW_SESSION_MAX", "0", "LLMGW_SESSION_MAX is 0: write 1 or more"),
     ("LLMGW_SESSION_AGE", "-1", "LLMGW_SESSION_AGE is -1: write 1 or more")],
)  # fmt: skip
def test_a_bad_setting_stops_the_start_naming_it(name: str, value: str, said: str) -> None:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "llmgw_admin.settings", name: value,
           "LLMGW_SECRET_KEY": "x"}  # fmt: skip
    done = subprocess.run([sys.executable, "-c", "import django; django.setup()"],
                          cwd=Path(__file__).resolve().parents[2], env=env,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode != 0 and said in done.stderr, done.stderr[-500:]


def test_the_defaults() -> None:
    table = Sessions.from_settings(django_settings)
    assert (table.skew, table.size, table.age) == (2.0, 100_000, 1800.0)
    assert django_settings.LLMGW_SESSION_SKEW == DEFAULT_SKEW
