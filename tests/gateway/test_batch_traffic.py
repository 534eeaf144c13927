"""Batch traffic marked as such: live requests and a batch's lines of one key through the
real gateway (uvicorn, the ``openai`` client), counted apart on the Traffic page's live
figures, the usage rows (and their API) and the model's charts."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from django.template.loader import render_to_string

from gateway import live
from gateway.batch import token
from gateway.models import TrafficPoint, Usage
from gateway.path.table import digest
from gateway.records import history
from gateway.records.history import HistoryRecorder
from gateway.records.observe import Fanout
from gateway.records.traffic import SPAN, Traffic, Window
from gateway.records.usage import UsageRecorder
from tests.gateway.harness import KEY, Harness, model
from tests.waiting import wait_until


@pytest.fixture
def h() -> Iterator[Harness]:
    harness = Harness()
    yield harness
    harness.close()


def test_a_batchs_lines_are_counted_apart_from_live_traffic(
    h: Harness, transactional_db: Any, api_for: Any, client_for: Any, viewer: Any
) -> None:
    h.serve([model("m")], [(1, "m", h.engine("e"))])
    traffic, usage, points = Traffic(), UsageRecorder(), HistoryRecorder()
    traffic._started = True  # no thread: the test takes the seconds itself
    h.gateway.observer = Fanout(traffic, usage, points)
    line = token.make(digest(KEY), "batch_abc", int(time.time()) + 3600)
    messages = [{"role": "user", "content": "hi"}]
    for secret, n in ((KEY, 3), (line, 2)):
        api = openai.OpenAI(base_url=h.url + "/v1", api_key=secret, max_retries=0, timeout=15)
        for _ in range(n):
            assert api.chat.completions.create(model="m", messages=messages).choices

    # Each request is heard once its answer has gone: the last one may still be on its way.
    wait_until(lambda: sum(c.requests for c in points.pending().values()) == 5, 10,
               "every request heard")  # fmt: skip

    # The Traffic page's live figures: 5 requests over the span, 3 live and 2 a batch's.
    window = Window()
    window.add(traffic.take(2**62))
    now = max(second for _, second, _ in window.items) + 1
    fig = window.summary(now)["m"]
    assert (fig["rps"], fig["live_rps"], fig["batch_rps"]) == (5 / SPAN, 3 / SPAN, 2 / SPAN)
    panel = render_to_string("gateway/partials/traffic.html", {
        "rows": live.traffic_rows(window.summary(now)), "span": SPAN, "heard": True,
        "ejected": [], "max_percent": 50})  # fmt: skip
    assert f"{3 / SPAN:.1f} live · {2 / SPAN:.1f} batch" in panel

    # The usage rows say how much was a batch's, in the API too.
    usage.flush()
    row = Usage.objects.get(model="m")
    assert (row.key, row.requests, row.batch_requests) == ("harness", 5, 2)
    listed = api_for(viewer).get("/api/v1/gateway/usage/?model=m").json()
    assert [r["batch_requests"] for r in listed["results"]] == [2]

    # The model's charts: its requests, and of them the batch's lines.
    points.flush()
    assert TrafficPoint.objects.get(model="m").batch_requests == 2
    series = history.series("m", "hour")
    assert sum(p.batch_requests for p in series) == 2 and sum(p.requests for p in series) == 5
    page = client_for(viewer).get("/gateway/traffic/?model=m&span=hour").content.decode()
    assert 'data-series="of them, batch lines"' in page
