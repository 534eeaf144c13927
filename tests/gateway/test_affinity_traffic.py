"""The Traffic page shows session affinity per model: the sessions the gateway processes
remember and the share of turns that kept their replica. Requests naming sessions through
the real gateway (real uvicorn, three engines), the process's traffic taken as its thread
publishes it, summed by the web process's window, and the panel rendered as the consoles
get it."""

from __future__ import annotations

import re
import time

import httpx
import pytest

from gateway import live
from gateway.records.observe import Fanout
from gateway.records.traffic import Traffic, Window
from tests.gateway.harness import KEY, Harness, wait
from tests.gateway.harness import model as make_model

pytestmark = pytest.mark.django_db


def _ask(h: Harness, session: str, turn: int) -> None:
    r = httpx.post(h.url + "/v1/chat/completions", headers={
        "Authorization": f"Bearer {KEY}", "x-session-id": session,
    }, json={"model": "m", "max_tokens": 4,
             "messages": [{"role": "user", "content": f"{session} turn {turn}"}]},
        timeout=30)  # fmt: skip
    assert r.status_code == 200, r.text


def test_the_traffic_page_shows_sessions_and_the_share_kept() -> None:
    h = Harness()
    published: list[dict] = []
    traffic = Traffic(publish=published.append)
    traffic._started = True  # published by hand below, not by its thread
    traffic.watch_sessions(h.gateway.sessions)
    h.gateway.observer = Fanout(traffic)
    engines = [h.engine(f"e{i}") for i in range(3)]
    try:
        h.serve([make_model("m")], [(i + 1, "m", e) for i, e in enumerate(engines)])
        for turn in range(3):
            for s in range(4):
                _ask(h, f"s{s}", turn)
        # The replica of s0 goes: its sessions' next turns move.
        where = {s: h.gateway.sessions.last("m", f"team:t\x00s{s}", time.monotonic())
                 for s in range(4)}  # fmt: skip
        gone = where[0]
        h.serve([make_model("m")], [(i + 1, "m", e) for i, e in enumerate(engines)
                                    if i + 1 != gone])  # fmt: skip
        for s in range(4):
            _ask(h, f"s{s}", 3)
        wait(lambda: sum(c.kept + c.moved + c.new
                         for c in h.gateway.sessions.counts.values()) == 16,
             what="every turn counted")  # fmt: skip
        moved = sum(1 for s in range(4) if where[s] == gone)
        # Published with the process's second: sessions held, turns kept, moved, new.
        items = traffic.take(int(time.time()) + 1)
        (item,) = [i for i in items if "sessions" in i]
        assert item["sessions"] == [4, 12 - moved, moved, 4], item
        # A second with no turns still says the sessions held, and no turns.
        (again,) = traffic.take(int(time.time()) + 2)
        assert again["sessions"] == [4, 0, 0, 0] and again["requests"] == 0
        # Summed by the web process's window, two processes' worth.
        other = {**item, "process": "other:1", "sessions": [3, 4, 0, 1]}
        window = Window()
        window.add([*items, other], now=item["second"] + 1)
        fig = window.summary(item["second"] + 1)["m"]
        assert fig["sessions"] == 7
        assert fig["kept_share"] == pytest.approx((16 - moved) / 16)
        # The panel the consoles get.
        live.WINDOW.items.clear()
        live.WINDOW.add([*items, other], now=item["second"] + 1)
        html = live.render_traffic(item["second"] + 1.5)
        cell = re.search(r'<td class="num" data-role="sessions"[^>]*>(.*?)</td>', html)
        assert cell is not None, html
        assert cell.group(1) == f"7 · {round(100 * (16 - moved) / 16)} % kept", cell.group(1)
        assert "sessions · kept" in html
    finally:
        live.WINDOW.items.clear()
        h.close()


def test_a_malformed_sessions_figure_is_dropped() -> None:
    window = Window()
    base = {"process": "p", "second": 100, "model": "m", "requests": 1, "errors": 0,
            "refusals": 0, "tokens_out": 0, "ttft": [0] * 20, "tpot": [0] * 20}  # fmt: skip
    from gateway.path.admission import EDGES_MS

    base["ttft"] = base["tpot"] = [0] * (len(EDGES_MS) + 1)
    for bad in ([1, 2, 3], [1, 2, 3, -1], "4", [1, 2, 3, True]):
        window.add([{**base, "sessions": bad}], now=100)
        assert not window.items
    window.add([{**base, "sessions": [2, 1, 0, 1]}], now=100)
    assert window.summary(101)["m"]["sessions"] == 2
