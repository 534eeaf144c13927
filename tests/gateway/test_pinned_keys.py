"""A client key pinned to one replica (``ClientKey.replica``): the capacity bench's key,
made by the control plane alone (``gateway.services.pinned_key``).

Through the real gateway (uvicorn, real sockets): its requests reach that replica only,
never another replica of the model, its canary or its fallback; a failure there is a 502
naming it, not a retry elsewhere; a replica out of routing is a 503 naming it, read from
the database by the real state when the replica's row goes; admission neither holds it
nor counts its times. No public surface (API, console, ``gateway key create``) sets a
pin."""

from __future__ import annotations

import io
from typing import Any

import httpx
import pytest
from django.core.management import CommandError, call_command

from catalog import spec
from cluster.models import ClusterAction, Replica
from gateway import services
from gateway.models import ClientKey
from gateway.path.admission import Admission, Counts
from gateway.path.table import Key, digest
from gateway.records.state import State
from tests.catalog.samples import sim_model, store
from tests.gateway.harness import KEY, Harness, model, wait

PINNED = "llmgw-ck-pinned-to-replica-one"
LOW = "llmgw-ck-pinned-test-low-band"
BODY = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}


def ask(h: Harness, secret: str, model_name: str = "m") -> httpx.Response:
    return httpx.post(h.url + "/v1/chat/completions", json={**BODY, "model": model_name},
                      headers={"Authorization": f"Bearer {secret}"}, timeout=15)  # fmt: skip


@pytest.fixture
def h() -> Any:
    harness = Harness()
    harness.keys[digest(PINNED)] = Key(7, "bench-replica-1", "", ("m",), None,
                                       priority="high", replica=1)  # fmt: skip
    harness.keys[digest(LOW)] = Key(8, "batch", "team:t", (), None, priority="low")
    yield harness
    harness.close()


def test_a_pinned_key_reaches_its_replica_alone_and_never_another_nor_a_fallback(
    h: Harness,
) -> None:
    one, two, backup = h.engine("one"), h.engine("two"), h.engine("backup")
    h.serve([model("m", fallbacks=["f"], canary=spec.Canary(model="c", percent=100)),
             model("f"), model("c")],
            [(1, "m", one), (2, "m", two), (3, "f", backup), (4, "c", backup)])  # fmt: skip
    for _ in range(20):
        r = ask(h, PINNED)
        assert r.status_code == 200, r.text
    assert (one.requests, two.requests, backup.requests) == (20, 0, 0)
    # Any other key goes the usual way (here: the canary takes every request).
    assert ask(h, KEY).status_code == 200 and backup.requests == 1

    # Its replica fails: a 502 naming it; no other replica, no fallback is tried.
    one.behaviour = "503"
    r = ask(h, PINNED)
    assert r.status_code == 502, r.text
    error = r.json()["error"]
    assert error["code"] == "upstream_error"
    assert "Replica #1 of 'm' gave no answer (HTTP 503)" in error["message"]
    assert "never sent to another replica" in error["message"]
    assert (two.requests, backup.requests) == (0, 1)

    # Its replica leaves routing (stopped, or no longer ready): a 503 naming it, at once.
    one.behaviour = "ok"
    h.rows = [row for row in h.rows if row.id != 1]
    h.refresh()
    r = ask(h, PINNED)
    assert r.status_code == 503, r.text
    assert r.headers["retry-after"]
    error = r.json()["error"]
    assert error["code"] == "replica_unavailable"
    assert error["message"].startswith("Replica #1 of 'm' is not in routing")
    assert (two.requests, backup.requests) == (0, 1)


def test_a_pinned_key_names_its_model_alone(h: Harness) -> None:
    h.serve([model("m"), model("other")], [(1, "m", h.engine("one")), (2, "other", h.engine("o"))])
    r = ask(h, PINNED, "other")
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"


def test_admission_neither_holds_a_pinned_key_nor_counts_its_overload(h: Harness) -> None:
    """The bench drives its replica past the slo on purpose: its slow answers do not put
    the model under pressure, so a low band is still let in (it would be held after
    answers this slow from any other key: ``test_admission_gateway``)."""
    counts = Counts()
    h.gateway.admission = Admission(window=3.0, queue=0.2, counts=counts)
    slow = h.engine("slow", delay=0.6)  # 600 ms to the answer, slo 300 ms
    h.serve([model("m", slo=spec.SLO(ttft_p99=300_000_000))], [(1, "m", slow)])
    for _ in range(4):
        assert ask(h, PINNED).status_code == 200
    assert ask(h, LOW).status_code == 200  # nothing past the slo was heard of the model
    assert h.gateway.admission.state().get("m", {}).get("limit") is None
    # The bench's requests are not counted per band either: only the low one was.
    taken = counts.take(2**40)
    bands = {band for second in taken.values() for per in second.values() for band in per}
    assert bands == {"low"}


class JudgeEverything:
    """A guard that judges requests and answers, counting what it is asked, refusing
    requests that hold "forbidden"."""

    def __init__(self) -> None:
        self.asked = 0

    def directions(self) -> tuple[bool, bool]:
        return True, True

    async def judge(self, request: str, answer: str | None = None) -> dict[str, Any]:
        self.asked += 1
        if "forbidden" in request:
            return {"decision": "refuse", "verdict": "unsafe", "judge": "j",
                    "categories": ["Violent"]}  # fmt: skip
        return {"decision": "allow", "verdict": "safe", "judge": "j", "categories": []}


def test_the_guard_neither_judges_nor_holds_a_pinned_keys_requests() -> None:
    """The bench's own prompt, its answers thrown away: timed as the replica gives them,
    not held in a judge's windows (any other key is judged as before)."""
    guard = JudgeEverything()
    h = Harness(guard=guard)
    h.keys[digest(PINNED)] = Key(7, "bench-replica-1", "", ("m",), None, priority="high",
                                 replica=1)  # fmt: skip
    try:
        h.serve([model("m")], [(1, "m", h.engine("one"))])
        forbidden = {**BODY, "messages": [{"role": "user", "content": "forbidden"}]}
        for secret in (PINNED, KEY):
            for stream in (False, True):
                r = httpx.post(h.url + "/v1/chat/completions", json={**forbidden, "stream": stream},
                               headers={"Authorization": f"Bearer {secret}"}, timeout=15)  # fmt: skip
                assert r.status_code == (200 if secret == PINNED else 400), r.text
        assert guard.asked == 2  # the other key's two requests, none of the pinned key's
    finally:
        h.close()


@pytest.mark.django_db(transaction=True)
def test_the_real_state_carries_the_pin_and_a_replica_gone_is_a_503_naming_it() -> None:
    """The pin from the database to the gateway's table (``gateway.records.state``'s loader), and
    the replica's row gone: 503 naming it, while the model's other replica serves others."""
    store(sim_model("m", 2, tp=None))
    h = Harness(state=State())
    try:
        one, two = h.engine("one"), h.engine("two")
        first = Replica.objects.create(model_name="m", profile="sim", state="ready",
                                       endpoint=one.url)  # fmt: skip
        Replica.objects.create(model_name="m", profile="sim", state="ready", endpoint=two.url)
        pk = first.pk
        with services.pinned_key("m", pk, via="test") as secret:
            key = ClientKey.objects.get(replica=pk, revoked__isnull=True)
            assert (key.models, key.priority, key.owner, key.expires is not None) == (
                ["m"], "high", "", True,
            )  # fmt: skip
            h.serve([], [])
            for _ in range(10):
                r = ask(h, secret)
                assert r.status_code == 200, r.text
            assert (one.requests, two.requests) == (10, 0)
            first.delete()
            wait(lambda: ask(h, secret).status_code == 503, what="the gateway to read it gone")
            error = ask(h, secret).json()["error"]
            assert error["message"].startswith(f"Replica #{pk} of 'm' is not in routing")
            assert two.requests == 0
        key.refresh_from_db()
        assert key.revoked is not None  # revoked when the run ended
        assert ClusterAction.objects.filter(
            action="client key create", detail__contains=f"pinned to replica #{pk}"
        ).exists()
    finally:
        h.close()


@pytest.mark.django_db
def test_no_public_surface_sets_a_pin(operator: Any, api_for: Any, client_for: Any) -> None:
    store(sim_model("m", 0, tp=None))
    api = api_for(operator)
    made = api.post("/api/v1/gateway/keys/", {"name": "api-key", "replica": 5, "models": ["m"]},
                    format="json")  # fmt: skip
    assert made.status_code == 201, made.content
    assert "replica" not in made.json()
    web = client_for(operator)
    assert web.post("/gateway/keys/create/", {"name": "web-key", "replica": "5"}).status_code == 200
    assert dict(ClientKey.objects.values_list("name", "replica")) == {
        "api-key": None, "web-key": None,
    }  # fmt: skip
    with pytest.raises(CommandError):
        call_command("gateway", "key", "create", "cli-key", "--replica", "5", stdout=io.StringIO())
    # The admin shows keys read-only; the pin is no field of any form (not editable).
    assert not ClientKey._meta.get_field("replica").editable


def test_load_scaling_leaves_out_a_pinned_keys_requests_in_flight_and_their_times(
    h: Harness,
) -> None:
    """The bench overloads its replica on purpose: load scaling must not answer it with a
    replica more (its in-flight requests and TTFTs are left out of the load report), while
    another key's request on the same replica counts."""
    import threading

    from gateway.records.loadreport import LoadReport
    from gateway.records.observe import Fanout
    from gateway.records.traffic import Traffic

    traffic = Traffic("test:1")
    traffic._started = True  # taken by hand below, not by its thread
    h.gateway.observer = Fanout(h.gateway.observer, traffic)
    slow = h.engine("slow", delay=0.5)
    h.serve([model("m")], [(1, "m", slow)])
    writer = LoadReport(h.gateway.parts, "test:1")
    asking = [threading.Thread(target=ask, args=(h, PINNED)) for _ in range(3)]
    for t in asking:
        t.start()
    wait(lambda: h.gateway.in_flight.get(1) == 3, 5, "the bench's three requests in flight")
    assert writer.in_flight_now() == {}  # none of them is load
    other = threading.Thread(target=ask, args=(h, KEY))
    other.start()
    wait(lambda: h.gateway.in_flight.get(1) == 4, 5, "a client's request beside them")
    assert writer.in_flight_now() == {"m": 1}
    for t in [*asking, other]:
        t.join(15)
    wait(lambda: not h.gateway.in_flight, 5, "every request's end")
    items = traffic.take(2**40)
    assert sum(i["requests"] for i in items) == 4  # the Traffic page sees the bench run
    assert sum(sum(i["ttft"]) for i in items) == 1  # but only the client's time counts
