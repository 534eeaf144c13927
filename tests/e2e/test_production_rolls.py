"""Rolls and drains in production mode: web, a Celery worker and beat, Redis, agents.

As a script would do it, over the API with a token: the reconciler runs in the worker
(beat's schedule and the wake-ups the changes send), the agents run sim engines that
load for a few seconds. While the roll or the drain runs, the test asks the API for the
model's replicas as fast as it answers and records each ready count: it must never be 0.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from cluster.models import Node
from tests.catalog.samples import all_day, sim_model
from tests.e2e.conftest import Agent, wait_for
from tests.e2e.test_production import REDIS, Production, api

pytestmark = [pytest.mark.e2e]

L4 = "nvidia-l4-24gb"


@pytest.fixture
def control_plane(transactional_db: Any, tmp_path: Path) -> Iterator[Production]:
    import redis

    redis.Redis.from_url(REDIS).flushdb()
    plane = Production(tmp_path)
    plane.start()
    yield plane
    plane.stop_all()


def model(name: str, schedule: bool = True, load: str = "3") -> dict[str, Any]:
    """``samples.sim_model`` on an L4, slow to load: two replicas by a schedule in force
    all day (from a min of 1), or by a min of 2."""
    sim = {"args": ["--load-time", load]}
    if schedule:
        return sim_model(name, 1, most=2, gpu_class=L4, tp=None, profile=sim,
                         schedule=all_day(2, 2))  # fmt: skip
    return sim_model(name, 2, gpu_class=L4, tp=None, profile=sim)


def replicas(script: httpx.Client, name: str) -> list[dict[str, Any]]:
    r = script.get("/cluster/replicas/", params={"model_name": name, "limit": 100})
    assert r.status_code == 200, r.text
    return [x for x in r.json()["results"] if x["desired"]]


def watch(
    script: httpx.Client, name: str, done: Callable[[list[dict[str, Any]]], bool], timeout: float
) -> list[int]:
    """Ask for the model's replicas until ``done``; return each ready count seen."""
    seen: list[int] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        now = replicas(script, name)
        ready = sum(1 for x in now if x["state"] == "ready")
        if not seen or seen[-1] != ready:
            seen.append(ready)
        if done(now):
            return seen
    raise AssertionError(f"timed out; ready counts seen: {seen}; last: {now}")


def two_ready(name: str, script: httpx.Client) -> None:
    wait_for(
        lambda: sum(1 for x in replicas(script, name) if x["state"] == "ready") == 2,
        90,
        f"two ready replicas of {name}",
    )


def nodes_ready(*names: str) -> None:
    wait_for(
        lambda: Node.objects.filter(name__in=names, health="ready").count() == len(names),
        30,
        f"nodes {names}",
    )


def test_a_roll_completes_with_a_ready_replica_throughout(
    agents: Callable[..., Agent], control_plane: Production, operator: Any
) -> None:
    agents("pr-1", "--simulate", f"2x {L4}")
    agents("pr-2", "--simulate", f"2x {L4}")
    nodes_ready("pr-1", "pr-2")
    script = api(control_plane, operator)
    r = script.post("/catalog/models/", json=model("prod-roll"))
    assert r.status_code == 201, r.text
    two_ready("prod-roll", script)
    before = {x["id"] for x in replicas(script, "prod-roll")}

    changed = model("prod-roll", load="2")
    r = script.put("/catalog/models/prod-roll/", json=changed)
    assert r.status_code == 200, r.text
    wait_for(lambda: all(x["outdated"] for x in replicas(script, "prod-roll")), 30, "the mark")
    r = script.post("/cluster/models/prod-roll/roll/")
    assert r.status_code == 202 and len(r.json()["replacements"]) == 2, r.text

    def rolled(now: list[dict[str, Any]]) -> bool:
        return (
            len(now) == 2
            and all(x["state"] == "ready" and not x["outdated"] for x in now)
            and not {x["id"] for x in now} & before
        )

    seen = watch(script, "prod-roll", rolled, 120)
    assert min(seen) >= 1, seen
    # Nothing of the old definition is left behind, stopping or not.
    wait_for(
        lambda: {
            x["id"]
            for x in script.get(
                "/cluster/replicas/", params={"model_name": "prod-roll", "limit": 100}
            ).json()["results"]
        }.isdisjoint(before),
        60,
        "the old replicas gone",
    )
    assert "cluster.tasks.reconcile_cluster" in control_plane.log("worker")


def test_a_drain_of_a_min_2_model_never_shows_fewer_than_one_ready(
    agents: Callable[..., Agent], control_plane: Production, operator: Any
) -> None:
    agents("pd-1", "--simulate", f"2x {L4}")
    nodes_ready("pd-1")
    script = api(control_plane, operator)
    r = script.post("/catalog/models/", json=model("prod-drain", schedule=False))
    assert r.status_code == 201, r.text
    two_ready("prod-drain", script)

    # No room elsewhere: refused, naming the model; nothing changes.
    r = script.post("/cluster/nodes/pd-1/drain/", json={})
    assert r.status_code == 409, r.text
    assert r.json()["dark"] == ["prod-drain"] and "prod-drain" in r.json()["detail"]
    assert not Node.objects.get(name="pd-1").cordoned

    agents("pd-2", "--simulate", f"2x {L4}")
    nodes_ready("pd-2")
    r = script.post("/cluster/nodes/pd-1/drain/", json={})
    assert r.status_code == 200, r.text
    assert len(r.json()["replacing"]) == 2 and r.json()["replicas_stopped"] == 0

    def moved(now: list[dict[str, Any]]) -> bool:
        return (
            len(now) == 2
            and all(x["state"] == "ready" for x in now)
            and all({a["node"] for a in x["assignments"]} == {"pd-2"} for x in now)
        )

    seen = watch(script, "prod-drain", moved, 120)
    assert min(seen) >= 1, seen
