"""The live traffic's figures: one process's seconds as its observer
counts them, and several processes' seconds summed as the console's window reads them."""

from __future__ import annotations

import time
from typing import Any

from gateway.path import admission
from gateway.records.observe import Done
from gateway.records.traffic import EDGES_MS, SPAN, Traffic, Window, quantile, slo_verdict


def done(model: str = "m", status: int = 200, ttft: float | None = 0.04, seconds: float = 0.5,
         tokens_out: int = 10) -> Done:  # fmt: skip
    return Done(model=model, status=status, owner="", key="k", seconds=seconds, ttft=ttft,
                tokens_in=3, tokens_out=tokens_out, replica=1, stream=True)  # fmt: skip


def seconds_of(t: Traffic) -> list[dict[str, Any]]:
    t._started = True  # no thread: the test takes the seconds itself
    return t.take(2**62)


def test_a_process_counts_requests_errors_refusals_tokens_and_latencies_per_model() -> None:
    # Admission's counts per band are the process's: an earlier test's would ride along.
    admission.COUNTS.take(2**62)
    t = Traffic()
    t._started = True
    for _ in range(3):
        t.request(done())
    t.request(done(status=503, ttft=None, tokens_out=0))
    t.refused("answer", "judge", ("S1",))
    t.request(done(status=200, tokens_out=2))
    t.request(done(model=""))  # no model named: not a model's traffic
    items = seconds_of(t)
    assert {i["model"] for i in items} == {"m"}
    # One item a second: the requests may have straddled a second's end.
    assert len(items) == len({i["second"] for i in items}) <= 2
    item = {k: sum(i[k] for i in items) for k in ("requests", "errors", "refusals", "tokens_out")}
    item["model"] = "m"
    for k in ("ttft", "tpot"):
        item[k] = [sum(col) for col in zip(*(i[k] for i in items), strict=True)]
    assert item["model"] == "m" and item["requests"] == 5
    assert item["errors"] == 1 and item["refusals"] == 1
    assert item["tokens_out"] == 32
    assert sum(item["ttft"]) == 4 and item["ttft"][EDGES_MS.index(50)] == 4  # 40 ms ≤ 50
    # Time per output token: (0.5 - 0.04) s over 9 tokens is 51 ms (≤ 75).
    assert item["tpot"][EDGES_MS.index(75)] == 3
    assert seconds_of(t) == []  # taken once


def test_the_window_sums_every_process_and_says_the_slo() -> None:
    now = 1_000_000.5
    a, b = Traffic(), Traffic()
    a.process, b.process = "host:1", "host:2"
    window = Window()
    zero = [0] * (len(EDGES_MS) + 1)

    def item(process: str, second: int, requests: int, slow: int) -> dict[str, Any]:
        ttft = list(zero)
        ttft[EDGES_MS.index(50)] = requests - slow
        ttft[EDGES_MS.index(1000)] = slow
        return {"process": process, "second": second, "model": "m", "requests": requests,
                "errors": 1, "refusals": 0, "tokens_out": 100 * requests, "ttft": ttft,
                "tpot": list(zero)}  # fmt: skip

    last = int(now) - 1
    window.add([item("host:1", last, 60, 0), item("host:2", last, 38, 2)], now)
    window.add([item("host:1", last, 60, 0)], now)  # heard twice: kept once
    window.add([item("host:1", last - SPAN, 500, 500)], now)  # older than the span
    window.add([{"process": "x", "second": "bad"}], now)  # not figures: ignored
    m = window.summary(now)["m"]
    assert m["rps"] == 98 / SPAN
    assert m["tokens_per_s"] == 9800 / SPAN
    assert m["error_rate"] == 2 / 98
    assert m["ttft_p50_ms"] == 50.0
    assert m["ttft_p99_ms"] == 1000.0  # 2 of 98 slow: the 99th percentile is among them
    assert slo_verdict(m["ttft_p99_ms"], 2_000_000_000) == "met"
    assert slo_verdict(m["ttft_p99_ms"], 500_000_000) == "missed"
    assert slo_verdict(m["ttft_p99_ms"], 0) == ""
    assert slo_verdict(None, 500_000_000) == ""
    assert quantile(zero, 0.5) is None


def test_a_process_tells_the_replicas_it_ejected_each_second_even_with_no_traffic() -> None:
    t = Traffic()
    t._started = True
    now = time.time()
    t.ejected("m", 7, 30.0, now + 30)
    t.ejected("n", 8, 30.0, now - 1)  # already back
    items = t.take(int(now))  # no traffic: a second of its own, for "m" only
    assert [(i["model"], i["requests"], i.get("ejected")) for i in items] == [
        ("m", 0, [[7, now + 30]])
    ]
    t.request(done())
    items = seconds_of(t)
    assert [(i["model"], i["requests"], i["ejected"]) for i in items] == [("m", 1, [[7, now + 30]])]


def test_the_window_shows_each_ejected_replica_until_the_latest_back_time() -> None:
    w = Window()
    now = 1_000_000.0

    def item(process: str, second: int, ejected: Any) -> dict[str, Any]:
        return {"process": process, "second": second, "model": "m", "requests": 0, "errors": 0,
                "refusals": 0, "tokens_out": 0, "ttft": [0] * (len(EDGES_MS) + 1),
                "tpot": [0] * (len(EDGES_MS) + 1), "ejected": ejected}  # fmt: skip

    w.add([item("a", 999_998, [[7, now + 20]]), item("b", 999_999, [[7, now + 25], [9, now + 5]]),
           item("c", 999_999, [[7, "soon"]])], now=now)  # fmt: skip
    assert w.ejected(now) == [
        {"model": "m", "replica": 7, "until": now + 25, "processes": 2},
        {"model": "m", "replica": 9, "until": now + 5, "processes": 1},
    ]
    # A process's later second without it: that process has it back.
    w.add([item("b", 1_000_000, [])], now=now)
    assert w.ejected(now) == [{"model": "m", "replica": 7, "until": now + 20, "processes": 1}]
    assert w.ejected(now + 21) == []  # and the other's while is over
