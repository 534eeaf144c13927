"""Faults in production mode (docs/production.md): the web process, a Celery worker and
beat as processes, simulated agents, and a Redis of the test's own that it can stop.

- the web process killed and kept down for 40 s: no node is lost, no engine restarted;
- Redis away and back: an open console (Chromium) says it is not live meanwhile, then
  shows a change made while Redis was away;
- beat stopped: the dashboard and the API say the reconciler stopped, and who ran it last;
- web, worker and beat started from an environment built from requirements.txt alone
  (cached in ~/.cache/llmgw, keyed by the file's hash).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.utils import timezone

from cluster.models import Assignment, ControlMark, Node, Replica
from llmgw_core.models import ApiToken
from tests.catalog import samples
from tests.catalog.samples import store
from tests.e2e.conftest import ROOT, Agent, ControlPlane, wait_for
from tests.redisserver import RedisServer as Redis

pytestmark = [pytest.mark.e2e, pytest.mark.browser]

L4 = "nvidia-l4-24gb"
LOST_AFTER = 4  # ControlPlane.env's LLMGW_NODE_LOST_AFTER
CACHE = Path(os.environ.get("LLMGW_CACHE", Path.home() / ".cache" / "llmgw"))


@dataclass
class Plane(ControlPlane):
    """Production's processes (docs/production.md) with a chosen Python and Redis."""

    redis_url: str = ""
    python: str = sys.executable
    others: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def env(self) -> dict[str, str]:
        return dict(super().env(), LLMGW_REDIS_URL=self.redis_url, LLMGW_PROBE_INTERVAL="2")

    def command(self) -> list[str]:
        return [self.python, "manage.py", "serve", "--port", str(self.port)]

    def start_all(self) -> None:
        self.start()
        beat_schedule = self.tmp / "beat-schedule"
        for name, args in (
            ("worker", ["worker", "--loglevel", "INFO"]),
            ("beat", ["beat", "--loglevel", "INFO", "--schedule", str(beat_schedule)]),
        ):
            log = (self.tmp / f"{name}.log").open("wb")  # noqa: SIM115
            self.others[name] = subprocess.Popen(
                [self.python, "-m", "celery", "-A", "llmgw_admin", *args],
                cwd=ROOT, env=self.env(), stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip

    def kill_web(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop_all(self) -> None:
        """Every process told at once, then each waited for (killed past 20 s)."""
        procs = [p for p in (self.proc, *self.others.values()) if p is not None]
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
def redis_server(tmp_path: Path) -> Iterator[Redis]:
    server = Redis(tmp_path)
    server.start()
    yield server
    server.stop()


@pytest.fixture
def control_plane(transactional_db: Any, tmp_path: Path, redis_server: Redis) -> Iterator[Plane]:
    plane = Plane(tmp_path, redis_url=redis_server.url)
    plane.start_all()
    yield plane
    plane.stop_all()


def api(plane: Plane, user: Any) -> httpx.Client:
    _, secret = ApiToken.issue(user, "script")
    return httpx.Client(
        base_url=plane.url + "/api/v1", headers={"Authorization": f"Bearer {secret}"}, timeout=30
    )


sim_model = partial(samples.sim_model, gpu_class=L4, tp=None)


def ready_with_pids(name: str, count: int) -> dict[int, int] | None:
    """The model's engines' PIDs by replica, once ``count`` replicas are ready with one."""
    ready = Replica.objects.filter(model_name=name, state="ready", desired=True)
    pids = dict(Assignment.objects.filter(replica__in=ready).values_list("replica_id", "pid"))
    if len(pids) == count and all(pids.values()):
        return pids
    return None


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def last_tick() -> Any:
    mark = ControlMark.objects.filter(kind="tick").first()
    return mark.at if mark else None


# 166 s at load 6 to 22 (setup 15, the test 140, teardown 11).
@pytest.mark.takes(166)
def test_the_web_process_down_for_40_s_restarts_no_engine(
    control_plane: Plane, agents: Callable[..., Agent]
) -> None:
    for i in range(4):
        agents(f"f{i}", "--simulate", f"1x {L4}")
    wait_for(lambda: Node.objects.filter(health="ready").count() == 4, 60, "four nodes")
    store(sim_model("fault-chat", 4))
    pids = wait_for(lambda: ready_with_pids("fault-chat", 4), 90, "four replicas ready")
    assert len(set(pids.values())) == 4
    restarts = dict(Replica.objects.values_list("pk", "restarts"))

    # kill -9 the web process, the one that hears heartbeats, and keep it down for 40 s:
    # ten times LLMGW_NODE_LOST_AFTER, while the worker goes on reconciling.
    control_plane.kill_web()
    down_at = timezone.now()
    deadline = time.monotonic() + 40
    while time.monotonic() < deadline:
        lost = list(Node.objects.filter(health="lost").values_list("name", flat=True))
        assert not lost, f"nodes lost while the web process was down: {lost}"
        time.sleep(0.5)
    wait_for(lambda: last_tick() > down_at + timedelta(seconds=30), 60,
             "the worker to tick with the web process down")  # fmt: skip
    held = Node.objects.filter(health="not_ready")
    assert held.count() == 4 and "control plane" in held.first().reason

    control_plane.start()
    back_at = timezone.now()
    wait_for(lambda: Node.objects.filter(health="ready").count() == 4, 30, "the agents heard again")
    # Long enough for a returning node to be called lost (silence past LLMGW_NODE_LOST_AFTER
    # after the web process is back), and for every agent to read its desired list again.
    settle = back_at + timedelta(seconds=LOST_AFTER + 8)
    wait_for(lambda: (t := last_tick()) and t > settle, 60, "the worker's ticks after the return")
    assert not Node.objects.filter(health="lost").exists()
    assert ready_with_pids("fault-chat", 4) == pids
    assert all(alive(pid) for pid in pids.values())
    assert dict(Replica.objects.values_list("pk", "restarts")) == restarts


# 71 s at load 6 to 22 (setup 34, the test 26, teardown 11).
@pytest.mark.takes(71)
def test_after_redis_is_away_and_back_an_open_console_shows_a_change_made_meanwhile(
    control_plane: Plane,
    redis_server: Redis,
    agents: Callable[..., Agent],
    console: Callable[..., Any],
    viewer: Any,
    operator: Any,
) -> None:
    agents("blip-1", "--simulate", f"1x {L4}")
    node = wait_for(lambda: Node.objects.filter(name="blip-1", health="ready").first(), 30, "node")
    page = console(viewer)
    card = page.locator(f"#cluster-node-{node.pk}")
    card.wait_for()
    assert "state-cordoned" not in (card.get_attribute("class") or "")
    badge = page.locator("#live-status")

    redis_server.stop()
    # The page says it is not live: events are being dropped.
    page.locator("#live-status:not(.on)").wait_for(timeout=15_000)
    # From now on, every class the badge takes, and the sockets the page opens: each is
    # accepted, then closed (1013) while Redis is away.
    page.evaluate("""() => {
        const badge = document.querySelector('#live-status');
        window.badgeClasses = [];
        window.socketsOpened = 0;
        new MutationObserver(() => window.badgeClasses.push(badge.className))
            .observe(badge, {attributes: true, attributeFilter: ['class']});
        document.addEventListener('htmx:wsOpen', () => { window.socketsOpened += 1; });
    }""")
    # A change while Redis is away: its event is dropped.
    script = api(control_plane, operator)
    r = script.post("/cluster/nodes/blip-1/cordon/")
    assert r.status_code == 200, r.text
    assert Node.objects.get(pk=node.pk).cordoned
    # Two sockets opened and closed again while Redis is away: the badge never said live.
    wait_for(lambda: page.evaluate("window.socketsOpened") >= 2, 60, "the page to try again")
    taken = page.evaluate("window.badgeClasses")
    assert not [c for c in taken if "on" in c.split()], taken
    # Still not live, and showing the state from before, while Redis is away.
    assert "on" not in (badge.get_attribute("class") or "").split()
    assert "state-cordoned" not in (card.get_attribute("class") or "")

    redis_server.start()
    # Back: the console resynchronises and shows the cordon, and says it is live again.
    page.locator(f"#cluster-node-{node.pk}.state-cordoned").wait_for(timeout=30_000)
    page.locator("#live-status.on").wait_for(timeout=15_000)
    assert badge.inner_text() == "live"


# 78 s at load 6 to 22 (setup 27, the test 49, teardown 1).
@pytest.mark.takes(78)
def test_with_beat_stopped_the_worker_ticks_and_with_it_stopped_the_console_says_so(
    control_plane: Plane, console: Callable[..., Any], viewer: Any
) -> None:
    page = console(viewer)
    status = page.locator("#cluster-reconciler")
    page.locator('#cluster-reconciler[data-stale="false"]').wait_for(timeout=30_000)
    assert "by worker on" in status.inner_text()
    script = api(control_plane, viewer)
    assert not script.get("/cluster/status/").json()["reconciler"]["stale"]

    beat = control_plane.others["beat"]
    beat.kill()
    beat.wait()
    # The worker's own timer ticks on without beat (and without Redis).
    killed = timezone.now()
    wait_for(lambda: (last_tick() or killed) > killed + timedelta(seconds=10), 60,
             "a tick 10 s after beat stopped")  # fmt: skip
    assert not script.get("/cluster/status/").json()["reconciler"]["stale"]
    assert page.locator('#cluster-reconciler[data-stale="false"]').count() == 1

    worker = control_plane.others["worker"]
    worker.kill()
    worker.wait()
    # No tick for 3 intervals (5 s at least): the open page warns, without a reload.
    page.locator('#cluster-reconciler[data-stale="true"]').wait_for(timeout=30_000)
    warning = page.locator('[data-role="tick-warning"]').inner_text()
    assert "has not run for" in warning and "worker and beat" in warning
    body = script.get("/cluster/status/").json()["reconciler"]
    assert body["stale"] and body["by"].startswith("worker on ") and body["age_s"] > 5


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


@pytest.fixture(scope="session")
def requirements_python() -> str:
    """A Python whose environment holds requirements.txt alone (not the test pins).

    Built once per content of requirements.txt in ~/.cache/llmgw (pip: PyPI and
    PIP_FIND_LINKS; about 2 minutes), reused by later runs; a build cut short is built
    again, and the one for earlier requirements removed.
    """
    req = ROOT / "requirements.txt"
    digest = hashlib.sha256(req.read_bytes()).hexdigest()[:16]
    venv = CACHE / f"venv-requirements-{digest}"
    python = venv / "bin" / "python"
    done = venv / ".installed"
    with _locked(CACHE / f"venv-requirements-{digest}.lock"):
        if not done.exists():
            shutil.rmtree(venv, ignore_errors=True)
            base = getattr(sys, "_base_executable", sys.executable)
            subprocess.run([base, "-m", "venv", str(venv)], check=True)
            pip = subprocess.run(
                [str(python), "-m", "pip", "install", "--quiet", "-r", str(req)],
                capture_output=True, text=True, timeout=1500,
            )  # fmt: skip
            if pip.returncode:
                pytest.fail(f"pip install -r requirements.txt failed:\n{pip.stderr[-4000:]}")
            done.write_text(req.read_text())
            # Environments of earlier requirements are not used again.
            for old in CACHE.glob("venv-requirements-*"):
                if old.is_dir() and old != venv:
                    shutil.rmtree(old, ignore_errors=True)
                    old.with_name(old.name + ".lock").unlink(missing_ok=True)
    return str(python)


@pytest.fixture
def plane_from_requirements(
    transactional_db: Any, tmp_path: Path, redis_server: Redis, requirements_python: str
) -> Iterator[Plane]:
    plane = Plane(tmp_path, redis_url=redis_server.url, python=requirements_python)
    plane.start_all()
    yield plane
    plane.stop_all()


# 174 s at load 6 to 22 (setup 135, building requirements.txt's environment once a
# machine; the test 28, teardown 11).
@pytest.mark.takes(174)
def test_web_worker_and_beat_run_from_requirements_txt_alone(
    plane_from_requirements: Plane, requirements_python: str, tmp_path: Path
) -> None:
    plane = plane_from_requirements
    # The environment is requirements.txt's: none of the test pins.
    probe = subprocess.run(
        [requirements_python, "-c", "import importlib.util as u; print(u.find_spec('pytest'))"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert probe.stdout.strip() == "None"
    # An agent joins the web process; beat schedules the reconciler and the worker places
    # and the agent starts a model's replica.
    from cluster.models import JoinToken

    _, secret = JoinToken.issue("requirements")
    log = (tmp_path / "agent.log").open("wb")
    env = dict(os.environ, LLMGW_E2E_RUN=str(tmp_path))
    agent = subprocess.Popen(
        [requirements_python, "-m", "agent", "--server", plane.url, "--join-token", secret,
         "--name", "req-1", "--state-dir", str(tmp_path / "agent"), "--heartbeat", "1s",
         "--simulate", f"1x {L4}", "--stop-engines-on-exit"],
        cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env,
    )  # fmt: skip
    try:
        wait_for(lambda: Node.objects.filter(name="req-1", health="ready").exists(), 60, "node")
        store(sim_model("req-chat", 1))
        wait_for(lambda: ready_with_pids("req-chat", 1), 90, "the replica ready")
        for name, proc in plane.others.items():
            assert proc.poll() is None, f"{name} exited:\n{plane.log(name)[-3000:]}"
        # The worker's own timer may have placed the replica before beat's first task came
        # (it ticks when no tick finished in time): beat's task is run by the worker too.
        wait_for(lambda: "reconcile-cluster" in plane.log("beat"), 60, "beat sending its task")
        wait_for(
            lambda: "cluster.tasks.reconcile_cluster" in (w := plane.log("worker"))
            and "succeeded" in w,
            60,
            "the worker running beat's task",
        )
        assert (ControlMark.objects.get(kind="tick").by or "").startswith("worker on ")
    finally:
        agent.terminate()
        try:
            agent.wait(timeout=20)
        except subprocess.TimeoutExpired:
            agent.kill()
        for environ in Path("/proc").glob("[0-9]*/environ"):
            with contextlib.suppress(OSError, ValueError):
                if f"LLMGW_E2E_RUN={tmp_path}".encode() in environ.read_bytes().split(b"\0"):
                    os.kill(int(environ.parent.name), signal.SIGKILL)
