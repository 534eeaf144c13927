"""Which API a request spoke, on the Traffic page: each process counts its requests per
dialect (``Done.dialect``) into its seconds, the console's window sums every process's,
and the panel shows them per model, most first."""

from __future__ import annotations

import pytest

from gateway import live
from gateway.records.observe import Done
from gateway.records.traffic import Traffic, Window


def done(dialect: str, model: str = "chat") -> Done:
    return Done(model=model, status=200, owner="", key="k", seconds=0.1, ttft=0.05,
                tokens_in=3, tokens_out=4, replica=1, stream=True, dialect=dialect)  # fmt: skip


def test_each_process_counts_its_dialects_and_the_window_sums_them() -> None:
    one, two = Traffic(), Traffic()
    one.process, two.process = "a:1", "b:2"
    one._started = two._started = True  # counted, not published by a thread
    for dialect in ("messages", "chat", "messages"):
        one.request(done(dialect))
    for dialect in ("responses", "messages"):
        two.request(done(dialect))
    second = max(*one.seconds, *two.seconds) + 1
    items = one.take(second) + two.take(second)
    told: dict[str, dict[str, int]] = {}
    for item in items:  # one second each, or two should a second end between requests
        for dialect, n in item["dialects"].items():
            told.setdefault(item["process"], {}).setdefault(dialect, 0)
            told[item["process"]][dialect] += n
    assert told == {
        "a:1": {"messages": 2, "chat": 1}, "b:2": {"responses": 1, "messages": 1}}  # fmt: skip
    window = Window()
    window.add(items, now=second)
    assert window.summary(now=second + 1)["chat"]["dialects"] == [
        {"dialect": "messages", "requests": 3},
        {"dialect": "chat", "requests": 1},
        {"dialect": "responses", "requests": 1},
    ]


@pytest.mark.parametrize("dialects", [[1], {"messages": -1}, {"messages": True}, {1: 2}])
def test_a_malformed_dialect_count_is_dropped(dialects: object) -> None:
    t = Traffic()
    t._started = True
    t.request(done("messages"))
    item = t.take(max(t.seconds) + 1)[0]
    item["dialects"] = dialects
    window = Window()
    window.add([item], now=item["second"] + 1)
    assert window.items == {}


@pytest.mark.django_db
def test_the_panel_shows_requests_per_dialect() -> None:
    t = Traffic()
    t._started = True
    for dialect in ("responses", "messages", "messages"):
        t.request(done(dialect))
    second = max(t.seconds)
    live.WINDOW.items.clear()
    live.WINDOW.add(t.take(second + 1), now=second + 0.5)
    live._rendered = None
    html = live.render_traffic(second + 1.5)
    assert 'data-dialect="messages" data-requests="2"' in html
    assert 'data-dialect="responses" data-requests="1"' in html
    live.WINDOW.items.clear()
    live._rendered = None
