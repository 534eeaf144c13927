"""The agent's loop against a stand-in control plane speaking docs/agent-protocol.md.

The stand-in serves a fixed desired list the test sets; the end-to-end test against the
real control plane lives with it.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from agent import state
from agent.client import ControlPlane, Unauthorized, Unreachable
from agent.engines import AGENT_ROOT
from agent.main import Agent, build_parser, parse_duration, parse_labels
from tests.waiting import wait_until

JOIN_TOKEN = "llmgw_join_test"


class FakeControlPlane:
    """Serve the control plane's side of the agent API in a thread; stop and restart it."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.version = 1
        self.replicas: list[dict[str, Any]] = []
        self.reports: list[dict[str, Any]] = []
        self.inventories: list[dict[str, Any]] = []
        self.joins: list[dict[str, Any]] = []
        self.tokens: set[str] = set()
        # Replicas whose reports are refused as not this node's.
        self.foreign: set[int] = set()
        self.port = 0
        self.server: http.server.ThreadingHTTPServer | None = None
        self.up()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def up(self) -> None:
        plane = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def answer(self, status: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def body(self) -> dict[str, Any]:
                length = int(self.headers.get("Content-Length") or 0)
                return json.loads(self.rfile.read(length) or b"{}")

            def authorized(self) -> bool:
                token = self.headers.get("Authorization", "").removeprefix("Bearer ")
                if token not in plane.tokens:
                    self.answer(401, {"detail": "unknown node token"})
                    return False
                return True

            def do_POST(self) -> None:
                body = self.body()
                with plane.lock:
                    if self.path == "/api/v1/agent/join":
                        if body.get("token") != JOIN_TOKEN:
                            return self.answer(401, {"detail": "bad join token"})
                        plane.joins.append(body)
                        token = f"llmgw_node_{len(plane.joins)}"
                        plane.tokens = {token}
                        return self.answer(201, {"node": body["name"], "node_token": token})
                    if not self.authorized():
                        return None
                    if self.path == "/api/v1/agent/heartbeat":
                        plane.inventories.append(body["inventory"])
                        return self.answer(
                            200, {"node": "n1", "state": "ready", "desired_version": plane.version}
                        )
                    if self.path == "/api/v1/agent/report":
                        reports = body["reports"]
                        if any(r["replica"] in plane.foreign for r in reports):
                            return self.answer(403, {"detail": "not this node's replica"})
                        plane.reports.extend(reports)
                        return self.answer(200, {"accepted": len(reports)})
                return self.answer(404, {"detail": "no such call"})

            def do_GET(self) -> None:
                with plane.lock:
                    if not self.authorized():
                        return
                    if self.path == "/api/v1/agent/desired":
                        self.answer(
                            200, {"version": plane.version, "replicas": list(plane.replicas)}
                        )
                        return
                self.answer(404, {"detail": "no such call"})

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()

    def down(self) -> None:
        assert self.server is not None
        self.server.shutdown()
        self.server.server_close()
        self.server = None

    def set_desired(self, replicas: list[dict[str, Any]]) -> None:
        with self.lock:
            self.replicas = replicas
            self.version += 1

    def states(self, rid: int) -> list[str]:
        with self.lock:
            out: list[str] = []
            for r in self.reports:
                if r["replica"] == rid and (not out or out[-1] != r["state"]):
                    out.append(r["state"])
            return out

    def last(self, rid: int) -> dict[str, Any]:
        with self.lock:
            return [r for r in self.reports if r["replica"] == rid][-1]


@pytest.fixture
def plane() -> Iterator[FakeControlPlane]:
    cp = FakeControlPlane()
    yield cp
    if cp.server is not None:
        cp.down()


class Running:
    """Run an agent's loop in a thread."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self.code: int | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        self.code = self.agent.run()

    def stop(self) -> int | None:
        self.agent.stop()
        self.thread.join(timeout=30)
        return self.code


@pytest.fixture
def start(tmp_path: Path, plane: FakeControlPlane) -> Iterator[Callable[..., Running]]:
    running: list[Running] = []

    def start_agent(*extra: str, join: bool = True) -> Running:
        argv = [
            "--server",
            plane.url,
            "--name",
            "n1",
            "--state-dir",
            str(tmp_path / "state"),
            "--simulate",
            "2x nvidia-h100-80gb",
            "--labels",
            "llmgw.io/rack=r12,zone=a",
            "--heartbeat",
            "200ms",
            "--grace",
            "2s",
            *extra,
        ]
        if join:
            argv += ["--join-token", JOIN_TOKEN]
        agent = Running(Agent(build_parser().parse_args(argv)))
        running.append(agent)
        return agent

    yield start_agent
    for agent in running:
        agent.agent.args.stop_engines_on_exit = True
        agent.stop()
    for rec in state.load_engines(tmp_path / "state").values():
        with contextlib.suppress(ProcessLookupError, PermissionError, TypeError):
            os.killpg(rec["pid"], signal.SIGKILL)


def eventually(check: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.05)
    raise AssertionError("condition not met in time")


def sim_replica(rid: int = 42, generation: int = 1) -> dict[str, Any]:
    return {
        "id": rid,
        "generation": generation,
        "model": "chat",
        "profile": "sim",
        "fingerprint": "9f2c",
        "engine": "sim",
        "engine_version": "",
        "source": "sim://chat",
        "served_name": "chat",
        "args": ["--load-time", "0.5"],
        "env": {},
        "tp": 1,
        "pp": 1,
        "gpus_per_node": 1,
        "nodes": 1,
        "rank": 0,
        "leader": None,
        "cards": [0],
        "cpu_cores": 0,
        "adapters": [],
        "max_loaded_adapters": 0,
        "kv_events": False,
        "startup_timeout_s": 60,
        "sha256": None,
        "context_length": 0,
        "guard": None,
    }


def alive(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return status not in ("Z", "X")


def health(port: int) -> int | None:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code
    except httpx.HTTPError:
        return None


def test_join_heartbeat_converge_and_report(
    start: Callable[..., Running], plane: FakeControlPlane, tmp_path: Path
) -> None:
    agent = start()
    eventually(lambda: len(plane.inventories) >= 2)
    # Joined once, with the inventory; the node token kept for this user only.
    [join] = plane.joins
    assert join["name"] == "n1" and join["token"] == JOIN_TOKEN
    token_file = tmp_path / "state" / state.TOKEN_FILE
    assert token_file.read_text().strip() == "llmgw_node_1"
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    inventory = plane.inventories[-1]
    assert inventory["simulated"] is True
    assert [c["class"] for c in inventory["cards"]] == ["nvidia-h100-80gb"] * 2
    assert inventory["labels"] == {"llmgw.io/rack": "r12", "zone": "a"}
    assert inventory["engines"]["sim"] == "1"

    plane.set_desired([sim_replica()])
    eventually(lambda: plane.states(42)[-1:] == ["ready"])
    assert plane.states(42)[0] == "pending"
    assert "ready" in plane.states(42)
    ready = plane.last(42)
    assert health(ready["port"]) == 200
    assert ready["generation"] == 1 and ready["at"].endswith("Z")

    plane.set_desired([])
    eventually(lambda: plane.states(42)[-1:] == ["stopped"])
    assert plane.states(42)[-2:] == ["stopping", "stopped"]
    assert not alive(ready["pid"])
    assert agent.stop() == 0


def test_unreachable_control_plane_leaves_engines_running_and_reports_wait(
    start: Callable[..., Running],
    plane: FakeControlPlane,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    start()
    plane.set_desired([sim_replica()])
    eventually(lambda: plane.states(42)[-1:] == ["ready"])
    first = plane.last(42)

    plane.down()

    def failed_heartbeats() -> int:
        return sum("control plane unreachable" in r.getMessage() for r in caplog.records)

    wait_until(lambda: failed_heartbeats() >= 2, what="two heartbeats to fail")
    assert health(first["port"]) == 200
    # A change while the control plane is away: the engine dies and is restarted.
    os.kill(first["pid"], signal.SIGKILL)

    def restarted() -> bool:
        rec = state.load_engines(tmp_path / "state").get(42, {})
        return rec.get("pid") not in (None, first["pid"]) and health(first["port"]) == 200

    eventually(restarted)
    assert plane.last(42)["pid"] == first["pid"]  # nothing reached it yet
    # The agent itself has seen the new engine ready (its health answers a moment before
    # the supervisor's next look: a control plane back in between hears "loading" first).
    wait_until(lambda: sum("ready (the engine answers /health)" in r.getMessage()
                           for r in caplog.records) >= 2, what="the restarted engine ready")  # fmt: skip

    plane.up()
    eventually(lambda: plane.last(42)["restarts"] == 1 and plane.last(42)["state"] == "ready")
    # Only the latest state per replica was kept while waiting.
    waited = [r for r in plane.reports if r["replica"] == 42 and r["restarts"] == 1]
    assert [r["state"] for r in waited] == ["ready"]


def test_restarted_agent_adopts_its_engines_without_joining_again(
    start: Callable[..., Running], plane: FakeControlPlane
) -> None:
    first = start()
    plane.set_desired([sim_replica()])
    eventually(lambda: plane.states(42)[-1:] == ["ready"])
    pid = plane.last(42)["pid"]
    assert first.stop() == 0
    # The agent is gone; the engine is not.
    assert alive(pid)
    assert plane.states(42)[-1] == "ready"

    before = len(plane.reports)
    start()
    eventually(lambda: len(plane.reports) > before and plane.last(42)["state"] == "ready")
    since = plane.reports[before:]
    # What the new agent reports is the engine the old one started.
    assert {r["pid"] for r in since if r["replica"] == 42} == {pid}
    assert "starting" not in [r["state"] for r in since]
    assert len(plane.joins) == 1


def test_restarted_agent_adopts_engines_older_than_their_startup_timeout(
    start: Callable[..., Running], plane: FakeControlPlane, tmp_path: Path
) -> None:
    # An agent's restart (an upgrade) must keep the engines it finds running whatever
    # their age: the startup timeout bounds an engine's start, not its life.
    replica = {**sim_replica(), "startup_timeout_s": 3}
    first = start()
    plane.set_desired([replica])
    eventually(lambda: plane.states(42)[-1:] == ["ready"])
    pid = plane.last(42)["pid"]
    assert first.stop() == 0
    assert alive(pid)
    started_at = state.load_engines(tmp_path / "state")[42]["started_at"]
    wait_until(
        lambda: time.time() - started_at > 4,
        timeout=30,
        what="the engine to be older than its startup timeout",
    )

    before = len(plane.reports)
    second = start()
    eventually(lambda: len(plane.reports) > before and plane.last(42)["state"] == "ready")
    # It stays ready: two more heartbeats (a tick of the supervisor each at least) later,
    # the same engine runs and nothing said it failed.
    beats = len(plane.inventories)
    wait_until(lambda: len(plane.inventories) >= beats + 2, what="two more heartbeats")
    assert second.agent.supervisor.states()[42]["state"] == "ready"
    since = [r for r in plane.reports[before:] if r["replica"] == 42]
    assert [r["state"] for r in since if r["state"] not in ("loading", "ready")] == []
    assert {r["pid"] for r in since} == {pid}
    assert alive(pid) and health(plane.last(42)["port"]) == 200


def test_stop_engines_on_exit(start: Callable[..., Running], plane: FakeControlPlane) -> None:
    agent = start("--stop-engines-on-exit")
    plane.set_desired([sim_replica()])
    eventually(lambda: plane.states(42)[-1:] == ["ready"])
    pid = plane.last(42)["pid"]
    assert agent.stop() == 0
    assert not alive(pid)
    assert plane.last(42)["state"] == "stopped"


def test_new_generation_restarts_through_the_loop(
    start: Callable[..., Running], plane: FakeControlPlane
) -> None:
    start()
    plane.set_desired([sim_replica()])
    eventually(lambda: plane.states(42)[-1:] == ["ready"])
    pid = plane.last(42)["pid"]
    plane.set_desired([sim_replica(generation=2)])
    eventually(lambda: plane.last(42)["generation"] == 2 and plane.last(42)["state"] == "ready")
    assert plane.last(42)["pid"] != pid


def test_no_token_and_no_join_token_stops(
    start: Callable[..., Running], plane: FakeControlPlane
) -> None:
    agent = start(join=False)
    agent.thread.join(timeout=10)
    assert agent.code == 2
    assert plane.joins == []


def test_refused_join_token_stops(start: Callable[..., Running], plane: FakeControlPlane) -> None:
    agent = start("--join-token", "llmgw_join_wrong", join=False)
    agent.thread.join(timeout=10)
    assert agent.code == 2


def test_replaced_node_token_joins_again(
    start: Callable[..., Running], plane: FakeControlPlane
) -> None:
    start()
    eventually(lambda: len(plane.joins) == 1 and len(plane.inventories) >= 1)
    with plane.lock:
        plane.tokens = set()  # the node's token revoked
    eventually(lambda: len(plane.joins) == 2)
    eventually(lambda: len(plane.inventories) >= 3)


# -- the client on its own ----------------------------------------------------------------


def test_reports_deduplicated_and_kept_until_delivered(
    plane: FakeControlPlane, tmp_path: Path
) -> None:
    client = ControlPlane(plane.url, tmp_path)
    client.join(JOIN_TOKEN, "n1", {})
    client.queue_report({"replica": 1, "state": "starting"})
    client.queue_report({"replica": 2, "state": "ready"})
    client.queue_report({"replica": 1, "state": "loading"})
    plane.down()
    with pytest.raises(Unreachable):
        client.flush_reports()
    assert [r["state"] for r in client.pending()] == ["ready", "loading"]
    plane.up()
    assert client.flush_reports() == 2
    assert client.pending() == []
    assert [(r["replica"], r["state"]) for r in plane.reports] == [(2, "ready"), (1, "loading")]
    client.close()


def test_report_for_a_replica_not_this_nodes_dropped_alone(
    plane: FakeControlPlane, tmp_path: Path
) -> None:
    client = ControlPlane(plane.url, tmp_path)
    client.join(JOIN_TOKEN, "n1", {})
    plane.foreign = {7}
    client.queue_report({"replica": 7, "state": "ready"})
    client.queue_report({"replica": 8, "state": "ready"})
    assert client.flush_reports() == 1
    assert client.pending() == []
    assert [r["replica"] for r in plane.reports] == [8]
    client.close()


def test_calls_need_a_node_token(plane: FakeControlPlane, tmp_path: Path) -> None:
    client = ControlPlane(plane.url, tmp_path)
    with pytest.raises(Unauthorized):
        client.heartbeat({})
    with pytest.raises(Unauthorized):
        client.join("llmgw_join_wrong", "n1", {})
    client.close()


def test_durations_and_labels() -> None:
    assert parse_duration("5s") == 5
    assert parse_duration("500ms") == 0.5
    assert parse_duration("1m30s") == 90
    for bad in ("5", "", "5 s", "-1s", "0s"):
        with pytest.raises(ValueError):
            parse_duration(bad)
    assert parse_labels("a=1, llmgw.io/rack=r12,,") == {"a": "1", "llmgw.io/rack": "r12"}
    with pytest.raises(ValueError):
        parse_labels("novalue")


def test_the_command_stops_on_sigterm_and_leaves_its_engines(
    plane: FakeControlPlane, tmp_path: Path
) -> None:
    plane.set_desired([sim_replica()])
    env = {**os.environ, "PYTHONPATH": AGENT_ROOT, "LLMGW_JOIN_TOKEN": JOIN_TOKEN}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "agent",
            "--server",
            plane.url,
            "--name",
            "n1",
            "--state-dir",
            str(tmp_path / "state"),
            "--simulate",
            "1x nvidia-l4-24gb",
            "--heartbeat",
            "200ms",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        eventually(lambda: plane.states(42)[-1:] == ["ready"])
        pid = plane.last(42)["pid"]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
        assert alive(pid)
        assert b"joined as n1" in (proc.stdout.read() if proc.stdout else b"")
    finally:
        if proc.poll() is None:
            proc.kill()
        for rec in state.load_engines(tmp_path / "state").values():
            with contextlib.suppress(ProcessLookupError, PermissionError, TypeError):
                os.killpg(rec["pid"], signal.SIGKILL)
