"""The gateway's Prometheus counts over real sockets: what a request,
a retry, a fallback and a request in flight leave in ``/metrics``' text, read back with
Prometheus' own parser. Across processes and with the scrape's auth:
tests/e2e/test_gateway_metrics.py."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.path import series
from gateway.records import metrics
from tests.gateway.harness import KEY, Harness, model, wait


def value(name: str, **labels: str) -> float:
    """A sample of this host's scrape (0 when absent); of a per-process gauge, this
    process's own sample (another process's breaker is not this one's)."""
    labels.setdefault("pid", str(os.getpid()))
    for family in text_string_to_metric_families(metrics.scrape().decode()):
        for s in family.samples:
            if s.name != name:
                continue
            wanted = (
                labels if "pid" in s.labels else {k: v for k, v in labels.items() if k != "pid"}
            )
            if all(s.labels.get(k) == v for k, v in wanted.items()):
                return float(s.value)
    return 0.0


@pytest.fixture
def h() -> Iterator[Harness]:
    harness = Harness()
    observer = metrics.Metrics()
    harness.gateway.observer = observer
    metrics.exported(harness.gateway.parts, observer)
    yield harness
    harness.close()


def api(h: Harness) -> openai.OpenAI:
    return openai.OpenAI(base_url=h.url + "/v1", api_key=KEY, max_retries=0, timeout=10)


def test_a_streamed_request_counts_by_model_status_and_owner_with_its_tokens(h: Harness) -> None:
    h.serve([model("mx-a")], [(1, "mx-a", h.engine("e", words=7))])
    n = "llmgw_gateway_"
    before = value(n + "requests_total", model="mx-a", status="200", owner="team:t")
    out_before = value(n + "tokens_out_total", model="mx-a")
    in_before = value(n + "tokens_in_total", model="mx-a")
    chunks = list(api(h).chat.completions.create(
        model="mx-a", messages=[{"role": "user", "content": "hi"}], stream=True))  # fmt: skip
    assert chunks
    api(h).chat.completions.create(model="mx-a", messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(openai.NotFoundError):
        api(h).chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])
    # A request is counted as its answer ends, which the client may see first.
    wait(lambda: value(n + "requests_total", model="", status="404", owner="team:t") >= 1
         and value(n + "requests_total", model="mx-a", status="200", owner="team:t") >= before + 2,
         10, "both answers and the 404 counted")  # fmt: skip
    assert value(n + "requests_total", model="mx-a", status="200", owner="team:t") == before + 2
    # Both answers' usage (7 words, 3 prompt tokens each); the harness's stream writes its
    # usage chunk with spaces (`"usage": {`), as Python's json does.
    assert value(n + "tokens_out_total", model="mx-a") == out_before + 14
    assert value(n + "tokens_in_total", model="mx-a") == in_before + 6
    assert value(n + "ttft_seconds_count", model="mx-a") >= 2
    assert value(n + "request_seconds_count", model="mx-a") >= 2
    assert value(n + "request_seconds_bucket", model="mx-a", le="+Inf") >= 2


def test_retries_fallbacks_and_in_flight(h: Harness) -> None:
    ok, busy = h.engine("ok", delay=1.0), h.engine("busy", behaviour="503")
    h.serve([model("mx-f", fallbacks=["mx-g"]), model("mx-g")],
            [(21, "mx-f", busy), (22, "mx-g", ok)])  # fmt: skip
    n = "llmgw_gateway_"
    before = value(n + "fallbacks_total", model="mx-f", to="mx-g")
    answered: list[Any] = []
    asking = threading.Thread(target=lambda: answered.append(api(h).chat.completions.create(
        model="mx-f", messages=[{"role": "user", "content": "hi"}])))  # fmt: skip
    asking.start()
    # While the fallback's engine holds the request, replica 22 has one in flight.
    wait(lambda: h.gateway.in_flight.get(22), 5, "the request in flight on replica 22")
    observer = h.gateway.observer
    observer.sync()
    assert value(n + "in_flight", replica="22") == 1
    asking.join(10)
    assert answered and answered[0].choices[0].message.content
    # The client may read its answer a moment before the request's end is counted.
    wait(lambda: not h.gateway.in_flight.get(22), 5, "the request's end on replica 22")
    observer.sync()
    assert value(n + "in_flight", replica="22") == 0
    assert value(n + "fallbacks_total", model="mx-f", to="mx-g") == before + 1


def test_a_model_name_with_control_characters_leaves_readable_one_line_samples(h) -> None:
    # A name stored before the catalog refused control characters: the scrape
    # held its CR raw, which breaks the exposition's lines for a scraper.
    name = "mx-\rcr\x1b"
    h.serve([model(name)], [(31, name, h.engine("e", words=2))])
    api(h).chat.completions.create(model=name, messages=[{"role": "user", "content": "hi"}])
    # The request is counted as its answer ends, which the client may see first.
    wait(lambda: value("llmgw_gateway_requests_total", model="mx-\u240dcr\u241b", status="200"),
         10, "the request counted under its name's visible spelling")  # fmt: skip
    text = metrics.scrape().decode()
    assert not any(c in text for c in "\r\x1b\x00")


def test_a_scrape_while_a_process_makes_its_file_leaves_that_file_out(h: Harness) -> None:
    # A new process's file is empty from its creation until it is sized; the library's
    # collector failed the whole scrape on one (struct.error: a 500 to Prometheus).
    h.serve([model("mx-new")], [(41, "mx-new", h.engine("e", words=2))])
    api(h).chat.completions.create(model="mx-new", messages=[{"role": "user", "content": "hi"}])
    being_made = series.folder() / f"counter_{os.getpid() + 100000}.db"
    being_made.touch()
    try:
        wait(lambda: value("llmgw_gateway_requests_total", model="mx-new", status="200"), 10,
             "the request counted, the empty file beside it")  # fmt: skip
    finally:
        being_made.unlink()


def _fail_a_read() -> None:
    metrics.state_failed("forked")


def test_a_forked_process_counts_in_a_file_of_its_own() -> None:
    # The process id is kept, not asked for on every sample (gateway.path.series.pid): a
    # process forked after its parent made its metrics (a worker) still writes its own
    # file, and the scrape sums it with the parent's.
    import multiprocessing

    metrics.state_failed("forked")
    before = value("llmgw_gateway_state_read_failures_total", part="forked")
    child = multiprocessing.get_context("fork").Process(target=_fail_a_read)
    child.start()
    child.join(30)
    assert child.exitcode == 0
    assert (series.folder() / f"counter_{child.pid}.db").exists()
    assert value("llmgw_gateway_state_read_failures_total", part="forked") == before + 1


def test_requests_ended_in_one_pass_are_written_as_they_would_be_one_by_one() -> None:
    # A request's samples are added up and written once a pass of the loop: the scrape
    # after that pass has each one, in the bucket prometheus_client's own observe picks
    # (a value on a bound in that bound's bucket; past the last, +Inf's only).
    import asyncio

    from gateway.records.observe import Done

    exported = metrics.Metrics()
    name, n = "mx-pass", "llmgw_gateway_"
    edge = metrics.SECONDS[0]
    times = (edge, edge + 1e-9, 0.3, 400.0)
    before = {le: value(n + "request_seconds_bucket", model=name, le=le)
              for le in ("0.005", "0.01", "0.5", "300.0", "+Inf")}  # fmt: skip
    count = value(n + "requests_total", model=name, status="200", owner="o")
    tokens = value(n + "tokens_out_total", model=name)

    async def a_pass() -> float:
        for seconds in times:
            exported.request(Done(model=name, status=200, owner="o", key="k", seconds=seconds,
                                  ttft=seconds, tokens_in=3, tokens_out=2, replica=1,
                                  stream=False))  # fmt: skip
        written = value(n + "requests_total", model=name, status="200", owner="o")
        await asyncio.sleep(0)
        return written

    assert asyncio.run(a_pass()) == count  # not yet: the pass had not ended
    assert value(n + "requests_total", model=name, status="200", owner="o") == count + 4
    assert value(n + "tokens_out_total", model=name) == tokens + 8
    # Prometheus' buckets count the values at or under their bound.
    for le, was in before.items():
        got = value(n + "request_seconds_bucket", model=name, le=le) - was
        assert got == sum(t <= float(le) for t in times), le
