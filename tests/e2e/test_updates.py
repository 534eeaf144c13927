"""Updates end to end in production mode: three updates of one model while clients ask.

Real processes (tests/e2e/faultplane.py, no fault injected): the web process, a Celery
worker and beat, two ``gateway serve`` processes, PostgreSQL and Redis; two simulated
nodes whose agents run sim engines taking their weights file from the control plane's
mirror; the Hub stand-in as the registry (``HF_ENDPOINT``), through the real
``huggingface_hub``; openai clients sending chat requests to both gateways throughout.
An operator starts each update over the API with a token, ``auto`` and a 50 % canary:

1. "worse" weights (arithmetic 30 %) are stopped by the eval gate: the update fails at
   its eval naming the failed cases, the candidate goes, the model is untouched;
2. "failing" weights (every second request answered 500) pass the eval and are rolled
   back by the gateway's canary: the update fails with the canary's figures;
3. "better" weights pass both and are promoted: the model's origin is the new revision
   with the old one as previous, its replicas roll to it (an arithmetic question is then
   answered right), and no client request failed, through all three.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from django.db import connection

from catalog.services import stored_specs
from cluster.models import Node, Replica
from tests.catalog.samples import sim_model, store
from tests.e2e.conftest import wait_for
from tests.e2e.faultplane import FAST, H100, FaultPlane
from tests.e2e.test_faults import Redis, api
from tests.faultproxy import FaultProxy
from tests.updates.hubstandin import HubStandIn
from updates import mirror
from updates.models import UpdateRun

pytestmark = [pytest.mark.e2e]

REPO = "acme/chat"


def weights(name: str, **figures: float) -> bytes:
    return json.dumps({"llmgw-sim-weights": 1, "name": name, **figures}).encode()


@pytest.fixture
def hub() -> Iterator[HubStandIn]:
    with HubStandIn() as stand_in:
        yield stand_in


@pytest.fixture
def control_plane(
    transactional_db: Any, tmp_path: Path, hub: HubStandIn, settings: Any
) -> Iterator[FaultPlane]:
    """Production (web, worker, beat, two gateways) with the mirror on the Hub stand-in;
    the test process reads the same mirror folder."""
    db = connection.settings_dict
    redis = Redis(tmp_path)
    redis.start()
    pg = FaultProxy((db["HOST"] or "127.0.0.1", int(db["PORT"] or 5432))).start()
    rp = FaultProxy(("127.0.0.1", redis.port)).start()
    plane = FaultPlane(tmp_path, pg=pg, redis=rp)
    mirror_dir = tmp_path / "mirror"
    plane.extra.update(
        HF_ENDPOINT=hub.url,
        LLMGW_MIRROR_DIR=str(mirror_dir),
        LLMGW_MIRROR_HOSTS=hub.url,
        LLMGW_GATEWAY_URL=plane.url,
    )
    settings.HF_ENDPOINT = hub.url
    settings.LLMGW_MIRROR = True
    settings.LLMGW_MIRROR_DIR = mirror_dir
    settings.LLMGW_MIRROR_HOSTS = [hub.url]
    try:
        plane.start_all()
        yield plane
    finally:
        plane.stop_all()
        pg.stop()
        rp.stop()
        redis.stop()


def spec() -> Any:
    return stored_specs(names=["chat"])[0]


def ended(pk: int) -> UpdateRun | None:
    r = UpdateRun.objects.get(pk=pk)
    return r if r.state not in ("running", "waiting") else None


def start(client: httpx.Client) -> int:
    answer = client.post("/catalog/models/chat/update/", json={"auto": True, "canary_percent": 50})
    assert answer.status_code == 202, answer.text
    return int(answer.json()["id"])


def candidate_gone(r: UpdateRun) -> bool:
    return (
        not stored_specs(names=[r.candidate])
        and not Replica.objects.filter(model_name=r.candidate, desired=True).exists()
    )


def test_worse_weights_stop_at_the_gate_failing_ones_at_the_canary_better_ones_are_promoted(
    control_plane: FaultPlane, agents: Any, hub: HubStandIn, operator: Any
) -> None:
    plane = control_plane
    first = hub.commit(
        REPO, {"sim-weights.json": weights("v1", arithmetic=0.0), "README.md": b"v1"}
    )
    for i in range(2):
        agents(f"up-{i}", "--simulate", f"3x {H100}", "--stop-engines-on-exit")
    wait_for(lambda: Node.objects.filter(health="ready").count() == 2, 60, "the nodes")
    store(sim_model("chat", 2, source=REPO, profile={"env": dict(FAST)},
                    eval={"suite": "arithmetic", "min_score": 0.8}))  # fmt: skip
    fetch = mirror.request_fetch("chat", by="test", surface="cli", start=False)
    assert mirror.run_fetch(fetch.pk).state == "done"
    assert spec().origin.revision == first
    wait_for(lambda: Replica.objects.filter(model_name="chat", state="ready").count() >= 2,
             120, "two replicas of chat ready")  # fmt: skip
    key = plane.key("load")
    ops = api(plane, operator)

    with plane.load(key, "chat", clients=4) as load:
        load.wait_for_answers(20)

        # 1. Worse weights: the eval gate stops them.
        hub.commit(REPO, {"sim-weights.json": weights("worse", arithmetic=0.3), "README.md": b"v2"})
        pk = start(ops)
        r = wait_for(lambda: ended(pk), 240, "the worse update to end")
        assert (r.state, r.step) == ("failed", "eval"), (r.state, r.reason, r.lines)
        assert r.reason.startswith("eval arithmetic: score ") and "below 0.80; failed: " in r.reason
        assert r.score is not None and r.score < 0.8 and r.failed_cases
        assert spec().origin.revision == first and spec().canary is None
        wait_for(lambda: candidate_gone(r), 60, "the worse candidate to go")

        # 2. Failing weights: past the eval, rolled back by the gateway's canary.
        hub.commit(
            REPO, {"sim-weights.json": weights("failing", error_rate=0.5), "README.md": b"v3"}
        )
        pk = start(ops)
        r = wait_for(lambda: ended(pk), 300, "the failing update to end")
        assert (r.state, r.step) == ("failed", "canary"), (r.state, r.reason, r.lines)
        assert r.score is not None and r.score >= 0.8
        assert "rolled back: error rate" in r.reason, r.reason
        assert r.canary["why"] == r.reason
        assert spec().origin.revision == first and spec().canary is None
        wait_for(lambda: candidate_gone(r), 60, "the failing candidate to go")

        # 3. Better weights: promoted, the replicas rolled to them, no request failed.
        better = hub.commit(REPO, {"sim-weights.json": weights("better"), "README.md": b"v4"})
        before = set(
            Replica.objects.filter(model_name="chat", desired=True).values_list("pk", flat=True)
        )
        pk = start(ops)
        r = wait_for(lambda: ended(pk), 300, "the better update to end")
        assert r.state == "promoted", (r.state, r.reason, r.lines)
        m = spec()
        assert m.origin.revision == better and m.origin.previous.revision == first
        assert m.canary is None

        def rolled() -> bool:
            desired = Replica.objects.filter(model_name="chat", desired=True)
            ready = desired.filter(state="ready")
            return desired.count() == ready.count() == 2 and not {x.pk for x in ready} & before

        wait_for(rolled, 240, "chat's replicas rolled to the better weights")
        wait_for(lambda: candidate_gone(r), 60, "the better candidate to go")
        load.wait_for_answers(20)

    assert load.failures == [], load.summary()
    client = openai.OpenAI(base_url=plane.urls()[0] + "/v1", api_key=key, max_retries=0, timeout=30)
    answers = {
        (client.chat.completions.create(
            model="chat", messages=[{"role": "user", "content": f"What is {a} + 5?"}]
        ).choices[0].message.content)
        for a in range(10, 30)
    }  # fmt: skip
    assert answers == {str(a + 5) for a in range(10, 30)}
    assert [x.model for x in UpdateRun.objects.order_by("pk")] == ["chat"] * 3
    # Every update is recorded with who started it, through the API.
    assert {x.surface for x in UpdateRun.objects.all()} == {"api"}
    assert all(x.started_by.startswith(operator.username) for x in UpdateRun.objects.all())


def test_a_promote_on_a_full_node_keeps_a_lone_replica_s_model_answering(
    control_plane: FaultPlane, agents: Any, hub: HubStandIn, operator: Any
) -> None:
    """One node of two cards: the model's one replica on one, the candidate on the other.
    The replacement has no room beside the old replica, which stops first; the candidate
    answers the model's requests until the replacement is ready, then goes."""
    plane = control_plane
    hub.commit(REPO, {"sim-weights.json": weights("v1"), "README.md": b"v1"})
    agents("full-0", "--simulate", f"2x {H100}", "--stop-engines-on-exit")
    wait_for(lambda: Node.objects.filter(health="ready").count() == 1, 60, "the node")
    store(sim_model("chat", source=REPO, profile={"env": dict(FAST)}))
    fetch = mirror.request_fetch("chat", by="test", surface="cli", start=False)
    assert mirror.run_fetch(fetch.pk).state == "done"
    wait_for(lambda: Replica.objects.filter(model_name="chat", state="ready").count() == 1,
             120, "chat's replica ready")  # fmt: skip
    [old] = Replica.objects.filter(model_name="chat", desired=True)
    key = plane.key("load")
    ops = api(plane, operator)
    # Why the old replica stops is its reason from the control plane's stop until its
    # agent's next report (a moment): read every 10 ms by a thread of its own, not at the
    # pace of the waits below.
    why_old_stopped: list[str] = []
    watched = threading.Event()

    def watch() -> None:
        try:
            while not watched.wait(0.01):
                for why in Replica.objects.filter(pk=old.pk).values_list("reason", flat=True):
                    if why not in why_old_stopped:
                        why_old_stopped.append(why)
        finally:
            connection.close()

    watcher = threading.Thread(target=watch, name="why-old-stopped", daemon=True)
    watcher.start()
    try:
        with plane.load(key, "chat", clients=4) as load:
            load.wait_for_answers(20)
            better = hub.commit(REPO, {"sim-weights.json": weights("v2"), "README.md": b"v2"})
            answer = ops.post(
                "/catalog/models/chat/update/", json={"auto": True, "canary_percent": 0}
            )
            assert answer.status_code == 202, answer.text
            pk = int(answer.json()["id"])
            r = wait_for(lambda: ended(pk), 240, "the update to end")
            assert r.state == "promoted", (r.state, r.reason, r.lines)
            assert spec().origin.revision == better

            def rolled() -> bool:
                # One read: between a count and a row the replica may leave ready.
                ready = list(Replica.objects.filter(model_name="chat", desired=True, state="ready")
                             .values_list("pk", flat=True))  # fmt: skip
                return ready != [old.pk] and len(ready) == 1

            wait_for(rolled, 240, "chat's replica rolled to the new weights")
            wait_for(lambda: candidate_gone(r), 90, "the candidate to go")
            load.wait_for_answers(20)
    finally:
        watched.set()
        watcher.join(30)
    # It did stop before its replacement was ready: the gap the candidate covered.
    assert any("to make room" in why for why in why_old_stopped), why_old_stopped
    r.refresh_from_db()
    assert any("the replacements are ready" in line["text"] for line in r.lines), r.lines
    assert load.failures == [], load.summary()
