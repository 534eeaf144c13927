"""Load scaling in the reconciler, with a frozen clock and the gateway's reports written as
a gateway process writes them (cluster.load, in this process's memory)."""

from __future__ import annotations

import time
from datetime import datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from cluster import agentbeat, agentreport, live, load, reconciler, services
from cluster.models import ClusterAction, ModelScale, Node, Replica
from gateway.path.admission import EDGES_MS
from tests.catalog import samples
from tests.catalog.samples import store
from tests.cluster.helpers import join_node

pytestmark = pytest.mark.django_db

H100 = "nvidia-h100-80gb"
T0 = datetime(2026, 11, 30, 12, tzinfo=ZoneInfo("UTC"))
UP, DOWN = 10, 60


@pytest.fixture(autouse=True)
def windows(settings: Any) -> None:
    settings.REDIS_URL = ""
    settings.LLMGW_SCALE_UP_AFTER = UP
    settings.LLMGW_SCALE_DOWN_AFTER = DOWN
    load.clear()
    yield
    load.clear()


def report(model: str, in_flight: int = 0, waiting: int = 0, ttft_ms: int | None = None) -> None:
    ttft = [0] * (len(EDGES_MS) + 1)
    if ttft_ms is not None:
        ttft[EDGES_MS.index(ttft_ms)] = 50
    load.write({"process": "gw:1", "at": time.time(), "edges": list(EDGES_MS),
                "models": {model: {"in_flight": in_flight, "waiting": waiting, "ttft": ttft}}})  # fmt: skip


def tick(seconds: float) -> reconciler.TickResult:
    now = T0 + timedelta(seconds=seconds)
    Node.objects.update(last_heartbeat=now)
    return reconciler.tick(now)


def wanted(name: str) -> int:
    return Replica.objects.filter(model_name=name, desired=True).count()


def sim_model(name: str = "chat", **extra: Any) -> dict[str, Any]:
    """A sim model on H100s, one card a node, with ``extra`` (its ``scaling``) over it."""
    return samples.sim_model(name, tp=None, profile={"name": "h100", "gpus_per_node": 1},
                             source=f"org/{name}", **extra)  # fmt: skip


def test_up_after_the_window_held_at_max_then_down_one_at_a_time() -> None:
    join_node("n1", [H100] * 4)
    store(sim_model(scaling={"min": 1, "max": 3}))
    tick(0)
    assert wanted("chat") == 1
    assert ModelScale.objects.get().reason == "at min 1: no load"
    report("chat", in_flight=10)  # capacity 4 each (the sim's default): 3 needed
    tick(1)
    assert wanted("chat") == 1
    assert "scaling up if it holds" in ModelScale.objects.get().reason
    tick(1 + UP)
    assert wanted("chat") == 3
    scale = ModelScale.objects.get()
    assert scale.target == 3
    assert scale.reason == "scaled up to 3: 10 in flight over 0 replicas, capacity 4 each"
    row = live.model_row("chat")
    assert (row.scale_target, row.scale_range) == (3, "1–3")
    report("chat", in_flight=30)
    tick(2 + UP)
    assert ModelScale.objects.get().reason.startswith("holding at max 3: 30 in flight")
    report("chat", in_flight=1)
    tick(100)
    tick(100 + DOWN)
    assert wanted("chat") == 2
    assert ModelScale.objects.get().reason.startswith("scaled down to 2: 1 in flight")
    tick(101 + DOWN)
    assert wanted("chat") == 2
    load.clear()  # no gateway reports: no load
    tick(100 + 2 * DOWN)
    assert wanted("chat") == 1
    # Each step is in the actions log, by load scaling, with its reason; a hold is not.
    steps = list(ClusterAction.objects.order_by("at", "id").values_list(
        "actor_name", "action", "target", "detail"))  # fmt: skip
    assert [s[:3] for s in steps] == [
        ("system (load scaling)", "scaled up", "model chat"),
        ("system (load scaling)", "scaled down", "model chat"),
        ("system (load scaling)", "scaled down", "model chat"),
    ]
    assert steps[0][3] == "scaled up to 3: 10 in flight over 0 replicas, capacity 4 each"


def test_a_burst_shorter_than_the_window_adds_nothing() -> None:
    join_node("n1", [H100] * 4)
    store(sim_model(scaling={"min": 1, "max": 3}))
    tick(0)
    report("chat", in_flight=12)
    tick(1)
    report("chat", in_flight=2)
    tick(UP - 1)
    report("chat", in_flight=12)
    tick(UP + 1)
    assert wanted("chat") == 1


def test_a_replica_still_starting_counts_toward_the_target() -> None:
    """One scale-up for one load: the replica it added counts while it starts (it serves
    nothing yet), so the same load held for more up windows adds none."""
    join_node("n1", [H100] * 4)
    store(sim_model(scaling={"min": 1, "max": 4}))
    tick(0)
    Replica.objects.update(state="ready")
    report("chat", in_flight=8)  # capacity 4 each (the sim's default): 2 needed
    tick(1)
    tick(1 + UP)
    assert wanted("chat") == 2
    assert Replica.objects.filter(model_name="chat", desired=True, state="ready").count() == 1
    for n in (2, 3, 4):
        report("chat", in_flight=8)
        tick(1 + n * UP)
        assert wanted("chat") == 2, ModelScale.objects.get().reason
    assert ModelScale.objects.get().reason.startswith("steady at 2: 8 in flight over 1 replica")


def test_ttft_past_the_slo_at_max_says_so() -> None:
    join_node("n1", [H100] * 4)
    store(sim_model("fixed", scaling={"min": 1, "max": 1}))
    store(sim_model(scaling={"min": 1, "max": 2}, slo={"ttft_p99": "1s"}))
    tick(1)
    assert not ModelScale.objects.filter(model_name="fixed").exists()  # nothing to scale
    Replica.objects.update(state="ready")
    report("chat", in_flight=2, ttft_ms=3000)
    tick(2)
    tick(2 + UP)
    assert wanted("chat") == 2
    Replica.objects.update(state="ready")
    tick(3 + UP)
    assert (
        ModelScale.objects.get(model_name="chat").reason
        == "holding at max 2: TTFT p99 3 s over the 1 s slo"
    )


def test_a_scale_up_with_no_room_says_so() -> None:
    join_node("n1", [H100] * 1)
    store(sim_model(scaling={"min": 1, "max": 3}))
    tick(0)
    report("chat", in_flight=12)
    tick(1)
    tick(1 + UP)
    scale = ModelScale.objects.get()
    assert scale.target == 3
    assert scale.shown.startswith("no room: scaled up to 3, a replica waits: ")
    assert live.model_row("chat").scale_reason == scale.shown
    # Room again: the word goes.
    join_node("n2", [H100] * 2)
    tick(2 + UP)
    assert ModelScale.objects.get().no_room == ""


def test_redis_away_holds_every_target(settings: Any) -> None:
    join_node("n1", [H100] * 4)
    store(sim_model(scaling={"min": 1, "max": 3}))
    report("chat", in_flight=12)
    tick(0)
    tick(UP)
    assert wanted("chat") == 3
    from tests.redisserver import free_port

    settings.REDIS_URL = f"redis://127.0.0.1:{free_port()}/0"
    load._client = None
    try:
        tick(UP + DOWN * 3)
    finally:
        load._client = None
    assert wanted("chat") == 3
    assert ModelScale.objects.get().reason.startswith("holding at 3: no load figures (Redis")


def test_on_demand_zero_to_n_and_back_to_zero() -> None:
    join_node("n1", [H100] * 4)
    store(sim_model(scaling={"min": 0, "max": 3, "idle_timeout": "2m"}))
    tick(0)
    assert wanted("chat") == 0
    services.demand("chat")  # the gateway's first request
    from cluster.models import ModelDemand

    ModelDemand.objects.update(last_demand=T0)
    report("chat", waiting=9)
    tick(1)
    assert wanted("chat") == 1
    tick(1 + UP)
    assert wanted("chat") == 3
    assert ModelScale.objects.get().reason.startswith("on demand: scaled up to 3: ")
    load.clear()
    tick(200)  # idle past its timeout
    assert wanted("chat") == 0
    assert not ModelScale.objects.exists()


def agent_says_ready() -> None:
    """The node's agent: every engine it was asked to run is up (what a real one reports)."""
    from cluster.models import Assignment

    for node in Node.objects.all():
        listed = {r["id"] for r in agentbeat.desired_list(node)["replicas"]}
        reports = [
            {"replica": a.replica_id, "state": "ready", "port": 9000 + a.pk}
            for a in Assignment.objects.filter(node=node, replica_id__in=listed)
        ]
        if reports:
            agentreport.report(node, reports)


def test_a_serving_replica_scaled_down_drains_before_its_engine_stops(settings: Any) -> None:
    """It leaves the gateways' table at once; its engine runs on (its node's desired list
    keeps it) for LLMGW_STOP_DRAIN seconds, so the requests in flight finish; then it stops."""
    from gateway.records.state import Loader

    settings.LLMGW_STOP_DRAIN = 20
    node, _ = join_node("n1", [H100] * 4)
    store(sim_model(scaling={"min": 1, "max": 2}))
    report("chat", in_flight=8)
    tick(0)
    tick(UP + 1)
    assert wanted("chat") == 2
    agent_says_ready()
    assert Replica.objects.filter(model_name="chat", state="ready").count() == 2
    report("chat", in_flight=1)
    tick(UP + 2)
    tick(UP + 3 + DOWN)
    assert wanted("chat") == 1
    gone = Replica.objects.get(model_name="chat", desired=False)
    assert gone.state == "stopping"
    assert gone.reason.startswith("draining, then stopping: scaled down"), gone.reason
    # Off the gateways' table, still on its node's list; an agent's report of it still
    # running does not make it ready again.
    table = Loader()()
    assert set(table.pools["chat"].endpoints) == {
        r.pk for r in Replica.objects.filter(desired=True)
    }
    listed = {r["id"] for r in agentbeat.desired_list(node)["replicas"]}
    assert gone.pk in listed
    agent_says_ready()
    gone.refresh_from_db()
    assert gone.state == "stopping" and gone.drain_until is not None
    tick(UP + 3 + DOWN + 19)
    assert gone.pk in {r["id"] for r in agentbeat.desired_list(node)["replicas"]}
    # The grace over: off the list, so its agent stops the engine.
    tick(UP + 3 + DOWN + 20)
    assert gone.pk not in {r["id"] for r in agentbeat.desired_list(node)["replicas"]}
    gone.refresh_from_db()
    assert gone.drain_until is None and not gone.desired


def test_a_replica_that_never_served_stops_at_once(settings: Any) -> None:
    settings.LLMGW_STOP_DRAIN = 20
    node, _ = join_node("n1", [H100] * 4)
    store(sim_model(scaling={"min": 1, "max": 2}))
    report("chat", in_flight=8)
    tick(0)
    tick(UP + 1)
    assert wanted("chat") == 2
    report("chat", in_flight=1)
    tick(UP + 2)
    tick(UP + 3 + DOWN)
    gone = Replica.objects.get(model_name="chat", desired=False)
    assert gone.drain_until is None
    assert not gone.reason.startswith("draining")
    assert gone.pk not in {r["id"] for r in agentbeat.desired_list(node)["replicas"]}


def test_a_model_under_load_is_pushed_when_its_reason_says_something_new(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Figures that move each tick ("3.8 in flight", a countdown) re-render the consoles at
    most every FIGURES_EVERY seconds; a change of target or of the reason's words at once."""
    from cluster.scaling import FIGURES_EVERY
    from llmgw_core import events

    sent: list[dict[str, Any]] = []
    real = events.changed

    def changed(**marked: Any) -> None:
        sent.append(marked)
        real(**marked)

    monkeypatch.setattr(events, "changed", changed)

    def pushes() -> int:
        """The pushes naming the model so far."""
        return sum(1 for m in sent if "chat" in m.get("models", ()))

    join_node("n1", [H100] * 4)
    store(sim_model(scaling={"min": 1, "max": 3}))
    tick(0)
    sent.clear()
    # Over capacity, each tick a new figure and a new countdown: within the up window
    # the words stay ("at 1, scaling up if it holds …"), so few pushes.
    for n in range(1, UP):
        report("chat", in_flight=5 + n % 2)
        tick(n)
    assert "scaling up if it holds" in ModelScale.objects.get().reason
    assert 1 <= pushes() <= 1 + (UP - 1) // FIGURES_EVERY + 1, sent
    before = pushes()
    report("chat", in_flight=6)
    tick(UP + 1)  # the target moves: pushed at once
    assert ModelScale.objects.get().target == 2
    assert pushes() > before
