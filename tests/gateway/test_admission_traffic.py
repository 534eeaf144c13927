"""Admission on the Traffic page: each process's admitted and held
requests per band ride its traffic seconds; the console's window sums every process's,
and the panel shows them per model, top band first."""

from __future__ import annotations

import time

import pytest

from gateway import live
from gateway.path import admission
from gateway.records.traffic import Traffic, Window


def test_a_process_sends_its_bands_and_the_window_sums_every_process() -> None:
    second = int(time.time()) - 2
    admission.COUNTS.take(2**62)  # what earlier tests left
    for band, held in [("low", True), ("low", True), ("high", False), ("low", False)]:
        admission.COUNTS.add(second, "m", band, held)
    one, two = Traffic(), Traffic()
    one.process, two.process = "a:1", "b:2"
    items = one.take(second + 1)  # no request counted, but the bands make the second
    assert [(i["model"], i["bands"]) for i in items] == [("m", {"low": [1, 2], "high": [1, 0]})]
    admission.COUNTS.add(second, "m", "normal", True)
    window = Window()
    window.add(items + two.take(second + 1), now=second + 1)
    bands = window.summary(now=second + 2)["m"]["bands"]
    assert bands == [
        {"band": "high", "admitted": 1, "held": 0},
        {"band": "normal", "admitted": 0, "held": 1},
        {"band": "low", "admitted": 1, "held": 2},
    ]


@pytest.mark.parametrize("bands", [{"urgent": [1, 0]}, {"low": [1]}, {"low": [-1, 0]}, [1, 2]])
def test_a_malformed_band_count_is_dropped(bands: object) -> None:
    t = Traffic()
    admission.COUNTS.take(2**62)
    second = int(time.time()) - 2
    admission.COUNTS.add(second, "m", "low", True)
    item = t.take(second + 1)[0]
    item["bands"] = bands
    window = Window()
    window.add([item], now=second + 1)
    assert window.items == {}


@pytest.mark.django_db
def test_the_panel_shows_admitted_and_held_per_band() -> None:
    admission.COUNTS.take(2**62)
    now = time.time()
    second = int(now) - 1
    admission.COUNTS.add(second, "chat", "high", False)
    admission.COUNTS.add(second, "chat", "low", True)
    live.WINDOW.items.clear()
    live.WINDOW.add(Traffic().take(second + 1), now=now)
    live._rendered = None
    html = live.render_traffic(now + 0.5)
    assert 'data-band="high" data-admitted="1" data-held="0"' in html
    assert 'data-band="low" data-admitted="0" data-held="1"' in html and "1 held" in html
    live.WINDOW.items.clear()
    live._rendered = None
