"""A real control plane (`manage.py serve`: uvicorn) and real agents, as processes.

The web process uses the test database (transactional tests, so both sides see committed
rows) and reconciles in-process every second. Agents are `python -m agent` processes with
state folders of their own; engines are real processes (the sim engine, llama-server).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.conf import settings

from tests.browser.conftest import CHROMIUM, CHROMIUM_ARGS, PASSWORD
from tests.dburl import database_url
from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(check: Callable[[], Any], timeout: float = 60, what: str = "condition") -> Any:
    """``tests.waiting.wait_until`` with the end-to-end tests' bound and pace: each look
    asks real processes or the database, so it looks every 0.25 s."""
    return wait_until(check, timeout, what, every=0.25)


def engine_auth(replica_id: int) -> dict[str, str]:
    """Return the header replica ``replica_id``'s engine asks of every caller: the
    processes a test starts share its secret key, so the test computes their engines'
    keys as they do (and asks their judges itself, as guard.services does)."""
    from cluster.enginekeys import authorization

    return {"Authorization": authorization(replica_id)}


@dataclass
class ControlPlane:
    """The web process, restartable."""

    tmp: Path
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0
    extra: dict[str, str] = field(default_factory=dict)  # more of the process's variables
    up_within: float = 60  # seconds its start may take (two planes on a loaded machine: more)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        env = dict(
            os.environ,
            DJANGO_SETTINGS_MODULE="llmgw_admin.settings",
            LLMGW_DATABASE_URL=database_url(),
            LLMGW_DATA_DIR=str(self.tmp / "data"),
            LLMGW_SECRET_KEY=str(settings.SECRET_KEY),
            LLMGW_RECONCILE_INTERVAL="1",
            LLMGW_NODE_LOST_AFTER="4",
            LLMGW_LOCAL_AGENT="false",
        )
        env.pop("LLMGW_REDIS_URL", None)
        env.update(self.extra)
        return env

    def command(self) -> list[str]:
        """What runs the web process: ``manage.py serve``, as the README starts it."""
        return [sys.executable, "manage.py", "serve", "--port", str(self.port)]

    def start(self) -> None:
        self.starts += 1
        log = (self.tmp / f"web-{self.starts}.log").open("wb")  # noqa: SIM115
        self.proc = subprocess.Popen(
            self.command(), cwd=ROOT, env=self.env(), stdout=log, stderr=subprocess.STDOUT
        )
        wait_for(self._up, self.up_within, "the web process to answer")

    def _up(self) -> bool:
        try:
            return httpx.get(self.url + "/login/", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def restart(self) -> None:
        self.stop()
        self.start()


@dataclass
class Agent:
    """One agent process with its own state folder."""

    name: str
    proc: subprocess.Popen[bytes]
    state_dir: Path

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()


@pytest.fixture
def control_plane(transactional_db: Any, tmp_path: Path) -> Iterator[ControlPlane]:
    cp = ControlPlane(tmp_path)
    cp.start()
    yield cp
    cp.stop()


class Agents:
    """Agent processes joined to a control plane, started on demand (``agents(name,
    *flags)``), and stopped with their engines by ``stop``."""

    def __init__(self, control_plane: ControlPlane, tmp: Path) -> None:
        from cluster.models import JoinToken

        _, self.secret = JoinToken.issue("e2e")
        self.control_plane, self.tmp = control_plane, tmp
        self.started: list[Agent] = []

    def __call__(self, name: str, *extra: str) -> Agent:
        state = self.tmp / f"agent-{name}"
        log = (self.tmp / f"agent-{name}.log").open("ab")  # noqa: SIM115
        # Engines inherit the agent's environment: the marker finds them at the end, even
        # those of an agent killed on purpose, whose replicas the control plane forgot.
        env = dict(os.environ, LLMGW_E2E_RUN=str(self.tmp))
        proc = subprocess.Popen(
            [sys.executable, "-m", "agent", "--server", self.control_plane.url,
             "--join-token", self.secret, "--name", name, "--state-dir", str(state),
             "--heartbeat", "1s", "--grace", "3s", *extra],
            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env,
        )  # fmt: skip
        agent = Agent(name, proc, state)
        self.started.append(agent)
        return agent

    def stop(self) -> None:
        # Each told at once, then waited for: they stop side by side.
        for a in self.started:
            if a.proc.poll() is None:
                a.proc.terminate()
        for a in self.started:
            try:
                a.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                a.proc.kill()
        # Engines outlive their agents on purpose; the tests' own must not outlive the tests.
        from cluster.models import Assignment

        for pid in Assignment.objects.exclude(pid=None).values_list("pid", flat=True):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
        marker = f"LLMGW_E2E_RUN={self.tmp}".encode()
        for environ in Path("/proc").glob("[0-9]*/environ"):
            with contextlib.suppress(OSError, ValueError):
                if marker in environ.read_bytes().split(b"\0"):
                    os.kill(int(environ.parent.name), signal.SIGKILL)


@pytest.fixture
def agents(control_plane: ControlPlane, tmp_path: Path) -> Iterator[Callable[..., Agent]]:
    started = Agents(control_plane, tmp_path)
    yield started
    started.stop()


@pytest.fixture(scope="session")
def _test_database(
    request: pytest.FixtureRequest, django_db_setup: Any, django_db_blocker: Any
) -> Iterator[None]:
    """The test database, made as pytest-django makes it: it makes one only when a test of
    the run asks by its marker or fixtures, which a module sharing one (below) does not;
    run alone, such a module makes it here."""
    asked = any(
        item.get_closest_marker("django_db")
        or {"db", "transactional_db", "live_server"} & set(getattr(item, "fixturenames", ()))
        for item in request.session.items
    )
    if asked:
        yield
        return
    from django.test.utils import setup_databases, teardown_databases

    with django_db_blocker.unblock():
        made = setup_databases(verbosity=0, interactive=False, aliases={"default"})
    yield
    with django_db_blocker.unblock():
        teardown_databases(made, verbosity=0)


@pytest.fixture(scope="module")
def module_transactional_db(_test_database: None, django_db_blocker: Any) -> Iterator[None]:
    """The database as ``transactional_db`` gives it (committed rows, which the processes
    a test starts read), for a whole module: its tests share one plane of processes
    started once, and the tables are emptied once, at the module's end. A test of such a
    module must leave nothing the next one would notice (each module says how)."""
    from django.test import TransactionTestCase

    with django_db_blocker.unblock():

        class ModuleCase(TransactionTestCase):
            pass

        ModuleCase.setUpClass()
        case = ModuleCase(methodName="__init__")
        case._pre_setup()
        try:
            yield
        finally:
            case._post_teardown()
            ModuleCase.tearDownClass()
            ModuleCase.doClassCleanups()


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    """The system Chromium, driven by Playwright, for the tests of a module."""
    from playwright.sync_api import sync_playwright

    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: apt-get install -y chromium")
    with pytest.MonkeyPatch.context() as mp, sync_playwright() as p:
        mp.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture
def console(chromium: Any, control_plane: ControlPlane) -> Iterator[Callable[..., Any]]:
    """Open a page of the control plane in Chromium, signed in as a user."""

    contexts = []

    def open_as(user: Any, path: str = "/cluster/") -> Any:
        context = chromium.new_context(viewport={"width": 1400, "height": 1000})
        contexts.append(context)
        page = context.new_page()
        page.set_default_timeout(30_000)
        page.goto(control_plane.url + "/login/?next=" + path)
        page.fill("#id_username", user.username)
        page.fill("#id_password", PASSWORD)
        page.click("button[type=submit]")
        page.wait_for_url(control_plane.url + path)
        if page.locator("[data-live]").count():
            page.wait_for_selector("[data-live-status].on")  # the socket is open
        return page

    yield open_as
    for c in contexts:
        c.close()
