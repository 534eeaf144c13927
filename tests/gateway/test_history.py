"""Traffic over time: each process's minutes per model written off the
request path and added in the database, minutes rolled into hours and old hours deleted,
the series read back by span (the API, the Traffic page, the keys' and owners' pages),
and the charts' geometry."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.models import TrafficPoint, Usage
from gateway.path import admission
from gateway.records import history
from gateway.records.observe import Done

NOW = dt.datetime(2026, 12, 2, 12, 30, 20, tzinfo=dt.UTC)


def done(
    model: str = "m", status: int = 200, ttft: float | None = 0.04, seconds: float = 1.5
) -> Done:
    return Done(model=model, status=status, owner="team:a", key="k", seconds=seconds, ttft=ttft,
                tokens_in=3, tokens_out=7, replica=1, stream=True)  # fmt: skip


@pytest.mark.django_db
def test_two_processes_minutes_add_up_and_a_hold_and_a_refusal_are_counted() -> None:
    clock = lambda: NOW.timestamp()  # noqa: E731
    one, two = history.HistoryRecorder(clock=clock), history.HistoryRecorder(clock=clock)
    one.request(done())
    one.request(done(status=503, ttft=None))
    admission.was_held.set(True)
    one.request(done(status=429, ttft=None))
    one.refused("request", "judge", ("S1",))
    one.request(done(status=400, ttft=None))
    two.request(done(ttft=2.5))
    history.write(one.pending())
    history.write(two.pending())
    history.write(two.pending())  # a second flush adds again (what it would have gathered)
    row = TrafficPoint.objects.get()
    assert (row.resolution, row.at, row.model) == ("minute", NOW.replace(second=0), "m")
    assert (row.requests, row.errors, row.held, row.refusals) == (6, 1, 1, 1)
    assert (row.tokens_in, row.tokens_out, row.busy_ms) == (18, 42, 9000)
    assert sum(row.ttft) == 3
    [p] = [p for p in history.series("m", "hour", NOW) if p.requests]
    # Two of the three at 2.5 s: the p50 is the upper edge of their bucket, 3 s.
    assert p.ttft_p50_ms == 3000.0 and p.in_flight == 9.0 / 60


@pytest.mark.django_db
def test_old_minutes_roll_into_hours_and_old_hours_go(settings: Any) -> None:
    settings.LLMGW_HISTORY_MINUTE_HOURS = 24
    settings.LLMGW_HISTORY_HOUR_DAYS = 30
    old = NOW - dt.timedelta(hours=30)
    for minute in (5, 6):
        TrafficPoint.objects.create(resolution="minute", model="m", requests=2, held=1,
                                    at=old.replace(minute=minute, second=0),
                                    ttft=[1] + [0] * (history.NBUCKETS - 1))  # fmt: skip
    TrafficPoint.objects.create(
        resolution="minute", model="m", at=NOW.replace(second=0), requests=1
    )
    TrafficPoint.objects.create(resolution="hour", model="m", at=NOW - dt.timedelta(days=40))
    assert history.roll(NOW) == (2, 1)
    hour = TrafficPoint.objects.get(resolution="hour")
    assert (hour.at, hour.requests, hour.held, hour.ttft[0]) == (
        old.replace(minute=0, second=0),
        4,
        2,
        2,
    )
    assert TrafficPoint.objects.filter(resolution="minute").count() == 1  # today's stays
    week = history.series("m", "week", NOW)
    assert len(week) == 168 and sum(p.requests for p in week) == 5


@given(st.lists(st.one_of(st.none(), st.floats(0, 1e6)), min_size=1, max_size=200))
def test_the_chart_stays_in_its_box(values: list[float | None]) -> None:
    t0 = NOW
    points = [history.Point(t0 + dt.timedelta(minutes=i), 1, 0, 0, i % 3, 0, 0, 0.0, v, v)
              for i, v in enumerate(values)]  # fmt: skip
    c = history.chart(points, "ttft_p99_ms", "x", [(t0, "scale", "replica #1 made")])
    for part in c.path.split():
        x, y = map(float, part[1:].split(","))
        assert 0 <= x <= c.width and 0 <= y <= c.height
    assert len(c.holds) == sum(1 for i in range(len(values)) if i % 3)
    assert c.marks == ((0.0, "scale", "replica #1 made"),)


@pytest.mark.django_db
def test_the_api_and_the_pages_show_the_series(viewer: Any, api_for: Any, client_for: Any) -> None:
    now = dt.datetime.now(dt.UTC).replace(second=0, microsecond=0)
    TrafficPoint.objects.create(resolution="minute", model="chat", at=now, requests=5, held=2)
    Usage.objects.create(minute=now, key="bot", owner="team:a", model="chat", requests=3,
                         tokens_out=30)  # fmt: skip
    api = api_for(viewer)
    body = api.get("/api/v1/gateway/history/?model=chat&span=hour").json()
    assert body["step_s"] == 60 and len(body["points"]) == 60
    assert sum(p["requests"] for p in body["points"]) == 5
    assert sum(p["held"] for p in body["points"]) == 2 and body["marks"] == []
    owner = api.get("/api/v1/gateway/history/?owner=team:a&span=day").json()
    assert sum(p["tokens_out"] for p in owner["points"]) == 30 and len(owner["points"]) == 144
    bad = api.get("/api/v1/gateway/history/?span=year")
    assert bad.status_code == 400
    assert {e["field"] for e in bad.json()["errors"]} == {"span"}
    none = api.get("/api/v1/gateway/history/?span=day")
    assert none.status_code == 400 and [e["field"] for e in none.json()["errors"]] == ["model"]
    web = client_for(viewer)
    page = web.get("/gateway/traffic/?model=chat&span=hour").content.decode()
    assert 'data-history="chat"' in page and 'data-series="requests"' in page
    assert 'class="hold"' in page  # the held minute is shaded
    key = web.get("/gateway/history/?key=bot").content.decode()
    assert 'data-series="tokens out"' in key
    assert web.get("/gateway/history/").status_code == 400


@pytest.mark.django_db
def test_a_models_marks_are_its_own_scale_steps_replicas_and_bench_runs(
    viewer: Any, api_for: Any
) -> None:
    from cluster import services

    now = dt.datetime.now(dt.UTC).replace(second=0, microsecond=0)
    TrafficPoint.objects.create(resolution="minute", model="pair", at=now, requests=5)
    services.log_action(None, "scaled up", "model pair", "scaled up to 2: 9 in flight",
                        via="load scaling")  # fmt: skip
    services.log_action(None, "bench done", "model pair profile big", "capacity 6")
    services.log_action(None, "scaled up", "model pair2", "not pair's")  # another model's
    services.log_action(None, "cordon", "model pair", "not a mark")
    body = api_for(viewer).get("/api/v1/gateway/history/?model=pair&span=hour").json()
    assert sorted((m["kind"], m["what"]) for m in body["marks"]) == [
        ("bench", "bench done"),
        ("scale", "scaled up: scaled up to 2: 9 in flight"),
    ]
    charts = history.charts_for(model="pair", span="hour")
    assert {kind for _, kind, _ in charts[0].marks} == {"bench", "scale"}
