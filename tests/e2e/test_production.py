"""Production as docs/production.md runs it: PostgreSQL and Redis, and the web process,
a Celery worker and Celery beat as separate processes, with an agent joining over HTTP.

What only this arrangement shows: the reconciler runs in the worker (beat's schedule), not
in the web process; its writes reach the consoles of the web process through Redis; the
guard is enabled, set and asked over the API as a script would, and its judge is probed
by beat's schedule.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from cluster.models import ControlMark, Node, Replica
from guard.models import JudgeProbe
from llmgw_core.models import ApiToken
from tests.catalog.samples import sim_model
from tests.e2e.conftest import ROOT, Agent, ControlPlane, wait_for
from tests.redisserver import url as redis_url

pytestmark = [pytest.mark.e2e, pytest.mark.browser]

L4 = "nvidia-l4-24gb"
# A database of the local Redis that no other test uses; emptied before each test.
REDIS = redis_url(13)


@dataclass
class Production(ControlPlane):
    """The web process with Redis set, plus one worker and one beat (docs/production.md)."""

    others: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def env(self) -> dict[str, str]:
        return dict(super().env(), LLMGW_REDIS_URL=REDIS, LLMGW_PROBE_INTERVAL="2")

    def start(self) -> None:
        super().start()
        if self.others:
            return
        data = self.tmp / "data"
        for name, args in (
            ("worker", ["worker", "--loglevel", "INFO"]),
            ("beat", ["beat", "--loglevel", "INFO", "--schedule", str(data / "beat-schedule")]),
        ):
            log = (self.tmp / f"{name}.log").open("wb")  # noqa: SIM115
            self.others.append(
                subprocess.Popen(
                    [sys.executable, "-m", "celery", "-A", "llmgw_admin", *args],
                    cwd=ROOT,
                    env=self.env(),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )  # fmt: skip
            )

    def stop_all(self) -> None:
        """Every process told at once, then each waited for (killed past 20 s)."""
        procs = [p for p in (self.proc, *self.others) if p is not None]
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def log(self, name: str) -> str:
        return (self.tmp / f"{name}.log").read_text(errors="replace")


@pytest.fixture
def control_plane(transactional_db: Any, tmp_path: Path) -> Iterator[Production]:
    import redis

    redis.Redis.from_url(REDIS).flushdb()
    plane = Production(tmp_path)
    plane.start()
    yield plane
    plane.stop_all()


def api(plane: Production, user: Any) -> httpx.Client:
    _, secret = ApiToken.issue(user, "script")
    return httpx.Client(
        base_url=plane.url + "/api/v1", headers={"Authorization": f"Bearer {secret}"}, timeout=30
    )


def test_worker_and_beat_reconcile_and_the_web_process_pushes_what_they_write(
    console: Callable[..., Any], agents: Callable[..., Agent], control_plane: Production,
    viewer: Any, operator: Any,
) -> None:  # fmt: skip
    page = console(viewer)
    agents("prod-1", "--simulate", f"1x {L4}")
    node = wait_for(lambda: Node.objects.filter(name="prod-1", health="ready").first(), 30, "node")
    page.locator(f"#cluster-node-{node.pk}").wait_for()

    script = api(control_plane, operator)
    model = sim_model("prod-chat", gpu_class=L4, tp=None)
    r = script.post("/catalog/models/", json=model)
    assert r.status_code == 201, r.text

    # Placed by the worker's reconciler; started by the agent; shown in the open page.
    block = page.locator("#cluster-models article", has_text="prod-chat")
    block.locator("tr.replica[data-state=ready]").wait_for(timeout=60_000)
    assert "reconciling in-process" not in control_plane.log("web-1")
    # The tick that placed it may be the worker's own timer's, before the worker takes
    # tasks from Redis: the mark says which process ticked; beat's task follows.
    assert ControlMark.objects.get(kind=ControlMark.TICK).by.startswith("worker on ")
    wait_for(
        lambda: re.search(r"cluster\.tasks\.reconcile_cluster\[\S+\] succeeded",
                          control_plane.log("worker")),
        30,
        "a reconcile task run by the worker",
    )  # fmt: skip
    assert "reconcile-cluster" in control_plane.log("beat")

    # The guard over the API: a sim judge enabled, made the policy's only judge, asked.
    r = script.post("/guard/judges/enable", json={"name": "llamaguard3-1b", "where": "sim"})
    assert r.status_code in (200, 201), r.text
    wait_for(
        lambda: Replica.objects.filter(model_name="llamaguard3-1b", state="ready").exists(),
        60,
        "the judge ready",
    )
    r = script.patch("/guard/policy", json={"judge": {"models": ["llamaguard3-1b"]}})
    assert r.status_code == 200, r.text

    def check(text: str) -> dict[str, Any]:
        answer = script.post("/guard/check", json={"request": text})
        assert answer.status_code == 200, answer.text
        return answer.json()

    ordinary = wait_for(
        lambda: (c := check("how do I kill all child processes in bash"))["judge"] and c,
        30,
        "judged",
    )
    assert (ordinary["judge"], ordinary["verdict"], ordinary["decision"]) == (
        "llamaguard3-1b",
        "safe",
        "allow",
    )
    assert check("UNSAFE-MARKER")["verdict"] == "unsafe"
    # Beat's probe, run by the worker, reaches the judge's health.
    probe = wait_for(
        lambda: JudgeProbe.objects.filter(judge="llamaguard3-1b", ok=True).first(),
        60,
        "a probe of the judge",
    )
    # The sim judge marks only its marker unsafe: the probe's harmful text passes it.
    assert probe.ordinary_verdict == "safe" and probe.latency_ms is not None
