"""The canary watch: its share routed through the real Gateway, its outcomes judged, the
rollback written once through the catalog's services, as done by the gateway.

Every rollback here is the real one (``gateway.records.watch.roll_back``, through
``catalog.services``): the tests look at the catalog's state and its change log, and a
harness whose table is read from the stored catalog (``CatalogHarness``) routes by what
the write left there, as a gateway process's state does."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from catalog import spec
from gateway.path.table import Table, build
from gateway.records.observe import Done, Fanout
from gateway.records.watch import CanaryWatch, roll_back
from tests.gateway.harness import KEY, Harness, model, wait


def canaried(percent: int, **limits: Any) -> list[spec.Model]:
    return [model("m", canary=spec.Canary(model="c", percent=percent, **limits)), model("c")]


@pytest.fixture
def h() -> Iterator[Harness]:
    harness = Harness()
    yield harness
    harness.close()


class CatalogHarness(Harness):
    """The harness with its models read from the stored catalog each time its state
    reads the table (every 0.05 s, in the state's reader thread), as gateway.records.state's
    loader reads them: a rollback the watch writes is what the gateway routes by next."""

    def _table(self) -> Table:
        from catalog.services import stored_specs

        self.models = stored_specs()
        return super()._table()


@pytest.fixture
def hc(transactional_db: Any) -> Iterator[CatalogHarness]:
    harness = CatalogHarness()
    yield harness
    harness.close()


def rollbacks(name: str = "m") -> list[Any]:
    """Return the catalog's change log entries the gateway wrote for a model."""
    from catalog.models import ChangeRecord

    return list(ChangeRecord.objects.filter(model_name=name, surface="gateway").order_by("id"))


def canary_percent(name: str = "m") -> int:
    from catalog.models import ServedModel

    return ServedModel.objects.get(name=name).to_spec().canary.percent


def store_canaried(percent: int, candidate: str = "c", **limits: Any) -> None:
    """Store "c" and "m" whose canary sends ``percent`` to ``candidate``, as an operator."""
    from tests.catalog.samples import cpu_model, store

    store(cpu_model("c", aliases=["c-next"]),
          cpu_model("m", canary={"model": candidate, "percent": percent, **limits}))  # fmt: skip


def set_share(percent: int) -> None:
    """An operator puts the canary's share back (the catalog's own write)."""
    from catalog import codec, services
    from catalog.choices import Surface
    from tests.catalog.samples import cpu_model

    data = cpu_model("m", canary={"model": "c", "percent": percent, "min_requests": 10})
    m, problems = codec.decode_model(data)
    assert not problems, problems
    services.save_model(m, services.Actor(user=None, surface=Surface.CLI, name="operator"),
                        replacing="m")  # fmt: skip


def api(h: Harness) -> openai.OpenAI:
    return openai.OpenAI(base_url=h.url + "/v1", api_key=KEY, max_retries=0, timeout=10)


def ask(h: Harness, text: str) -> str:
    answer = api(h).chat.completions.create(
        model="m", messages=[{"role": "user", "content": text}])  # fmt: skip
    return answer.choices[0].message.content or ""


def test_the_canary_takes_its_share_of_conversations_and_keeps_them(h: Harness) -> None:
    main, cand = h.engine("main"), h.engine("cand")
    h.serve(canaried(25), [(1, "m", main), (2, "c", cand)])
    first = {n: ask(h, f"conversation {n}") for n in range(200)}
    share = sum(a.startswith("cand") for a in first.values()) / len(first)
    assert 0.15 <= share <= 0.35, share
    # Sticky: a conversation's next turn goes where its first went.
    for n in range(0, 200, 10):
        assert ask(h, f"conversation {n}")[:4] == first[n][:4]
    # At 0 percent nothing goes to the candidate.
    h.models = canaried(0)
    h.refresh()
    before = cand.requests
    for n in range(50):
        assert ask(h, f"conversation {n}").startswith("main")
    assert cand.requests == before


def test_a_failing_candidate_is_rolled_back_once_and_clients_never_see_it(
    hc: CatalogHarness,
) -> None:
    main, cand = hc.engine("main"), hc.engine("cand", behaviour="503")
    store_canaried(50, min_requests=20)
    hc.serve([], [(1, "m", main), (2, "c", cand)])
    watch = CanaryWatch(lambda: hc.state.table, interval=0.02)  # the real write: roll_back
    hc.gateway.observer = Fanout(watch)
    watch.start()
    wait(lambda: watch.tracked, what="the watch to track the canary")
    try:
        n = 0
        while not watch.rolled:
            # Every answer is the model's: the candidate's 503s moved on to it.
            assert ask(hc, f"conversation {n}").startswith("main")
            n += 1
            assert n < 400, "never rolled back"
        # The gateway routes by what the write left in the catalog.
        wait(lambda: hc.state.table.models["m"].canary.percent == 0, what="the share at 0")
        served = cand.requests
        for k in range(60):
            assert ask(hc, f"later {k}").startswith("main")
        assert cand.requests == served  # the candidate takes nothing more
    finally:
        watch.stop()
    assert canary_percent() == 0
    (change,) = rollbacks()  # written once
    assert change.action == "update" and change.actor is None
    assert change.summary.startswith(
        "canary: canary c rolled back: error rate 100% vs 0% over 20 requests"
    ), change.summary
    assert change.before["canary"]["percent"] == 50 and change.after["canary"]["percent"] == 0


def table(percent: int = 10, **limits: Any) -> Table:
    return build(canaried(percent, **limits), [], {})


def done(name: str, status: int = 200, ttft: float = 0.1) -> Done:
    return Done(model=name, status=status, owner="", key="k", seconds=ttft, ttft=ttft,
                tokens_in=1, tokens_out=1, replica=1, stream=False)  # fmt: skip


def test_a_rollback_is_not_written_again_until_the_table_shows_it(transactional_db: Any) -> None:
    from gateway.records.state import load_table

    store_canaried(10, min_requests=10)
    current = [load_table()]  # the table as this process last read it
    watch = CanaryWatch(lambda: current[0], start_on_request=False)
    watch.check()
    for _ in range(10):
        watch.request(done("c", 500))
        watch.request(done("m"))
    watch.check()
    assert canary_percent() == 0 and len(rollbacks()) == 1
    # An operator puts the share back while this process's table still shows the old one
    # (its read is on its way): more failures are not written again, though the catalog
    # would take a second rollback now.
    set_share(10)
    for _ in range(30):
        watch.request(done("c", 500))
    watch.check()
    watch.check()
    assert canary_percent() == 10 and len(rollbacks()) == 1
    # A table read after the write still shows a share (the operator's): judged afresh,
    # from new outcomes only.
    current[0] = load_table()
    watch.check()
    assert len(rollbacks()) == 1 and watch.window("c").requests == 0
    for _ in range(10):
        watch.retried("c")
    watch.check()
    assert canary_percent() == 0 and len(rollbacks()) == 2
    watch.stop()


def test_a_refused_write_is_tried_again_later(transactional_db: Any) -> None:
    """The catalog refuses the rollback while the candidate is gone from it (removed by
    SQL, under the catalog's services: its canary then names nothing); tried again after
    the back-off, it is written once the candidate is back."""
    from catalog.models import ServedModel
    from gateway.records.state import load_table
    from tests.catalog.samples import cpu_model, store

    store_canaried(30, min_requests=5)
    table = load_table()  # as this process read it, before "c" went
    watch = CanaryWatch(lambda: table, start_on_request=False)
    watch.check(now=0)
    ServedModel.objects.filter(name="c").delete()
    for _ in range(5):
        watch.request(done("c", 502))
    watch.check(now=1)  # refused by the catalog: nothing written
    assert canary_percent() == 30 and rollbacks() == [] and watch.rolled == []
    store(cpu_model("c"))
    watch.check(now=2)  # within the back-off: not tried
    assert canary_percent() == 30
    watch.check(now=7)
    assert canary_percent() == 0 and len(rollbacks()) == 1
    watch.stop()


def test_outcomes_that_say_nothing_of_the_engines_are_not_counted() -> None:
    watch = CanaryWatch(lambda: table(), start_on_request=False)
    watch.check()
    watch.request(dataclasses.replace(done("c", 503), replica=None))  # no engine reached
    watch.request(done("c", 499))  # the client went away
    watch.request(done("other", 500))  # in no canary
    assert watch.window("c").requests == 0 and watch.window("other").requests == 0
    watch.request(done("c", 400))  # the client's error: a request, no error, no TTFT
    watch.request(done("c", 200, ttft=0.3))
    watch.retried("c")
    assert watch.window("c") == type(watch.window("c"))(3, 1, 0.3, 1)
    watch.stop()


def test_the_watch_judges_off_the_request_path(transactional_db: Any) -> None:
    """The write runs in the watch's own thread, not the one telling it of requests: the
    catalog's change is committed there (its catalog_changed is sent from that thread)."""
    from catalog.signals import catalog_changed
    from gateway.records.state import load_table

    store_canaried(30, min_requests=5)
    threads: list[threading.Thread] = []

    def receiver(sender: Any, names: list[str], **kw: Any) -> None:
        threads.append(threading.current_thread())

    catalog_changed.connect(receiver, weak=False, dispatch_uid="test-canary-thread")
    watch = CanaryWatch(load_table, interval=0.01)
    watch.start()
    try:
        wait(lambda: watch.tracked, what="tracking")
        for _ in range(5):
            watch.request(done("c", 500))
        wait(lambda: threads, what="the rollback")
    finally:
        watch.stop()
        catalog_changed.disconnect(dispatch_uid="test-canary-thread")
    assert threads[0] is not threading.current_thread()
    assert threads[0].name == "gateway-canary"
    assert canary_percent() == 0 and len(rollbacks()) == 1


# The rollback written through the catalog's services.


def _store() -> None:
    from tests.catalog.samples import cpu_model, store

    store(cpu_model("c"), cpu_model("m", canary={"model": "c", "percent": 30}))


@pytest.fixture
def stored(db: Any) -> None:
    _store()


@pytest.fixture
def committed(transactional_db: Any) -> None:
    _store()  # committed: what the rollback's commit sends is its own


def test_the_rollback_is_written_as_the_gateways_with_its_figures(committed: None) -> None:
    from catalog.models import ChangeRecord, ServedModel
    from catalog.signals import catalog_changed

    heard: list[list[str]] = []

    def receiver(sender: Any, names: list[str], **kw: Any) -> None:
        heard.append(names)

    catalog_changed.connect(receiver, weak=False, dispatch_uid="test-canary-rollback")
    try:
        why = "canary c rolled back: error rate 12% vs 1% over 50 requests"
        assert roll_back("m", "c", why) is True
        # Written once: a second process deciding the same finds the share at 0.
        assert roll_back("m", "c", why) is False
    finally:
        catalog_changed.disconnect(dispatch_uid="test-canary-rollback")
    m = ServedModel.objects.get(name="m").to_spec()
    assert m.canary is not None and m.canary.model == "c" and m.canary.percent == 0
    change = ChangeRecord.objects.filter(model_name="m").order_by("-id").first()
    assert change is not None and change.action == "update"
    assert change.surface == "gateway" and change.get_surface_display() == "gateway"
    assert change.actor_name.startswith("gateway (") and change.actor is None
    assert change.summary == f"canary: {why}"
    assert change.before["canary"]["percent"] == 30 and change.after["canary"]["percent"] == 0
    assert ChangeRecord.objects.filter(model_name="m", surface="gateway").count() == 1
    # The consoles hear of it as of any catalog change (catalog_changed pushes the rows).
    assert heard == [["m"]]


def test_the_change_log_api_lists_the_gateways_changes(
    stored: None, viewer: Any, api_for: Any
) -> None:
    assert roll_back("m", "c", "canary c rolled back: error rate 50% vs 0% over 50 requests")
    listed = api_for(viewer).get("/api/v1/catalog/changes/", {"surface": "gateway"})
    assert listed.status_code == 200, listed.content
    (entry,) = listed.json()["results"]
    assert entry["model_name"] == "m" and entry["surface"] == "gateway"
    assert entry["summary"].endswith("error rate 50% vs 0% over 50 requests")


def test_a_canary_changed_meanwhile_is_left_alone(stored: None) -> None:
    from catalog.models import ServedModel

    assert roll_back("m", "someone-else", "x") is False
    assert roll_back("gone", "c", "x") is False
    assert ServedModel.objects.get(name="m").to_spec().canary.percent == 30


def test_the_watch_over_the_stored_catalog_rolls_back(stored: None) -> None:
    from catalog.models import ServedModel
    from gateway.records.state import load_table

    watch = CanaryWatch(load_table, start_on_request=False)
    watch.check()
    assert set(watch.tracked) == {"m", "c"}
    for _ in range(50):
        watch.request(done("m", ttft=0.05))
        watch.request(done("c", ttft=0.2))
    watch.check()
    assert ServedModel.objects.get(name="m").to_spec().canary.percent == 0
    assert watch.rolled and "mean time to first token 200 ms vs 50 ms" in watch.rolled[0][2]
    watch.check()
    assert watch.tracked == {}
    watch.stop()


def test_a_canary_named_by_an_alias_takes_its_share_and_is_watched(hc: CatalogHarness) -> None:
    """The catalog lets a canary name an alias; the gateway sent it nothing and the watch
    never looked at it."""
    main, cand = hc.engine("main"), hc.engine("cand", behaviour="503")
    store_canaried(50, candidate="c-next", min_requests=20)
    hc.serve([], [(1, "m", main), (2, "c", cand)])
    watch = CanaryWatch(lambda: hc.state.table, interval=0.02)
    hc.gateway.observer = Fanout(watch)
    watch.start()
    wait(lambda: watch.tracked, what="the watch to track the canary")
    try:
        assert set(watch.tracked) == {"m", "c"}
        n = 0
        while not watch.rolled:
            assert ask(hc, f"conversation {n}").startswith("main")
            n += 1
            assert n < 400, "never rolled back"
    finally:
        watch.stop()
    assert cand.requests >= 20  # it had its share
    # The rollback is written against the canary as the catalog names it.
    from catalog.models import ServedModel

    m = ServedModel.objects.get(name="m").to_spec()
    assert (m.canary.model, m.canary.percent) == ("c-next", 0)
    (change,) = rollbacks()
    assert change.summary.startswith("canary: canary c rolled back: error rate 100%"), change


def test_a_rollback_of_a_canary_named_by_an_alias_is_written(db: Any) -> None:
    from catalog.models import ServedModel
    from tests.catalog.samples import cpu_model, store

    store(cpu_model("c", aliases=["c-next"]),
          cpu_model("m", canary={"model": "c-next", "percent": 30}))  # fmt: skip
    assert roll_back("m", "c-next", "canary c rolled back: error rate 50% vs 0% over 50 requests")
    assert ServedModel.objects.get(name="m").to_spec().canary.percent == 0
