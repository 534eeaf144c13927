"""Every status the gateway answers is counted, in ``/metrics`` and in usage, over real sockets with the ``openai`` client and httpx: 200, 401, 404, 405, 413,
429, a 500 (an unexpected exception in the gateway: an OpenAI-shaped error with the
request id, a log line with it, never a raw crash) and 499 (a client gone before its
answer ended, streamed or whole)."""

from __future__ import annotations

import json
import logging
import socket
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from django.db.models import Sum
from prometheus_client.parser import text_string_to_metric_families

from gateway.models import Usage
from gateway.path.table import Key, digest
from gateway.records import metrics
from gateway.records.observe import Fanout
from gateway.records.usage import UsageRecorder
from llmgw_core.upstream import Upstream
from tests.gateway.harness import KEY, Harness, model, wait

TIGHT = "llmgw-ck-statuses-tight"
N = "llmgw_gateway_requests_total"


def counted(status: int, model: str = "", owner: str = "team:t") -> float:
    """``requests_total`` of this host's scrape for one label set (0 when absent)."""
    for family in text_string_to_metric_families(metrics.scrape().decode()):
        for s in family.samples:
            if s.name == N and s.labels == {"model": model, "status": str(status), "owner": owner}:
                return float(s.value)
    return 0.0


class Buggy(Upstream):
    """The real upstream, with a defect of the gateway's own on cue: a prompt saying
    ``bug-before`` raises before the engine is asked; ``bug-mid`` once the stream's first
    bytes reached the client."""

    async def request(self, method: str, url: str, body: bytes, *args: Any, **kw: Any) -> Any:
        if b"bug-before" in body:
            raise RuntimeError("a defect of the gateway")
        resp = await super().request(method, url, body, *args, **kw)
        if b"bug-mid" in body:
            conn = resp._conn
            real = conn.next_data
            calls = [0]

            async def next_data(timeout: float | None) -> bytes | None:
                calls[0] += 1
                if calls[0] == 3:
                    conn.next_data = real
                    raise RuntimeError("a defect of the gateway, mid-stream")
                return await real(timeout)

            conn.next_data = next_data
        return resp


@pytest.fixture
def h(transactional_db: Any) -> Iterator[Harness]:
    harness = Harness()
    harness.keys[digest(TIGHT)] = Key(2, "tight", "team:t", (), None, rpm=1)
    harness.one_budget_minute()
    harness.gateway.upstream = Buggy()
    harness.recorder = UsageRecorder(interval=0.05)  # type: ignore[attr-defined]
    harness.gateway.observer = Fanout(metrics.Metrics(), harness.recorder)  # type: ignore[attr-defined]
    harness.recorder.start()  # type: ignore[attr-defined]
    yield harness
    harness.recorder.stop()  # type: ignore[attr-defined]
    harness.close()


def api(h: Harness, key: str = KEY, timeout: float = 10) -> openai.OpenAI:
    return openai.OpenAI(base_url=h.url + "/v1", api_key=key, max_retries=0, timeout=timeout)


def usage(**filters: Any) -> dict[str, int]:
    got = Usage.objects.filter(**filters).aggregate(requests=Sum("requests"),
                                                    errors=Sum("errors"))  # fmt: skip
    return {k: v or 0 for k, v in got.items()}


def hi(text: str = "hi") -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def test_an_unexpected_exception_is_a_counted_500_with_the_request_id(
    h: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    h.serve([model("st-a")], [(1, "st-a", h.engine("e", behaviour="slow", words=40))])
    before = counted(500, "st-a")
    with (
        caplog.at_level(logging.ERROR, logger="gateway"),
        pytest.raises(openai.InternalServerError) as failed,
    ):
        api(h).chat.completions.create(model="st-a", messages=hi("bug-before"))
    error = failed.value
    assert error.status_code == 500
    assert error.body["type"] == "server_error"  # OpenAI's shape
    request_id = error.response.headers["x-request-id"]
    assert request_id.startswith("req_") and request_id in error.message
    assert any(request_id in r.getMessage() and r.exc_info for r in caplog.records)
    # Mid-stream: the head said 200; the request came to a 500 all the same.
    with pytest.raises(openai.APIError):
        for _ in api(h).chat.completions.create(model="st-a", messages=hi("bug-mid"), stream=True):
            pass
    wait(lambda: counted(500, "st-a") == before + 2, what="both 500s in /metrics")
    wait(lambda: usage(model="st-a") == {"requests": 2, "errors": 2}, what="both 500s in usage")


@pytest.mark.parametrize("stream", [True, False])
def test_a_client_gone_before_its_answer_ended_is_a_499(h: Harness, stream: bool) -> None:
    slow = h.engine("slow", behaviour="slow", words=100)
    h.serve([model("st-b")], [(1, "st-b", slow)])
    before = counted(499, "st-b")
    body = {"model": "st-b", "stream": stream, "messages": hi()}
    if stream:
        with (
            httpx.Client(timeout=30) as client,
            client.stream("POST", h.url + "/v1/chat/completions", json=body,
                          headers={"Authorization": f"Bearer {KEY}"}) as resp,
        ):  # fmt: skip
            assert resp.status_code == 200
            next(resp.iter_raw())  # gone after the answer's first bytes
    else:
        # Gone once the engine has the request (its whole answer takes 10 s), not after a
        # fixed time: the connection closed, as a client that gives up closes it.
        payload = json.dumps(body).encode()
        with socket.create_connection(("127.0.0.1", h.port), timeout=30) as conn:
            conn.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\n"
                         b"Authorization: Bearer " + KEY.encode() + b"\r\n"
                         b"Content-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n" % len(payload) + payload)  # fmt: skip
            wait(lambda: slow.requests == 1, 30, "the engine to be asked")
    wait(lambda: slow.cancelled == 1, 30, "the engine to see its client go")
    wait(lambda: counted(499, "st-b") == before + 1, what="the 499 in /metrics")
    assert counted(200, "st-b") == 0
    # A request and no error in usage (the client's doing, not the gateway's).
    wait(lambda: usage(model="st-b") == {"requests": 1, "errors": 0}, what="the 499 in usage")


def test_every_other_status_is_counted(h: Harness) -> None:
    h.serve([model("st-c")], [(1, "st-c", h.engine("e"))])
    h.gateway.options.max_body = 2000
    statuses = (200, 401, 404, 405, 413, 429)
    before = {s: counted(s) + counted(s, "st-c") + counted(s, owner="") for s in statuses}
    client = api(h)
    client.chat.completions.create(model="st-c", messages=hi())  # 200, st-c
    client.models.list()  # 200
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("nope")  # 404
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=hi())  # 404
    with pytest.raises(openai.AuthenticationError):
        api(h, "llmgw-ck-nobody").models.list()  # 401, no key: no owner
    with pytest.raises(openai.APIStatusError) as wrong:
        client.get("/chat/completions", cast_to=object)  # 405
    assert wrong.value.status_code == 405
    with pytest.raises(openai.APIStatusError) as large:
        client.chat.completions.create(model="st-c", messages=hi("x" * 5000))  # 413
    assert large.value.status_code == 413
    tight = api(h, TIGHT)
    tight.chat.completions.create(model="st-c", messages=hi())  # 200, st-c
    with pytest.raises(openai.RateLimitError):
        tight.chat.completions.create(model="st-c", messages=hi())  # 429, st-c
    expected = {200: 3, 401: 1, 404: 2, 405: 1, 413: 1, 429: 1}

    def now() -> dict[int, float]:
        return {s: counted(s) + counted(s, "st-c") + counted(s, owner="") - before[s]
                for s in statuses}  # fmt: skip

    wait(lambda: now() == expected, what=f"every status in /metrics ({now()} != {expected})")
    assert counted(401, owner="") >= 1  # no valid key: no owner
    # Usage: every request, under its key (a 401's has none), errors apart from the 200s.
    wait(lambda: usage()["requests"] == sum(expected.values()), what="every request in usage")
    assert usage() == {"requests": 9, "errors": 6}
    assert usage(key="") == {"requests": 1, "errors": 1}
    assert usage(key="tight") == {"requests": 2, "errors": 1}


def test_a_kept_alive_connection_closed_under_the_gateway_is_not_a_500(h: Harness) -> None:
    """uvloop raises RuntimeError writing to a transport closed under it (an engine's idle
    connection dropped, not yet noticed): it was a 500 of the gateway's own (seen in the
    fault suite); the request goes on a new connection."""
    h.serve([model("st-d")], [(1, "st-d", h.engine("e"))])
    api(h).chat.completions.create(model="st-d", messages=hi())
    idle = [c for conns in h.gateway.upstream._idle.values() for c in conns]
    assert idle

    def closed(data: bytes) -> None:
        raise RuntimeError("unable to perform operation on <TCPTransport closed=True>; the "
                           "handler is closed")  # fmt: skip

    for conn in idle:
        conn.transport.write = closed
    answer = api(h).chat.completions.create(model="st-d", messages=hi())
    assert answer.choices[0].message.content
    wait(lambda: counted(200, "st-d") >= 2, what="both answers counted")
    assert counted(500, "st-d") == 0
