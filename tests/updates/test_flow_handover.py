"""A promote on a full node: a one-replica model whose replacement has no room beside the
old replica (the candidate holds the node's other cards) must stop the old one first; the
ready candidate takes the model's traffic until the replacement is ready, then goes.

Through the update flow, the reconciler and the real gateway (its state read from the
database as a gateway process reads it, uvicorn, the openai client), on PostgreSQL.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import openai
import pytest
from django.utils import timezone

from catalog.services import stored_specs
from cluster.models import Replica
from gateway.records.state import State, load_table
from tests.catalog.samples import gpu_model, store
from tests.cluster.helpers import join_node
from tests.cluster.test_reconciler import H100, tick
from tests.gateway.harness import Engine, Harness
from tests.updates.hubstandin import HubStandIn
from tests.waiting import wait_until
from updates import flow, mirror, run
from updates import signals as update_signals
from updates.models import Fetch

pytestmark = pytest.mark.django_db(transaction=True)

V1 = b'{"llmgw-sim-weights": 1, "name": "v1"}'
V2 = b'{"llmgw-sim-weights": 1, "name": "v2"}'


@pytest.fixture
def gateway() -> Iterator[Harness]:
    """The real gateway, its table read from the database (gateway.records.state.load_table)."""
    h = Harness(state=State(loader=load_table, interval=0.05, record_demand=lambda m: None))
    try:
        yield h
    finally:
        h.close()


def _tick() -> None:
    """A reconcile tick, and the look at the updates it starts on a thread of its own
    (embedded: ``updates.signals``), waited for: that look ends handovers and sweeps
    too, and on a loaded machine it ran after the test's next step and took its work."""
    tick(timezone.now())
    wait_until(lambda: not update_signals._looking.locked(), 30, "the tick's look at the updates")


def _ready(pk: int, engine: Engine) -> None:
    Replica.objects.filter(pk=pk).update(state="ready", endpoint=engine.url)


def _ask(h: Harness, secret: str) -> str:
    h.refresh()
    client = openai.OpenAI(base_url=h.url + "/v1", api_key=secret, max_retries=0, timeout=10)
    answer = client.chat.completions.create(
        model="chat", messages=[{"role": "user", "content": "hi"}]
    )
    return str(answer.choices[0].message.content)


def _fallbacks() -> list[str]:
    return list(stored_specs(names=["chat"])[0].fallbacks)


def test_the_candidate_answers_while_a_full_node_replaces_the_lone_replica(
    hub: HubStandIn, gateway: Harness, settings: Any
) -> None:
    from gateway import services as gateway_services

    settings.REDIS_URL = ""
    hub.commit("org/chat", {"sim-weights.json": V1})
    join_node("n1", [H100] * 4)  # two replicas of tp 2: the candidate fills it
    store(gpu_model("chat", scaling={"min": 1, "max": 1}))
    assert mirror.run_fetch(mirror.request_fetch("chat", start=False).pk).state == "done"
    _tick()
    [old] = Replica.objects.filter(model_name="chat", desired=True)
    old_engine, candidate_engine, new_engine = (
        gateway.engine("old", say="old"),
        gateway.engine("candidate", say="candidate"),
        gateway.engine("new", say="new"),
    )
    _ready(old.pk, old_engine)
    _, secret = gateway_services.create_key("client")
    gateway.serve([], [])  # uvicorn up; the table is the database's
    assert _ask(gateway, secret) == "old"

    # The update: v2 fetched, its candidate placed on the node's two free cards, ready.
    commit = hub.commit("org/chat", {"sim-weights.json": V2})
    r = run.start("chat")
    # Started, the fetch runs on its own thread (the embedded mode's dispatch): waited
    # for, never run a second time beside it.
    done = wait_until(lambda: Fetch.objects.filter(pk=r.fetch_id, state__in=("done", "failed")).first(),
                      60, "the update's fetch to end")  # fmt: skip
    assert done.state == "done", done.reason
    r = run.advance(r.pk)
    _tick()
    [cand] = Replica.objects.filter(model_name=r.candidate, desired=True)
    assert cand.assignments.exists()
    _ready(cand.pk, candidate_engine)
    r = run.advance(r.pk)
    assert r.state == "waiting", r.lines

    r = run.promote("chat")
    assert r.state == "promoted" and r.handover, r.lines
    assert _fallbacks() == [r.candidate]
    assert f"{r.candidate} takes chat's traffic until it is ready" in r.lines[-1]["text"]
    # No room beside the old replica: it stops first, and the model has no ready replica
    # of its own until the replacement is.
    _tick()
    old.refresh_from_db()
    [new] = r.handover
    assert not old.desired, old.reason
    assert Replica.objects.get(pk=new).state != "ready"
    assert _ask(gateway, secret) == "candidate"  # not dark: the candidate answers
    assert run.end_handovers() == []
    assert run.sweep(timezone.now() + timedelta(seconds=run.DRAIN_S * 10)) == []  # kept

    # The replacement is ready: the model answers itself, the candidate goes once drained.
    _tick()
    _ready(new, new_engine)
    assert run.end_handovers() == [r.pk]
    assert _fallbacks() == []
    assert _ask(gateway, secret) == "new"
    r.refresh_from_db()
    assert "the replacements are ready" in r.lines[-1]["text"]
    assert run.sweep() == []
    assert run.sweep(timezone.now() + timedelta(seconds=run.DRAIN_S)) == [r.candidate]
    assert stored_specs(names=["chat"])[0].origin.revision == commit


def test_the_handover_ends_when_the_replacement_is_ready_failed_or_gone() -> None:
    over = flow.handover_over
    assert over("chat", "chat@1", {5: "starting"}, 10) == ""
    assert over("chat", "chat@1", {5: "pending", 6: "ready"}, 10) == ""
    assert "replacements are ready" in over("chat", "chat@1", {5: "ready", 6: None}, 10)
    assert "replacement #5 failed" in over("chat", "chat@1", {5: "failed"}, 10)
    assert "#5 not ready after 30 minutes" in over("chat", "chat@1", {5: "pending"}, 1800)
    assert "replacements are ready" in over("chat", "chat@1", {}, 0)


def test_a_tick_looks_while_a_candidate_takes_the_traffic_however_long() -> None:
    from updates import signals
    from updates.models import UpdateRun

    assert not signals.worth_a_look()
    long_ago = timezone.now() - timedelta(hours=1)
    r = UpdateRun.objects.create(
        model="chat", candidate="chat@1", state="promoted", handover=[1], finished=long_ago
    )
    assert signals.worth_a_look()  # its replacement may take longer than any drain
    UpdateRun.objects.filter(pk=r.pk).update(handover_ended=long_ago)
    assert not signals.worth_a_look()
