"""Two ``gateway serve`` processes behave as one through Redis, in production's arrangement
(tests/e2e/faultplane.py: web, worker, beat, two gateways, PostgreSQL and Redis behind
proxies, simulated nodes with sim engines), asked with the official openai client:

- a replica refusing connections, ejected by the first gateway after its own failures,
  is skipped by the second within a second, and none of the second's requests fails on it;
- a judge's breaker opened by the first gateway's failures is open in the second: its
  first request is refused under ``fail: closed`` with the judge skipped, not asked;
- a band's admissions across both gateways stay within its allowance plus one;
- with Redis cut, both go on serving alone (each ejects a dead replica on its own) and
  say so, and share again once it is back.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from cluster.models import Assignment, Replica
from gateway.models import Refusal
from guard.models import JudgeBreaker
from guard.services import set_policy
from llmgw_core.models import ApiToken
from tests.catalog.samples import store
from tests.e2e.conftest import Agent, wait_for
from tests.e2e.faultplane import FaultPlane, GatewayProcess, Load, sim_model
from tests.e2e.faults.test_ejection import failures_on, pin
from tests.faultproxy import FaultProxy

pytestmark = pytest.mark.e2e

JUDGE_TIMEOUT = 1
FAILURES = 3
OWN = r"ejected from routing for \S+ s after"
ADOPTED = "by another gateway process"


@pytest.fixture
def plane(monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> FaultPlane:
    """The fault plane, its processes started with a short judge timeout and breaker."""
    monkeypatch.setenv("LLMGW_GUARD_JUDGE_TIMEOUT", str(JUDGE_TIMEOUT))
    monkeypatch.setenv("LLMGW_GUARD_BREAKER_FAILURES", str(FAILURES))
    monkeypatch.setenv("LLMGW_GUARD_BREAKER_BACKOFF", "30")
    monkeypatch.setenv("LLMGW_GUARD_BREAKER_PROBE_EVERY", "30")
    return request.getfixturevalue("fault_plane")  # type: ignore[no-any-return]


@contextmanager
def proxied_replica(model: str) -> Iterator[tuple[int, FaultProxy]]:
    """One of ``model``'s replicas reached through a proxy the test cuts (its endpoint held
    there: ``test_ejection.pin``)."""
    replica = Replica.objects.filter(model_name=model, state="ready").order_by("pk")[0]
    real = urlsplit(replica.endpoint)
    proxy = FaultProxy((real.hostname or "127.0.0.1", real.port or 80)).start()
    done = threading.Event()
    pinning = threading.Thread(target=pin, args=(replica.pk, f"http://127.0.0.1:{proxy.port}",
                                                 done), daemon=True)  # fmt: skip
    pinning.start()
    try:
        yield replica.pk, proxy
    finally:
        done.set()
        pinning.join(5)
        proxy.stop()


def said(gw: GatewayProcess, pattern: str) -> int:
    return len(re.findall(pattern, gw.output()))


@contextmanager
def loading(urls: list[str], key: str, model: str) -> Iterator[Load]:
    load = Load(urls, key, model, clients=3)
    load.start()
    try:
        yield load
    finally:
        load.stop()


def test_a_replica_ejected_by_one_gateway_is_skipped_by_the_other_within_a_second(
    plane: FaultPlane, agents: Callable[..., Agent]
) -> None:
    plane.sim_cluster(agents, model="steady", replicas=2)
    key = plane.key("load")
    first, second = plane.gateways
    with proxied_replica("steady") as (replica, proxy):
        plane.serving(key, "steady")
        own, adopted = rf"replica {replica} of steady {OWN}", rf"replica {replica} .*{ADOPTED}"
        with loading([first.url], key, "steady") as load:
            wait_for(lambda: proxy.passed >= 2, 60, "requests through the proxied replica")
            load.wait_for_answers(10)
            cut = load.now()
            proxy.refuse()
            proxy.stop()
            wait_for(lambda: said(first, own), 30, "the first gateway to eject it")
            ejected = time.monotonic()
            # A pass every quarter second: within a second; a second more for the loaded
            # machine and this test's look at the log every quarter second.
            wait_for(lambda: said(second, rf"replica {replica} of steady ejected from "
                                          rf"routing for \S+ s {ADOPTED}"), 2,
                     "the second gateway to skip it")  # fmt: skip
            took = time.monotonic() - ejected
            with loading([second.url], key, "steady") as other:
                other.wait_for_answers(30)
            load.wait_for_answers(10)
    assert failures_on(plane, replica)[second.name] == 0, second.output()[-3000:]
    assert said(second, own) == 0 and said(second, adopted) == 1
    assert other.failures == [], other.summary()
    assert load.failures == [] and load.since(cut), load.summary()
    sys.stderr.write(f"\nreplica {replica} skipped by the second gateway {took:.2f} s after "
                     f"the first ejected it; the second's load: {other.summary()}\n")  # fmt: skip


def judge_pid() -> int:
    a = Assignment.objects.filter(replica__model_name="judge", state="ready").exclude(pid=None)
    return int(a.values_list("pid", flat=True).first() or 0)


def refused(client: openai.OpenAI) -> str:
    """Ask; the refusal's request id (400 content_filter), or "" when answered."""
    try:
        client.chat.completions.create(
            model="steady", messages=[{"role": "user", "content": "/echo closed"}]
        )
    except openai.BadRequestError as error:
        assert error.code == "content_filter", error
        return str(error.response.headers["x-request-id"])
    return ""


def test_a_judge_breaker_opened_in_one_gateway_is_open_in_the_other(
    plane: FaultPlane, agents: Callable[..., Agent]
) -> None:
    plane.sim_cluster(agents, model="steady", replicas=1, nodes=1)
    store(sim_model("judge", 1, role="guard", guard={"format": "qwen3guard"}))
    wait_for(judge_pid, 120, "the judge's engine ready")
    set_policy({"judge": {"models": ["judge"]}, "directions": ["requests"], "fail": "closed"},
               surface="cli", name="test")  # fmt: skip
    key = plane.key("load")
    plane.serving(key, "steady")  # judged and allowed by both
    first, second = plane.gateways
    clients = [openai.OpenAI(base_url=gw.url + "/v1", api_key=key, max_retries=0, timeout=60)
               for gw in plane.gateways]  # fmt: skip
    pid = judge_pid()
    os.killpg(pid, signal.SIGSTOP)
    try:
        # The first gateway asks it until its breaker opens (each refused: fail: closed).
        for _ in range(FAILURES):
            assert refused(clients[0])
        procs = {gw.name: f"{os.uname().nodename}:{gw.proc.pid}" for gw in plane.gateways}
        open_in = lambda: set(JudgeBreaker.objects.filter(  # noqa: E731
            judge="judge", state="open").values_list("process", flat=True))  # fmt: skip
        heard = "judge judge: its circuit breaker is open, as another gateway process found it"
        wait_for(lambda: said(second, heard), 5, "the second gateway to hear of it")
        # The second's first request: refused at once, the judge skipped (not asked).
        rid = refused(clients[1])
        assert rid
        wait_for(lambda: open_in() >= set(procs.values()), 30, "the breaker open in both")
    finally:
        os.killpg(pid, signal.SIGCONT)
    record = wait_for(lambda: Refusal.objects.filter(request_id=rid).first(), 30, "its record")
    assert [(f["judge"], f["kind"]) for f in record.failures] == [("judge", "breaker_open")]
    assert not record.judged


def unshared(plane: FaultPlane, token: str, kind: str) -> float:
    """``llmgw_gateway_shared_local_total{kind}`` of this host's gateways (one folder)."""
    got = httpx.get(plane.gateways[0].url + "/metrics", timeout=10,
                    headers={"Authorization": f"Bearer {token}"})  # fmt: skip
    assert got.status_code == 200, got.text
    return sum(
        s.value
        for family in text_string_to_metric_families(got.text)
        for s in family.samples
        if s.name == "llmgw_gateway_shared_local_total" and s.labels.get("kind") == kind
    )


def test_with_redis_cut_both_gateways_serve_alone_and_share_again_after(
    plane: FaultPlane, agents: Callable[..., Agent], viewer: Any
) -> None:
    plane.sim_cluster(agents, model="steady", replicas=2)
    key = plane.key("load")
    first, second = plane.gateways
    assert plane.redis is not None
    with proxied_replica("steady") as (replica, proxy):
        plane.serving(key, "steady")
        own = rf"replica {replica} of steady {OWN}"
        with loading(plane.urls(), key, "steady") as load:
            wait_for(lambda: proxy.passed >= 2, 60, "requests through the proxied replica")
            load.wait_for_answers(10)
            plane.redis.refuse()
            alone = "alone while Redis does not answer"
            wait_for(lambda: said(first, alone) and said(second, alone), 30, "both alone")
            cut = load.now()
            proxy.refuse()
            proxy.stop()
            # Each ejects it after its own failures (nothing is shared while Redis is away).
            wait_for(lambda: said(first, own) and said(second, own), 30, "both to eject it")
            load.wait_for_answers(20)
            plane.redis.heal()
            back = "shared in Redis again"
            wait_for(lambda: said(first, back) and said(second, back), 30, "both shared again")
            load.wait_for_answers(10)
    assert load.failures == [] and load.since(cut), load.summary()
    # Said in /metrics too: each gateway's ejection made alone.
    _, token = ApiToken.issue(viewer, "prometheus")
    assert unshared(plane, token, "ejection") >= 2


@pytest.fixture
def admission_plane(monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> FaultPlane:
    """The fault plane with a long admission window (one slow first token keeps the model
    under pressure through the test) and no queue (a held request is refused at once)."""
    monkeypatch.setenv("LLMGW_ADMISSION_WINDOW", "60")
    monkeypatch.setenv("LLMGW_ADMISSION_QUEUE_MS", "0")
    return request.getfixturevalue("fault_plane")  # type: ignore[no-any-return]


ALLOWANCE = re.compile(r"at most (\d+) in flight")


def streamed(url: str, key: str) -> tuple[int, str]:
    """One streamed request of ``banded``: (200, its first token's seconds, for the
    figures) or (status, message)."""
    client = openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=60)
    start, first = time.monotonic(), None
    try:
        for _ in client.chat.completions.create(
            model="banded", messages=[{"role": "user", "content": "hello"}], stream=True
        ):
            first = first or time.monotonic() - start
    except openai.APIStatusError as error:
        return error.status_code, error.message
    return 200, f"{first or 0:.2f}"


def through_slow_proxy(url: str, key: str) -> bool:
    """One streamed request answered, its first token 2.5 s or more after it was sent."""
    status, said_ = streamed(url, key)
    assert status == 200, said_
    return float(said_) >= 2.5


def allowances(messages: list[str]) -> list[int]:
    return [int(m.group(1)) for text in messages if (m := ALLOWANCE.search(text))]


def burst(urls: list[str], key: str) -> list[tuple[str, int, str]]:
    """One streamed request of ``key`` to each of ``urls``, all at once; each answer's
    (url, status, message) once every one has ended."""
    results: list[tuple[str, int, str]] = []
    start = threading.Barrier(len(urls))

    def one(url: str) -> None:
        start.wait(30)
        results.append((url, *streamed(url, key)))

    threads = [threading.Thread(target=one, args=(u,), daemon=True) for u in urls]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    assert len(results) == len(urls), results
    return results


def test_a_lower_band_admitted_across_both_gateways_within_its_allowance_plus_one(
    admission_plane: FaultPlane, agents: Callable[..., Agent]
) -> None:
    plane = admission_plane
    # First tokens at 50 ms, well within the slo of 2 s; answers of 1 to 3.5 s.
    sim = {"LLMGW_SIM_TTFT": "0.05", "LLMGW_SIM_TPS": "20", "LLMGW_SIM_PARALLEL": "32"}
    plane.sim_cluster(agents, model="banded", replicas=1, nodes=1,
                      slo={"ttft_p99": "2000ms"}, profile={"env": sim})  # fmt: skip
    high = plane.key("prod", "--priority", "high")
    low = plane.key("batch", "--priority", "low")
    first, second = plane.gateways
    bursts: list[tuple[int, int, list[int]]] = []
    firsts: list[str] = []  # the admitted ones' first tokens, seconds (the figures)
    with proxied_replica("banded") as (_, proxy):
        plane.serving(high, "banded")
        plane.serving(low, "banded")
        # One slow first token at the first gateway: the model is under pressure, the
        # lower bands' allowance starts at half of what is in flight (none: 0).
        # Each gateway's table takes the pinned endpoint on a pass of its own, and an
        # agent's report may set it back for a moment: a first token of 2.5 s or more says
        # the request went through the proxy (one that did not is fast, within the slo).
        proxy.slow(2.5)
        wait_for(lambda: through_slow_proxy(first.url, high), 90,
                 "a high request's slow first token through the proxy at the first gateway")  # fmt: skip
        proxy.heal()
        # The next request there finds it (a low one: held, the allowance 0), and the
        # second gateway hears of it.
        assert streamed(first.url, low)[0] == 429
        heard = "model banded is under pressure, as another gateway process found it"
        wait_for(lambda: said(second, heard), 5, "the second gateway to hear of it")
        # The top band is never held: its fast first tokens at each gateway are the last
        # ones measured, so the allowance may grow.
        for gw in plane.gateways:
            for _ in range(3):
                assert streamed(gw.url, high)[0] == 200
        # Bursts of low requests, half at each gateway, each burst more than twice the
        # allowance the last said, until one meets an allowance of 2 or more (it grows by
        # one a second while the band waits and the first tokens are fast), where two
        # gateways each keeping its own would let in twice the allowance, past it plus one.
        allowance = 0
        while allowance < 2:
            assert len(bursts) < 40, (bursts, firsts)
            n = max(allowance, 2) + 2
            results = burst([first.url] * n + [second.url] * n, low)
            admitted = [r for r in results if r[1] == 200]
            held = [r for r in results if r[1] == 429]
            assert len(admitted) + len(held) == len(results), results
            told = allowances([r[2] for r in held])
            assert len(told) == len(held), held  # each held one says its allowance
            bursts.append((len(results), len(admitted), told))
            firsts += [r[2] for r in admitted]
            # Across both gateways: within the allowance said, plus one (one step of it
            # within the burst).
            assert len(admitted) <= max(told) + 1, (bursts, firsts)
            allowance = max(told)
    last_admitted = bursts[-1][1]
    assert {r[0] for r in held} == {first.url, second.url}, results  # held at both
    assert last_admitted >= 1, bursts
    sys.stderr.write(
        "\nbursts of low requests across both gateways (sent, admitted, allowance said): "
        + "; ".join(f"{n}, {a}, {sorted(set(s))}" for n, a, s in bursts)
        + "\n"
    )
