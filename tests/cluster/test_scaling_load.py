"""The gateway processes' load reports (cluster.load) and their writer (gateway.records.loadreport):
summed per model, expired after their TTL, kept in a real Redis in production."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from redis import Redis

from cluster import load
from cluster.scaling import Load
from gateway.path.admission import EDGES_MS
from gateway.records.loadreport import LoadReport
from tests.redisserver import url as redis_url

N = len(EDGES_MS) + 1


def hist(**at: int) -> list[int]:
    counts = [0] * N
    for edge, count in at.items():
        counts[EDGES_MS.index(int(edge[1:]))] = count
    return counts


@pytest.fixture(autouse=True)
def no_sampler(monkeypatch: pytest.MonkeyPatch) -> None:
    """A writer's first tick starts its sampler, a thread a gateway process runs for ever
    (every SAMPLE_EVERY): here it would outlive each test, sampling a stand-in gateway
    beside the next ones. These tests read what one tick writes, and sample by hand where
    they mean to (test_in_flight_is_the_mean_of_the_last_seconds_samples)."""
    monkeypatch.setattr(LoadReport, "start_sampling", lambda self: None)


def report(process: str, **models: dict) -> dict:
    return {"process": process, "at": time.time(), "edges": list(EDGES_MS), "models": models}


def test_the_sum_over_processes() -> None:
    a = report("a:1", chat={"in_flight": 3, "waiting": 1, "ttft": hist(e100=98)})
    b = report("b:2", chat={"in_flight": 4, "waiting": 0, "ttft": hist(e2000=2)},
               other={"in_flight": 1})  # fmt: skip
    out = load.total([a, b])
    assert out["chat"] == Load(in_flight=7, waiting=1, ttft_p99_ms=2000.0, samples=100)
    assert out["other"] == Load(in_flight=1)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.dictionaries(st.text(max_size=8), st.none() | st.integers() | st.text()
                                | st.lists(st.integers()) | st.dictionaries(st.text(max_size=5),
                                st.integers() | st.lists(st.integers())))))  # fmt: skip
def test_malformed_reports_are_left_out_never_raise(items: list) -> None:
    out = load.total(items)
    for figures in out.values():
        assert figures.in_flight >= 0 and figures.waiting >= 0


def test_in_process_reports_expire(settings: object) -> None:
    settings.REDIS_URL = ""  # type: ignore[attr-defined]
    load.clear()
    load.write(report("a:1", chat={"in_flight": 2}))
    assert load.read()["chat"].in_flight == 2
    load._local["a:1"] = (time.monotonic() - 1, load._local["a:1"][1])
    assert load.read() == {}


@pytest.fixture
def redis_settings(settings: object) -> str:
    url = redis_url(12)
    Redis.from_url(url).flushdb()
    settings.REDIS_URL = url  # type: ignore[attr-defined]
    load._client = None
    yield url
    load._client = None


def test_reports_in_redis_with_a_ttl(redis_settings: str) -> None:
    load.write(report("a:1", chat={"in_flight": 2}))
    load.write(report("b:2", chat={"in_flight": 5}))
    assert load.read()["chat"].in_flight == 7
    client = Redis.from_url(redis_settings)
    assert 0 < client.ttl(load.prefix() + "a:1") <= load.TTL
    client.delete(load.prefix() + "a:1")  # as its TTL would
    assert load.read()["chat"].in_flight == 5
    assert client.smembers(load.prefix() + "processes") == {b"b:2"}


def test_two_clusters_on_one_redis_read_only_their_own_reports(
    redis_settings: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from django.conf import settings

    load.write(report("a:1", chat={"in_flight": 2}))
    db = settings.DATABASES["default"]
    monkeypatch.setitem(settings.DATABASES, "default", {**db, "NAME": f"{db['NAME']}_other"})
    # Another cluster's gateway (another database, the same Redis), on a host of its own.
    load.write(report("b:1", chat={"in_flight": 5}))
    assert load.read()["chat"].in_flight == 5
    monkeypatch.undo()
    assert load.read()["chat"].in_flight == 2


def test_redis_away_is_unavailable(settings: object) -> None:
    from tests.redisserver import free_port

    settings.REDIS_URL = f"redis://127.0.0.1:{free_port()}/0"  # type: ignore[attr-defined]
    load._client = None
    try:
        with pytest.raises(load.Unavailable, match="Redis did not answer"):
            load.read()
    finally:
        load._client = None


def test_the_gateway_writes_its_in_flight_waiting_and_ttft(settings: object) -> None:
    settings.REDIS_URL = ""  # type: ignore[attr-defined]
    load.clear()
    pool = SimpleNamespace(endpoints={11: "http://a", 12: "http://b"})
    state = SimpleNamespace(table=SimpleNamespace(pools={"chat": pool}),
                            _waiters={"cold": [object(), object()], "none": []})  # fmt: skip
    gateway = SimpleNamespace(state=state, in_flight={11: 2, 12: 1, 99: 4}, pinned_in_flight={})
    writer = LoadReport(gateway, "here:1")
    now = time.time()
    second = int(now) - 1
    writer.tick([{"second": second, "model": "chat", "ttft": hist(e50=3)}])
    out = load.read()
    assert out["chat"] == Load(in_flight=3, waiting=0, ttft_p99_ms=50.0, samples=3)
    assert out["cold"] == Load(in_flight=0, waiting=2)
    assert "none" not in out
    # The TTFT counts cover the last WINDOW seconds, then are dropped.
    later = writer.report([], now=now + load.WINDOW + 2)
    assert sum(later["models"]["chat"]["ttft"]) == 0


def test_a_failed_write_is_dropped_and_counted(settings: object) -> None:
    from tests.redisserver import free_port

    settings.REDIS_URL = f"redis://127.0.0.1:{free_port()}/0"  # type: ignore[attr-defined]
    load._client = None
    gateway = SimpleNamespace(state=SimpleNamespace(table=SimpleNamespace(pools={}),
                                                    _waiters={}), in_flight={}, pinned_in_flight={})  # fmt: skip
    writer = LoadReport(gateway, "here:1")
    try:
        writer.tick([])
        writer.tick([])
    finally:
        load._client = None
    assert writer.failures == 2


def test_in_flight_is_the_mean_of_the_last_seconds_samples(settings: object) -> None:
    from gateway.records.loadreport import SMOOTH

    pool = SimpleNamespace(endpoints={11: "http://a"})
    gateway = SimpleNamespace(state=SimpleNamespace(table=SimpleNamespace(pools={"chat": pool}),
                                                    _waiters={}), in_flight={11: 4}, pinned_in_flight={})  # fmt: skip
    writer = LoadReport(gateway, "here:1")
    writer.sample(now=100.0)
    gateway.in_flight = {}
    writer.sample(now=100.5)
    writer.sample(now=101.0)
    gateway.in_flight = {11: 2}
    writer.sample(now=101.5)
    assert writer.smoothed() == {"chat": 1.5}  # (4 + 0 + 0 + 2) / 4
    writer.sample(now=101.5 + SMOOTH)  # the older ones are forgotten
    assert writer.smoothed() == {"chat": 2.0}
    assert load.total([writer.report([])])["chat"].in_flight == 2.0


def test_a_hung_redis_fails_writes_and_reads_in_time_and_they_resume_after(
    settings: object,
) -> None:
    """Redis hung (connections accepted, no byte answered), then back, through a proxy:
    the gateway's writer counts its failures and returns each second, the reconciler's
    read says Unavailable (it holds every target: test_scaling_reconciler), and both
    work again once Redis answers, without a restart."""
    from urllib.parse import urlsplit

    from tests.faultproxy import fault_proxy

    target = urlsplit(redis_url(12))
    Redis.from_url(redis_url(12)).flushdb()
    settings.LLMGW_REDIS_TIMEOUT_MS = 200  # type: ignore[attr-defined]
    gateway = SimpleNamespace(state=SimpleNamespace(table=SimpleNamespace(pools={}),
                                                    _waiters={"cold": [object()]}),
                              in_flight={}, pinned_in_flight={})  # fmt: skip
    writer = LoadReport(gateway, "hung:1")
    with fault_proxy((target.hostname, target.port)) as proxy:
        settings.REDIS_URL = f"redis://{proxy.address}/12"  # type: ignore[attr-defined]
        load._client = None
        try:
            writer.tick([])
            assert writer.failures == 0 and load.read()["cold"].waiting == 1
            proxy.hang()
            writer.tick([])
            assert writer.failures == 1
            with pytest.raises(load.Unavailable, match="Redis did not answer"):
                load.read()
            proxy.heal()
            gateway.state._waiters["cold"].append(object())
            writer.tick([])
            assert writer.failures == 1
            assert load.read()["cold"].waiting == 2
        finally:
            load._client = None
