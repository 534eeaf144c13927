"""The capacity bench: its decisions (cluster.bench, hypothesis) and its runs against real
sim engines with a capacity, through a real gateway process (cluster.benchrun, the
command, the API, the console; tests/cluster/conftest.py)."""

from __future__ import annotations

from io import StringIO
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from hypothesis import given, settings
from hypothesis import strategies as st

from catalog.models import ChangeRecord, ServedModel
from cluster import bench, live
from cluster.models import ClusterAction, Replica
from gateway.models import ClientKey
from tests.catalog.samples import sim_model, sim_profile, store

# About 47 s for the file's 11 tests in a full run (load 2 to 10): listed with the
# long files, so that it starts early rather than end the run alone (tests/conftest.py).
pytestmark = pytest.mark.takes(4.2)

LIMIT = bench.Limits(ttft=0.5, tpot=None)


def level(c: int, ttft: float, failed: int = 0) -> bench.Level:
    samples = [bench.Sample(ttft, 0.02)] * 3 + [bench.Sample(9, None, ok=False)] * failed
    return bench.judge(c, samples, LIMIT)


def test_judging_a_level() -> None:
    assert level(4, 0.3).within
    assert not level(4, 0.6).within
    assert not level(4, 0.3, failed=1).within
    tight = bench.Limits(ttft=1.0, tpot=0.01)
    assert not bench.judge(2, [bench.Sample(0.1, 0.02)], tight).within


def test_limits_without_a_slo_are_twice_one_request_alone() -> None:
    got = bench.limits(0, 0, [bench.Sample(0.2, 0.02), bench.Sample(0.3, 0.04)])
    assert got == bench.Limits(ttft=0.6, tpot=0.08, derived=True)
    assert bench.limits(2_000_000_000, 0) == bench.Limits(2.0, None)


def search(true_capacity: int, top: int = 128) -> tuple[int, list[int]]:
    done: list[bench.Level] = []
    tried = []
    while (c := bench.next_level(done, top)) is not None:
        tried.append(c)
        done.append(level(c, 0.2 if c <= true_capacity else 0.9))
        assert len(tried) < 40
    return bench.capacity(done), tried


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 128))
def test_the_search_finds_the_capacity(true_capacity: int) -> None:
    found, tried = search(true_capacity)
    assert found == true_capacity
    assert len(set(tried)) == len(tried)  # no level twice


def test_the_table() -> None:
    lines = bench.table([level(2, 0.2), level(1, 0.1), level(3, 0.9)], LIMIT)
    assert lines[0] == "limits (slo): TTFT p99 500 ms, TPOT p99 -"
    assert [line.split()[0] for line in lines[2:]] == ["1", "2", "3"]
    assert lines[-1].endswith("no")


# -- against real sim engines -----------------------------------------------------------


def two_profiles() -> None:
    big, small = sim_profile("big", tp=None), sim_profile("small", gpu_class="nvidia-l4", tp=None)
    store(sim_model("chat", 2, source="org/chat", slo={"ttft_p99": "400ms"}, profiles=[big, small]))


def ready_replica(profile: str, sims: Any, parallel: int) -> Replica:
    served = ServedModel.objects.get(name="chat")
    r = Replica.objects.create(model=served, model_name="chat", profile=profile,
                               state="ready", reason="ready")  # fmt: skip
    r.endpoint = sims("chat", r.pk, parallel).url
    r.save()
    return r


@pytest.mark.django_db(transaction=True)
def test_two_profiles_three_to_one_measure_three_to_one(sims: Any, gateway: Any) -> None:
    two_profiles()
    ready_replica("big", sims, 6)
    small = ready_replica("small", sims, 2)
    out = StringIO()
    call_command("cluster", "bench", "chat", "--profile", "big", stdout=out)
    text = out.getvalue()
    assert "engine check: whole and streamed answers are well-formed" in text
    assert "limits (slo): TTFT p99 400 ms" in text
    call_command("cluster", "bench", "chat", "--profile", "small", stdout=StringIO())
    m = ServedModel.objects.get(name="chat").to_spec()
    big_p, small_p = m.profiles
    ratio = big_p.weight / small_p.weight
    assert abs(ratio - 3) <= 0.3, f"big {big_p.weight}, small {small_p.weight}"
    assert (big_p.capacity, small_p.capacity) == (big_p.weight, small_p.weight)
    record = ChangeRecord.objects.filter(model_name="chat").latest("id")
    assert record.actor_name.endswith("(cli)") and "bench: capacity" in record.summary
    done = ClusterAction.objects.filter(action="bench done").latest("id")
    assert "capacity" in done.detail and "clients" in done.detail
    assert live.model_row("chat").bench.startswith("bench done: chat profile small")
    # A weight is the router's only: the replica is not made outdated by it.
    small.refresh_from_db()
    assert not live.model_row("chat").outdated


@pytest.mark.django_db(transaction=True)
def test_an_engine_answering_badly_is_refused_before_it_is_timed(sims: Any, gateway: Any) -> None:
    two_profiles()
    r = ready_replica("big", sims, 2)
    Replica.objects.filter(pk=r.pk).update(endpoint=r.endpoint + "/nowhere")
    with pytest.raises(CommandError, match="engine check: a whole answer was HTTP 404"):
        call_command("cluster", "bench", "chat", stdout=StringIO())
    assert ServedModel.objects.get(name="chat").to_spec().profiles[0].capacity == 0
    assert ClusterAction.objects.filter(action="bench failed").exists()
    # The run's client key was revoked all the same.
    assert ClientKey.objects.filter(replica=r.pk).exists()
    assert not ClientKey.objects.filter(replica=r.pk, revoked__isnull=True).exists()


@pytest.mark.django_db
def test_no_ready_replica_or_profile_says_what_to_do() -> None:
    two_profiles()
    with pytest.raises(CommandError, match="has no ready replica of profile big to measure"):
        call_command("cluster", "bench", "chat", "--profile", "big", stdout=StringIO())
    with pytest.raises(CommandError, match=r"has no profile tiny \(its profiles: big, small\)"):
        call_command("cluster", "bench", "chat", "--profile", "tiny", stdout=StringIO())
    with pytest.raises(CommandError, match="model nope is not in the catalog"):
        call_command("cluster", "bench", "nope", stdout=StringIO())


@pytest.mark.django_db
def test_the_api_and_the_console_refuse_what_cannot_run_and_need_an_operator(
    api_for: Any, client_for: Any, viewer: Any, operator: Any
) -> None:
    two_profiles()
    url = "/api/v1/cluster/models/chat/bench/"
    assert api_for(viewer).post(url, {}, format="json").status_code == 403
    api = api_for(operator)
    r = api.post(url, {"profile": "tiny"}, format="json")
    assert r.status_code == 404 and "its profiles: big, small" in r.json()["detail"]
    r = api.post(url, {}, format="json")
    assert r.status_code == 409 and "no ready replica" in r.json()["detail"]
    r = api.post(url, {"profile": ["x"]}, format="json")
    assert r.status_code == 400
    assert api.post("/api/v1/cluster/models/nope/bench/", {}, format="json").status_code == 404
    assert client_for(viewer).post("/cluster/models/chat/bench/").status_code == 403
    assert not ClusterAction.objects.filter(action="bench").exists()


@pytest.mark.django_db(transaction=True)
def test_the_console_button_and_the_api_start_it_in_the_background(
    sims: Any, gateway: Any, api_for: Any, client_for: Any, operator: Any
) -> None:
    from tests.waiting import wait_until

    two_profiles()
    ready_replica("small", sims, 2)
    html = client_for(operator).post("/cluster/models/chat/bench/").content.decode()
    assert 'data-role="bench-state">bench: started' in html
    ended = ("bench done", "bench failed")
    wait_until(lambda: ClusterAction.objects.filter(action__in=ended).exists(), timeout=120,
               what="the console's bench to end")  # fmt: skip
    assert ClusterAction.objects.get(action__in=ended).action == "bench done"
    r = api_for(operator).post("/api/v1/cluster/models/chat/bench/", {"profile": "small"},
                               format="json")  # fmt: skip
    assert r.status_code == 202 and r.json()["status"] == "started"
    wait_until(lambda: ClusterAction.objects.filter(action__in=ended).count() == 2,
               timeout=120, what="the API's bench to end")  # fmt: skip
    assert ClusterAction.objects.filter(action="bench done").count() == 2
    assert ServedModel.objects.get(name="chat").to_spec().profiles[1].capacity == 2
    html = client_for(operator).get("/cluster/").content.decode()
    assert "bench done: chat profile small: capacity 2" in html


def test_the_sim_slows_as_its_batch_fills() -> None:
    from agent.sim import SimServer
    from agent.simconfig import Config

    async def stretch_at(busy: int) -> float:
        server = SimServer(Config(model="m", parallel=4, slowdown=0.5))
        server.slots.busy = busy
        return server.stretch()

    import asyncio

    assert [asyncio.run(stretch_at(n)) for n in (0, 1, 2, 4)] == [1.0, 1.0, 1.5, 2.5]


@pytest.mark.django_db
def test_the_cluster_page_offers_bench_for_a_ready_model_and_never_for_a_judge(
    client_for: Any, operator: Any
) -> None:
    """The bench goes through the gateway, which serves judges to no client: the first
    start's walk found a Bench button on the sim judge that could only be refused."""
    from tests.guard.helpers import guard_model

    two_profiles()
    guard_model("judge", endpoint="http://127.0.0.1:9")
    served = ServedModel.objects.get(name="chat")
    Replica.objects.create(model=served, model_name="chat", state="ready", endpoint="http://x")
    html = client_for(operator).get("/cluster/").content.decode()
    assert 'id="' + live.model_dom_id("judge") + '"' in html  # its card is there
    assert "/cluster/models/judge/bench/" not in html
    assert "/cluster/models/chat/bench/" in html
