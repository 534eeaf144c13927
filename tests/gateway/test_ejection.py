"""Replicas ejected on failure, over real sockets with the ``openai``
client: a replica refusing connections, or answering 503, is left out of routing after a
few failures in a row (every request still answered by the other), comes back on its
own once its while is over and it listens again, and retries stop growing meanwhile.
The rules themselves: tests/gateway/test_outliers.py."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.path.outliers import Outliers, Rules
from gateway.path.table import ReplicaRow
from gateway.records import metrics
from gateway.records.observe import Fanout
from tests.gateway.harness import KEY, Harness, model

AFTER = 3
BASE = 30.0


class Clock:
    """The monotonic clock, which the test may move on (the while an ejection lasts
    passes at once, however slow this machine is)."""

    def __init__(self) -> None:
        self.ahead = 0.0

    def __call__(self) -> float:
        return time.monotonic() + self.ahead


@pytest.fixture
def h() -> Iterator[Harness]:
    harness = Harness()
    harness.metrics = metrics.Metrics()  # type: ignore[attr-defined]
    harness.gateway.observer = Fanout(harness.metrics)  # type: ignore[attr-defined]
    harness.metrics.watch(harness.gateway.parts)  # type: ignore[attr-defined]
    harness.clock = Clock()  # type: ignore[attr-defined]
    harness.gateway.outliers = Outliers(Rules(after=AFTER, base=BASE), harness.clock)  # type: ignore[attr-defined]
    yield harness
    harness.close()


def api(h: Harness) -> openai.OpenAI:
    return openai.OpenAI(base_url=h.url + "/v1", api_key=KEY, max_retries=0, timeout=10)


def ask(h: Harness, i: int, name: str = "m") -> str:
    """A request of its own conversation (so the ring spreads them over both replicas)."""
    answer = api(h).chat.completions.create(
        model=name, messages=[{"role": "user", "content": f"conversation {i}"}]
    )
    return answer.choices[0].message.content or ""


def sample(name: str, **labels: str) -> float:
    for family in text_string_to_metric_families(metrics.scrape().decode()):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return float(s.value)
    return 0.0


def test_a_replica_refusing_connections_is_ejected_and_comes_back(h: Harness) -> None:
    dead, good = h.engine("dead"), h.engine("good")
    h.serve([model("ej-a")], [(1, "ej-a", dead), (2, "ej-a", good)])
    ejections = sample("llmgw_gateway_ejections_total", model="ej-a")
    h.run(dead.stop())  # refuses connections from now on
    answers = [ask(h, i, "ej-a") for i in range(40)]
    # Every request answered by the other replica.
    assert all(a.startswith("good0") for a in answers)
    observer = h.gateway.observer
    # Ejected after AFTER attempts on it failed (each moved on): no more retries after.
    assert observer.retries == {"ej-a": AFTER}
    assert observer.ejections == {"ej-a": 1}
    assert h.gateway.outliers.excluded((1, 2)) == {1}
    assert sample("llmgw_gateway_ejections_total", model="ej-a") == ejections + 1
    h.metrics.sync()  # type: ignore[attr-defined]
    assert sample("llmgw_gateway_ejected_replicas", model="ej-a") == 1
    # It listens again: still out until its while is over.
    h.run(dead.start())
    assert all(ask(h, i, "ej-a").startswith("good0") for i in range(40, 50))
    assert dead.requests == 0
    # Its while over, it is chosen again on its own, and answers.
    h.clock.ahead += BASE  # type: ignore[attr-defined]
    answers = [ask(h, i, "ej-a") for i in range(50, 70)]
    assert any(a.startswith("dead0") for a in answers)
    assert dead.requests > 0
    assert observer.retries == {"ej-a": AFTER}  # none since
    assert h.gateway.outliers.excluded((1, 2)) == frozenset()
    h.metrics.sync()  # type: ignore[attr-defined]
    assert sample("llmgw_gateway_ejected_replicas", model="ej-a") == 0


def test_a_replica_answering_503_is_ejected(h: Harness) -> None:
    busy, good = h.engine("busy", behaviour="503"), h.engine("good")
    h.serve([model("ej-b")], [(1, "ej-b", busy), (2, "ej-b", good)])
    answers = [ask(h, i, "ej-b") for i in range(30)]
    assert all(a.startswith("good0") for a in answers)
    assert busy.requests == AFTER
    assert h.gateway.observer.ejections == {"ej-b": 1}


def test_a_429_is_not_a_failure(h: Harness) -> None:
    """A replica at its limit is busy, not broken: it is tried again, never ejected."""
    full, good = h.engine("full", behaviour="429"), h.engine("good")
    h.serve([model("ej-c")], [(1, "ej-c", full), (2, "ej-c", good)])
    for i in range(20):
        ask(h, i, "ej-c")
    assert full.requests > AFTER
    assert h.gateway.observer.ejections == {}


def test_one_replica_is_never_ejected(h: Harness, caplog: pytest.LogCaptureFixture) -> None:
    """With no other replica, ejecting it would make every request fail for the while,
    even once it answers again: it stays in, and each request tries it; the log says so
    once."""
    dead = h.engine("dead")
    h.serve([model("ej-d")], [(1, "ej-d", dead)])
    h.run(dead.stop())
    for i in range(2 * AFTER):
        with pytest.raises(openai.APIStatusError) as failed:
            ask(h, i, "ej-d")
        assert failed.value.status_code == 502
    assert h.gateway.observer.ejections == {}
    said = [r.getMessage() for r in caplog.records if "stays in routing" in r.getMessage()]
    assert said == [
        f"replica 1 of ej-d failed {AFTER} times in a row and stays in routing: it is the "
        "model's only ready replica"
    ]
    h.run(dead.start())
    assert ask(h, 99, "ej-d").startswith("dead0")  # the first request after it is back


def test_a_whole_answer_whose_body_breaks_is_retried_and_counts_as_a_failure(h: Harness) -> None:
    """An engine that sends a whole answer's head and dies within its body: nothing has
    reached the client, so the request moves to another replica (it was a 500 of the
    gateway's own), and the attempt counts toward the replica's ejection."""

    async def breaking(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                     b'Content-Length: 500\r\n\r\n{"id": "x", "choi')  # fmt: skip
        await writer.drain()
        writer.transport.abort()

    server = h.run(asyncio.start_server(breaking, "127.0.0.1", 0))
    port = server.sockets[0].getsockname()[1]
    good = h.engine("good")
    h.serve([model("ej-e")], [(2, "ej-e", good)])
    h.rows.append(ReplicaRow(1, "ej-e", "sim", f"http://127.0.0.1:{port}"))
    h.refresh()
    answers = [ask(h, i, "ej-e") for i in range(30)]
    assert all(a.startswith("good0") for a in answers)
    assert h.gateway.observer.retries == {"ej-e": AFTER}
    assert h.gateway.observer.ejections == {"ej-e": 1}
    h.run(_closed(server))


async def _closed(server: asyncio.base_events.Server) -> None:
    server.close()
