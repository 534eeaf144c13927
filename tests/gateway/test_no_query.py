"""The request path makes no database query: 1,000 requests through the real state
(read from PostgreSQL), the real guard (a sim judge process judging every request) and a
sim engine process, with queries counted in every thread."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from django.db.backends import utils

from cluster.models import Replica
from gateway import services as keys
from gateway.models import Refusal
from gateway.path.guarding import Guard
from gateway.records.observe import Fanout
from gateway.records.refusals import RefusalRecorder
from gateway.records.state import State
from guard import records
from guard import services as guard_services
from guard import snapshots as guard_snapshots
from tests.catalog.samples import sim_model, store
from tests.gateway.harness import Harness
from tests.guard.helpers import guard_model
from tests.guard.test_client import launch, stop

pytestmark = pytest.mark.django_db(transaction=True)

# Threads that read and write off the request path, by design: the gateway's table
# reader, the guard's recorder, the guard's refresh ahead of its snapshot, and the writer
# of the refusals' records.
OFF_PATH = ("gateway-state", "guard-recorder", "guard-refresh", "gateway-refusals")


@pytest.fixture
def processes() -> Iterator[tuple[str, str]]:
    judge, judge_url = launch("--model", "judge", "--guard-format", "qwen3guard", "--ttft", "0",
                              "--tps", "100000")  # fmt: skip
    engine, engine_url = launch("--model", "chat", "--ttft", "0", "--tps", "100000")
    yield judge_url, engine_url
    stop(judge)
    stop(engine)


@pytest.fixture
def queries(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    counted: Counter[str] = Counter()
    real = utils.CursorWrapper._execute

    def execute(self: Any, *args: Any, **kwargs: Any) -> Any:
        counted[threading.current_thread().name] += 1
        return real(self, *args, **kwargs)

    monkeypatch.setattr(utils.CursorWrapper, "_execute", execute)
    return counted


def test_a_thousand_requests_make_no_query(
    processes: tuple[str, str], queries: Counter[str]
) -> None:
    judge_url, engine_url = processes
    guard_model("judge", endpoint=judge_url)
    store(sim_model("chat", tp=None))
    Replica.objects.create(model_name="chat", state="ready", endpoint=engine_url, profile="sim")
    guard_services.set_policy(
        {"judge": {"models": ["judge"]}, "directions": ["requests"]}, surface="cli"
    )
    _, secret = keys.create_key("bench")
    records.start()
    h = Harness(state=State(), guard=Guard())
    recorder = RefusalRecorder(interval=0.05)  # each refusal's record, written in batches
    h.gateway.observer = Fanout(recorder)
    recorder.start()
    try:
        h.serve([], [])
        body = {"model": "chat", "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]}
        with httpx.Client(base_url=h.url, headers={"Authorization": f"Bearer {secret}"},
                          timeout=10) as client:  # fmt: skip
            for _ in range(50):  # warm-up: the policy and its judges read once
                assert client.post("/v1/chat/completions", json=body).status_code == 200
            queries.clear()
            judged = guard_snapshots.snapshot().policy.judge_requests
            for _ in range(1000):
                assert client.post("/v1/chat/completions", json=body).status_code == 200
            refused = [client.post("/v1/chat/completions", json={
                **body, "messages": [{"role": "user", "content": "UNSAFE-MARKER"}]})
                for _ in range(20)]  # fmt: skip
        assert judged and {r.status_code for r in refused} == {400}  # the guard was on the path
        on_path = {t: n for t, n in queries.items() if not t.startswith(OFF_PATH)}
        assert on_path == {}, on_path
        assert queries  # the state did read in the background meanwhile
        recorder.stop()  # writes what is left
        assert set(Refusal.objects.values_list("request_id", flat=True)) == {
            r.headers["x-request-id"] for r in refused
        }
    finally:
        recorder.stop()
        h.close()
        records.RECORDER.stop()
