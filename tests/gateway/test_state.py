"""What a gateway process loads to route by: the catalog, the replicas it may use, keys;
and budgets shared by every gateway process through Redis."""

from __future__ import annotations

import asyncio
import secrets
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from cluster.choices import NodeHealth
from cluster.models import Assignment, Node, Replica
from gateway import services
from gateway.path.limits import LocalLimits, RedisLimits
from gateway.path.table import digest
from gateway.records.state import load_table
from tests.catalog.samples import sim_model, store
from tests.guard.helpers import guard_model
from tests.redisserver import url as redis_url

# About 38 s for the file's 15 tests in a full run (load 2 to 10): listed with the
# long files, so that it starts early rather than end the run alone (tests/conftest.py).
pytestmark = pytest.mark.takes(2.5)

WEIGHT = {"weight": 2}  # the sim profile's, carried into the table


def replica(model: str, node: Node, **kw: object) -> Replica:
    r = Replica.objects.create(model_name=model, profile="sim", state=kw.pop("state", "ready"),
                               endpoint=kw.pop("endpoint", f"http://{node.name}:9000"), **kw)  # fmt: skip
    Assignment.objects.create(replica=r, node=node)
    return r


@pytest.mark.django_db
def test_only_ready_wanted_replicas_on_heard_nodes_are_routed_to() -> None:
    store(sim_model("chat", 1, most=4, tp=None, profile=WEIGHT, aliases=["c"],
                    adapters=[{"name": "chat-sql", "source": "/lora/sql"}]))  # fmt: skip
    guard_model("judge")
    ok = Node.objects.create(name="ok", health=NodeHealth.READY)
    lost = Node.objects.create(name="lost", health=NodeHealth.LOST)
    good = replica("chat", ok)
    replica("chat", lost)  # its node is not heard from
    replica("chat", ok, desired=False)  # being stopped: finishes its own, takes no new ones
    replica("chat", ok, state="loading")
    replica("chat", ok, endpoint="")
    replica("judge", ok)
    table = load_table()
    pool = table.pool("chat")
    assert pool is not None and [t.id for t in pool.targets] == [good.pk]
    assert pool.targets[0].weight == 2
    assert table.resolve("c").model.name == "chat"
    assert table.resolve("chat-sql").adapter == "chat-sql"
    assert table.resolve("judge") is None  # judges are nobody's to name
    # A draining node's replica takes traffic only while the model has no other.
    cordoned = Node.objects.create(name="cordoned", health=NodeHealth.READY, cordoned=True)
    leaving = replica("chat", cordoned)
    assert [t.id for t in load_table().pool("chat").targets] == [good.pk]
    Replica.objects.filter(pk=good.pk).update(desired=False)
    assert [t.id for t in load_table().pool("chat").targets] == [leaving.pk]


@pytest.mark.django_db
def test_live_keys_only_and_their_expiry() -> None:
    store(sim_model("chat", tp=None, profile=WEIGHT))
    _, live = services.create_key("live", owner="team:a", models=["chat"], rpm=5)
    _, soon = services.create_key("soon", expires=timezone.now() + timedelta(seconds=30))
    _, gone = services.create_key("gone")
    services.revoke_key("gone")
    keys = load_table().keys
    assert digest(gone) not in keys
    k = keys[digest(live)]
    assert (k.owner, k.models, k.rpm) == ("team:a", ("chat",), 5)
    assert not keys[digest(soon)].expired(timezone.now().timestamp())
    assert keys[digest(soon)].expired((timezone.now() + timedelta(seconds=31)).timestamp())


@pytest.mark.django_db
def test_a_key_cannot_name_a_judge_or_an_unknown_model() -> None:
    guard_model("judge")
    with pytest.raises(services.KeyRefused, match="judge traffic"):
        services.create_key("bad", models=["judge"])
    with pytest.raises(services.KeyRefused, match="not in the catalog"):
        services.create_key("bad", models=["nope"])


def test_local_budgets_refuse_past_the_limit_until_the_minute_ends() -> None:
    now = [120.0]
    limits = LocalLimits(clock=lambda: now[0])

    async def run() -> list[float | None]:
        return [await limits.take(1, "requests", 1, 2) for _ in range(3)]

    assert asyncio.run(run())[:2] == [None, None]
    now[0] = 130.0
    assert asyncio.run(limits.take(1, "requests", 1, 2)) == 50.0  # seconds to the minute's end
    now[0] = 180.0
    assert asyncio.run(limits.take(1, "requests", 1, 2)) is None


def test_a_budget_in_redis_is_shared_by_every_process() -> None:
    """Two limiters (as two gateway processes have) share one key's budget."""
    url = redis_url(14)
    now = [1_000_040.0]  # 20 s into a minute

    async def run() -> list[float | None]:
        a, b = RedisLimits(url, clock=lambda: now[0]), RedisLimits(url, clock=lambda: now[0])
        key = 10**9 + secrets.randbelow(10**9)  # a key id of this run's own
        return [await limiter.take(key, "tokens", 40, 100) for limiter in (a, b, a, b)]

    taken = asyncio.run(run())
    assert taken[:2] == [None, None]  # 80 of 100
    assert taken[2] == taken[3] == 40.0  # 40 more would pass 100, whichever process asks


@pytest.mark.django_db
def test_the_loader_rebuilds_only_when_something_changed() -> None:
    from gateway.records.state import Loader

    store(sim_model("chat", tp=None, profile=WEIGHT))
    load = Loader()
    first = load()
    assert load() is first  # nothing changed: the same table, its rings not built again
    store(sim_model("new", tp=None, profile=WEIGHT))
    second = load()
    assert second is not first and second.resolve("new") is not None
    replica("new", Node.objects.create(name="n1", health=NodeHealth.READY))
    third = load()
    assert third is not second and third.pool("new") is not None
    _, secret = services.create_key("k")
    assert digest(secret) in load().keys


@pytest.mark.django_db(transaction=True)
def test_a_change_event_is_heard_at_once_though_the_poll_is_a_minute(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The gateway hears the events the consoles hear: a replica ready is routed to at
    once, not at the next poll. (This process plays the embedded web process: it holds
    live.sock, as ``manage.py serve`` does.)"""
    from cluster import relay
    from llmgw_core import events

    monkeypatch.setattr(relay, "_listening", (tmp_path / "live.sock", 0))
    # The listener makes the harness's loop this process's home loop: put it back after,
    # so later tests' events are not handed to a stopped loop.
    monkeypatch.setattr(events, "_home_loop", events._home_loop)
    from gateway.records.state import State
    from tests.gateway.harness import Harness

    store(sim_model("chat", tp=None, profile=WEIGHT))
    h = Harness(state=State(interval=60))
    try:
        h.serve([], [])
        h.run(asyncio.sleep(0))
        listening = asyncio.run_coroutine_threadsafe(h.state.listen(), h.loop)
        import time

        deadline = time.monotonic() + 5
        while h.state.table.resolve("chat") is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert h.state.table.pool("chat") is None
        node = Node.objects.create(name="n1", health=NodeHealth.READY)
        from channels.layers import get_channel_layer

        layer = get_channel_layer()

        def joined() -> bool:
            members = layer.groups.get("cluster.models", {})
            return any(c.startswith("gateway-state.") for c in members)

        deadline = time.monotonic() + 5
        while not joined() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert joined()
        r = replica("chat", node)
        events.changed(replicas=[r.pk])
        deadline = time.monotonic() + 3
        while h.state.table.pool("chat") is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert h.state.table.pool("chat") is not None and h.state.events >= 1
        listening.cancel()
    finally:
        h.close()


def test_a_gateway_process_of_its_own_leaves_its_events_to_the_relay() -> None:
    """Embedded, ``gateway serve`` is not the web process: it must not keep events (its
    traffic) in a layer of its own, where no console hears them."""
    from cluster import relay
    from gateway.records.state import State
    from llmgw_core import events

    assert not relay.listening()
    before = events._home_loop
    asyncio.run(asyncio.wait_for(State(interval=60).listen(), 2))
    assert events._home_loop is before


def test_unknown_keys_do_not_have_the_database_read_for_each_of_them() -> None:
    """Each request with a key the table does not hold waits for the next pass; twenty
    waves of them within one interval ask for one early pass, not twenty (an
    unauthenticated client could otherwise drive the database)."""
    from gateway.path.table import Table
    from gateway.records.state import State

    passes = []

    def loader() -> Table:
        passes.append(1)
        return Table()

    state = State(loader=loader, interval=30)

    async def main() -> None:
        state.start(asyncio.get_running_loop())
        await state.first_load()
        before = len(passes)
        for _ in range(20):
            await asyncio.gather(*(state.next_pass(timeout=0.05) for _ in range(10)))
        assert len(passes) - before == 1
        state.stop()

    asyncio.run(main())


def test_a_database_away_is_logged_once_then_a_line_a_minute(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from gateway.path.table import Table
    from gateway.records.state import State

    def loader() -> Table:
        raise ConnectionError("the database is away")

    state = State(loader=loader, interval=0.01)
    with caplog.at_level("ERROR", logger="gateway.records.state"):
        for _ in range(50):
            state._pass()
    said = [r for r in caplog.records if "could not read the catalog" in r.getMessage()]
    assert len(said) == 1 and said[0].exc_info is not None
    assert state.failures == 50


@pytest.mark.django_db
def test_a_model_has_no_room_only_while_none_of_its_replicas_is_on_a_node() -> None:
    """One replica loading and a second placement found no room for: the first will be
    ready, so requests wait for it; with it gone, the model has no room."""
    store(sim_model("chat", 2, tp=None, profile=WEIGHT))
    node = Node.objects.create(name="ok", health=NodeHealth.READY)
    loading = replica("chat", node, state="loading")
    Replica.objects.create(model_name="chat", state="pending", unplaced=True,
                           reason="no node has 2 free nvidia-h100-80gb")  # fmt: skip
    assert load_table().unplaced == {}
    loading.delete()
    assert load_table().unplaced == {"chat": "no node has 2 free nvidia-h100-80gb"}


@pytest.mark.django_db
def test_a_models_created_is_when_it_was_added_not_when_the_table_was_read() -> None:
    from catalog.models import ServedModel
    from gateway.path.listing import describe as _describe

    store(sim_model("chat", tp=None, profile=WEIGHT, aliases=["c"]))
    ServedModel.objects.filter(name="chat").update(created=timezone.now() - timedelta(days=3))
    added = int(ServedModel.objects.get(name="chat").created.timestamp())
    table = load_table()
    assert _describe(table.resolve("chat"), table)["created"] == added
    assert _describe(table.resolve("c"), table)["created"] == added  # an alias: its model's


def test_a_pass_begun_as_the_process_stops_says_nothing(caplog: pytest.LogCaptureFixture) -> None:
    # SIGTERM stops the state: its reader is shut down, and a pass the thread had begun
    # just then asked it for a read ("cannot schedule new futures after shutdown", logged
    # with its traceback as the first failed read: the Redis fault test's gateway log).
    from gateway.path.table import Table
    from gateway.records.state import State

    state = State(loader=Table, interval=60)
    state.stop()
    with caplog.at_level("ERROR", logger="gateway.records.state"):
        state._pass()
    assert state.failures == 0 and not state.stale
    assert "could not read" not in caplog.text


def test_the_change_listener_joins_again_when_nothing_arrives(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The listener's wait for an event is bounded by the groups' rejoin: a layer that
    delivers nothing (a quiet cluster, a Redis that stopped delivering) is joined again,
    not waited on for ever while its groups expire; a join that hangs is given up on."""
    from gateway.records import state as states
    from gateway.records.state import State

    class Silent:
        joined: list[str] = []
        hang_joins = False

        async def new_channel(self, prefix: str) -> str:
            return prefix + "1"

        async def group_add(self, group: str, channel: str) -> None:
            if self.hang_joins:
                await asyncio.Event().wait()
            self.joined.append(group)

        async def receive(self, channel: str) -> dict[str, Any]:
            await asyncio.Event().wait()  # nothing ever arrives
            return {}

    silent = Silent()
    monkeypatch.setattr(states, "get_channel_layer", lambda: silent)
    monkeypatch.setattr(states, "JOIN_WAIT", 0.2, raising=False)
    state = State(interval=60)
    state.rejoin_every = 0.2

    async def listen_until(done: Any) -> None:
        task = asyncio.ensure_future(state.listen())
        try:
            for _ in range(200):
                if done():
                    return
                await asyncio.sleep(0.05)
            raise AssertionError("the listener did not join again")
        finally:
            task.cancel()

    asyncio.run(listen_until(lambda: state.joins >= 3))
    # A join that hangs: given up on after JOIN_WAIT, said, and tried again.
    silent.hang_joins = True
    joins = state.joins
    with caplog.at_level("WARNING", logger="gateway"):
        asyncio.run(listen_until(lambda: "could not hear change events" in caplog.text))
    assert state.joins == joins


# A process whose state reads the table continually, then stops without State.stop: its
# interpreter's exit shuts the reader down under a pass ("cannot schedule new futures after
# interpreter shutdown", logged with its traceback as a failed read).
STOPPING = """
import asyncio, logging, os, signal, sys, threading, time
import django
django.setup()
logging.basicConfig(level=logging.INFO)
from gateway.records.state import State
from gateway.path.table import Table
passes = threading.Event()
def loader():
    passes.set()
    return Table()
async def main():
    state = State(loader=loader, interval=0.0005)
    state.start()
    assert await state.first_load(30)
how = sys.argv[1]
asyncio.run(main())
assert passes.wait(30)
print("passing", flush=True)
if how == "exit":
    sys.exit(0)
if how == "signal":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(30)
if how == "interrupt":
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(30)
"""


def test_a_process_that_stops_says_nothing_of_the_passes_it_cuts_short(tmp_path: Any) -> None:
    """Its main code ends, it calls sys.exit, a SIGTERM handler exits, or it is
    interrupted (SIGINT): twice each, side by side (the pass the exit cuts is a race)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, DJANGO_SETTINGS_MODULE="tests.settings", PYTHONPATH=str(root))
    script = tmp_path / "stopping.py"
    script.write_text(STOPPING)
    runs = [
        (how, subprocess.Popen([sys.executable, str(script), how], cwd=root, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        for how in ("end", "exit", "signal", "interrupt") * 2
    ]  # fmt: skip
    for how, proc in runs:
        out, err = proc.communicate(timeout=120)
        assert "passing" in out, (how, out, err)
        assert "could not read" not in err and "RuntimeError" not in err, (how, err)
        if how != "interrupt":  # KeyboardInterrupt's own traceback
            assert "Traceback" not in err, (how, err)
